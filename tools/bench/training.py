"""The default preset trained with a 1e6-capacity memmap buffer: frames/s, updates/s and
where an iteration's time goes, phase by phase."""

from __future__ import annotations

import time
from typing import Any

from rl_app.config import Config
from rl_app.run import train
from tools.bench.shared import phase_seconds


def bench_training(config: Config) -> dict[str, Any]:
    """``config`` trained: end-to-end rates, and each phase's mean time per iteration."""
    started = time.perf_counter()
    result = train(config)
    wall = time.perf_counter() - started
    iterations = result.frames // config.collector.frames_per_batch
    seconds = result.seconds_per_phase
    checkpoint_share = phase_seconds(seconds, "saving a checkpoint") / wall
    iteration_seconds = sum(seconds.values())
    replay_seconds = phase_seconds(seconds, "sampling", "writing back")
    return {
        "replay_capacity": config.replay.capacity,
        "sampling_and_priority_share_of_iteration": replay_seconds / iteration_seconds,
        "run_dir": str(result.run_dir),
        "frames": result.frames,
        "wall_seconds": wall,
        "frames_per_second": result.frames / wall,
        "updates_per_second": result.updates / wall,
        "ms_per_update_step": 1000 * phase_seconds(seconds, "updating") / max(result.updates, 1),
        "ms_per_iteration": {p: 1000 * s / iterations for p, s in seconds.items()},
        "checkpoint_share_of_wall_time": checkpoint_share,
    }


def print_training(training: dict[str, Any]) -> None:
    print(f"\n== training ({training['frames']} frames, default preset, "
          f"{training['replay_capacity']:,}-transition memmap buffer)")  # fmt: skip
    print(f"environment frames/s (end to end): {training['frames_per_second']:.1f}")
    print(f"updates/s (end to end):             {training['updates_per_second']:.1f}")
    print(f"one update step:                    {training['ms_per_update_step']:.1f} ms")
    print("time per iteration:")
    total = sum(training["ms_per_iteration"].values())
    for phase, ms in training["ms_per_iteration"].items():
        print(f"  {phase:<22} {ms:8.1f} ms  {100 * ms / total:5.1f}%")
    share = training["sampling_and_priority_share_of_iteration"]
    print(f"prioritized slice sampling + priority writes: {share:.1%} of an iteration")
    print(f"checkpointing: {100 * training['checkpoint_share_of_wall_time']:.2f}% of wall time")
