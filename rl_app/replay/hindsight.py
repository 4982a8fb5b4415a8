"""Hindsight relabelling (``replay.her_ratio``): the first ``her_ratio`` of each sampled
batch takes as desired goal (and next desired goal) what its episode achieved after one
of its steps, picked by ``replay.her_strategy``, with the reward the goal env gives for
it; every sampled transition's ``terminated`` is recomputed for its goal. From a slice
sampler, the share is one of slices, each relabelled with one goal: the one its first step
would get, so that a multi-step target along it is for one goal; its priority is then its
own TD errors under that goal (:func:`rl_app.replay.buffer.write_priorities`).

Built on TorchRL's ``HERReplayBuffer`` (:class:`rl_app.upstream.torchrl_hindsight.HERSampling`),
changing three of its behaviours:

- A relabelled transition keeps TorchRL's stored ``("next", "terminated")``: where an
  episode ends on reaching its goal, the step that reaches the new goal would bootstrap
  past it, and the step that reached the old one would stop bootstrapping. Here
  ``terminated_fn`` recomputes the flag of every sampled transition after the relabelling,
  and a step that now terminates is ``done``; a transition that keeps its goal gets back
  its own flag, where ``terminated_fn`` agrees with the env. A slice sampler's flags travel
  in the sample's info, which TorchRL writes over the data after sampling: they are
  recomputed there too.
- TorchRL draws a goal for each sampled step, so along a slice the goal would change from
  step to step and a multi-step target would mix rewards and values of different goals.
  Here a relabelled slice takes one goal, drawn as its first step's, and each of its steps
  gets the reward and termination of that goal.
- Its relabelled share is the first ``her_ratio`` of one sampler call: drawn for an
  iteration's updates at once, the sample is dealt out so that each batch gets its share.

TorchRL finds episodes in storage order: the steps of the one episode that wraps past the
end of a full ring take goals from their own slot (future) or from the episode before
them (final, episode). Those transitions stay right, reward and termination being
recomputed for whatever goal they get; only their goals are not hindsight ones.

Tests: ``tests/test_her.py``; TorchRL's own behaviour in ``tests/test_her_upstream.py``, and
what this module changes of it in ``tests/test_upstream.py``
(``test_her_still_keeps_the_stored_terminated_flag``,
``test_her_still_draws_a_goal_per_step_of_a_slice``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDictBase

from rl_app.config import ReplayConfig
from rl_app.replay.buffer import RunReplayBuffer
from rl_app.replay.keys import NEXT_ACHIEVED_GOAL
from rl_app.upstream.torchrl_hindsight import HERSampling


class HindsightReplayBuffer(HERSampling, RunReplayBuffer):
    """A buffer relabelling goals as it samples (the module's rule), with the reward
    ``reward_fn`` and the termination ``terminated_fn`` give a transition for its goal."""

    def __init__(
        self,
        reward_fn: Callable[[TensorDictBase], torch.Tensor],
        terminated_fn: Callable[[TensorDictBase], torch.Tensor],
        **kwargs: Any,
    ) -> None:
        super().__init__(reward_fn, **kwargs)
        self.terminated_fn = terminated_fn

    def sample_relabelled(self, batch_size: int) -> tuple[TensorDictBase, dict]:
        if self.slice_len in (None, 1):
            data, info = self.relabelled_per_step(batch_size)
        else:
            data, info = self.not_relabelled(batch_size)
            self.relabel_slices(data, info)
        terminated = self.terminated_fn(data)
        with data.unlock_():
            data.set(("next", "terminated"), terminated)
            data.set(("next", "done"), data["next", "done"] | terminated)
        if ("next", "terminated") in info:
            info[("next", "terminated")] = terminated
            info[("next", "done")] = info[("next", "done")] | terminated
        return data, info

    def relabel_slices(self, data: TensorDictBase, info: dict) -> None:
        """The first ``her_ratio`` of the slices in ``data``, each given one goal: what its
        episode achieved at a step drawn by the strategy from the slice's first step."""
        episode_ends = self.episode_ends()
        index = info["index"][0] if isinstance(info["index"], tuple) else info["index"]
        firsts = torch.as_tensor(index).reshape(-1, self.slice_len)[:, 0].contiguous()
        relabelled = int(len(firsts) * self.her_ratio)
        if len(episode_ends) == 0 or relabelled == 0:
            return
        sources = self.goal_sources(firsts[:relabelled], episode_ends)
        goals = self.storage.get(sources).get(self.achieved_goal_key)
        steps = data[: relabelled * self.slice_len]
        goals = goals.repeat_interleave(self.slice_len, dim=0).to(steps.device)
        with data.unlock_():
            steps.set_(self.goal_key, goals)
            steps.set_(("next", self.goal_key), goals)
            steps.set_(self.reward_key, self.reward_fn(steps))

    def dealt_out(self, sample: TensorDictBase, count: int) -> TensorDictBase:
        """Flat ``sample``'s slices (or transitions) reordered so that, cut into ``count``
        batches, each holds every ``count``-th slice of it: each batch then gets its share
        of the relabelled slices, which come first."""
        return dealt_out(sample, count, self.slice_len or 1)


def dealt_out(sample: TensorDictBase, count: int, slice_len: int) -> TensorDictBase:
    """Flat ``sample``'s slices of ``slice_len`` steps (1: transitions) reordered so that,
    cut into ``count`` batches, each holds every ``count``-th slice of it."""
    slices = sample.reshape(-1, slice_len)
    order = torch.arange(slices.shape[0]).reshape(-1, count).T.reshape(-1)
    return slices[order].reshape(-1)


def hindsight_buffer(
    replay: ReplayConfig, goal_env: gym.Env, **parts: Any
) -> HindsightReplayBuffer:
    """A buffer made of ``parts`` relabelling goals by ``replay.her_ratio`` and
    ``replay.her_strategy``, with the reward and termination of ``goal_env``; its goals
    are drawn from torch's global generator, which checkpoints save too."""
    return HindsightReplayBuffer(
        reward_fn=functools.partial(goal_reward, goal_env),
        terminated_fn=functools.partial(goal_terminated, goal_env),
        her_ratio=replay.her_ratio,
        strategy=replay.her_strategy,
        achieved_goal_key=NEXT_ACHIEVED_GOAL,
        **parts,
    )


def goal_reward(goal_env: gym.Env, transitions: TensorDictBase) -> torch.Tensor:
    """The reward of each transition for its desired goal: ``goal_env.compute_reward`` of
    the goal achieved after its action."""
    reward = goal_env.compute_reward(*goals_of(transitions), [{}] * transitions.numel())
    return as_step_values(reward, transitions, torch.float32)


def goal_terminated(goal_env: gym.Env, transitions: TensorDictBase) -> torch.Tensor:
    """Whether each transition ends its episode under its desired goal:
    ``goal_env.compute_terminated`` of the goal achieved after its action."""
    ended = goal_env.compute_terminated(*goals_of(transitions), [{}] * transitions.numel())
    return as_step_values(ended, transitions, torch.bool)


def goals_of(transitions: TensorDictBase) -> tuple[np.ndarray, np.ndarray]:
    """The goals achieved after each transition's action and the desired ones, as a goal
    env's functions take them."""
    achieved = transitions[NEXT_ACHIEVED_GOAL].reshape(transitions.numel(), -1)
    desired = transitions["desired_goal"].reshape(transitions.numel(), -1)
    return achieved.cpu().numpy(), desired.cpu().numpy()


def as_step_values(
    values: np.ndarray, transitions: TensorDictBase, dtype: torch.dtype
) -> torch.Tensor:
    """One value per transition, shaped as its reward: ``[*batch, 1]``. A goal env may
    answer a constant for every goal (gymnasium-robotics' ``compute_terminated``)."""
    values = np.broadcast_to(np.asarray(values), (transitions.numel(),))
    tensor = torch.as_tensor(values.copy(), dtype=dtype, device=transitions.device)
    return tensor.reshape(*transitions.shape, 1)
