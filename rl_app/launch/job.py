"""What a SLURM job runs: :class:`TrainJob`, training with ``rl_app.run.train``, or
:class:`WorkerJob`, training one run after another (a sweep's worker); both are requeued on
preemption.

``train`` resumes by itself when the run directory holds a checkpoint. On SIGUSR2 (a
preemption, or the time limit coming: SLURM sends it ``slurm.signal_delay_s`` ahead) the loop
finishes its iteration and saves a checkpoint; only then is submitit's own handler called,
which asks :meth:`PreemptibleJob.checkpoint` for what to run next (the same job: same config,
same run directory), requeues the job and exits. Each attempt is recorded in
``<run_dir>/slurm/attempts.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import submitit

from rl_app.config import Config
from rl_app.launch.cluster import JOB_DIR, job_settings
from rl_app.rundir import CHECKPOINTS_DIR

if TYPE_CHECKING:  # torch and TorchRL: imported in the job only
    from rl_app.loop import EvalHook, TrainResult

# What a WorkerJob hands its work: trains one run in the job, as train(config, on_eval=...).
TrainInJob = Callable[..., "TrainResult"]

ATTEMPTS_FILE = "attempts.jsonl"
# A requeued attempt waits this long for an earlier attempt still holding the run directory
# (a node SLURM lost sight of, whose process has not ended yet), then fails naming it.
REQUEUE_LOCK_WAIT_S = 300.0


class RequeueLimitReached(RuntimeError):
    """Preempted once more than ``slurm.max_requeues`` allows; the checkpoint is saved."""


class PreemptibleJob:
    """A callable SLURM runs that is requeued on preemption: submitit requeues callables
    that have a ``checkpoint`` method, and runs what it returns (this same job) again."""

    # How to carry on once the requeue limit is reached (the end of a sentence).
    resume_hint = ""

    def __init__(self, max_requeues: int) -> None:
        self.max_requeues = max_requeues

    def checkpoint(self) -> submitit.helpers.DelayedSubmission:
        """Called by submitit before it requeues: run this same job again. What it trains
        already holds the checkpoint saved at the iteration boundary."""
        return submitit.helpers.DelayedSubmission(self)

    @contextmanager
    def preemptible(self, record_dir: Path) -> Iterator[Callable[..., NoReturn]]:
        """Inside the block a USR2 requeues at once (recorded in ``record_dir``); yields
        ``requeue(frames, record_dir=...)``, for a training loop that stopped on USR2."""
        submitit_handler = signal.getsignal(signal.SIGUSR2)

        def requeue(frames: int | None, record_dir: Path = record_dir) -> NoReturn:
            self._requeue(submitit_handler, frames, record_dir)

        def on_usr2(signum: int, frame: Any) -> None:
            # The training loop replaces this handler with its own while it runs, and saves
            # at the next iteration boundary. Outside the loop (starting up, closing down)
            # nothing is in flight: requeue at once; the run resumes from its newest
            # checkpoint.
            requeue(frames=None)

        signal.signal(signal.SIGUSR2, on_usr2)
        try:
            yield requeue
        finally:
            signal.signal(signal.SIGUSR2, submitit_handler)

    def _requeue(
        self, submitit_handler: Callable[..., Any], frames: int | None, record_dir: Path
    ) -> NoReturn:
        """Requeue through submitit, unless this job was requeued ``max_requeues`` times
        already (submitit itself limits timeouts only, not preemptions)."""
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", 0))
        requeue = restarts < self.max_requeues
        # frames=None: preempted while starting up, before any new iteration.
        record_attempt(record_dir, event="preempted", frames=frames, requeued=requeue)
        if not requeue:
            raise RequeueLimitReached(
                f"preempted after {restarts} requeue(s), the limit (slurm.max_requeues="
                f"{self.max_requeues}); the checkpoint in {record_dir} is saved: "
                f"{self.resume_hint}"
            )
        # submitit calls self.checkpoint(), runs `scontrol requeue` and exits.
        submitit_handler(signal.SIGUSR2, None)
        raise RuntimeError("submitit's handler returned without requeueing the job")


class TrainJob(PreemptibleJob):
    """What a SLURM job runs: ``train(config)`` in the run's directory, requeued on
    preemption."""

    def __init__(self, config: Config, max_requeues: int) -> None:
        super().__init__(max_requeues)
        self.config = config
        self.resume_hint = f"resume with python train.py run_dir={config.run_dir}"

    def __call__(self) -> TrainResult:
        show_run_log()
        run_dir = Path(self.config.run_dir)
        with self.preemptible(run_dir) as requeue:
            result = self.attempt()
        end_attempt(run_dir, result, self.config.collector.total_frames, requeue)
        return result

    def attempt(self) -> TrainResult:
        """One attempt at the run, up to its end or a stop on USR2."""
        return train_attempt(self.config)


class WorkerJob(PreemptibleJob):
    """What a sweep's worker job runs: ``work(train_in_job)``, which trains run after run
    with the function it is given (each run recorded, and the job requeued when USR2 stops
    one), and returns once nothing is left. Its own attempts are recorded in
    ``record_dir``."""

    def __init__(
        self,
        work: Callable[[TrainInJob], str],
        record_dir: Path,
        max_requeues: int,
        resume_hint: str,
    ) -> None:
        super().__init__(max_requeues)
        self.work, self.record_dir, self.resume_hint = work, record_dir, resume_hint

    def __call__(self) -> str:
        show_run_log()
        record_attempt(self.record_dir, event="start")
        with self.preemptible(self.record_dir) as requeue:

            def train_in_job(config: Config, on_eval: EvalHook | None = None) -> TrainResult:
                result = train_attempt(config, on_eval)
                end_attempt(Path(config.run_dir), result, config.collector.total_frames, requeue)
                return result

            outcome = self.work(train_in_job)
        record_attempt(self.record_dir, event="ended", outcome=outcome)
        return outcome


def train_attempt(config: Config, on_eval: EvalHook | None = None) -> TrainResult:
    """One attempt at ``train(config)`` inside a SLURM job, recorded in the run directory;
    torch's threads follow the job's allocation."""
    import torch  # heavy imports: in the job only

    from rl_app.collection import decide_devices
    from rl_app.run import train

    # Threads follow the job's allocation, not the host's core count.
    threads = int(os.environ.get("SLURM_CPUS_PER_TASK", config.threads))
    config = dataclasses.replace(config, threads=threads)
    run_dir = Path(config.run_dir)
    record_attempt(
        run_dir,
        event="start",
        resumed_from_frames=newest_checkpoint_frames(run_dir),
        cuda_available=torch.cuda.is_available(),
        device=str(decide_devices(config).learner),
        threads=threads,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
    grace_s = job_settings(config.slurm).signal_delay_s  # USR2 comes this long before the kill
    return train(config, lock_wait_s=REQUEUE_LOCK_WAIT_S, on_eval=on_eval, usr2_grace_s=grace_s)


def end_attempt(
    run_dir: Path, result: TrainResult, total_frames: int, requeue: Callable[..., NoReturn]
) -> None:
    """Requeue a run that USR2 stopped short of its frames; record how any other ended."""
    finished = result.frames >= total_frames
    if result.stopped_by == "SIGUSR2" and not finished:
        requeue(frames=result.frames, record_dir=run_dir)
    record_attempt(run_dir, event="finished" if finished else "stopped",
                   frames=result.frames, stopped_by=result.stopped_by)  # fmt: skip


def show_run_log() -> None:
    """The loop's log lines ("resumed from ...") in the job's stderr. Only rl_app's logger:
    submitit's has its own handler, and the root's would print its lines twice."""
    run_log = logging.getLogger("rl_app")
    if not run_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        run_log.addHandler(handler)
        run_log.setLevel(logging.INFO)


def newest_checkpoint_frames(run_dir: Path) -> int:
    """Frames of the newest checkpoint, the one a resume starts from (0: a fresh start)."""
    from rl_app.checkpointing import (  # torchrl: in the job only
        checkpoint_candidates,
        checkpoint_frames,
    )

    newest = checkpoint_candidates(run_dir / CHECKPOINTS_DIR)
    return checkpoint_frames(newest[0]) if newest else 0


def job_id() -> str | None:
    """The id ``train.py`` printed: ``<array id>_<task>`` for an array task."""
    if "SLURM_ARRAY_JOB_ID" in os.environ:
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def record_attempt(run_dir: Path, event: str, **details: Any) -> None:
    """Append one line to ``<run_dir>/slurm/attempts.jsonl``: which job, which attempt."""
    row = {
        "event": event,
        "time": time.time(),
        "job_id": job_id(),
        "restart_count": int(os.environ.get("SLURM_RESTART_COUNT", 0)),
        "host": socket.gethostname(),
        **details,
    }
    path = run_dir / JOB_DIR / ATTEMPTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as file:
        file.write(json.dumps(row) + "\n")
    print(f"rl_app.launch.job: {json.dumps(row)}", file=sys.stderr, flush=True)


def read_attempts(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / JOB_DIR / ATTEMPTS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
