"""Collection: where everything runs, the TorchRL collector that feeds the buffer, and how
the learner's weights reach it.

Six topologies, all TorchRL collectors the loop iterates the same way:
- ``direct``: one env (or ``env.num_envs``) stepped in the learner's process, acting with
  the learner's policy (built here);
- ``sync`` / ``async``: worker processes (:mod:`rl_app.collection.workers`);
- ``distributed``: SLURM jobs, each batch gathered from every job
  (:mod:`rl_app.collection.distributed`);
- ``ray``: Ray actors on a local or joined Ray cluster (:mod:`rl_app.collection.ray`);
- ``rpc``: TorchRL's RPC collector, worker processes or SLURM jobs driven over
  ``torch.distributed.rpc`` (:mod:`rl_app.collection.rpc`).
Worker processes and jobs build env and policy from picklable factories and act with a
snapshot of the learner's weights that changes only when :class:`WeightSync` pushes one. A
reader of direct mode needs neither.

To add a topology: write ``rl_app/collection/<name>.py`` with a factory that returns a
TorchRL collector from the config and the policy's factory (as
:func:`rl_app.collection.workers.make_worker_collector`); add its
name to ``collector.mode``'s choices (``rl_app/config/schema.py``) and a branch to
:func:`make_collector`, importing the module there only, so that other modes never load
it; check its settings in ``rl_app/checks.py``; test it on real processes beside
``tests/test_collection.py``."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import connection
from multiprocessing.process import BaseProcess
from typing import Any

import torch
from tensordict import TensorDict
from torchrl.collectors import BaseCollector, Collector

from rl_app.algorithms import Algorithm
from rl_app.config import Config
from rl_app.envs import env_factory
from rl_app.envs.resumable import ResumableEnv
from rl_app.upstream.torchrl import gymnasium_env, next_step_input

log = logging.getLogger("rl_app")


@dataclass(frozen=True)
class Devices:
    """Where each part of a run lives. Decided once, by :func:`decide_devices`."""

    learner: torch.device  # networks, losses and optimizer
    policy: torch.device  # the acting policy inside the collector
    env: torch.device  # environment stepping (Gymnasium runs on the CPU)
    storage: torch.device  # replay data


def decide_devices(config: Config) -> Devices:
    """The learner uses CUDA when asked for (``device=auto`` takes it when present).

    In direct mode the acting policy is the learner's own module, on the learner's device,
    so no copy is needed. Worker processes act on ``collector.device`` (the CPU by default:
    small policies step faster there, and workers need no GPU). Gymnasium envs step on the
    CPU; replay data live where ``replay.device`` says (CPU, memory-mapped to disk)."""
    if config.device == "auto":
        learner = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        learner = torch.device(config.device)
    policy = learner if config.collector.mode == "direct" else torch.device(config.collector.device)
    return Devices(
        learner=learner,
        policy=policy,
        env=torch.device("cpu"),
        storage=torch.device(config.replay.device),
    )


def make_collector(config: Config, algorithm: Algorithm, devices: Devices) -> BaseCollector:
    """The collector named by ``collector.mode``. It runs until the loop stops iterating
    (the loop counts frames, so that a resumed run knows where it is)."""
    settings = config.collector
    common: dict[str, Any] = {
        "frames_per_batch": settings.frames_per_batch,
        "total_frames": -1,
        "env_device": devices.env,
        "policy_device": devices.policy,
        "storing_device": devices.storage,
        "compile_policy": settings.compile_policy,
    }
    if settings.mode == "direct":
        return Collector(
            env_factory(config.env, config.seed, network=config.network),
            algorithm.policy,
            init_random_frames=settings.init_random_frames,
            **common,
        )
    # The one door to scale-out: imported only when a run asks for that mode.
    if settings.mode == "distributed":
        from rl_app.collection.distributed import make_collection_jobs

        return make_collection_jobs(config, algorithm.policy_factory(), devices)
    if settings.mode == "ray":
        from rl_app.collection.ray import make_ray_collector

        return make_ray_collector(config, algorithm.policy_factory(), devices)
    if settings.mode == "rpc":
        from rl_app.collection.rpc import make_rpc_collector

        return make_rpc_collector(config, algorithm.policy_factory(), devices)
    from rl_app.collection.workers import make_worker_collector

    return make_worker_collector(config, algorithm.policy_factory(), common)


class CollectorStopped(RuntimeError):
    """A collector worker (process, SLURM job or Ray actor) stopped; the message names it in
    one form: ``collector worker N (kind, where it ran) of env E stopped: how it ended``."""


class WorkerDied(CollectorStopped):
    """A collector worker process stopped."""

    def __init__(self, index: int, process: BaseProcess, env_name: str) -> None:
        super().__init__(
            f"collector worker {index} (worker process, pid {process.pid}) of env {env_name} "
            f"stopped: {how_it_exited(process.exitcode)}; had it raised, its traceback is "
            "printed above"
        )


def how_it_exited(exitcode: int | None) -> str:
    """A process's exit code in words: ``exit code 1``, ``killed by SIGKILL``."""
    if exitcode is not None and exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


def check_workers(collector: BaseCollector, env_name: str) -> None:
    """Raise if a worker process has stopped, naming its env. A worker that fails prints
    its traceback and exits; TorchRL's collectors notice only at their next batch (the
    async one raises "At least one process failed"), while a weight push to a dead worker
    would wait for its acknowledgement (see :mod:`rl_app.upstream`): the loop checks before
    every push and every checkpoint."""
    for index, process in enumerate(getattr(collector, "procs", ())):
        if not process.is_alive():
            raise WorkerDied(index, process, env_name)


def collector_metrics(collector: BaseCollector) -> dict[str, float]:
    """What a collector counts of itself, logged each iteration: a Ray collection, the
    actors it replaced."""
    metrics = getattr(collector, "metrics", None)
    return metrics() if metrics is not None else {}


# How long a collector that raised is given for one of its workers to end.
WORKER_EXIT_S = 30.0


@contextmanager
def naming_dead_workers(collector: BaseCollector, env_name: str) -> Iterator[None]:
    """Around a collector's next batch: if it raises while a worker process has ended (or
    ends within ``WORKER_EXIT_S``), raise :class:`WorkerDied` naming that worker instead.

    Finding a dead worker, TorchRL terminates the others, waits 0.1 s and closes them
    (``torchrl._utils._check_for_faulty_process``); one still exiting then makes it raise
    "Cannot close a process while it is still running" (a ValueError) in place of naming
    the worker that failed, depending on how busy the machine is. Test:
    ``test_async_collector_names_a_dead_worker_or_fails_to_close_another``."""
    try:
        yield
    except Exception as error:
        ended = ended_worker(getattr(collector, "procs", ()), WORKER_EXIT_S)
        if ended is None:
            raise
        raise WorkerDied(*ended, env_name) from error


def ended_worker(
    processes: Sequence[BaseProcess], timeout: float
) -> tuple[int, BaseProcess] | None:
    """(index, process) of a worker process that has ended, waiting up to ``timeout``
    seconds for one to end; ``None`` if none does. TorchRL closes the others (exit code 0)
    or terminates them (SIGTERM) once one has died: a worker that ended otherwise is named
    first."""
    open_processes = {}
    for index, process in enumerate(processes):
        try:
            process.exitcode  # noqa: B018 (raises once TorchRL has closed the process)
        except ValueError:
            continue
        open_processes[index] = process
    if not open_processes:
        return None
    connection.wait([process.sentinel for process in open_processes.values()], timeout)
    ended = []
    for index, process in open_processes.items():
        if connection.wait([process.sentinel], 0):  # it has exited
            process.join()  # returns once it is reaped, at once
            ended.append((index, process))
    asked_to_end = (0, -signal.SIGTERM)
    failed = [worker for worker in ended if worker[1].exitcode not in asked_to_end]
    return (failed + ended)[0] if ended else None


class WeightSync:
    """Pushes the learner's weights to the collector's acting policy, and counts the pushes:
    ``version`` is the learner's policy version, to which the per-frame ``policy_version``
    written by worker processes compares.

    Worker processes receive a new snapshot of the weights. A direct collector acts with
    the learner's own module, so there is nothing to copy unless it keeps its own copy on
    another device."""

    def __init__(self, collector: BaseCollector, algorithm: Algorithm, env_name: str) -> None:
        self.collector = collector
        self.algorithm = algorithm
        self.env_name = env_name
        self.version = 0
        if not isinstance(collector, Collector):
            self.push()  # workers start from their own random initialisation

    def push(self) -> None:
        check_workers(self.collector, self.env_name)
        if isinstance(self.collector, Collector):
            self.collector.update_policy_weights_()
        else:
            self.collector.update_policy_weights_(self.algorithm.policy)
        self.version += 1


class CollectorState:
    """The collector's part of a checkpoint.

    TorchRL's collector state holds its frame counters (each worker's, for worker
    processes), the trajectory-id pool and the env transforms' buffers (stacked frames);
    on load it starts a new episode under a new trajectory id. A direct collector with one
    env also saves the episode in progress: the Gymnasium env's state
    (:class:`rl_app.envs.resumable.ResumableEnv`) and the collector's next step, which
    holds what the TorchRL transforms count for the episode (step count, episode return,
    ``is_init``) and its trajectory id, so that a resumed run continues that episode
    exactly. An env that cannot give its state mid-episode, worker processes and a batch of
    envs start new episodes on resume, as TorchRL does; which one is logged once."""

    def __init__(self, collector: BaseCollector) -> None:
        self.collector = collector
        self.gym_env: ResumableEnv | None = None
        if isinstance(collector, Collector):
            gym_env = gymnasium_env(collector.env)
            self.gym_env = gym_env if isinstance(gym_env, ResumableEnv) else None
        self.told_why = False

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"collector": self.collector.state_dict()}
        episode = self.gym_env.get_state() if self.gym_env is not None else None
        if episode is None:
            self.tell_why_once()
        else:
            state["env"] = episode
            state["next_step"] = next_step_input(self.collector).to_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        collector_state = state["collector"]
        if "env" in state:
            self.gym_env.set_state(state["env"])
            # Loading hands the current episode the pool's next id: step back one, so that
            # the pool continues as it was (the saved next step brings the episode's id).
            pool = collector_state["traj_pool"]
            collector_state = {**collector_state, "traj_pool": {"traj_id": pool["traj_id"] - 1}}
        self.collector.load_state_dict(collector_state)
        if "env" in state:
            next_step = next_step_input(self.collector)
            next_step.update(TensorDict(state["next_step"], batch_size=next_step.batch_size))

    def tell_why_once(self) -> None:
        if self.told_why:
            return
        self.told_why = True
        if self.gym_env is not None:
            why = f"{self.gym_env.unsaved_part()} cannot give its state mid-episode"
        elif isinstance(self.collector, Collector):
            why = "the env is a batch of envs"
        else:
            why = "the envs run in other processes"
        log.info(
            "checkpoints do not save the episode in progress (%s): a run resumed "
            "from one mid-episode starts a new episode",
            why,
        )
