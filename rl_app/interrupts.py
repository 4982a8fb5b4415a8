"""Stopping cleanly: a signal only sets a flag; the loop saves and stops at the next
iteration boundary, never in the middle of an update. An evaluation in progress is dropped
at its next step (:class:`Abandoned`): the loop saves first and owes the evaluation to the
resume, or runs it then if it fits before a known deadline (:meth:`StopRequest.allows`).

The handler raises nothing into the code it interrupts: a signal lands anywhere, inside
library code too, whose broad ``except Exception`` would turn an exception raised there into
an error of its own. The work a stop drops checks the flag between its steps instead
(:meth:`StopRequest.abandon_point`).

SIGINT is Ctrl-C, SIGTERM a polite kill, SIGUSR2 what SLURM (through submitit) sends
before a preemption or the time limit. A second Ctrl-C during a save waits for the save
to end, then stops; at any other time it stops at once, after saying what is lost."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Abandoned(BaseException):
    """Raised by :meth:`StopRequest.abandon_point` when a stop came during abandonable work.
    Not an ``Exception``: library code that the work calls back from (a rollout's callback)
    lets it through."""


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
        self._stopped_at_once = False  # a second Ctrl-C raised KeyboardInterrupt
        self._abandon = False  # a stop came since the abandonable work in progress began

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        """A stop asked for by the program itself (e.g. a sweep pruning the run)."""
        self.reason = reason

    @contextmanager
    def installed(self) -> Iterator[StopRequest]:
        """The handlers, for the ``with`` block. A second Ctrl-C's KeyboardInterrupt comes
        out of it as one, even where the library code it landed in turned it into another
        error (tensordict has been seen to)."""
        previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        try:
            yield self
        except Exception as error:
            if self._stopped_at_once:
                raise KeyboardInterrupt from error
            raise
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
        """Work that a stop drops at its next :meth:`abandon_point` (raising
        :class:`Abandoned`), since it can be redone after a resume; dropped at once if the
        stop was asked for before it began (unless :meth:`allowing` it)."""
        self._abandon = False  # only a stop that comes from now on drops it
        if self.requested and not self._allowing:  # (one that came before: at once)
            raise Abandoned
        yield

    def abandon_point(self) -> None:
        """Called between the steps of abandonable work: raise :class:`Abandoned` once if a
        stop came since it began."""
        if self._abandon:
            self._abandon = False
            raise Abandoned

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested and signum == signal.SIGINT:
            if self._saving:
                self._stop_after_save = True
                say("second Ctrl-C: stopping once the checkpoint is saved")
                return
            self._stopped_at_once = True
            say(f"second Ctrl-C: stopping now; lost: {self.unsaved()}")
            raise KeyboardInterrupt
        first = not self.requested
        if signum == signal.SIGUSR2 and self.usr2_grace_s is not None and self.deadline is None:
            self.deadline = time.monotonic() + self.usr2_grace_s
        # Recorded before anything is said: a second signal may run its handler inside
        # this one's say(), and must find the stop asked for.
        self.reason = signal.Signals(signum).name
        self._abandon = True
        if first:
            say(
                f"{signal.Signals(signum).name}: saving a checkpoint, then stopping "
                "(Ctrl-C again stops at once)"
            )


def say(message: str) -> None:
    """Write ``message`` to stderr from a signal handler: with ``os.write``, since a print
    could land inside a print of the code interrupted (a reentrant call, an error there)."""
    os.write(2, f"rl_app: {message}\n".encode())
