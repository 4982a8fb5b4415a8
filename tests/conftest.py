"""Shared helpers: tiny but real training configurations, and the local SLURM cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_app.config import Config, load_config

ROOT = Path(__file__).resolve().parent.parent
TRAIN_PY = ROOT / "train.py"
PYTHON = sys.executable
UP_SCRIPT = ROOT / "slurm" / "local-cluster" / "up.sh"

# A run of a few seconds: small networks, a few evaluations, real env, real buffer on disk.
TINY_RUN = [
    "network.hidden_sizes=[32,32]",
    "collector.total_frames=1200",
    "collector.frames_per_batch=200",
    "collector.init_random_frames=400",
    "optim.utd_ratio=0.1",
    "optim.batch_size=64",
    "replay.capacity=5000",
    "eval.interval_frames=400",
    "eval.episodes=2",
    "logger.backend=none",
]


@pytest.fixture
def tiny_config(tmp_path: Path):
    """``tiny_config(*overrides)``: a validated tiny :class:`Config` writing under tmp_path."""

    def make(*overrides: str, preset: str = "default", run_dir: Path | None = None) -> Config:
        target = run_dir or tmp_path / "run"
        return load_config(preset, [*TINY_RUN, f"run_dir={target}", *overrides])

    return make


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """The local cluster, started (or found running) once per session."""
    try:
        started = subprocess.run(
            ["bash", str(UP_SCRIPT)], capture_output=True, text=True, timeout=900
        )
        reason = (started.stderr.strip() or started.stdout.strip()).splitlines()[-1:]
        failed = started.returncode != 0
    except (OSError, subprocess.TimeoutExpired) as error:
        reason, failed = [str(error)], True
    if failed:
        message = f"local SLURM cluster could not start: {' '.join(reason) or 'no reason given'}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
