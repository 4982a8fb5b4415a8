"""Collection by TorchRL's RPC collector (``collector.mode=rpc``).

TorchRL's ``RPCCollector``: ``collector.workers`` workers, each a TorchRL collector of
``env.num_envs`` envs built from picklable factories, driven over ``torch.distributed.rpc``;
local processes (``rpc.launcher=local``) or one SLURM job each (``rpc.launcher=slurm``,
submitted with the ``slurm.collector_*`` settings as ``collector.mode=distributed`` does).
Weights reach them through TorchRL's ``RPCWeightSyncScheme`` (RPC to signal, gloo to carry
the tensors), pushed by :class:`rl_app.collection.WeightSync` as in every other mode. Each
batch is gathered from every worker: TorchRL's asynchronous RPC collection applies a push
while the worker is acting (``rpc.sync=false`` is refused, docs/scale-out.md).

:class:`RPCCollection` adds what a run needs:

- trajectory ids unique across workers and resumes (each worker numbers its own);
- the workers' collector state in checkpoints (TorchRL's ``RPCCollector`` has none);
- a worker process that ended (through ``procs``, as the training loop names dead worker
  processes), a SLURM job that ended, or a worker that raised, is named
  (:class:`rl_app.collection.WorkerDied`,
  :class:`rl_app.collection.distributed.CollectionJobEnded`, :class:`WorkerFailed`), so
  that the run stops at that iteration boundary with its last checkpoint intact;
- every worker process or job is gone after :meth:`RPCCollection.shutdown`, on every exit
  path;
- a second RPC collector in a process that ran one is refused (:class:`RPCAlreadyUsed`):
  torch's RPC would wait for it for ever.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torch.distributed import rpc
from torchrl.collectors import Collector

from rl_app.collection import CollectorStopped
from rl_app.collection.distributed import (
    COLLECTION_JOBS_DIR,
    JOB_STATE_WAIT_S,
    RUNNING_STATES,
    CollectionJobEnded,
    ended_jobs,
    state_of,
    wait_until_ended,
)
from rl_app.collection.workers import remote_collector_kwargs
from rl_app.config import Config
from rl_app.envs import env_factory, worker_seed
from rl_app.launch.cluster import JOB_DIR, check_cluster, collection_job_settings, make_executor
from rl_app.replay import TRAJECTORY_KEY
from rl_app.upstream.torchrl_collectors import (
    LaunchedRPCCollector,
    free_local_port,
    rpc_started_in_this_process,
    rpc_worker_of,
    split_warm_up,
    undo_rpc_trajectory_id_shift,
)

log = logging.getLogger("rl_app")


class WorkerFailed(CollectorStopped):
    """A collector worker raised while collecting (its process still runs)."""

    def __init__(self, index: int, env_name: str, why: str) -> None:
        super().__init__(f"collector worker {index} (RPC) of env {env_name} stopped: {why}")


class RPCAlreadyUsed(RuntimeError):
    """This process already ran an RPC collector."""


class RPCCollection(LaunchedRPCCollector):
    """TorchRL's ``RPCCollector`` on local processes or SLURM jobs; see the module
    docstring."""

    def __init__(self, env_name: str, **kwargs: Any) -> None:
        if rpc_started_in_this_process():
            raise RPCAlreadyUsed(
                "collector.mode=rpc runs one RPC collector per process and this process has "
                "run one: torch's RPC cannot start another after it; start a new process"
            )
        self.env_name = env_name
        self.closed = False
        self.worker_raised = False
        self.pushes = 0
        try:
            super().__init__(sync=True, **kwargs)
        except BaseException:
            self.stop_workers()
            raise

    @property
    def procs(self) -> list[Any]:
        """The local worker processes (none for SLURM jobs): the training loop names one
        that ended (:func:`rl_app.collection.naming_dead_workers`, ``check_workers``).
        None once a worker raised: TorchRL then shuts the collector down, stopping the
        others, and it is the worker that raised that is named (:class:`WorkerFailed`)."""
        return [] if self.executor is not None or self.worker_raised else self.jobs

    def iterator(self) -> Iterator[TensorDictBase]:
        with self.naming_stopped_workers():
            for batch in super().iterator():
                ids = undo_rpc_trajectory_id_shift(batch.get(TRAJECTORY_KEY), self.num_workers)
                batch.set(TRAJECTORY_KEY, ids)
                yield batch

    def update_policy_weights_(self, *args: Any, **kwargs: Any) -> None:
        with self.naming_stopped_workers():
            super().update_policy_weights_(*args, **kwargs)
        self.pushes += 1

    def state_dict(self) -> list[dict[str, Any]]:
        """Each worker's collector state: frame counters and trajectory-id pool."""
        with self.naming_stopped_workers():
            return [worker.rpc_sync().state_dict() for worker in self.collector_rrefs]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        """Each worker's state, but its policy version: a worker's counts the pushes since
        its run started, the learner's (:class:`rl_app.collection.WeightSync`) those since
        this process started, which this collector has relayed (``pushes``)."""
        with self.naming_stopped_workers():
            for worker, worker_state in zip(self.collector_rrefs, state, strict=True):
                worker_state = {**worker_state, "policy_version": self.pushes}
                worker.rpc_sync().load_state_dict(worker_state)

    @contextmanager
    def naming_stopped_workers(self) -> Iterator[None]:
        """A worker's error names its RPC node; a SLURM job that ended names nothing: it is
        the job SLURM no longer runs (a local process that ended, the loop names)."""
        try:
            yield
        except Exception as error:
            failed = rpc_worker_of(error)
            if failed is not None:
                self.worker_raised = True
                raise WorkerFailed(failed[0], self.env_name, failed[1]) from error
            ended = ended_jobs(self.jobs, JOB_STATE_WAIT_S) if self.executor is not None else []
            if not ended:
                raise
            raise CollectionJobEnded(self.jobs, ended, self.env_name) from error

    def shutdown(self, timeout: float | None = None) -> None:
        """TorchRL's shutdown waits for every worker's last batch and answer: after a
        worker failed it raises (and, when it is TorchRL's iterator that calls it, in place
        of the error that named the worker), leaving the workers running. Then every worker
        is stopped and the RPC agent closed without waiting for them."""
        if self.closed:
            return
        self.closed = True
        if not self.ended_workers():
            try:
                super().shutdown(timeout)
            except Exception as error:
                log.warning("RPC collector workers did not all stop cleanly (%s)", error)
            else:
                self.stop_workers(JOB_STATE_WAIT_S)
                return
        self.stop_workers()
        rpc.shutdown(graceful=False)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    def ended_workers(self) -> bool:
        if self.executor is None:
            return not all(process.is_alive() for process in self.jobs)
        return any(state_of(job) not in RUNNING_STATES for job in self.jobs)

    def stop_workers(self, wait_s: float = 0.0) -> None:
        """Stop the worker processes, or cancel the jobs still queued or running after
        ``wait_s`` (after a clean shutdown a job ends by itself)."""
        if self.executor is not None and self.jobs:
            wait_until_ended(self.jobs, wait_s)
        for worker in getattr(self, "jobs", []):
            if self.executor is not None:
                if state_of(worker) in RUNNING_STATES:
                    worker.cancel(check=False)
                continue
            if worker.is_alive():
                worker.terminate()
            worker.join()


def make_rpc_collector(
    config: Config, policy_factory: Callable[..., Any], devices: Any
) -> RPCCollection:
    """``collector.workers`` workers of ``env.num_envs`` envs each, each batch gathered
    from all of them (``frames_per_batch / workers`` frames each)."""
    settings, workers = config.collector, config.collector.workers
    where: dict[str, Any] = {}
    if config.rpc.launcher == "slurm":
        run_dir, jobs = Path(config.run_dir), collection_job_settings(config.slurm)
        check_cluster(jobs, "rpc.launcher=slurm")  # before submitting
        where["executor"] = make_executor(
            run_dir / JOB_DIR / COLLECTION_JOBS_DIR, jobs, name=f"{run_dir.name}-collect"
        )
        where["address"] = settings.address or socket.gethostbyname(socket.gethostname())
    return RPCCollection(
        config.env.name,
        create_env_fn=[
            env_factory(config.env, worker_seed(config.seed, worker), network=config.network)
            for worker in range(workers)
        ],
        policy_factory=policy_factory,
        frames_per_batch=settings.frames_per_batch,
        init_random_frames=split_warm_up(settings.init_random_frames, workers),
        collector_class=Collector,
        collector_kwargs=remote_collector_kwargs(workers, settings.compile_policy),
        tcp_port=settings.port or free_local_port(),
        env_device=devices.env,
        policy_device=devices.policy,
        storing_device=devices.storage,
        **where,
    )
