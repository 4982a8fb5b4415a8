"""One writer per run directory: a process that trains in ``run_dir`` holds an OS file lock
on ``run_dir/.lock`` for as long as it trains.

The lock is ``filelock``'s ``flock(2)`` lock: the kernel releases it when the process dies
(``kill -9``, a crash, a lost node's process finally ending), so a directory is never left
locked for ever. Who holds it (host, pid, since when) is written beside it, in
``.lock.holder``, for the message a second process prints.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from rl_app.config import ConfigError, file_in_the_way
from rl_app.rundir import HOLDER_FILE, LOCK_FILE

# What flock(2) fails with where the file system has no flock locks: no flock at all, none
# served (NFS without its lock daemon), or an operation the file system does not support
# (FUSE, some network file systems).
NO_FLOCK_ERRNOS = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP})


class RunDirUnwritable(Exception):
    """The run directory (or its lock file) cannot be created or written."""


class RunDirBusy(ConfigError):
    """Another process trains in this run directory (the message names it), or the
    directory cannot be locked: exit status 2, like any other mistake in the input."""


def describe_holder(run_dir: Path) -> str:
    """ "host H, pid P, since T", as the holder wrote it (or that it is unknown)."""
    try:
        holder = json.loads((run_dir / HOLDER_FILE).read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
        return f"host {holder['host']}, pid {holder['pid']}, since {since}"
    except (OSError, ValueError, KeyError):
        return "a process that has not said who it is yet"


def busy_message(run_dir: Path, waited_s: float) -> str:
    waited = f" (waited {waited_s:.0f} s)" if waited_s else ""
    return (
        f"run_dir={str(run_dir)!r} is in use by another training process{waited}: "
        f"{describe_holder(run_dir)}; wait for it to end or stop it, or give another run_dir"
    )


def outermost_missing(path: Path) -> Path | None:
    """The outermost directory of ``path`` (itself included) that does not exist yet."""
    missing = None
    while not path.exists():
        missing, path = path, path.parent
    return missing


@contextmanager
def removed_if_refused(directories: list[Path]) -> Iterator[None]:
    """Around making ``directories`` and what may still refuse them (sbatch, the lock): on a
    refusal (a :class:`ConfigError`), what was made of them (and above them) is removed
    again, so that nothing is left of a run that never started."""
    created = {outermost_missing(path.resolve()) for path in directories} - {None}
    try:
        yield
    except ConfigError:
        for directory in created:
            shutil.rmtree(directory, ignore_errors=True)
        raise


def make_writable_directory(directory: Path, key: str) -> None:
    """Make ``directory`` (its parents too) and write a file in it, or raise
    :class:`ConfigError` naming ``key`` (the setting or option that gave it) and why, leaving
    nothing made: for what a tool writes its results into, before it writes them."""
    if (blocking := file_in_the_way(directory)) is not None:
        raise ConfigError(f"{key} {str(directory)!r} cannot be made: {str(blocking)!r} is a file")
    with removed_if_refused([directory]):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=directory).close()
        except OSError as error:
            raise ConfigError(
                f"{key} {str(directory)!r} cannot be written: {error.strerror}"
            ) from None


def make_writable_file(path: Path, key: str) -> None:
    """Refuse, with :class:`ConfigError` naming ``key``, a file's ``path`` where a directory
    stands, or whose folder cannot be made and written (:func:`make_writable_directory`)."""
    if path.is_dir():
        raise ConfigError(f"{key} {str(path)!r} is a directory: give a file")
    make_writable_directory(path.parent, key)


def acquire(run_dir: Path, wait_s: float) -> FileLock:
    """``run_dir``'s lock, held (the directory is created if needed); :class:`RunDirBusy`
    if another process keeps it longer than ``wait_s`` seconds or the file system cannot
    lock at all, :class:`RunDirUnwritable` if the directory cannot be written."""
    lock = FileLock(run_dir / LOCK_FILE, mode=0o644, fallback_to_soft=False)
    with removed_if_refused([run_dir]):
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            lock.acquire(timeout=wait_s)
        except Timeout:
            raise RunDirBusy(busy_message(run_dir, wait_s)) from None
        except OSError as error:
            if error.errno not in NO_FLOCK_ERRNOS:
                raise RunDirUnwritable(error.strerror) from None
            raise RunDirBusy(
                f"run_dir={str(run_dir)!r} cannot be locked ({error.strerror}): put it on a "
                "file system with flock locks (a local disk, NFSv4, Lustre mounted with -o flock)"
            ) from None
    return lock


@contextmanager
def run_dir_lock(run_dir: Path, wait_s: float = 0.0) -> Iterator[None]:
    """Hold ``run_dir``'s lock inside the block (creating the directory if needed), waiting
    up to ``wait_s`` for another holder to let go; raise :class:`RunDirBusy` otherwise,
    leaving the directory as it was."""
    lock = acquire(run_dir, wait_s)
    try:
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        (run_dir / HOLDER_FILE).write_text(json.dumps(holder))
        yield
    finally:
        lock.release()


def check_run_dir_free(run_dir: Path) -> None:
    """Raise :class:`RunDirBusy` if a process holds ``run_dir``'s lock now (a launcher asks
    before submitting); changes nothing."""
    if (run_dir / LOCK_FILE).exists():
        acquire(run_dir, wait_s=0.0).release()
