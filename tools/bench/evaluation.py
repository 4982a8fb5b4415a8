"""What evaluation costs training, side by side: ``eval.backend=blocking`` (training waits
while the episodes play) against ``eval.backend=process`` (they play in a process of their
own while training goes on). ``default`` and ``dqn_atari100k`` in short runs that evaluate
along the way: the run's wall time, the time training waited for evaluations, and what was
learned and scored (the evaluation rows, which the two backends must log alike)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_app.checks import load_config
from rl_app.logger import EVAL_KEY, read_metrics
from rl_app.run import train
from tools.bench.shared import phase_seconds, timed

# Each preset shortened, evaluating along the way: (its settings, what its learning is
# compared by in the last row).
EVALUATION_RUNS = {
    "default": (
        ["collector.total_frames=6000", "optim.compile=false", "eval.interval_frames=2000"],
        ("train/loss_qvalue", "train/loss_actor"),
    ),
    "dqn_atari100k": (
        ["collector.total_frames=3200", "replay.capacity=20000", "eval.interval_frames=1600",
         "eval.episodes=4"],
        ("train/loss",),
    ),
}  # fmt: skip
BACKENDS = ("blocking", "process")


def evaluation_run(preset: str, settings: list[str], run_dir: Path) -> dict[str, Any]:
    config = load_config(preset, [*settings, "logger.backend=csv", f"run_dir={run_dir}"])
    result, wall = timed(lambda: train(config))
    rows = read_metrics(run_dir)
    return {
        "wall_seconds": wall,
        "waiting_for_evaluations_s": phase_seconds(result.seconds_per_phase, "evaluating"),
        "frames_per_second": result.frames / wall,
        "evaluations": {row["frames"]: row[EVAL_KEY] for row in rows if EVAL_KEY in row},
        "last_row": rows[-1],
    }


def bench_evaluation(run_dir: Path) -> dict[str, Any]:
    """Each of ``EVALUATION_RUNS`` with each of ``BACKENDS``; wall-time ratios."""
    report: dict[str, Any] = {}
    for preset, (settings, _) in EVALUATION_RUNS.items():
        runs = {
            backend: evaluation_run(
                preset, [*settings, f"eval.backend={backend}"], run_dir / f"{preset}-{backend}"
            )
            for backend in BACKENDS
        }
        report[preset] = {
            "runs": runs,
            "wall_time_ratio_process_to_blocking": (
                runs["process"]["wall_seconds"] / runs["blocking"]["wall_seconds"]
            ),
        }
    return report


def print_evaluation(evaluation: dict[str, Any]) -> None:
    print("\n== evaluation: blocking vs in a process of its own (wall time, the time training "
          "waited for evaluations, scores)")  # fmt: skip
    for preset, (_, learned) in EVALUATION_RUNS.items():
        ratio = evaluation[preset]["wall_time_ratio_process_to_blocking"]
        print(f"  {preset} (process: {ratio:.2f}x blocking's wall time):")
        for backend, run in evaluation[preset]["runs"].items():
            row = run["last_row"]
            scores = ", ".join(f"{key} {row[key]:.4g}" for key in learned if key in row)
            evaluations = ", ".join(
                f"{frames}: {value:.4g}" for frames, value in run["evaluations"].items()
            )
            print(f"    {backend:<9} {run['wall_seconds']:6.1f} s, waited "
                  f"{run['waiting_for_evaluations_s']:5.1f} s for evaluations, "
                  f"{run['frames_per_second']:6.1f} frames/s; evaluations {evaluations}; "
                  f"last row: {scores}")  # fmt: skip
