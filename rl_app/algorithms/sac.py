"""Soft Actor-Critic for continuous actions: a tanh-Gaussian actor and two Q-networks.

In a goal env the actor and the Q-networks read the desired goal with the observation, so
that hindsight relabelling (``replay.her_ratio``) can train them on other goals."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import TensorSpec
from torchrl.envs import EnvBase
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import SACLoss, SoftUpdate

from rl_app.algorithms.base import (
    Algorithm,
    accelerate,
    make_adam,
    make_value_estimator,
    mask_padded_steps,
    network_inputs,
)
from rl_app.config import Config, NetworkConfig, SACConfig
from rl_app.replay import PRIORITY_KEY
from rl_app.upstream.torchrl import create_target_entropy_buffer


class MultiInputSequential(nn.Sequential):
    """``nn.Sequential`` whose first module takes every input (TorchRL's MLP concatenates
    the observation and the desired goal); its parameters keep ``nn.Sequential``'s names,
    so the actor of a run without goals loads as before."""

    def forward(self, *inputs: torch.Tensor) -> Any:
        output = self[0](*inputs)
        for module in self[1:]:
            output = module(output)
        return output


def make_actor(
    network: NetworkConfig,
    observation_dim: int,
    goal_dim: int | None,
    action_spec: TensorSpec,
) -> ProbabilisticActor:
    """The SAC actor: observation (and the desired goal where the env observes one,
    ``goal_dim``) -> (loc, scale) -> TanhNormal within the action bounds."""
    action_dim = action_spec.shape[-1]
    in_keys, in_features = network_inputs(observation_dim, goal_dim)
    backbone = MultiInputSequential(
        MLP(
            in_features=in_features,
            out_features=2 * action_dim,
            num_cells=network.hidden_sizes,
            activation_class=nn.ReLU,
        ),
        NormalParamExtractor(),
    )
    return ProbabilisticActor(
        TensorDictModule(backbone, in_keys=in_keys, out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        spec=action_spec,
        distribution_class=TanhNormal,
        distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high},
        return_log_prob=False,
    )


def make_qvalue(
    network: NetworkConfig, observation_dim: int, goal_dim: int | None, action_dim: int
) -> ValueOperator:
    """A Q-network: (observation, desired goal where there is one, action) -> value."""
    in_keys, in_features = network_inputs(observation_dim, goal_dim)
    mlp = MLP(
        in_features=in_features + action_dim,
        out_features=1,
        num_cells=network.hidden_sizes,
        activation_class=nn.ReLU,
    )
    return ValueOperator(mlp, in_keys=[*in_keys, "action"])


class SAC(Algorithm):
    """SAC with a learned temperature, two Q-networks and soft target updates."""

    actions = "continuous"
    settings = SACConfig
    goals = True

    @staticmethod
    def make_policy(
        config: Config,
        observation_dim: int | None,
        goal_dim: int | None,
        action_spec: TensorSpec,
    ) -> ProbabilisticActor:
        """The actor (:func:`make_actor`)."""
        return make_actor(config.network, observation_dim, goal_dim, action_spec)

    def __init__(self, config: Config, env: EnvBase, device: torch.device) -> None:
        super().__init__(config, env, device)
        qvalue = make_qvalue(
            config.network, self._observation_dim, self._goal_dim, self._action_spec.shape[-1]
        ).to(device)
        self.loss = SACLoss(
            self.policy,
            qvalue,
            num_qvalue_nets=2,
            alpha_init=config.sac.init_alpha,
            action_spec=self._action_spec.to(device),
            # A compiled SACLoss with vmap-free Q-nets recompiles on every call.
            deactivate_vmap=not (config.sac.vmap_qnets or config.optim.compile),
        )
        self.loss.set_keys(priority=PRIORITY_KEY)
        create_target_entropy_buffer(self.loss)  # before a compile (rl_app.upstream)
        make_value_estimator(self.loss, config.optim, device)
        mask_padded_steps(self.loss, config.replay)
        self.target_updater = SoftUpdate(self.loss, tau=config.sac.tau)
        # One optimizer over actor, critics and temperature: each loss term only reaches
        # its own parameters (SACLoss detaches the others), so the summed loss is exact.
        self.optimizer = make_adam(self.loss.parameters(), config.optim)
        self.update = accelerate(self.update, config.optim, self.check_device, self.loss)

    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """The losses of actor, critics and temperature, one backward pass, one optimizer
        step, the soft target update; the loss writes each step's TD error into ``batch``."""
        losses = self.loss(batch)
        total = losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        self.optimizer.step()
        self.target_updater.step()
        return losses.detach().set(PRIORITY_KEY, batch[PRIORITY_KEY])

    def checkpoint_components(self) -> dict[str, Any]:
        # The loss module holds actor, critics, target critics and the temperature.
        return {"sac_networks": self.loss, "sac_optimizer": self.optimizer}
