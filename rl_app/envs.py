"""Environments: a Gymnasium env wrapped by TorchRL with the transforms every run uses."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torchrl.envs import (
    Compose,
    DoubleToFloat,
    EnvBase,
    GymEnv,
    InitTracker,
    RewardSum,
    StepCounter,
    TransformedEnv,
)

from rl_app.config import EnvConfig

# Evaluation episodes use seeds far from the training ones, so that the agent is scored on
# starts it did not necessarily train from.
EVAL_SEED_OFFSET = 1_000_003


def make_env(env: EnvConfig, seed: int, device: str | torch.device = "cpu") -> EnvBase:
    """One seeded environment: float observations, a step counter, the episode return
    (``episode_reward``) and ``is_init`` flags at episode starts."""
    base = GymEnv(env.name, device=device)
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
