"""Collection: where everything runs, and the TorchRL collector that feeds the buffer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


def sync_weights(collector: BaseCollector) -> None:
    """Bring the collector's acting policy up to date with the learner's weights.

    A direct collector on the learner's device acts with the learner's own modules, so
    this is cheap there; it copies when the collector holds its own copy."""
    collector.update_policy_weights_()
