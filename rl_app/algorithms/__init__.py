"""Algorithms the training loop can run, each behind :class:`rl_app.algorithms.base.Algorithm`."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict.nn import TensorDictModuleBase
from torchrl.data import TensorSpec
from torchrl.envs import EnvBase

from rl_app.algorithms import dqn, sac
from rl_app.algorithms.base import Algorithm, goal_dim, observation_dim
from rl_app.algorithms.dqn import DQN
from rl_app.algorithms.sac import SAC
from rl_app.config import Config

# `algo=` names; the action space each needs is in rl_app.config.ALGORITHM_ACTIONS.
ALGORITHMS: dict[str, type[Algorithm]] = {"sac": SAC, "dqn": DQN}

# The acting policy of each algorithm, as its `policy_factory()` builds it, from the config,
# the observation size (None: stacked frames), the desired goal's size (None: no goal) and
# the action spec: playing a run needs nothing else.
POLICIES: dict[
    str, Callable[[Config, int | None, int | None, TensorSpec], TensorDictModuleBase]
] = {
    "sac": lambda config, observation_dim, goal_dim, action_spec: sac.make_actor(
        config.network, observation_dim, goal_dim, action_spec
    ),
    "dqn": lambda config, observation_dim, goal_dim, action_spec: dqn.make_policy(
        config.network, config.dqn, observation_dim, goal_dim, action_spec
    ),
}

__all__ = ["ALGORITHMS", "POLICIES", "Algorithm", "make_algorithm", "make_policy"]


def make_algorithm(config: Config, env: EnvBase, device: torch.device) -> Algorithm:
    """Build the algorithm named by ``config.algo`` for ``env``'s specs on ``device``."""
    return ALGORITHMS[config.algo](config, env, device)


def make_policy(config: Config, env: EnvBase) -> TensorDictModuleBase:
    """The acting policy of ``config.algo`` for ``env``'s specs, on the CPU, with fresh
    weights: no loss, optimizer, buffer or collector is built."""
    action_spec = env.action_spec_unbatched.clone().cpu()
    return POLICIES[config.algo](config, observation_dim(env), goal_dim(env), action_spec)
