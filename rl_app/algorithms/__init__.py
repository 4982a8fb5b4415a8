"""Algorithms the training loop can run, each behind :class:`rl_app.algorithms.base.Algorithm`."""

from __future__ import annotations

import torch
from torchrl.envs import EnvBase

from rl_app.algorithms.base import Algorithm
from rl_app.algorithms.dqn import DQN
from rl_app.algorithms.sac import SAC
from rl_app.config import Config

# `algo=` names; the action space each needs is in rl_app.config.ALGORITHM_ACTIONS.
ALGORITHMS: dict[str, type[Algorithm]] = {"sac": SAC, "dqn": DQN}

__all__ = ["ALGORITHMS", "Algorithm", "make_algorithm"]


def make_algorithm(config: Config, env: EnvBase, device: torch.device) -> Algorithm:
    """Build the algorithm named by ``config.algo`` for ``env``'s specs on ``device``."""
    return ALGORITHMS[config.algo](config, env, device)
