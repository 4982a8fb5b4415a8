"""Collection jobs on SLURM (``collector.mode=distributed``).

TorchRL's ``DistributedCollector`` with the submitit launcher submits one SLURM job per
collection node. Each job builds its env and policy from picklable factories, runs a
TorchRL collector, and joins the learner over ``torch.distributed`` (gloo); the learner
receives one batch gathered from every job per iteration and pushes weights to them with
TorchRL's ``DistributedWeightSyncScheme``.

:class:`SlurmCollectionJobs` is that collector with what TorchRL 0.14.1 lacks for this
use, all in one place:

- the rendezvous address and the submitit executor (folder, SLURM resources) are ours:
  TorchRL takes the host name's address and a ``./log_test`` folder;
- the learner waits ``collector.connect_timeout_s`` for the jobs to join, where TorchRL
  would wait 1,000 days (``MAX_TIME_TO_CONNECT`` is passed to ``timedelta`` as days);
- an endless collector (``total_frames=-1``) yields nothing: ask for an unbounded count;
- each batch's trajectory ids are made unique across jobs and across resumes: TorchRL
  shifts job ``i``'s ids by job ``i-1``'s largest, so the first trajectory of one job
  takes the id of the last of the other, and the shift changes from batch to batch;
- a job that ends mid-run shows up as a gloo "Connection reset by peer" (or a timeout):
  it is reported with its job id, state and log;
- shutting down with a job gone raises in TorchRL and leaves the others running: every
  job is cancelled on every exit path.
"""

from __future__ import annotations

import logging
import math
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
from torchrl.collectors.distributed import DistributedCollector
from torchrl.collectors.distributed import generic as torchrl_distributed

from rl_app.config import Config
from rl_app.envs import env_factory
from rl_app.replay import TRAJECTORY_KEY

log = logging.getLogger("rl_app")

# Inside a run directory's slurm/ folder: the collection jobs' submitit files and logs.
COLLECTION_JOBS_DIR = "collectors"
# "Never stop" for TorchRL's distributed iterator (it treats -1 as zero frames).
UNBOUNDED_FRAMES = 2**62
# After a collective fails, how long SLURM may take to show the job that ended.
JOB_STATE_WAIT_S = 30.0
RUNNING_STATES = ("PENDING", "CONFIGURING", "RUNNING", "REQUEUED", "UNKNOWN")


class CollectionJobEnded(RuntimeError):
    """A collection job stopped while the learner needed it."""


class SlurmCollectionJobs(DistributedCollector):
    """TorchRL's distributed collector, submitting its jobs with ``executor`` and
    rendezvousing at ``address:port``; see the module docstring for what it adds."""

    def __init__(
        self,
        env_makers: list[Any],
        *,
        executor: submitit.AutoExecutor,
        address: str,
        port: int,
        connect_timeout_s: float,
        **kwargs: Any,
    ) -> None:
        # Read by _init_workers, which TorchRL's __init__ calls.
        self.executor = executor
        self.address = address
        self.connect_timeout_s = connect_timeout_s
        self.traj_id_base = self.next_traj_id = 0
        super().__init__(
            env_makers,
            launcher="submitit",
            sync=True,
            total_frames=UNBOUNDED_FRAMES,
            tcp_port=port,
            **kwargs,
        )

    # -- starting: submit the jobs, wait for them to join -----------------------------------

    def _init_workers(self) -> None:
        self.IPAddr = self.address
        self.jobs: list[submitit.Job] = []
        default_wait_days = torchrl_distributed.MAX_TIME_TO_CONNECT
        try:
            for node in range(self.num_workers):
                self.jobs.append(self._init_worker_dist_submitit(self.executor, node))
            log.info(
                "submitted collection jobs %s; logs in %s; waiting for them at %s:%s",
                ", ".join(job.job_id for job in self.jobs),
                self.executor.folder, self.address, self.tcp_port,
            )  # fmt: skip
            torchrl_distributed.MAX_TIME_TO_CONNECT = self.connect_timeout_s / 86_400
            with self.blaming_ended_jobs("waiting for collection jobs to join"):
                self._init_master_dist(self.num_workers + 1, self.backend)
        except BaseException:
            self.cancel_jobs()
            raise
        finally:
            torchrl_distributed.MAX_TIME_TO_CONNECT = default_wait_days

    # -- running ---------------------------------------------------------------------------

    def iterator(self) -> Iterator[TensorDictBase]:
        with self.blaming_ended_jobs("collecting"):
            for batch in super().iterator():
                yield self.relabel_trajectories(batch)

    def update_policy_weights_(self, *args: Any, **kwargs: Any) -> None:
        with self.blaming_ended_jobs("pushing weights"):
            super().update_policy_weights_(*args, **kwargs)

    def relabel_trajectories(self, batch: TensorDictBase) -> TensorDictBase:
        """Job ``j``'s local trajectory ``k`` becomes ``base + k * jobs + j``: unique
        across jobs, stable from batch to batch, and above every id of an earlier attempt
        of the run (``base``, restored from the checkpoint)."""
        ids = batch.get(TRAJECTORY_KEY)  # (jobs, frames per job)
        for node in range(self.num_workers - 1, 0, -1):  # undo TorchRL's shifts, last first
            ids[node] -= ids[node - 1].max()
        node_index = torch.arange(self.num_workers).view(-1, *[1] * (ids.dim() - 1))
        ids = self.traj_id_base + ids * self.num_workers + node_index
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
    def blaming_ended_jobs(self, doing: str) -> Iterator[None]:
        """Turn a failed collective into a message naming the job that ended, if one did."""
        try:
            yield
        except Exception as error:
            ended = self.ended_jobs(wait_s=JOB_STATE_WAIT_S)
            if not ended:
                raise
            described = "; ".join(
                f"job {job.job_id} is {job.state} (log: {job.paths.stderr})" for job in ended
            )
            raise CollectionJobEnded(
                f"a collection job stopped while {doing}: {described}"
            ) from error

    def ended_jobs(self, wait_s: float) -> list[submitit.Job]:
        """The jobs SLURM no longer runs, polling up to ``wait_s`` for one to show."""
        deadline = time.monotonic() + wait_s
        while True:
            ended = [job for job in self.jobs if self.state_of(job) not in RUNNING_STATES]
            if ended or time.monotonic() > deadline:
                return ended
            time.sleep(1.0)

    def shutdown(self, timeout: float | None = None) -> None:
        # TorchRL closes its weight-sync store as soon as each job has handed back its
        # result, while the job's receiver thread still waits on that store: the job then
        # aborts on its way out and ends FAILED. Keep the store until the jobs have ended.
        schemes, self._weight_sync_schemes = self._weight_sync_schemes, None
        try:
            super().shutdown(timeout)
        except Exception as error:  # a job already gone never answers "down"
            log.warning("collection jobs did not all stop cleanly (%s); cancelling them", error)
        finally:
            self.wait_until_ended(JOB_STATE_WAIT_S)
            self.cancel_jobs()
            for scheme in (schemes or {}).values():
                scheme.shutdown()
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()

    def state_of(self, job: submitit.Job) -> str:
        """SLURM's word for the job now (sacct may add "by <uid>" to CANCELLED)."""
        return job.watcher.get_state(job.job_id, mode="force").split()[0]

    def wait_until_ended(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(
            self.state_of(job) in (*RUNNING_STATES, "COMPLETING") for job in self.jobs
        ):
            time.sleep(0.5)

    def cancel_jobs(self) -> None:
        for job in self.jobs:
            if self.state_of(job) in RUNNING_STATES:
                job.cancel(check=False)


def make_collection_jobs(config: Config, policy_factory: Any, devices: Any) -> SlurmCollectionJobs:
    """``collector.nodes`` SLURM jobs of one env each, gathered into one batch per
    iteration (each job contributes ``frames_per_batch / nodes`` frames)."""
    from rl_app.collection import WORKER_SEED_STRIDE
    from rl_app.slurm import JOB_DIR, collection_job_settings, make_executor

    settings = config.collector
    run_dir = Path(config.run_dir)
    address = settings.address or socket.gethostbyname(socket.gethostname())
    executor = make_executor(
        run_dir / JOB_DIR / COLLECTION_JOBS_DIR,
        collection_job_settings(config.slurm),
        name=f"{run_dir.name}-collect",
    )
    return SlurmCollectionJobs(
        [
            env_factory(config.env, config.seed + node * WORKER_SEED_STRIDE)
            for node in range(settings.nodes)
        ],
        policy_factory=policy_factory,
        frames_per_batch=settings.frames_per_batch,
        collector_class=Collector,
        collector_kwargs={
            "track_policy_version": True,
            "compile_policy": settings.compile_policy,
        },
        # TorchRL gives each job init_random_frames // nodes.
        init_random_frames=settings.nodes * math.ceil(settings.init_random_frames / settings.nodes),
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
