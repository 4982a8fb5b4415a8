"""DQN for discrete actions: a Q-network acting greedily, with epsilon-greedy exploration
annealed over collected frames and a target network copied every few updates."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictSequential
from torch import nn
from torchrl.data import TensorSpec
from torchrl.envs import EnvBase
from torchrl.modules import MLP, EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, HardUpdate

from rl_app.algorithms.base import (
    Algorithm,
    capture_step,
    loss_function,
    make_adam,
    make_value_estimator,
)
from rl_app.config import Config, DQNConfig, NetworkConfig
from rl_app.replay import PRIORITY_KEY


def make_policy(
    network: NetworkConfig,
    dqn: DQNConfig,
    observation_dim: int,
    action_spec: TensorSpec,
    env: EnvBase | None = None,
) -> TensorDictSequential:
    """Q-network -> greedy action, then epsilon-greedy exploration, its epsilon annealed
    linearly over ``dqn.eps_annealing_frames`` by :meth:`EGreedyModule.step`.

    The exploration step acts only when the policy explores (collection); evaluation runs
    it deterministically, which leaves the greedy action. ``env`` is accepted and unused
    because TorchRL's Evaluator calls policy factories with the evaluation env."""
    qnetwork = MLP(
        in_features=observation_dim,
        out_features=action_spec.shape[-1],
        num_cells=network.hidden_sizes,
        activation_class=nn.ReLU,
    )
    actor = QValueActor(qnetwork, in_keys=["observation"], spec=action_spec)
    explore = EGreedyModule(
        action_spec,
        eps_init=dqn.eps_start,
        eps_end=dqn.eps_end,
        annealing_num_steps=dqn.eps_annealing_frames,
    )
    return TensorDictSequential(actor, explore)


class DQN(Algorithm):
    """DQN (double by default) with a hard-copied target network."""

    def __init__(self, config: Config, env: EnvBase, device: torch.device) -> None:
        self._observation_dim = env.observation_spec["observation"].shape[-1]
        self._action_spec = env.action_spec_unbatched.clone().cpu()
        self._network = config.network
        self._dqn = config.dqn
        self.policy = make_policy(
            config.network, config.dqn, self._observation_dim, self._action_spec
        ).to(device)
        actor, self.exploration = self.policy[0], self.policy[1]
        self.loss = DQNLoss(
            actor, delay_value=True, double_dqn=config.dqn.double, loss_function=config.dqn.loss
        )
        self.loss.set_keys(priority=PRIORITY_KEY)
        make_value_estimator(self.loss, config.optim)
        self.target_updater = HardUpdate(
            self.loss, value_network_update_interval=config.dqn.target_update_interval
        )
        self.optimizer = make_adam(self.loss.parameters(), config.optim)
        self.compute_losses = loss_function(self.loss, config.optim.compile)
        self.step = capture_step(self.gradient_step, config.optim)

    def policy_factory(self) -> Callable[..., TensorDictSequential]:
        return functools.partial(
            make_policy, self._network, self._dqn, self._observation_dim, self._action_spec
        )

    def gradient_step(self, batch: TensorDictBase) -> TensorDictBase:
        losses = self.compute_losses(batch)
        self.optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        if self._dqn.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.loss.parameters(), self._dqn.max_grad_norm)
        self.optimizer.step()
        return losses.detach().set(PRIORITY_KEY, batch[PRIORITY_KEY])

    def after_update(self, metrics: TensorDictBase) -> None:
        # The target copy counts updates on the host, outside a captured step.
        self.target_updater.step()
        metrics["epsilon"] = self.exploration.eps.clone()

    def after_collect(self, new_frames: int) -> None:
        self.exploration.step(new_frames)

    def checkpoint_components(self) -> dict[str, Any]:
        # The loss module holds the Q-network and its target; the exploration module its
        # current epsilon; the target updater counts updates until the next copy.
        return {
            "dqn_networks": self.loss,
            "dqn_optimizer": self.optimizer,
            "dqn_exploration": self.exploration,
            "dqn_target_updater": self.target_updater,
        }
