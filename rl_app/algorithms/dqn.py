"""DQN for discrete actions: a Q-network acting greedily, with epsilon-greedy exploration
annealed over collected frames and a target network copied every few updates.

With ``network.recurrent=lstm`` the Q-network is recurrent (an MLP embedding, an LSTM, a
one-layer MLP Q-head): it acts with its state carried through the episode by the env
(stored with every frame), and learns from sampled sequences, unrolled from each one's
stored state.

An Atari game's Q-network is the Nature CNN, reading stacks of frames that the replay
buffer stores once (:mod:`rl_app.replay.frames`)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import nn
from torchrl.data import TensorSpec
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, exploration_type, set_exploration_type
from torchrl.modules import (
    MLP,
    ConvNet,
    DuelingCnnDQNet,
    EGreedyModule,
    LSTMModule,
    QValueActor,
    QValueModule,
    set_recurrent_mode,
)
from torchrl.objectives import DQNLoss, HardUpdate

from rl_app.algorithms.base import (
    Algorithm,
    accelerate,
    make_adam,
    make_value_estimator,
    mask_padded_steps,
    network_inputs,
)
from rl_app.config import Config, ConfigError, DQNConfig, NetworkConfig
from rl_app.envs import FRAME_STACK, PIXELS_KEY, RECURRENT_STATE_KEYS, observes_frames
from rl_app.replay.keys import PRIORITY_KEY
from rl_app.upstream.torchrl_sequences import unrolling_view

# The Nature CNN's convolutions (Mnih et al., 2015): 84x84 frames come out as 64 maps of
# 7x7, read by a 512-unit layer.
NATURE_CONVOLUTIONS = {"num_cells": [32, 64, 64], "kernel_sizes": [8, 4, 3], "strides": [4, 2, 1]}
NATURE_FEATURES = 64 * 7 * 7
NATURE_HIDDEN = 512


class ScaledFrames(nn.Module):
    """uint8 frames to floats in [0, 1]: the buffer and the batches keep bytes. With
    ``channels_last`` each image comes out in that memory format (its channels innermost),
    laid out so while it is still bytes."""

    def __init__(self, channels_last: bool = False) -> None:
        super().__init__()
        self.channels_last = channels_last

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            frames = frames.movedim(-3, -1).contiguous().movedim(-1, -3)
        return frames.float().div_(255)  # in place: one float copy of the stacks, not two


def nature_cnn(actions: int, channels_last: bool = False, dueling: bool = False) -> nn.Sequential:
    """[..., FRAME_STACK, 84, 84] uint8 frames -> a Q-value per action, its convolutions in
    the channels-last memory format with ``channels_last``; with ``dueling``, the sum of a
    state value and the action's advantage less their mean, each read from the
    convolutions by its own hidden layer."""
    convolutions = {"in_features": FRAME_STACK, "activation_class": nn.ReLU, **NATURE_CONVOLUTIONS}
    head = {
        "in_features": NATURE_FEATURES,
        "num_cells": [NATURE_HIDDEN],
        "activation_class": nn.ReLU,
    }
    if dueling:  # ReLUs as DrQ(eps)'s network (TorchRL's default is ELU)
        q_values = [DuelingCnnDQNet(actions, 1, cnn_kwargs=convolutions, mlp_kwargs=head)]
    else:
        q_values = [ConvNet(**convolutions), MLP(out_features=actions, **head)]
    network = nn.Sequential(ScaledFrames(channels_last), *q_values)
    if channels_last:  # the convolutions' weights; the Linear layers' have no such format
        network.to(memory_format=torch.channels_last)
    return network


class EvaluationEpsilon(EGreedyModule):
    """Epsilon-greedy with a fixed epsilon, acting only where the policy does not explore
    (evaluation, playing): a greedy agent can stall a game (Breakout waits for FIRE)."""

    def __init__(self, action_spec: TensorSpec, eps: float) -> None:
        super().__init__(action_spec, eps_init=eps, eps_end=eps)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if exploration_type() in (ExplorationType.RANDOM, None):
            return tensordict  # collecting: the annealed exploration has acted
        with set_exploration_type(ExplorationType.RANDOM):
            return super().forward(tensordict)


def make_qvalue_actor(
    network: NetworkConfig,
    dqn: DQNConfig,
    observation_dim: int | None,
    goal_dim: int | None,
    action_spec: TensorSpec,
) -> TensorDictModuleBase:
    """Observation -> Q-value of every action -> greedy action: an MLP (over the
    observation and the desired goal where the env observes one, ``goal_dim``), or with
    ``network.recurrent=lstm`` an MLP embedding, an LSTM and a one-layer MLP Q-head; the
    Nature CNN for stacked frames (``observation_dim`` None), in the channels-last memory
    format with ``dqn.channels_last``, with a dueling head with ``dqn.dueling``.

    The LSTM reads its state from ``RECURRENT_STATE_KEYS`` and writes the next one under
    ``("next", key)``; one step at a time it starts from zeros where ``is_init`` marks an
    episode start. In recurrent mode (``set_recurrent_mode(True)``) it unrolls a
    ``[sequences, steps]`` batch from each sequence's first stored state."""
    actions = action_spec.shape[-1]
    if observation_dim is None:
        return QValueActor(
            nature_cnn(actions, dqn.channels_last, dqn.dueling),
            in_keys=[PIXELS_KEY],
            spec=action_spec,
        )
    if network.recurrent == "none":
        in_keys, in_features = network_inputs(observation_dim, goal_dim)
        qnetwork = MLP(
            in_features=in_features,
            out_features=actions,
            num_cells=network.hidden_sizes,
            activation_class=nn.ReLU,
        )
        return QValueActor(qnetwork, in_keys=in_keys, spec=action_spec)
    embedding = MLP(
        in_features=observation_dim,
        out_features=network.hidden_sizes[-1],
        num_cells=network.hidden_sizes[:-1],
        activation_class=nn.ReLU,
        activate_last_layer=True,
    )
    lstm = LSTMModule(
        input_size=network.hidden_sizes[-1],
        hidden_size=network.lstm_size,
        in_keys=["embedding", *RECURRENT_STATE_KEYS],
        out_keys=["features", *(("next", key) for key in RECURRENT_STATE_KEYS)],
    )
    # A ReLU layer after the LSTM: its outputs are bounded, Q-values (tens to a hundred in
    # CartPole) are not, and a linear head alone scales up to them slowly.
    head = MLP(
        in_features=network.lstm_size,
        out_features=actions,
        num_cells=network.hidden_sizes[-1:],
        activation_class=nn.ReLU,
    )
    return TensorDictSequential(
        TensorDictModule(embedding, in_keys=["observation"], out_keys=["embedding"]),
        lstm,
        TensorDictModule(head, in_keys=["features"], out_keys=["action_value"]),
        QValueModule(spec=action_spec),
    )


def picks_with_online_network(dqn: DQNConfig) -> bool:
    """Whether the loss runs double DQN's pick of the next action by the online network.

    A target copied after every update (``target_update_interval=1``) equals the online
    network at each update, so the online pick is the target's own greedy action and double
    DQN's target is plain DQN's, to the bit: plain DQN gets it with one forward pass of the
    next observations fewer."""
    return dqn.double and dqn.target_update_interval > 1


class DQN(Algorithm):
    """DQN (double by default) with a hard-copied target network."""

    actions = "discrete"
    settings = DQNConfig
    recurrent = True
    goals = True

    @staticmethod
    def make_policy(
        config: Config,
        observation_dim: int | None,
        goal_dim: int | None,
        action_spec: TensorSpec,
    ) -> TensorDictSequential:
        """Q-network -> greedy action, then epsilon-greedy exploration, its epsilon annealed
        linearly over ``dqn.eps_annealing_frames`` by :meth:`EGreedyModule.step`.

        The exploration step acts only when the policy explores (collection); evaluation runs
        it deterministically, which leaves the greedy action, or with ``dqn.eval_eps`` a
        random one that often (:class:`EvaluationEpsilon`)."""
        dqn = config.dqn
        actor = make_qvalue_actor(config.network, dqn, observation_dim, goal_dim, action_spec)
        explore = EGreedyModule(
            action_spec,
            eps_init=dqn.eps_start,
            eps_end=dqn.eps_end,
            annealing_num_steps=dqn.eps_annealing_frames,
        )
        if dqn.eval_eps:
            evaluation = EvaluationEpsilon(action_spec, dqn.eval_eps)
            return TensorDictSequential(actor, explore, evaluation)
        return TensorDictSequential(actor, explore)

    @classmethod
    def check(cls, config: Config) -> None:
        """``dqn.random_shift`` shifts the frames of an env that observes frames, and
        ``dqn.dueling`` is a head of the Nature CNN that reads them; epsilon anneals down
        (TorchRL's EGreedyModule refuses to raise it); a channels-last CNN's weights reach
        no worker through torch.distributed."""
        if config.dqn.eps_start < config.dqn.eps_end:
            raise ConfigError(
                f"dqn.eps_start={config.dqn.eps_start} is not accepted: epsilon anneals from it "
                f"down to dqn.eps_end={config.dqn.eps_end}, so it must be >= dqn.eps_end"
            )
        if observes_frames(config.env.name):
            mode = config.collector.mode
            if config.dqn.channels_last and mode in ("ray", "rpc", "distributed"):
                raise ConfigError(
                    f"dqn.channels_last=true: collector.mode={mode} sends the weights to its "
                    "workers through torch.distributed, which sends contiguous tensors only "
                    "(set dqn.channels_last=false)"
                )
            return
        if config.dqn.random_shift:
            given, off, why = (
                f"random_shift={config.dqn.random_shift}",
                "random_shift=0",
                "shifts frames",
            )
        elif config.dqn.dueling:
            given, off, why = (
                "dueling=true",
                "dueling=false",
                "is a head of the Nature CNN over frames",
            )
        else:
            return
        raise ConfigError(
            f"dqn.{given} {why}: {config.env.name} observes none (set dqn.{off}, or "
            "train on an env of frames, e.g. an Atari game)"
        )

    def __init__(self, config: Config, env: EnvBase, device: torch.device) -> None:
        super().__init__(config, env, device)
        self._dqn = config.dqn
        self._recurrent = config.network.recurrent != "none"
        self.ends_at_lost_lives = config.env.life_loss_terminal
        actor, self.exploration = self.policy[0], self.policy[1]
        self.loss = DQNLoss(
            unrolling_view(actor) if self._recurrent else actor,
            delay_value=True,
            double_dqn=picks_with_online_network(config.dqn),
            loss_function=config.dqn.loss,
            action_space=self._action_spec.to(device),
        )
        self.loss.set_keys(priority=PRIORITY_KEY)
        make_value_estimator(self.loss, config.optim, device)
        mask_padded_steps(self.loss, config.replay, stacked_frames=self._observation_dim is None)
        self.target_updater = HardUpdate(
            self.loss, value_network_update_interval=config.dqn.target_update_interval
        )
        self.optimizer = make_adam(self.loss.parameters(), config.optim)
        self.gradient_step = accelerate(
            self.gradient_step, config.optim, self.check_device, self.loss
        )

    def replay_keys(self) -> list[Any]:
        if self._observation_dim is None:  # stacked frames: stored once, rebuilt when sampled
            from rl_app.replay.frames import frame_replay_keys

            return frame_replay_keys(super().replay_keys())
        return super().replay_keys()

    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """Random shifts of the frames (``dqn.random_shift``), the gradient step, then on
        the host, outside a captured step, the counted target copy and epsilon's metric."""
        if self._dqn.random_shift:
            from rl_app.replay.frames import random_shift

            # Each stack its own shift, the next one's too, as Dopamine's DrQ(eps) draws them.
            for key in (PIXELS_KEY, ("next", PIXELS_KEY)):
                batch[key] = random_shift(batch[key], self._dqn.random_shift)
        metrics = self.gradient_step(batch)
        self.target_updater.step()
        metrics["epsilon"] = self.exploration.eps.clone()
        return metrics

    def gradient_step(self, batch: TensorDictBase) -> TensorDictBase:
        """The TD loss, one backward pass, the gradient clipped to ``dqn.max_grad_norm``,
        one optimizer step; the loss writes each step's TD error into ``batch``."""
        # A recurrent Q-network unrolls each sampled sequence (no effect on an MLP).
        with set_recurrent_mode(self._recurrent):
            losses = self.loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        if self._dqn.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.loss.parameters(), self._dqn.max_grad_norm)
        self.optimizer.step()
        return losses.detach().set(PRIORITY_KEY, batch[PRIORITY_KEY])

    @torch.no_grad()
    def recurrent_states(self, sequences: TensorDictBase) -> TensorDictBase | None:
        if not self._recurrent:
            return None
        embedding, lstm = self.policy[0][0], self.policy[0][1]
        steps = embedding(sequences.select("observation", "is_init", *RECURRENT_STATE_KEYS))
        carried = steps[:, 0].select(*RECURRENT_STATE_KEYS)
        before, after = [], []
        for t in range(steps.shape[1]):
            step = steps[:, t].exclude(*RECURRENT_STATE_KEYS)
            if t > 0:  # an episode start inside the window acts with zeros, as reset stores
                start = step["is_init"].reshape(-1, 1, 1)
                carried = carried.apply(lambda state, start=start: state.masked_fill(start, 0.0))
            step.update(carried)
            before.append(step.select(*RECURRENT_STATE_KEYS))
            carried = lstm(step)["next"].select(*RECURRENT_STATE_KEYS)
            after.append(carried)
        states = torch.stack(before, dim=1)
        states["next"] = torch.stack(after, dim=1)
        return states

    def checkpoint_components(self) -> dict[str, Any]:
        # The loss module holds the Q-network and its target; the exploration module its
        # current epsilon; the target updater counts updates until the next copy.
        return {
            "dqn_networks": self.loss,
            "dqn_optimizer": self.optimizer,
            "dqn_exploration": self.exploration,
            "dqn_target_updater": self.target_updater,
        }
