"""Collection jobs on SLURM (``collector.mode=distributed``).

TorchRL's ``DistributedCollector`` with the submitit launcher submits one SLURM job per
collection node. Each job builds its env and policy from picklable factories, runs a
TorchRL collector, and joins the learner over ``torch.distributed`` (gloo); the learner
receives one batch gathered from every job per iteration and pushes weights to them with
TorchRL's ``DistributedWeightSyncScheme``.

:class:`SlurmCollectionJobs` adds what a long run on a cluster needs (what works around
TorchRL 0.14.1 itself is in :mod:`rl_app.upstream`):

- each batch's trajectory ids are unique across jobs and across resumes;
- a job that ends mid-run shows up as a gloo "Connection reset by peer" (or a timeout):
  it is reported with its job id, state and log;
- every job is cancelled on every exit path (TorchRL's shutdown raises with a job gone,
  leaving the others running).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import submitit
import torch
from tensordict import TensorDictBase
from torchrl.collectors import Collector

from rl_app.collection import CollectorStopped
from rl_app.config import Config
from rl_app.envs import env_factory, worker_seed
from rl_app.launch.cluster import JOB_DIR, collection_job_settings, make_executor
from rl_app.replay import TRAJECTORY_KEY
from rl_app.upstream.torchrl_collectors import (
    ExecutorDistributedCollector,
    split_warm_up,
    undo_trajectory_id_shifts,
    weight_sync_kept_open,
)

log = logging.getLogger("rl_app")

# Inside a run directory's slurm/ folder: the collection jobs' submitit files and logs.
COLLECTION_JOBS_DIR = "collectors"
# After a collective fails, how long SLURM may take to show the job that ended.
JOB_STATE_WAIT_S = 30.0
RUNNING_STATES = ("PENDING", "CONFIGURING", "RUNNING", "REQUEUED", "UNKNOWN")


class CollectionJobEnded(CollectorStopped):
    """A collection job stopped while the learner needed it: named as every collector
    is, ``collector worker N (SLURM job J) of env E stopped: the job is STATE; its log:
    PATH``, and the jobs that ended with it."""

    def __init__(self, jobs: list[submitit.Job], ended: list[submitit.Job], env_name: str):
        first = ended[0]
        message = (
            f"collector worker {jobs.index(first)} (SLURM job {first.job_id}) of env "
            f"{env_name} stopped: the job is {state_of(first)}; its log: {first.paths.stderr}"
        )
        if len(ended) > 1:
            message += f" (ended with it: jobs {', '.join(job.job_id for job in ended[1:])})"
        super().__init__(message)


def state_of(job: submitit.Job) -> str:
    """SLURM's word for the job now (sacct may add "by <uid>" to CANCELLED)."""
    return job.watcher.get_state(job.job_id, mode="force").split()[0]


def wait_until_ended(jobs: list[submitit.Job], wait_s: float) -> None:
    """Wait up to ``wait_s`` for every job to end (completing jobs count as running)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(
        state_of(job) in (*RUNNING_STATES, "COMPLETING") for job in jobs
    ):
        time.sleep(0.5)


def ended_jobs(jobs: list[submitit.Job], wait_s: float) -> list[submitit.Job]:
    """The jobs SLURM no longer runs, polling up to ``wait_s`` for one to show."""
    deadline = time.monotonic() + wait_s
    while True:
        ended = [job for job in jobs if state_of(job) not in RUNNING_STATES]
        if ended or time.monotonic() > deadline:
            return ended
        time.sleep(1.0)


class SlurmCollectionJobs(ExecutorDistributedCollector):
    """TorchRL's distributed collector on SLURM jobs; see the module docstring."""

    def __init__(self, env_name: str, env_makers: list[Any], **kwargs: Any) -> None:
        self.env_name = env_name
        self.traj_id_base = self.next_traj_id = 0
        try:
            with self.blaming_ended_jobs():
                super().__init__(env_makers, **kwargs)
        except BaseException:
            self.cancel_jobs()
            raise

    # -- running ---------------------------------------------------------------------------

    def iterator(self) -> Iterator[TensorDictBase]:
        with self.blaming_ended_jobs():
            for batch in super().iterator():
                yield self.relabel_trajectories(batch)

    def update_policy_weights_(self, *args: Any, **kwargs: Any) -> None:
        with self.blaming_ended_jobs():
            super().update_policy_weights_(*args, **kwargs)

    def relabel_trajectories(self, batch: TensorDictBase) -> TensorDictBase:
        ids = relabel_trajectory_ids(batch.get(TRAJECTORY_KEY), self.traj_id_base)
        batch.set(TRAJECTORY_KEY, ids)
        self.next_traj_id = max(self.next_traj_id, int(ids.max()) + 1)
        return batch

    def state_dict(self) -> dict[str, Any]:
        # The jobs' envs cannot be saved: a resumed run starts new episodes in new jobs.
        return {"next_traj_id": self.next_traj_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.traj_id_base = self.next_traj_id = state["next_traj_id"]

    # -- failures and the end --------------------------------------------------------------

    @contextmanager
    def blaming_ended_jobs(self) -> Iterator[None]:
        """Turn a failed collective into a message naming the job that ended, if one did."""
        try:
            yield
        except Exception as error:
            ended = ended_jobs(self.jobs, JOB_STATE_WAIT_S)
            if not ended:
                raise
            raise CollectionJobEnded(self.jobs, ended, self.env_name) from error

    def shutdown(self, timeout: float | None = None) -> None:
        try:
            with weight_sync_kept_open(self):
                try:
                    super().shutdown(timeout)
                except Exception as error:  # a job already gone never answers "down"
                    log.warning("collection jobs did not all stop cleanly (%s)", error)
                finally:
                    wait_until_ended(self.jobs, JOB_STATE_WAIT_S)
        finally:
            self.cancel_jobs()
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()

    def cancel_jobs(self) -> None:
        for job in self.jobs:
            if state_of(job) in RUNNING_STATES:
                job.cancel(check=False)


def relabel_trajectory_ids(gathered: torch.Tensor, base: int) -> torch.Tensor:
    """Job ``j``'s local trajectory ``k`` (in a gathered ``(jobs, frames)`` batch) becomes
    ``base + k * jobs + j``: unique across jobs, stable from batch to batch, and above every
    id of an earlier attempt of the run (``base``, restored from the checkpoint)."""
    ids = undo_trajectory_id_shifts(gathered)
    jobs = ids.shape[0]
    job_index = torch.arange(jobs).view(-1, *[1] * (ids.dim() - 1))
    return base + ids * jobs + job_index


def make_collection_jobs(config: Config, policy_factory: Any, devices: Any) -> SlurmCollectionJobs:
    """``collector.nodes`` SLURM jobs of one env each, gathered into one batch per
    iteration (each job contributes ``frames_per_batch / nodes`` frames)."""
    settings = config.collector
    run_dir = Path(config.run_dir)
    address = settings.address or socket.gethostbyname(socket.gethostname())
    executor = make_executor(
        run_dir / JOB_DIR / COLLECTION_JOBS_DIR,
        collection_job_settings(config.slurm),
        name=f"{run_dir.name}-collect",
    )
    return SlurmCollectionJobs(
        config.env.name,
        [
            env_factory(config.env, worker_seed(config.seed, node), network=config.network)
            for node in range(settings.nodes)
        ],
        policy_factory=policy_factory,
        frames_per_batch=settings.frames_per_batch,
        collector_class=Collector,
        collector_kwargs={
            "track_policy_version": True,
            "compile_policy": settings.compile_policy,
        },
        init_random_frames=split_warm_up(settings.init_random_frames, settings.nodes),
        env_device=devices.env,
        policy_device=devices.policy,
        storing_device=devices.storage,
        executor=executor,
        address=address,
        port=settings.port or free_port(address),
        connect_timeout_s=settings.connect_timeout_s,
    )


def free_port(address: str) -> int:
    """A TCP port free at ``address`` now (TorchRL also takes the next one, or retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]
