"""TD3 (Fujimoto et al., 2018) for continuous actions: a deterministic actor explored with
Gaussian noise, two Q-networks learning from the smaller of their targets at a smoothed
target action, and the actor and the target networks updated at every
``td3.policy_delay``-th critic update.

Noise is given in half-widths of the action range, as Fujimoto's code and Stable-Baselines3
give it (their actions span [-1, 1]): 0.1 is an std of 0.2 on Pendulum's [-2, 2]. In a goal
env the actor and the Q-networks read the desired goal with the observation, as SAC's do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import TensorSpec
from torchrl.envs import EnvBase
from torchrl.modules import MLP, AdditiveGaussianModule, TanhModule
from torchrl.objectives import SoftUpdate, TD3Loss

from rl_app.algorithms.base import (
    Algorithm,
    accelerate,
    make_adam,
    make_value_estimator,
    mask_padded_steps,
    network_inputs,
)
from rl_app.algorithms.sac import make_qvalue
from rl_app.config import Config, NetworkConfig, TD3Config
from rl_app.replay import PRIORITY_KEY


def half_width(action_spec: TensorSpec) -> torch.Tensor:
    """Half the width of the action range, per action dimension."""
    return (action_spec.space.high - action_spec.space.low) / 2


def make_actor(
    network: NetworkConfig, observation_dim: int, goal_dim: int | None, action_spec: TensorSpec
) -> TensorDictSequential:
    """The deterministic actor: observation (and the desired goal where the env observes
    one) -> MLP -> tanh, scaled to the action bounds."""
    in_keys, in_features = network_inputs(observation_dim, goal_dim)
    mlp = MLP(
        in_features=in_features,
        out_features=action_spec.shape[-1],
        num_cells=network.hidden_sizes,
        activation_class=nn.ReLU,
    )
    return TensorDictSequential(
        TensorDictModule(mlp, in_keys=in_keys, out_keys=["unbounded_action"]),
        TanhModule(in_keys=["unbounded_action"], out_keys=["action"], spec=action_spec),
    )


def make_exploring_actor(
    network: NetworkConfig,
    td3: TD3Config,
    observation_dim: int,
    goal_dim: int | None,
    action_spec: TensorSpec,
) -> TensorDictSequential:
    """The actor, then Gaussian exploration noise of ``td3.exploration_noise`` half-widths,
    clipped to the action bounds. The noise acts only when the policy explores
    (collection); evaluation and play run it deterministically: the actor's action."""
    explore = AdditiveGaussianModule(
        action_spec,
        sigma_init=1.0,  # a constant std (annealing from 1 to 1)
        sigma_end=1.0,
        std=(td3.exploration_noise * half_width(action_spec)).tolist(),
    )
    return TensorDictSequential(
        make_actor(network, observation_dim, goal_dim, action_spec), explore
    )


class DelayedUpdates:
    """Which critic updates the actor and the target networks follow: every
    ``policy_delay``-th from the first. Keeps the count (on the host: deciding costs no
    device sync) and the latest actor loss, which every update reports; both go into
    checkpoints."""

    def __init__(self, policy_delay: int, device: torch.device) -> None:
        self.policy_delay = policy_delay
        self.critic_updates = 0
        self.loss_actor = torch.zeros((), device=device)

    def due(self) -> bool:
        return self.critic_updates % self.policy_delay == 0

    def state_dict(self) -> dict[str, Any]:
        return {"critic_updates": self.critic_updates, "loss_actor": self.loss_actor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critic_updates = int(state["critic_updates"])
        self.loss_actor = state["loss_actor"].to(self.loss_actor.device)


class LossTerm(nn.Module):
    """One term of a TorchRL loss (a method of the loss module) as a module of its own, so
    that :func:`~rl_app.algorithms.base.accelerate` compiles it alone."""

    def __init__(self, term: Callable[[TensorDictBase], Any]) -> None:
        super().__init__()
        self.term = term

    def forward(self, batch: TensorDictBase) -> Any:
        return self.term(batch)


class TD3(Algorithm):
    """TD3: clipped double-Q learning, target policy smoothing, delayed actor updates."""

    settings = TD3Config
    actions = "continuous"
    recurrent = False
    goals = True  # the networks read the desired goal (network_inputs)

    @staticmethod
    def make_policy(
        config: Config,
        observation_dim: int | None,
        goal_dim: int | None,
        action_spec: TensorSpec,
    ) -> TensorDictSequential:
        """The exploring actor (:func:`make_exploring_actor`)."""
        return make_exploring_actor(
            config.network, config.td3, observation_dim, goal_dim, action_spec
        )

    def __init__(self, config: Config, env: EnvBase, device: torch.device) -> None:
        super().__init__(config, env, device)
        actor = self.policy[0]
        qvalue = make_qvalue(
            config.network, self._observation_dim, self._goal_dim, self._action_spec.shape[-1]
        ).to(device)
        # The target action's noise, in the action's own units (TD3Loss takes them so).
        scale = half_width(self._action_spec).to(device)
        self.loss = TD3Loss(
            actor,
            qvalue,
            num_qvalue_nets=2,
            action_spec=self._action_spec.to(device),
            policy_noise=config.td3.policy_noise * scale,
            noise_clip=config.td3.noise_clip * scale,
            loss_function="l2",  # Fujimoto's and SB3's mean squared error
            deactivate_vmap=not config.optim.compile,  # as sac.vmap_qnets=false when eager
        )
        self.loss.set_keys(priority=PRIORITY_KEY)
        make_value_estimator(self.loss, config.optim, device)
        mask_padded_steps(self.loss, config.replay)
        self.target_updater = SoftUpdate(self.loss, tau=config.td3.tau)
        # One optimizer over actor and critics: each step gives gradients to one of them
        # only (the actor loss reads detached critics), and Adam leaves a parameter without
        # a gradient untouched, its moments and step count too, as separate optimizers do.
        self.optimizer = make_adam(self.loss.parameters(), config.optim)
        # TD3Loss's two halves, each a step of its own: most steps need no actor loss.
        self.critic_loss = LossTerm(self.loss.value_loss)
        self.actor_loss = LossTerm(self.loss.actor_loss)
        self.critic_step = accelerate(
            self.critic_step, config.optim, self.check_device, self.critic_loss
        )
        self.actor_step = accelerate(
            self.actor_step, config.optim, self.check_device, self.actor_loss
        )
        self.delayed = DelayedUpdates(config.td3.policy_delay, device)

    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """A critic step on ``batch`` then, at every ``td3.policy_delay``-th (from the
        first), an actor step on the same batch and the soft target updates. The metrics
        carry the latest actor loss."""
        due = self.delayed.due()
        metrics = self.critic_step(batch)
        if due:
            self.delayed.loss_actor = self.actor_step(batch)["loss_actor"].clone()
        self.delayed.critic_updates += 1
        return metrics.set("loss_actor", self.delayed.loss_actor)

    def critic_step(self, batch: TensorDictBase) -> TensorDictBase:
        """The critics' step: the smaller target Q-value at the target actor's action plus
        clipped noise, bootstrapped as ``optim.target`` says. Priorities: the larger squared
        TD error of the two critics, as ``TD3Loss`` writes them."""
        loss_qvalue, metadata = self.critic_loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss_qvalue.backward()
        self.optimizer.step()
        return TensorDict(
            {
                "loss_qvalue": loss_qvalue.detach(),
                "q_value": metadata["pred_value"].mean(),
                PRIORITY_KEY: metadata["td_error"].detach().amax(0),
            }
        )

    def actor_step(self, batch: TensorDictBase) -> TensorDictBase:
        """The actor's step (maximising the first critic's value of its action), then the
        soft updates of the target actor and critics."""
        loss_actor, _ = self.actor_loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss_actor.backward()
        self.optimizer.step()
        self.target_updater.step()
        return TensorDict({"loss_actor": loss_actor.detach()})

    def checkpoint_components(self) -> dict[str, Any]:
        # The loss module holds actor, critics and their targets.
        return {
            "td3_networks": self.loss,
            "td3_optimizer": self.optimizer,
            "td3_delayed_updates": self.delayed,
        }
