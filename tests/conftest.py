"""Fixtures: tiny but real training configurations, and the local SLURM cluster (shared
helpers are in tests/helpers.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from _pytest.nodeid import coerce_node_id

from rl_app.config import Config, load_config
from tests.helpers import TINY_RUN, UP_SCRIPT

# The learning checks take a fifth of the suite's time and the SLURM tests share one
# local cluster and its CPUs: they run one after the other, in one worker.
SERIAL_MARKERS = ("slow", "slurm")
SERIAL_GROUP = "serial"


def is_serial(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(marker) for marker in SERIAL_MARKERS)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``pytest -n 2 --dist loadgroup`` (``make test``) the serial tests go first, to
    one worker, while the other worker takes the rest; whichever is done first helps with
    what is left.

    pytest-xdist 3.8.0 sends the tests whose node id ends in ``@group`` to one worker, but
    its ``xdist_group`` marker no longer gets them that suffix under pytest 9 (it writes
    ``item._nodeid``, which pytest 9 does not read): the suffix is set here instead."""
    items.sort(key=lambda item: not is_serial(item))
    if config.getoption("loadgroup", False):  # set in xdist's workers under loadgroup
        for item in filter(is_serial, items):
            item._id = coerce_node_id(f"{item.nodeid}@{SERIAL_GROUP}")


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
