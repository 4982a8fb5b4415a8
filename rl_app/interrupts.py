"""Stopping cleanly: a signal only sets a flag; the loop saves and stops at the next
iteration boundary, never in the middle of an update. An evaluation in progress is dropped
at once (:class:`Abandoned`): the loop saves first and owes the evaluation to the resume,
or runs it then if it fits before a known deadline (:meth:`StopRequest.allows`).

SIGINT is Ctrl-C, SIGTERM a polite kill, SIGUSR2 what SLURM (through submitit) sends
before a preemption or the time limit. A second Ctrl-C during a save waits for the save
to end, then stops; at any other time it stops at once, after saying what is lost."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Abandoned(Exception):
    """Raised inside :meth:`StopRequest.abandonable` when a stop is asked for there."""


class StopRequest:
    """Records a stop asked for by a signal. ``unsaved()`` says what stopping at once would
    lose (for the second Ctrl-C's message)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)

    def __init__(
        self,
        unsaved: Callable[[], str] = lambda: "the work since the last save",
        usr2_grace_s: float | None = None,
    ) -> None:
        self.reason: str | None = None
        self.unsaved = unsaved
        # SIGUSR2 comes this long before the process is killed (a SLURM job's signal delay):
        # its deadline, when it came.
        self.usr2_grace_s = usr2_grace_s
        self.deadline: float | None = None
        self._allowing = False
        self._saving = False
        self._stop_after_save = False
        self._abandonable = False

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

    @contextmanager
    def saving(self) -> Iterator[None]:
        """A save: a second Ctrl-C waits for its end, then stops (KeyboardInterrupt)."""
        self._saving = True
        try:
            yield
        finally:
            self._saving = False
        if self._stop_after_save:
            raise KeyboardInterrupt

    def allows(self, seconds: float | None) -> bool:
        """Whether work of ``seconds`` fits before the deadline of the stop requested (one
        by SIGUSR2 with a known grace), other than work already allowed so."""
        if self.deadline is None or seconds is None or self._allowing:
            return False
        return time.monotonic() + seconds < self.deadline

    @contextmanager
    def allowing(self) -> Iterator[None]:
        """Abandonable work that :meth:`allows` let run despite the stop requested: a new
        signal still abandons it."""
        self._allowing = True
        try:
            yield
        finally:
            self._allowing = False

    @contextmanager
    def abandonable(self) -> Iterator[None]:
        """Work that a stop drops at once (raising :class:`Abandoned`), since it can be
        redone after a resume; also if the stop was asked for before it began (unless
        :meth:`allowing` it)."""
        if self.requested and not self._allowing:
            raise Abandoned
        self._abandonable = True
        try:
            yield
        finally:
            self._abandonable = False

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested and signum == signal.SIGINT:
            if self._saving:
                self._stop_after_save = True
                say("second Ctrl-C: stopping once the checkpoint is saved")
                return
            say(f"second Ctrl-C: stopping now; lost: {self.unsaved()}")
            raise KeyboardInterrupt
        if not self.requested:
            say(
                f"{signal.Signals(signum).name}: saving a checkpoint, then stopping "
                "(Ctrl-C again stops at once)"
            )
        if signum == signal.SIGUSR2 and self.usr2_grace_s is not None and self.deadline is None:
            self.deadline = time.monotonic() + self.usr2_grace_s
        self.reason = signal.Signals(signum).name
        if self._abandonable:
            self._abandonable = False  # raised once, however many signals follow
            raise Abandoned


def say(message: str) -> None:
    print(f"rl_app: {message}", file=sys.stderr, flush=True)
