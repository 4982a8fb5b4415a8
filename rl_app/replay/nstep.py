"""n-step transitions from sampled slices (``optim.target=nstep_transition``): each slice
of ``replay.slice_len`` steps becomes one transition, its first step's, whose reward is
the discounted sum of the slice's rewards and whose next observation is the one after the
slice's last step. A batch of them is the batch of n-step DQN as Rainbow and DrQ(eps)
sample it: as many independent places as transitions, each with an n-step target, where
learning along slices (``optim.target=nstep``) draws a few places and learns every step
of each with the steps left to its end.

The loss bootstraps with ``gamma ** n`` (TorchRL's TD(0) estimator reads the steps to the
next observation from ``"steps_to_next_obs"``) unless the slice's last step terminated.
The slice samplers keep a slice inside one trajectory, so only its last step can end an
episode. With ``env.life_loss_terminal`` a lost life ends a transition too, inside the
slice: its reward sums the steps up to the lost life, it does not bootstrap, and the rest
of the slice is not used (as Dopamine's replay cuts its n-step returns at a terminal). With
frames stored once (:mod:`rl_app.replay.frames`) only the two stacks a transition needs are
rebuilt: its first step's and its last step's next one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDictBase

from rl_app.envs import LIFE_LOST
from rl_app.replay.keys import LOSS_MASK_KEY

# Where TorchRL's value estimators read the steps between an observation and the next one.
STEPS_TO_NEXT_OBS = "steps_to_next_obs"


class NStepTransitions:
    """Sampled slices of ``slice_len`` steps (a flat sample, one slice after the other) ->
    one transition per slice, discounted by ``gamma``; ``stack`` rebuilds a sample's frame
    stacks when the buffer stores frames once (None: it stores whole observations)."""

    def __init__(
        self,
        gamma: float,
        slice_len: int,
        stack: Callable[[TensorDictBase], TensorDictBase] | None = None,
    ) -> None:
        self.slice_len = slice_len
        self.discounts = gamma ** torch.arange(slice_len, dtype=torch.float32)
        self.stack = stack

    def __call__(self, sample: TensorDictBase) -> TensorDictBase:
        slices = sample.reshape(-1, self.slice_len)
        rewards = slices["next", "reward"]
        discounts = self.discounts.to(rewards.device).expand(len(slices), -1)
        lost = slices.get(("next", LIFE_LOST), None)
        if lost is None:
            first, last = slices[:, 0].clone(), slices[:, -1].clone()
            steps = torch.full_like(rewards[:, 0], self.slice_len)
        else:  # each transition ends at its slice's first lost life, if any
            lost = lost.reshape(len(slices), -1)
            ends = torch.where(lost.any(dim=1), lost.int().argmax(dim=1), self.slice_len - 1)
            kept = torch.arange(self.slice_len, device=ends.device) <= ends[:, None]
            discounts = discounts * kept
            rows = torch.arange(len(slices), device=ends.device)
            first, last = slices[:, 0].clone(), slices[rows, ends]
            steps = (ends + 1).to(rewards.dtype).reshape(rewards[:, 0].shape)
            for key in ("terminated", "done"):
                last["next", key] = last["next", key] | last["next", LIFE_LOST]
        if self.stack is not None:
            first, last = self.stack(first), self.stack(last)
        discounts = discounts.reshape(*discounts.shape, *[1] * (rewards.ndim - 2))
        first["next"] = last["next"]  # the observation after the transition, how it ended
        first["next", "reward"] = (rewards * discounts).sum(dim=1)
        first[STEPS_TO_NEXT_OBS] = steps
        if LOSS_MASK_KEY in first.keys():  # a stack that could not be rebuilt whole
            first[LOSS_MASK_KEY] = first[LOSS_MASK_KEY] & last[LOSS_MASK_KEY]
        return first
