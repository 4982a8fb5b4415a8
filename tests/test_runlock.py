"""One run directory, one writer: a second training process on a run directory in use exits
2 naming the holder and changes nothing there; after the holder is killed, a third resumes."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from rl_app.runlock import HOLDER_FILE, RunDirBusy, run_dir_lock
from tests.helpers import (
    PYTHON,
    ROOT,
    TINY_RUN,
    TRAIN_PY,
    hold_lock_in_another_process,
    refusal,
    run_files,
    wait_for,
)

LONG_RUN = [*TINY_RUN, "collector.total_frames=1000000"]


def start_training(run_dir: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [PYTHON, str(TRAIN_PY), *LONG_RUN, f"run_dir={run_dir}", *overrides],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_a_second_process_is_refused_and_a_third_resumes_after_a_kill(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = start_training(run_dir)
    try:
        wait_for("a checkpoint", lambda: any((run_dir / "checkpoints").glob("checkpoint-*")), 300)
        first.send_signal(signal.SIGSTOP)  # hold still while the second one tries
        before = run_files(run_dir)
        second = subprocess.run(
            [PYTHON, str(TRAIN_PY), *LONG_RUN, f"run_dir={run_dir}"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert second.returncode == 2, second.stderr
        assert len(second.stderr.strip().splitlines()) == 1, second.stderr
        assert f"pid {first.pid}" in second.stderr and str(run_dir) in second.stderr
        assert run_files(run_dir) == before  # metrics, checkpoints, replay: untouched
        first.send_signal(signal.SIGCONT)
    finally:
        first.kill()  # SIGKILL: the OS releases the lock
        first.wait()

    frames = max(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("checkpoint-*"))
    third = subprocess.run(
        [PYTHON, str(TRAIN_PY), f"run_dir={run_dir}", f"collector.total_frames={frames + 400}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert third.returncode == 0, third.stderr
    assert f"resumed from {run_dir / 'checkpoints'}" in third.stderr
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [row["frames"] for row in rows]
    assert logged == sorted(set(logged)) and logged[-1] == frames + 400  # no row twice


def test_waiting_for_the_lock_is_bounded_and_names_the_holder(tmp_path: Path) -> None:
    holder = hold_lock_in_another_process(tmp_path / "run", seconds=3)
    try:
        with pytest.raises(RunDirBusy, match=rf"waited 1 s.*pid {holder.pid}"):
            with run_dir_lock(tmp_path / "run", wait_s=1):
                pass
        # The holder lets go after 3 s: the wait ends then (at 60 s it would raise).
        with run_dir_lock(tmp_path / "run", wait_s=60):
            assert json.loads((tmp_path / "run" / HOLDER_FILE).read_text())["pid"] == os.getpid()
    finally:
        holder.wait()


@pytest.mark.parametrize("error", [errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS])
def test_a_file_system_without_flock_locks_is_refused_naming_it_simulated(
    error: int,
    command: Callable[..., subprocess.CompletedProcess],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Simulated: no file system here lacks flock locks. flock(2) fails so on NFS without
    its lock daemon (ENOLCK), on a FUSE file system that does not lock (EOPNOTSUPP), or
    where flock does not exist (ENOSYS)."""

    def no_flock(fd: int, operation: int) -> None:
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    said = refusal(command(*TINY_RUN, f"run_dir={tmp_path / 'runs' / 'a'}"), tmp_path)
    assert f"run_dir={str(tmp_path / 'runs' / 'a')!r} cannot be locked" in said
    assert os.strerror(error) in said and "flock locks" in said
