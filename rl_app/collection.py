"""Collection: where everything runs, the TorchRL collector that feeds the buffer, and how
the learner's weights reach it.

Four topologies, all TorchRL collectors the loop iterates the same way:
- ``direct``: one env stepped in the learner's process, acting with the learner's policy;
- ``sync``: ``MultiSyncCollector``, each batch gathered from every worker process;
- ``async``: ``MultiAsyncCollector``, workers keep collecting while the learner updates,
  each batch from whichever worker is ready;
- ``distributed``: SLURM jobs, each batch gathered from every job (:mod:`rl_app.distributed`).
Worker processes and jobs build env and policy from picklable factories and act with a
snapshot of the learner's weights that changes only when :class:`WeightSync` pushes one.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import BaseCollector, Collector
from torchrl.weight_update import MultiProcessWeightSyncScheme

from rl_app.algorithms import Algorithm
from rl_app.config import Config
from rl_app.distributed import make_collection_jobs
from rl_app.envs import ReplayableReset, env_factory

# Worker i's env is seeded with seed + i * WORKER_SEED_STRIDE: distinct, reproducible episodes.
WORKER_SEED_STRIDE = 10_007


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
            env_factory(config.env, config.seed),
            algorithm.policy,
            init_random_frames=settings.init_random_frames,
            **common,
        )
    if settings.mode == "distributed":
        return make_collection_jobs(config, algorithm.policy_factory(), devices)
    collector = Collector(
        [
            env_factory(config.env, config.seed + worker * WORKER_SEED_STRIDE)
            for worker in range(settings.workers)
        ],
        policy_factory=functools.partial(make_guarded_policy, algorithm.policy_factory()),
        num_collectors=settings.workers,
        sync=settings.mode == "sync",
        # Each worker holds its own copy of the weights, replaced only by a push; handing
        # workers the policy object instead would share the learner's live tensors.
        weight_sync_schemes={"policy": GuardedWeightSyncScheme()},
        track_policy_version=True,
        # Each worker counts its own frames: split the random warm-up among them.
        init_random_frames=math.ceil(settings.init_random_frames / settings.workers),
        **common,
    )
    return collector


# Workers receive weights on a background thread, which TorchRL 0.14.1 copies into the
# policy parameter by parameter while the worker's main thread may be running that policy:
# one action could mix old and new layers, and act with new weights under the old version.
# In each worker process this lock is held by the policy's forward pass and by a weight
# update (from the "receive" instruction to its acknowledgement, which spans applying the
# weights and bumping the policy version), so that each action sees one whole version.
_WEIGHTS_LOCK = threading.Lock()
ACK_TIMEOUT_S = 60.0


class GuardedWeightSyncScheme(MultiProcessWeightSyncScheme):
    """TorchRL's multi-process weight sync, applying each update under ``_WEIGHTS_LOCK`` and
    waiting at most ``ACK_TIMEOUT_S`` for workers to acknowledge it.

    It hooks the two steps TorchRL's background receiver loop takes around an update (the
    loop has no public hook); an update that fails midway releases the lock at the loop's
    next wait."""

    _holding_lock = False

    def _wait_for_instruction(self, timeout: float | None = None) -> str | None:
        self._release_lock()
        instruction = super()._wait_for_instruction(timeout)
        if instruction == "receive":
            _WEIGHTS_LOCK.acquire()
            self._holding_lock = True
        return instruction

    def _send_ack(self, message: str = "updated") -> None:
        self._release_lock()
        super()._send_ack(message)

    def _wait_for_ack(self, worker_ids: Any = None, timeout: float | None = None) -> None:
        # A push waits until every worker has applied the weights; a worker that died would
        # never answer, and TorchRL would wait forever.
        super()._wait_for_ack(worker_ids, timeout=ACK_TIMEOUT_S if timeout is None else timeout)

    def _release_lock(self) -> None:
        if self._holding_lock:
            self._holding_lock = False
            _WEIGHTS_LOCK.release()


def make_guarded_policy(
    policy_factory: Callable[..., TensorDictModuleBase],
) -> TensorDictModuleBase:
    """A worker's policy, whose forward pass holds ``_WEIGHTS_LOCK``."""
    policy = policy_factory()
    policy.register_forward_pre_hook(acquire_weights_lock)
    policy.register_forward_hook(release_weights_lock)
    return policy


def acquire_weights_lock(module: Any, args: Any) -> None:
    _WEIGHTS_LOCK.acquire()  # a pre-hook returns None: the call's arguments stay as they are


def release_weights_lock(module: Any, args: Any, output: Any) -> None:
    _WEIGHTS_LOCK.release()


class WorkerDied(RuntimeError):
    """A collector worker process stopped."""


def check_workers(collector: BaseCollector, env_name: str) -> None:
    """Raise if a worker process has stopped. TorchRL 0.14.1 does not forward a worker's
    error while collecting: the worker prints its traceback and exits, and an async
    collector goes on with the others (a later weight push or checkpoint would then fail
    on its broken pipe)."""
    for index, process in enumerate(getattr(collector, "procs", ())):
        if not process.is_alive():
            raise WorkerDied(
                f"collector worker {index} (env {env_name}) stopped with exit code "
                f"{process.exitcode}; its traceback is printed above"
            )


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
    processes) and the trajectory-id pool; on load it starts a new episode under a new
    trajectory id. The direct collector resets an env as soon as an episode ends, so a run
    saved at an episode boundary has already drawn the next episode's start. To resume
    exactly, that reset is replayed from the random state it started from (recorded by
    :class:`rl_app.envs.ReplayableReset`) and the episode keeps the trajectory id it had.
    Mid-episode, in worker processes or with a batch of envs, the env's physics cannot be
    saved: the resumed run then starts new episodes, as TorchRL does."""

    def __init__(self, collector: BaseCollector) -> None:
        self.collector = collector
        self.replayable = isinstance(collector, Collector) and isinstance(
            self._gym_env(), ReplayableReset
        )

    def _gym_env(self) -> Any:
        # TorchRL's GymWrapper keeps the Gymnasium env in `_env`; there is no public handle.
        return self.collector.env.base_env._env

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"collector": self.collector.state_dict()}
        if self.replayable:
            gym_env = self._gym_env()
            state["at_episode_start"] = gym_env.steps_since_reset == 0
            state["random_state_before_reset"] = gym_env.random_state_before_reset
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        collector_state = state["collector"]
        if state.get("at_episode_start"):
            gym_env = self._gym_env()
            gym_env.unwrapped.np_random.bit_generator.state = state["random_state_before_reset"]
            self.collector.reset()
            # Loading hands the current episode the pool's next id: step back one, so that
            # the replayed episode gets the id it had.
            pool = collector_state["traj_pool"]
            collector_state = {**collector_state, "traj_pool": {"traj_id": pool["traj_id"] - 1}}
        self.collector.load_state_dict(collector_state)
