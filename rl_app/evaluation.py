"""Deterministic evaluation with TorchRL's Evaluator."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import Evaluator
from torchrl.envs import EnvBase

from rl_app.config import Config
from rl_app.envs import EVAL_SEED_OFFSET, SUCCESS_KEY, env_factory, make_env
from rl_app.logger import EVAL_KEY, SUCCESS_RATE_KEY


def evaluate(
    config: Config,
    policy_factory: Callable[..., TensorDictModuleBase],
    policy: TensorDictModuleBase,
) -> dict[str, float]:
    """Mean return (``EVAL_KEY``) of ``eval.episodes`` episodes played with ``policy``'s
    current weights and its deterministic action (the mode of its distribution); in a goal
    env, also the share of them whose last step reached the goal (``SUCCESS_RATE_KEY``).

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
        metrics_fn=success_rate,
    )
    try:
        metrics = evaluator.evaluate(policy)
    finally:
        evaluator.shutdown()
    # The Evaluator names its metrics "eval/<name>", metrics_fn's among them.
    scores = {EVAL_KEY: float(metrics["eval/reward"])}
    if SUCCESS_RATE_KEY in metrics:
        scores[SUCCESS_RATE_KEY] = float(metrics[SUCCESS_RATE_KEY])
    return scores


def success_rate(episodes: TensorDictBase) -> dict[str, float]:
    """The share of ``episodes`` (whole ones, one after the other) whose last step reached
    the goal, in a goal env (SUCCESS_KEY); nothing in others."""
    if ("next", SUCCESS_KEY) not in episodes.keys(include_nested=True):
        return {}
    ends = episodes["next", "done"]
    reached = episodes["next", SUCCESS_KEY][ends]
    return {"success_rate": reached.double().mean().item()}  # 9 of 10 reads 0.9


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
