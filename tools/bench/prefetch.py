"""``replay.prefetch`` off and on, side by side: ``default`` and ``dqn_atari100k`` in short
runs, interleaved (off, on, off, on): frames/s over the loop, the time an iteration waits
for its batches and spends updating, and what each run learned (its last metrics row)."""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Any

from rl_app.checks import load_config
from rl_app.logger import read_metrics
from rl_app.run import train
from tools.bench.shared import phase_seconds

# Each preset shortened: (its settings, what its learning is compared by).
PREFETCH_RUNS = {
    "default": (
        ["collector.total_frames=6000", "optim.compile=false", "eval.interval_frames=6000"],
        ("train/loss_qvalue", "train/loss_actor", "eval/return"),
    ),
    "dqn_atari100k": (
        ["collector.total_frames=3200", "replay.capacity=20000", "eval.interval_frames=3200",
         "eval.episodes=1"],
        ("train/loss", "eval/return"),
    ),
}  # fmt: skip
PREFETCH_ROUNDS = 2


def prefetch_run(preset: str, settings: list[str], prefetch: bool, run_dir: Path) -> dict:
    config = load_config(
        preset,
        [*settings, "logger.backend=csv", f"replay.prefetch={str(prefetch).lower()}",
         f"run_dir={run_dir}"],
    )  # fmt: skip
    result = train(config)
    seconds = result.seconds_per_phase
    loop = sum(seconds.values()) - phase_seconds(seconds, "evaluating", "saving a checkpoint")
    return {
        "frames_per_second": result.frames / loop,
        "sampling_s": phase_seconds(seconds, "sampling"),
        "updating_s": phase_seconds(seconds, "updating"),
        "last_row": read_metrics(run_dir)[-1],
    }


def bench_prefetch(run_dir: Path) -> dict[str, Any]:
    """Each of ``PREFETCH_RUNS`` with ``replay.prefetch`` off and on, ``PREFETCH_ROUNDS``
    rounds; the median rate of each and their ratio."""
    report: dict[str, Any] = {}
    for preset, (settings, _) in PREFETCH_RUNS.items():
        runs: dict[str, list[dict]] = {"off": [], "on": []}
        for round_ in range(PREFETCH_ROUNDS):
            for name in runs:
                where = run_dir / f"{preset}-{name}-{round_}"
                runs[name].append(prefetch_run(preset, settings, name == "on", where))
        report[preset] = runs
        rates = {name: median(run["frames_per_second"] for run in runs[name]) for name in runs}
        report[preset]["ratio_on_over_off"] = rates["on"] / rates["off"]
    return report


def print_prefetch(prefetch: dict[str, Any]) -> None:
    print(f"\n== replay.prefetch: off and on, {PREFETCH_ROUNDS} rounds each, interleaved "
          "(frames/s over the loop, evaluation and saves aside)")  # fmt: skip
    for preset, (_, learned) in PREFETCH_RUNS.items():
        runs = prefetch[preset]
        print(f"  {preset}: on / off = {runs['ratio_on_over_off']:.2f}")
        for name in ("off", "on"):
            for run in runs[name]:
                row = run["last_row"]
                scores = ", ".join(f"{key} {row[key]:.4g}" for key in learned if key in row)
                print(f"    {name:<4} {run['frames_per_second']:7.1f} frames/s, "
                      f"sampling {run['sampling_s']:6.1f} s, updating {run['updating_s']:6.1f} s; "
                      f"last row: {scores}")  # fmt: skip
