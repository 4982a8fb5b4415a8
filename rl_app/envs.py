"""Environments: a Gymnasium env wrapped by TorchRL with the transforms every run uses."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch
from torchrl.envs import (
    Compose,
    DoubleToFloat,
    EnvBase,
    GymWrapper,
    InitTracker,
    RewardSum,
    StepCounter,
    TransformedEnv,
)

from rl_app.config import EnvConfig

# Evaluation episodes use seeds far from the training ones, so that the agent is scored on
# starts it did not necessarily train from.
EVAL_SEED_OFFSET = 1_000_003
# Collector i (a worker process or a collection job) seeds its env with seed + i * stride:
# distinct, reproducible episodes.
WORKER_SEED_STRIDE = 10_007


def worker_seed(seed: int, worker: int) -> int:
    """The env seed of collector ``worker`` in a run seeded with ``seed``."""
    return seed + worker * WORKER_SEED_STRIDE


class ReplayableReset(gym.Wrapper):
    """Remembers the random state each episode started from, and whether the episode has
    taken a step yet: a checkpoint taken at an episode start can then replay its reset."""

    def reset(self, **kwargs: Any) -> Any:
        self.random_state_before_reset = self.unwrapped.np_random.bit_generator.state
        self.steps_since_reset = 0
        return super().reset(**kwargs)

    def step(self, action: Any) -> Any:
        self.steps_since_reset += 1
        return super().step(action)


def make_env(
    env: EnvConfig, seed: int, device: str | torch.device = "cpu", render_mode: str | None = None
) -> EnvBase:
    """One seeded environment: float observations, a step counter, the episode return
    (``episode_reward``) and ``is_init`` flags at episode starts.

    With ``env.num_envs > 1`` it is a batch of envs stepped together in this process (a
    Gymnasium ``SyncVectorEnv``): one policy call and one TorchRL step serve them all. Its
    envs reset one by one when their episodes end (TorchRL asks for partial resets, so the
    vector env's own autoreset is off). ``render_mode`` (one env only) is Gymnasium's, e.g.
    ``"rgb_array"`` for videos."""
    if env.num_envs == 1:
        gym_env = ReplayableReset(gym.make(env.name, render_mode=render_mode))
    else:
        gym_env = gym.vector.SyncVectorEnv(
            [functools.partial(gym.make, env.name)] * env.num_envs,
            autoreset_mode=gym.vector.AutoresetMode.DISABLED,
        )
    base = GymWrapper(gym_env, device=device)
    transformed = TransformedEnv(
        base, Compose(DoubleToFloat(), StepCounter(), RewardSum(), InitTracker())
    )
    transformed.set_seed(seed)
    return transformed


def env_factory(
    env: EnvConfig, seed: int, device: str | torch.device = "cpu"
) -> Callable[[], EnvBase]:
    """A picklable zero-argument factory, as collectors and the Evaluator expect."""
    return functools.partial(make_env, env, seed, device)
