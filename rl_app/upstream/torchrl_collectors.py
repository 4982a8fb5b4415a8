"""TorchRL 0.14.1's scale-out collectors: the distributed collector on submitit and the RPC
collector, their private names and the workarounds of their behaviours, and the endless run
and warm-up split that Ray's collector shares with them (the index is in
:mod:`rl_app.upstream`). Imported only by ``collector.mode=distributed|rpc|ray``."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed import rpc as rpc_api
from torchrl.collectors.distributed import DistributedCollector, RPCCollector
from torchrl.collectors.distributed import generic as torchrl_distributed
from torchrl.collectors.distributed import rpc as torchrl_rpc
from torchrl.collectors.distributed.default_configs import _find_free_port

log = logging.getLogger("rl_app")


# -- 1. the distributed collector on submitit ----------------------------------------------

# TorchRL's distributed iterator treats total_frames=-1 as zero frames: "never stop" is a
# count no run reaches. Test:
# ``test_distributed_collector_still_stops_at_once_when_frames_are_minus_one``.
UNBOUNDED_FRAMES = 2**62


def split_warm_up(init_random_frames: int, workers: int) -> int:
    """What to hand a distributed collector (submitit, RPC, Ray) for ``init_random_frames``
    random frames in all: it gives each of its ``workers`` a ``// workers`` share, which
    drops the remainder; here each share is rounded up to whole frames instead. Tests:
    ``test_distributed_collectors_still_split_the_warm_up``,
    ``test_ray_collector_still_stops_at_minus_one_frames_and_splits_the_warm_up``."""
    return workers * math.ceil(init_random_frames / workers)


class ExecutorDistributedCollector(DistributedCollector):
    """TorchRL's ``DistributedCollector`` with the submitit launcher, submitting its jobs
    with a given ``executor`` and rendezvousing at ``address:port`` within
    ``connect_timeout_s``; it runs until stopped.

    TorchRL 0.14.1 takes the host name's address, its own executor (a ``./log_test``
    folder, no SLURM resources) and waits for the jobs to join ``MAX_TIME_TO_CONNECT``
    *days* (1,000: it is passed to ``timedelta`` as days). ``jobs`` holds the submitted
    jobs as soon as they are submitted, also when joining then fails. Test:
    ``test_distributed_collector_still_takes_its_join_wait_in_days``."""

    def __init__(
        self,
        env_makers: list[Any],
        *,
        executor: Any,
        address: str,
        port: int,
        connect_timeout_s: float,
        **kwargs: Any,
    ) -> None:
        # Read by _init_workers, which TorchRL's __init__ calls.
        self.executor = executor
        self.address = address
        self.connect_timeout_s = connect_timeout_s
        self.jobs: list[Any] = []
        super().__init__(
            env_makers,
            launcher="submitit",
            sync=True,
            total_frames=UNBOUNDED_FRAMES,
            tcp_port=port,
            **kwargs,
        )

    def _init_workers(self) -> None:
        self.IPAddr = self.address
        for node in range(self.num_workers):
            self.jobs.append(self._init_worker_dist_submitit(self.executor, node))
        log.info(
            "submitted collection jobs %s; logs in %s; waiting for them at %s:%s",
            ", ".join(job.job_id for job in self.jobs),
            self.executor.folder, self.address, self.tcp_port,
        )  # fmt: skip
        default_wait_days = torchrl_distributed.MAX_TIME_TO_CONNECT
        torchrl_distributed.MAX_TIME_TO_CONNECT = self.connect_timeout_s / 86_400
        try:
            self._init_master_dist(self.num_workers + 1, self.backend)
        finally:
            torchrl_distributed.MAX_TIME_TO_CONNECT = default_wait_days


@contextmanager
def weight_sync_kept_open(collector: DistributedCollector) -> Iterator[None]:
    """Shut ``collector`` down inside this block, and its weight-sync store only after.

    TorchRL closes the store as soon as each job has handed back its result, while the
    job's receiver thread still waits on that store: the job then aborts on its way out and
    ends FAILED. Test: ``test_distributed_shutdown_still_closes_the_weight_store_itself``."""
    schemes, collector._weight_sync_schemes = collector._weight_sync_schemes, None
    try:
        yield
    finally:
        for scheme in (schemes or {}).values():
            scheme.shutdown()


def undo_trajectory_id_shifts(ids: torch.Tensor) -> torch.Tensor:
    """Each job's own trajectory ids, from a gathered ``(jobs, frames)`` batch.

    TorchRL shifts job ``i``'s ids by job ``i-1``'s largest (already shifted) id, so the
    first trajectory of one job takes the id of the last of the other, and the shift
    changes from batch to batch. Test: ``test_distributed_collector_still_shifts_ids``."""
    ids = ids.clone()
    for node in range(ids.shape[0] - 1, 0, -1):  # last first: each shift used the one before
        ids[node] -= ids[node - 1].max()
    return ids


# -- 2. the RPC collector on local processes and SLURM jobs --------------------------------

# TorchRL's RPC collector names worker i's RPC node "COLLECTOR_NODE_{i + 1}" (the learner is
# rank 0), and RPC re-raises a worker's error with the worker named in its message, the
# worker's own error on the next line. Test: ``test_an_rpc_worker_error_still_names_its_node``.
RPC_WORKER_NODE = re.compile(r"COLLECTOR_NODE_(\d+)\):\n(.*)")


def rpc_worker_of(error: BaseException) -> tuple[int, str] | None:
    """The index of the RPC collector worker ``error`` came from and its own error, if it
    names one."""
    found = RPC_WORKER_NODE.search(str(error))
    return (int(found.group(1)) - 1, found.group(2)) if found else None


def undo_rpc_trajectory_id_shift(ids: torch.Tensor, workers: int) -> torch.Tensor:
    """A sync RPC batch's trajectory ids as its workers wrote them.

    TorchRL concatenates the workers' batches (in the order they finish) and then shifts
    what it takes for worker ``i``'s ids, ``ids[i]``, by ``ids[i - 1].max()``: on the
    concatenated frames that adds frame ``i - 1``'s id to frame ``i``, for the first
    ``workers`` frames. Test: ``test_rpc_collector_still_shifts_the_first_frames_ids``."""
    ids = ids.clone()
    ids[:workers] = undo_trajectory_id_shifts(ids[:workers])
    return ids


def free_local_port() -> int:
    """A TCP port free on this machine now, for the RPC collector's rendezvous (TorchRL's
    own default, 10003, is one port for every run on the machine)."""
    return _find_free_port()


class LaunchedRPCCollector(RPCCollector):
    """TorchRL's ``RPCCollector`` on local processes (``executor=None``: its ``mp``
    launcher), or on SLURM jobs submitted with a given ``executor``, which join the learner
    at ``address``; it runs until stopped. ``jobs`` holds the processes or jobs.

    TorchRL 0.14.1's submitit launcher takes its own executor (a ``./log_test`` folder, no
    SLURM resources) and the host name's address: here the jobs are submitted as its
    ``submitit_delayed`` launcher expects them, already running, with TorchRL's own worker
    entry point. Test: ``test_rpc_collector_still_starts_its_nodes_with_this_entry_point``."""

    def __init__(self, *, executor: Any = None, address: str = "localhost", **kwargs: Any) -> None:
        self.executor = executor
        self.address = address
        launcher = "mp" if executor is None else "submitit_delayed"
        super().__init__(launcher=launcher, total_frames=UNBOUNDED_FRAMES, **kwargs)

    def _init_worker_rpc(self, executor: Any, i: int) -> Any:
        if self.executor is None:
            return super()._init_worker_rpc(executor, i)
        return self.executor.submit(
            torchrl_rpc._rpc_init_collection_node,
            i + 1,
            self.address,
            self.tcp_port,
            self.num_workers + 1,
            None,
            self.tensorpipe_options,
            self.backend,
            self._VERBOSE,
        )


def rpc_started_in_this_process() -> bool:
    """Whether this process has joined an RPC group before.

    torch 2.14.1 prefixes a group's rendezvous keys with a count of the process's
    ``init_rpc`` calls, and numbers its all-gathers per process: a process that already ran
    an RPC collector starts a second with keys and numbers its fresh workers never use, and
    waits for them for ever (resetting both counts gets it started, then its shutdown waits
    for ever). Test: ``test_a_second_rpc_group_in_a_process_still_uses_other_keys``."""
    return rpc_api._init_counter > 0
