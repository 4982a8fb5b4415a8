"""Evaluation plays its episodes in a batch of envs: each the episode that one env, seeded
once and played episode after episode, plays (as evaluation did before it was batched)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from tensordict.nn import TensorDictModuleBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rl_app.algorithms import make_policy
from rl_app.envs import EVAL_SEED_OFFSET, SUCCESS_KEY, make_env
from rl_app.evaluation import Episodes, evaluate, evaluation_env, play_episodes
from rl_app.logger import EVAL_KEY, SUCCESS_RATE_KEY
from rl_app.video import episode_horizon

EPISODES = 3
# A batch's matrix products round differently from one row's: SAC's continuous actions
# differ in their last bits, and so its returns, by this much at most (relative).
CONTINUOUS_RTOL = 1e-3


def sequential_episodes(config, policy: TensorDictModuleBase, episodes: int) -> Episodes:
    """The reference: one env seeded as the evaluation's, reset once (the collector's reset
    when built, never played), then its episodes one after another."""
    env = make_env(
        dataclasses.replace(config.env, num_envs=1),
        config.seed + EVAL_SEED_OFFSET,
        network=config.network,
    )
    env.reset()
    horizon = episode_horizon(config.env.name)
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        played = [env.rollout(horizon, policy, break_when_any_done=True) for _ in range(episodes)]
    env.close()
    returns = torch.stack([episode["next", "episode_reward"][-1, 0] for episode in played])
    if ("next", SUCCESS_KEY) not in played[0].keys(include_nested=True):
        return Episodes(returns, None)
    return Episodes(
        returns, torch.stack([episode["next", SUCCESS_KEY][-1, 0] for episode in played])
    )


def fresh_policy(config) -> TensorDictModuleBase:
    env = make_env(dataclasses.replace(config.env, num_envs=1), config.seed, network=config.network)
    policy = make_policy(config, env)
    env.close()
    return policy.eval()


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("default", []),
        ("dqn_cartpole", []),
        ("rdqn_cartpole_masked", []),
        ("dqn_atari100k", ["dqn.eval_eps=0", "env.max_episode_steps=150", "optim.batch_size=60"]),
        ("sac_pointreach", []),
        ("dqn_bitflip", []),
    ],
    ids=[
        "pendulum-sac",
        "cartpole-dqn",
        "masked-cartpole-recurrent-dqn",
        "pong-dqn-greedy",
        "pointreach-sac",
        "bitflip-dqn",
    ],
)
def test_batched_episodes_are_the_sequential_ones(tiny_config, preset, overrides) -> None:
    config = tiny_config(*overrides, preset=preset)
    policy = fresh_policy(config)
    batched = play_episodes(config, policy, EPISODES)
    sequential = sequential_episodes(config, policy, EPISODES)
    if config.algo == "sac":
        torch.testing.assert_close(
            batched.returns, sequential.returns, rtol=CONTINUOUS_RTOL, atol=0
        )
    else:  # greedy actions: the same, bit for bit
        assert batched.returns.tolist() == sequential.returns.tolist()
    if sequential.reached_goal is None:
        assert batched.reached_goal is None
    else:
        assert batched.reached_goal.tolist() == sequential.reached_goal.tolist()


def test_evaluate_scores_the_mean_return_and_success_rate(tiny_config) -> None:
    config = tiny_config("eval.episodes=4", preset="dqn_bitflip")
    policy = fresh_policy(config)
    reference = sequential_episodes(config, policy, 4)
    factory = lambda: fresh_policy(config)  # noqa: E731 - fresh weights, then the policy's
    scores = evaluate(config, factory, policy)
    assert scores[EVAL_KEY] == reference.returns.mean().item()
    assert scores[SUCCESS_RATE_KEY] == reference.reached_goal.float().mean().item()


def test_an_exploring_evaluation_plays_the_same_episodes_every_time(tiny_config) -> None:
    config = tiny_config("dqn.eval_eps=0.5", preset="dqn_cartpole")
    policy = fresh_policy(config)
    first = play_episodes(config, policy, EPISODES)
    torch.rand(7)  # the learner's generator moves on between evaluations
    assert play_episodes(config, policy, EPISODES).returns.tolist() == first.returns.tolist()
    # Exploring changed the greedy episodes: the draws are not ignored.
    assert first.returns.tolist() != sequential_episodes(config, policy, EPISODES).returns.tolist()


def test_evaluation_env_plays_the_first_episode(tiny_config) -> None:
    config = tiny_config(preset="dqn_cartpole")
    policy = fresh_policy(config)
    env = evaluation_env(config)
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        episode = env.rollout(episode_horizon(config.env.name), policy, break_when_any_done=True)
    assert episode["next", "episode_reward"][-1, 0] == play_episodes(config, policy, 1).returns[0]


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Torch on one thread during the test, as a run with ``threads=1`` is."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_an_evaluation_leaves_the_thread_count_and_the_generator_as_they_were(
    tiny_config, one_thread
) -> None:
    """The Evaluator's collector closes its batch of envs, which sets torch's thread count
    (rl_app.upstream.torchrl.keeping_threads), and the evaluation seeds torch's generator:
    the learner sees neither."""
    config = tiny_config(preset="dqn_cartpole")
    policy = fresh_policy(config)
    generator = torch.get_rng_state()
    play_episodes(config, policy, EPISODES)
    assert torch.get_num_threads() == 1
    assert torch.equal(torch.get_rng_state(), generator)


def test_an_evaluation_that_raises_leaves_the_thread_count_as_it_was(
    tiny_config, one_thread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TorchRL's collector closes its batch of envs when a step raises, which sets torch's
    thread count; a sweep worker trains its next trial in the same process."""
    config = tiny_config(preset="dqn_cartpole")
    policy = fresh_policy(config)

    def broken(*args, **kwargs):
        raise RuntimeError("the evaluation env broke")

    monkeypatch.setattr(CartPoleEnv, "step", broken)
    with pytest.raises(RuntimeError, match="the evaluation env broke"):
        play_episodes(config, policy, EPISODES)
    assert torch.get_num_threads() == 1
