"""Deterministic evaluation: its episodes played side by side, one per env of a batch."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from tensordict.nn import TensorDictModuleBase
from torchrl.envs import EnvBase, SerialEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rl_app.config import Config
from rl_app.envs import EVAL_SEED_OFFSET, SUCCESS_KEY, make_env
from rl_app.logger import EVAL_KEY, SUCCESS_RATE_KEY
from rl_app.upstream.torchrl import close_keeping_threads, gymnasium_env


@dataclasses.dataclass
class Episodes:
    returns: torch.Tensor  # float32, one per episode
    reached_goal: torch.Tensor | None  # in a goal env: whether each one's last step did


def no_stop() -> None:
    """An abandon point that never abandons: evaluation with no stop to heed."""


def evaluate(
    config: Config,
    policy_factory: Callable[..., TensorDictModuleBase],
    policy: TensorDictModuleBase,
    abandon_point: Callable[[], None] = no_stop,
) -> dict[str, float]:
    """Mean return (``EVAL_KEY``) of ``eval.episodes`` episodes played with ``policy``'s
    current weights and its deterministic action (the mode of its distribution); in a goal
    env, also the share of them whose last step reached the goal (``SUCCESS_RATE_KEY``).

    A copy of the policy (from ``policy_factory``) plays, so evaluation never touches the
    learner's modules. Every evaluation plays the same seeded episodes (:func:`play_episodes`),
    so that scores compare across evaluations and across resumes.

    ``abandon_point`` is called between its steps, and may raise to drop it
    (:meth:`rl_app.interrupts.StopRequest.abandon_point`)."""
    actor = policy_factory()
    abandon_point()
    actor.load_state_dict(policy.state_dict())
    episodes = play_episodes(config, actor, config.eval.episodes, abandon_point=abandon_point)
    scores = {EVAL_KEY: episodes.returns.mean().item()}
    if episodes.reached_goal is not None:
        scores[SUCCESS_RATE_KEY] = episodes.reached_goal.double().mean().item()  # 9 of 10: 0.9
    return scores


def play_episodes(
    config: Config,
    policy: TensorDictModuleBase,
    episodes: int,
    seed: int | None = None,
    abandon_point: Callable[[], None] = no_stop,
) -> Episodes:
    """The first ``episodes`` evaluation episodes (with ``seed``, those of an evaluation
    seeded so), played by ``policy`` deterministically in a batch of envs, episode k in
    env k (:func:`episode_env`), until each has ended once.

    The policy acts on the whole batch at every step. Where it still explores
    (``dqn.eval_eps``), it draws from torch's generator seeded with the env seed, so
    episode k's draws depend only on k and on ``episodes``, not on the learner's state."""
    seed = evaluation_seed(config) if seed is None else seed
    starts = episode_starts(config, seed, episodes, abandon_point)
    # One factory for all (with each env's own arguments): SerialEnv then builds one env,
    # not each, to learn their specs.
    env = SerialEnv(
        episodes,
        functools.partial(episode_env, config, seed, abandon_point=abandon_point),
        create_env_kwargs=[{"index": k, "start": start} for k, start in enumerate(starts)],
    )
    playing = torch.ones(episodes, 1, dtype=torch.bool)
    returns = torch.zeros(episodes)
    reached_goal = torch.zeros(episodes, dtype=torch.bool)
    goal_env = SUCCESS_KEY in env.observation_spec.keys()
    try:
        with (
            torch.no_grad(),
            set_exploration_type(ExplorationType.DETERMINISTIC),
            torch.random.fork_rng(),
        ):
            torch.manual_seed(seed)
            state = env.reset()
            while playing.any():
                abandon_point()
                # "_step": ended episodes' envs take no more steps (TorchRL's partial steps).
                state = env.step(policy(state).set("_step", playing))
                ends = (state["next", "done"] & playing).squeeze(-1)
                returns[ends] = state["next", "episode_reward"][ends].squeeze(-1)
                if goal_env:
                    reached_goal[ends] = state["next", SUCCESS_KEY][ends].squeeze(-1)
                playing &= ~state["next", "done"]
                state = env.step_mdp(state)
    finally:
        close_keeping_threads(env)
    return Episodes(returns, reached_goal if goal_env else None)


def evaluation_seed(config: Config) -> int:
    return config.seed + EVAL_SEED_OFFSET


def episode_starts(
    config: Config, seed: int, episodes: int, abandon_point: Callable[[], None] = no_stop
) -> list[dict[str, Any]]:
    """The random state each of the first ``episodes`` evaluation episodes starts from.

    Episode k is the k-th that one env seeded ``seed`` plays one after another, after a
    first reset never played (a collector's, when built): the order of the evaluations
    made before they were batched, whose scores then still compare. A reset draws an
    episode's start from the env's generator and steps draw nothing from it, so replaying
    the resets alone gives each episode's start."""
    env = make_env(dataclasses.replace(config.env, num_envs=1), seed)
    gym_env = gymnasium_env(env)
    env.reset()
    starts = []
    try:
        for _ in range(episodes):
            abandon_point()
            env.reset()
            starts.append(gym_env.random_state_before_reset)
    finally:
        env.close()
    return starts


def episode_env(
    config: Config,
    seed: int,
    index: int,
    start: dict[str, Any],
    render_mode: str | None = None,
    abandon_point: Callable[[], None] = no_stop,
) -> EnvBase:
    """An env whose next episode is evaluation episode ``index``, starting from ``start``
    (:func:`episode_starts`). It is seeded ``seed + index``: an Atari emulator, which draws
    its sticky actions from its own generator at every step, then plays each episode with
    a generator of its own. ``abandon_point`` is called first (a batch of 100 Atari envs
    takes seconds to build)."""
    abandon_point()
    env = make_env(
        dataclasses.replace(config.env, num_envs=1),
        seed + index,
        render_mode=render_mode,
        network=config.network,
    )
    gymnasium_env(env).unwrapped.np_random.bit_generator.state = start
    return env


def evaluation_env(
    config: Config, seed: int | None = None, render_mode: str | None = None
) -> EnvBase:
    """An env whose next episode is the evaluation's first (with ``seed``, that of an
    evaluation seeded so), for replaying it without a batch, e.g. to film it."""
    seed = evaluation_seed(config) if seed is None else seed
    return episode_env(config, seed, 0, episode_starts(config, seed, 1)[0], render_mode)
