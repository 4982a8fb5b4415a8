"""What a SLURM job runs: :class:`TrainJob`, training with ``rl_app.loop.train`` and requeued
on preemption.

``train`` resumes by itself when the run directory holds a checkpoint. On SIGUSR2 (a
preemption, or the time limit coming: SLURM sends it ``slurm.signal_delay_s`` ahead) the loop
finishes its iteration and saves a checkpoint; only then is submitit's own handler called,
which asks :meth:`TrainJob.checkpoint` for what to run next (the same job: same config, same
run directory), requeues the job and exits. Each attempt is recorded in
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
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import submitit

from rl_app.config import CHECKPOINTS_DIR, Config
from rl_app.scale.cluster import JOB_DIR

ATTEMPTS_FILE = "attempts.jsonl"
# A requeued attempt waits this long for an earlier attempt still holding the run directory
# (a node SLURM lost sight of, whose process has not ended yet), then fails naming it.
REQUEUE_LOCK_WAIT_S = 300.0


class RequeueLimitReached(RuntimeError):
    """Preempted once more than ``slurm.max_requeues`` allows; the checkpoint is saved."""


class TrainJob:
    """What a SLURM job runs: ``train(config)`` in the run's directory, requeued on
    preemption (submitit requeues callables that have a ``checkpoint`` method)."""

    def __init__(self, config: Config, max_requeues: int) -> None:
        self.config = config
        self.max_requeues = max_requeues

    def __call__(self) -> Any:
        import torch  # heavy imports: in the job only

        from rl_app.collection import decide_devices
        from rl_app.loop import train

        show_run_log()
        # Threads follow the job's allocation, not the host's core count.
        threads = int(os.environ.get("SLURM_CPUS_PER_TASK", self.config.threads))
        config = dataclasses.replace(self.config, threads=threads)
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
        submitit_handler = signal.getsignal(signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, self._usr2_handler(submitit_handler))
        try:
            result = train(config, lock_wait_s=REQUEUE_LOCK_WAIT_S)
        finally:
            signal.signal(signal.SIGUSR2, submitit_handler)
        finished = result.frames >= config.collector.total_frames
        if result.stopped_by == "SIGUSR2" and not finished:
            self._requeue(submitit_handler, frames=result.frames)
        record_attempt(run_dir, event="finished" if finished else "stopped",
                       frames=result.frames, stopped_by=result.stopped_by)  # fmt: skip
        return result

    def checkpoint(self) -> submitit.helpers.DelayedSubmission:
        """Called by submitit before it requeues: run this same job again. The run
        directory already holds the checkpoint saved at the iteration boundary."""
        return submitit.helpers.DelayedSubmission(self)

    def _usr2_handler(self, submitit_handler: Callable[..., Any]) -> Callable[..., None]:
        def on_usr2(signum: int, frame: Any) -> None:
            # The training loop replaces this handler with its own while it runs, and saves
            # at the next iteration boundary. Outside the loop (starting up, closing down)
            # nothing is in flight: requeue at once; the run resumes from its newest
            # checkpoint.
            self._requeue(submitit_handler, frames=None)

        return on_usr2

    def _requeue(self, submitit_handler: Callable[..., Any], frames: int | None) -> NoReturn:
        """Requeue through submitit, unless this job was requeued ``max_requeues`` times
        already (submitit itself limits timeouts only, not preemptions)."""
        run_dir = Path(self.config.run_dir)
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", 0))
        requeue = restarts < self.max_requeues
        # frames=None: preempted while starting up, before any new iteration.
        record_attempt(run_dir, event="preempted", frames=frames, requeued=requeue)
        if not requeue:
            raise RequeueLimitReached(
                f"preempted after {restarts} requeue(s), the limit (slurm.max_requeues="
                f"{self.max_requeues}); the checkpoint in {run_dir} is saved: "
                f"resume with python train.py run_dir={run_dir}"
            )
        # submitit calls self.checkpoint(), runs `scontrol requeue` and exits.
        submitit_handler(signal.SIGUSR2, None)
        raise RuntimeError("submitit's handler returned without requeueing the job")


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
    print(f"rl_app.scale.job: {json.dumps(row)}", file=sys.stderr, flush=True)


def read_attempts(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / JOB_DIR / ATTEMPTS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
