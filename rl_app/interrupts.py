"""Stopping cleanly: a signal only sets a flag; the loop saves and stops at the next
iteration boundary, never in the middle of an update.

SIGINT is Ctrl-C, SIGTERM a polite kill, SIGUSR2 what SLURM (through submitit) sends
before a preemption or the time limit."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class StopRequest:
    """Records a stop asked for by a signal. A second Ctrl-C stops at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)

    def __init__(self) -> None:
        self.reason: str | None = None

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        """A stop asked for by the program itself (e.g. a sweep pruning the run)."""
        self.reason = reason

    @contextmanager
    def installed(self) -> Iterator[StopRequest]:
        previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.reason = signal.Signals(signum).name
