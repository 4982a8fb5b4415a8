"""A checkpoint's save, verify-and-load time and size with a 100k-transition buffer."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rl_app.checkpointing import disk_size, verify_checkpoint
from rl_app.config import Config
from rl_app.envs import make_env
from rl_app.replay import TRAJECTORY_KEY
from rl_app.run import build_run
from tools.bench.shared import random_play

CHECKPOINT_BUFFER = 100_000


def bench_checkpoint(config: Config, directory: Path) -> dict[str, Any]:
    """One save and one verified load of a run whose buffer holds 100k real transitions."""
    config.run_dir = str(directory)
    config.replay.capacity = CHECKPOINT_BUFFER
    run = build_run(config)
    try:
        play = random_play(make_env(config.env, config.seed), CHECKPOINT_BUFFER // 10)
        for copy in range(10):  # ten copies of real play, each with its own trajectory ids
            play[TRAJECTORY_KEY] += copy * 1_000
            run.buffer.extend(play)
        run.progress.frames = CHECKPOINT_BUFFER

        started = time.perf_counter()
        path = run.checkpoints.save(CHECKPOINT_BUFFER, eval_return=0.0)
        save_seconds = time.perf_counter() - started
        started = time.perf_counter()
        verify_checkpoint(path)
        run.checkpoints.load(path)
        load_seconds = time.perf_counter() - started
        return {
            "transitions": len(run.buffer),
            "save_seconds": save_seconds,
            "verify_and_load_seconds": load_seconds,
            "size_mb": disk_size(path) / 1e6,
        }
    finally:
        run.close()


def print_checkpoint(checkpoint: dict[str, Any]) -> None:
    print(f"\n== checkpoint with {checkpoint['transitions']} Pendulum transitions")
    print(f"save: {checkpoint['save_seconds']:.2f} s")
    print(f"verify + load: {checkpoint['verify_and_load_seconds']:.2f} s")
    print(f"size: {checkpoint['size_mb']:.1f} MB")
