"""Deterministic evaluation with TorchRL's Evaluator."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import Evaluator
from torchrl.envs import EnvBase

from rl_app.config import Config
from rl_app.envs import EVAL_SEED_OFFSET, env_factory, make_env


def evaluate(
    config: Config,
    policy_factory: Callable[..., TensorDictModuleBase],
    policy: TensorDictModuleBase,
) -> float:
    """Mean return of ``eval.episodes`` episodes played with ``policy``'s current weights and
    its deterministic action (the mode of its distribution).

    The Evaluator builds its own env and its own policy copy, so evaluation never touches
    the learner's modules (the loop keeps the copy's initial weights off the learner's
    random stream). A fresh one each time replays the same seeded episode starts, so that
    scores compare across evaluations and across resumes."""
    evaluator = Evaluator(
        env_factory(
            dataclasses.replace(config.env, num_envs=1),
            config.seed + EVAL_SEED_OFFSET,
            network=config.network,
        ),
        policy_factory=policy_factory,
        num_trajectories=config.eval.episodes,
        max_steps=None,  # the env's StepCounter and time limit end episodes
        collector_kwargs={"traj_format": "cat"},
        backend="thread",
    )
    try:
        return float(evaluator.evaluate(policy)["eval/reward"])
    finally:
        evaluator.shutdown()


def evaluation_env(
    config: Config, seed: int | None = None, render_mode: str | None = None
) -> EnvBase:
    """An env whose next episodes are those :func:`evaluate` plays, in the same order (with
    ``seed``, other ones), for replaying them without an Evaluator.

    It is seeded as the evaluation's env and reset once: the Evaluator's collector resets
    its env when it is built, then again before collecting, so the first reset's episode
    is never played."""
    env = make_env(
        dataclasses.replace(config.env, num_envs=1),
        config.seed + EVAL_SEED_OFFSET if seed is None else seed,
        render_mode=render_mode,
        network=config.network,
    )
    env.reset()
    return env
