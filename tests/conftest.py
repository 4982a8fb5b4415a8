"""Fixtures: tiny but real training configurations, the command line run in this process,
and the local SLURM cluster (shared helpers are in tests/helpers.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rl_app.checks import load_config
from rl_app.config import Config
from rl_app.rendering import mp4_problem
from rl_app.upstream.pytest import send_to_group
from tests.helpers import TINY_RUN, UP_SCRIPT, refusal
from train import main

# Tests that run one after the other, each group in one worker: the SLURM tests share one
# local cluster and its CPUs; the Ray tests one local Ray per module, and the RPC tests start
# worker processes (one RPC collector per process). A test of both goes with the SLURM ones.
GROUPS = {"slurm": ("slurm",), "ray": ("ray", "rpc")}


def group_of(item: pytest.Item) -> str | None:
    for group, markers in GROUPS.items():
        if any(item.get_closest_marker(marker) for marker in markers):
            return group
    if item.get_closest_marker("together"):  # a module whose tests share what they saw
        return item.module.__name__
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``pytest -n 2 --dist loadgroup`` (``make test``) the groups go first, each to
    one worker, then the learning checks (a fifth of the suite's time), then the rest,
    wherever a worker is free. (xdist's own ``xdist_group`` marker does not group tests
    under pytest 9: :func:`rl_app.upstream.pytest.send_to_group`.)"""
    items.sort(key=lambda item: (group_of(item) is None, not item.get_closest_marker("slow")))
    if config.getoption("loadgroup", False):  # set in xdist's workers under loadgroup
        for item in items:
            group = group_of(item)
            if group is not None:
                send_to_group(item, group)


@pytest.fixture
def tiny_config(tmp_path: Path):
    """``tiny_config(*overrides)``: a validated tiny :class:`Config` writing under tmp_path."""

    def make(*overrides: str, preset: str = "default", run_dir: Path | None = None) -> Config:
        target = run_dir or tmp_path / "run"
        return load_config(preset, [*TINY_RUN, f"run_dir={target}", *overrides])

    return make


@pytest.fixture
def command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> Callable[..., subprocess.CompletedProcess]:
    """``command(*args)``: ``train.py *args`` run through its ``main`` in this process, from
    an empty ``tmp_path``: what it returned and printed. (A process per case pays torch's
    imports, about 7 s on 2 busy cores; ``tests/test_config.py`` runs the process itself
    once.)"""

    def run(*args: str) -> subprocess.CompletedProcess:
        monkeypatch.chdir(tmp_path)
        code = main(list(args))
        printed = capsys.readouterr()
        return subprocess.CompletedProcess(["train.py", *args], code, printed.out, printed.err)

    return run


@pytest.fixture
def refused(
    tmp_path: Path, command: Callable[..., subprocess.CompletedProcess]
) -> Callable[..., str]:
    """``refused(*args)``: the error line of ``train.py *args``, which must refuse
    (:func:`tests.helpers.refusal`)."""

    def run(*args: str) -> str:
        return refusal(command(*args), tmp_path)

    return run


@pytest.fixture
def tmpfs() -> Iterator[Callable[[Path, str], Path]]:
    """``tmpfs(path, options)``: a tmpfs mounted at ``path`` (``options`` such as
    ``size=8m`` or ``ro,size=1m``) until the test ends. Mounting needs root: skipped with
    the reason where it is not permitted, failed instead when CI is set."""
    mounted: list[Path] = []

    def mount(path: Path, options: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        command = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            message = f"cannot mount a tmpfs here (it needs root): {done.stderr.strip()}"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):  # lazily: a buffer of the test may still map files there
        subprocess.run(["umount", "--lazy", str(path)], check=False, timeout=60)


@pytest.fixture(scope="session")
def mp4() -> None:
    """MP4 videos can be written here: skipped with the reason where FFmpeg's libraries are
    missing (``make ffmpeg`` installs them, as root), failed instead when CI is set."""
    problem = mp4_problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)


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
