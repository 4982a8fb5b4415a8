"""Collection: where everything runs, and the TorchRL collector that feeds the buffer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import BaseCollector, Collector
from torchrl.envs import EnvBase

from rl_app.config import Config


@dataclass(frozen=True)
class Devices:
    """Where each part of a run lives. Decided once, by :func:`decide_devices`."""

    learner: torch.device  # networks, losses and optimizer
    policy: torch.device  # the acting policy inside the collector
    env: torch.device  # environment stepping (Gymnasium runs on the CPU)
    storage: torch.device  # replay data


def decide_devices(config: Config) -> Devices:
    """The learner uses CUDA when asked for (``device=auto`` takes it when present).

    The acting policy stays with the learner, so that the direct collector shares the
    learner's weights without copies; Gymnasium envs step on the CPU; replay data live
    where ``replay.device`` says (CPU by default, memory-mapped to disk)."""
    if config.device == "auto":
        learner = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        learner = torch.device(config.device)
    return Devices(
        learner=learner,
        policy=learner,
        env=torch.device("cpu"),
        storage=torch.device(config.replay.device),
    )


def make_collector(
    config: Config,
    env_factory: Callable[[], EnvBase],
    policy: TensorDictModuleBase,
    devices: Devices,
) -> BaseCollector:
    """The collector named by ``collector.mode``; it yields batches of
    ``collector.frames_per_batch`` frames until ``collector.total_frames``."""
    return Collector(
        env_factory,
        policy,
        frames_per_batch=config.collector.frames_per_batch,
        total_frames=config.collector.total_frames,
        init_random_frames=config.collector.init_random_frames,
        env_device=devices.env,
        policy_device=devices.policy,
        storing_device=devices.storage,
    )


class CollectorState:
    """The collector's part of a checkpoint.

    TorchRL's collector state holds its frame counter and trajectory-id pool; on load it
    starts a new episode under a new trajectory id. The collector resets an env as soon as
    an episode ends, so a run saved at an episode boundary has already drawn the next
    episode's start. To resume exactly, that reset is replayed from the random state it
    started from (recorded by :class:`rl_app.envs.ReplayableReset`) and the episode keeps
    the trajectory id it had. Mid-episode the env's physics cannot be saved: the resumed
    run then starts a new episode, as TorchRL does."""

    def __init__(self, collector: BaseCollector) -> None:
        self.collector = collector

    def _gym_env(self) -> Any:
        # TorchRL's GymWrapper keeps the Gymnasium env in `_env`; there is no public handle.
        return self.collector.env.base_env._env

    def state_dict(self) -> dict[str, Any]:
        gym_env = self._gym_env()
        return {
            "collector": self.collector.state_dict(),
            "at_episode_start": gym_env.steps_since_reset == 0,
            "random_state_before_reset": gym_env.random_state_before_reset,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        collector_state = state["collector"]
        if state["at_episode_start"]:
            gym_env = self._gym_env()
            gym_env.unwrapped.np_random.bit_generator.state = state["random_state_before_reset"]
            self.collector.reset()
            # Loading hands the current episode the pool's next id: step back one, so that
            # the replayed episode gets the id it had.
            pool = collector_state["traj_pool"]
            collector_state = {**collector_state, "traj_pool": {"traj_id": pool["traj_id"] - 1}}
        self.collector.load_state_dict(collector_state)


def sync_weights(collector: BaseCollector) -> None:
    """Bring the collector's acting policy up to date with the learner's weights.

    A direct collector on the learner's device acts with the learner's own modules, so
    this is cheap there; it copies when the collector holds its own copy."""
    collector.update_policy_weights_()
