"""Fixtures: tiny but real training configurations, and the local SLURM cluster (shared
helpers are in tests/helpers.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rl_app.config import Config, load_config
from tests.helpers import TINY_RUN, UP_SCRIPT

# The learning checks take a fifth of the suite's time and the SLURM tests share one
# local cluster and its CPUs: they run one after the other, in one worker.
SERIAL_MARKERS = ("slow", "slurm")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With ``pytest -n 2 --dist loadgroup`` (``make test``) the serial tests go first, to
    one worker, while the other worker takes the rest; whichever is done first helps with
    what is left."""
    serial = [item for item in items if any(item.get_closest_marker(m) for m in SERIAL_MARKERS)]
    for item in serial:
        item.add_marker(pytest.mark.xdist_group("serial"))
    ids = {id(item) for item in serial}
    items[:] = serial + [item for item in items if id(item) not in ids]


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
