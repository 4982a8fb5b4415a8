"""Deterministic evaluation with TorchRL's Evaluator."""

from __future__ import annotations

from collections.abc import Callable

from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import Evaluator
from torchrl.envs import EnvBase

from rl_app.config import EvalConfig


def make_evaluator(
    eval_config: EvalConfig,
    eval_env_factory: Callable[[], EnvBase],
    policy_factory: Callable[..., TensorDictModuleBase],
) -> Evaluator:
    """An Evaluator that plays ``eval.episodes`` whole episodes with the policy's
    deterministic action (the mode of its distribution).

    It builds its own env and its own copy of the policy, so that evaluation never
    touches the learner's modules; each call hands it the current weights."""
    return Evaluator(
        eval_env_factory,
        policy_factory=policy_factory,
        num_trajectories=eval_config.episodes,
        # The env's StepCounter and TimeLimit already end episodes.
        max_steps=None,
        collector_kwargs={"traj_format": "cat"},
        backend="thread",
    )


def evaluate(evaluator: Evaluator, policy: TensorDictModuleBase, frames: int) -> float:
    """Mean return over the evaluation episodes, with ``policy``'s current weights."""
    result = evaluator.evaluate(policy, step=frames)
    return float(result["eval/reward"])
