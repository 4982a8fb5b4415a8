"""What overlaps the updates, side by side: ``replay.prefetch`` (the next batch drawn while
an update runs) and async collection in one worker process (frames collected while the
learner updates), alone and together, against neither. ``default`` and ``dqn_atari100k``
in short runs, interleaved: frames/s over the loop, the time spent waiting for batches and
frames and updating, and what each run learned (its last metrics row)."""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Any

from rl_app.checks import load_config
from rl_app.logger import read_metrics
from rl_app.run import train
from tools.bench.shared import phase_seconds

# Each preset shortened: (its settings, what its learning is compared by).
OVERLAP_RUNS = {
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
ASYNC = ["collector.mode=async", "collector.workers=1"]
OVERLAP_VARIANTS = {
    "neither": [],
    "prefetch": ["replay.prefetch=true"],
    "async collection": ASYNC,
    "both": ["replay.prefetch=true", *ASYNC],
}
OVERLAP_ROUNDS = 2


def overlap_run(preset: str, settings: list[str], run_dir: Path) -> dict[str, Any]:
    result = train(load_config(preset, [*settings, "logger.backend=csv", f"run_dir={run_dir}"]))
    seconds = result.seconds_per_phase
    loop = sum(seconds.values()) - phase_seconds(seconds, "evaluating", "saving a checkpoint")
    return {
        "frames_per_second": result.frames / loop,
        "collecting_s": phase_seconds(seconds, "collecting"),
        "sampling_s": phase_seconds(seconds, "sampling"),
        "updating_s": phase_seconds(seconds, "updating"),
        "last_row": read_metrics(run_dir)[-1],
    }


def bench_overlap(run_dir: Path) -> dict[str, Any]:
    """Each of ``OVERLAP_RUNS`` in each of ``OVERLAP_VARIANTS``, ``OVERLAP_ROUNDS`` rounds
    (every variant once per round); each variant's median rate over neither's."""
    report: dict[str, Any] = {}
    for preset, (settings, _) in OVERLAP_RUNS.items():
        runs: dict[str, list[dict]] = {name: [] for name in OVERLAP_VARIANTS}
        for round_ in range(OVERLAP_ROUNDS):
            for name, variant in OVERLAP_VARIANTS.items():
                where = run_dir / f"{preset}-{name.replace(' ', '_')}-{round_}"
                runs[name].append(overlap_run(preset, [*settings, *variant], where))
        rates = {name: median(run["frames_per_second"] for run in runs[name]) for name in runs}
        report[preset] = {
            "runs": runs,
            "ratio_over_neither": {name: rates[name] / rates["neither"] for name in runs},
        }
    return report


def print_overlap(overlap: dict[str, Any]) -> None:
    print(f"\n== overlapping the updates: {OVERLAP_ROUNDS} rounds, interleaved (frames/s over "
          "the loop, evaluation and saves aside; async: one worker process)")  # fmt: skip
    for preset, (_, learned) in OVERLAP_RUNS.items():
        print(f"  {preset}:")
        for name, runs in overlap[preset]["runs"].items():
            ratio = overlap[preset]["ratio_over_neither"][name]
            print(f"    {name} ({ratio:.2f}x neither):")
            for run in runs:
                row = run["last_row"]
                scores = ", ".join(f"{key} {row[key]:.4g}" for key in learned if key in row)
                print(f"      {run['frames_per_second']:7.1f} frames/s; collecting "
                      f"{run['collecting_s']:5.1f} s, sampling {run['sampling_s']:5.1f} s, "
                      f"updating {run['updating_s']:5.1f} s; last row: {scores}")  # fmt: skip
