"""The goal-conditioned envs: their registration, spaces, rewards, episode ends and seeding."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rl_app.envs.goals import (
    BIT_FLIP_IDS,
    POINT_EPISODE_STEPS,
    POINT_MAX_STEP,
    POINT_REACH_ID,
    POINT_SUCCESS_DISTANCE,
)

ALL_IDS = [*BIT_FLIP_IDS.values(), POINT_REACH_ID]
GOAL_KEYS = {"observation", "achieved_goal", "desired_goal"}


def make(env_id: str, **kwargs: Any) -> gym.Env:
    """The env as the trainer's ``env.name`` names it: ``module:id``."""
    return gym.make(f"rl_app.envs.goals:{env_id}", **kwargs)


def bit_flip_start(seed: int) -> tuple[gym.Env, dict[str, np.ndarray]]:
    env = make(BIT_FLIP_IDS[10])
    observation, _ = env.reset(seed=seed)
    return env, observation


def steer_to_goal(observation: dict[str, np.ndarray]) -> np.ndarray:
    """The point env's action towards its goal, as far as one step goes."""
    return (observation["desired_goal"] - observation["achieved_goal"]) / POINT_MAX_STEP


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_envs_pass_gymnasiums_checker(env_id: str) -> None:
    # Among its checks: observations lie in their space and a seeded reset repeats itself.
    check_env(make(env_id).unwrapped, skip_render_check=True)


@pytest.mark.parametrize(("env_id", "size"), [(env_id, n) for n, env_id in BIT_FLIP_IDS.items()])
def test_bit_flip_observes_its_bits_and_ends_after_as_many_steps(env_id: str, size: int) -> None:
    env = make(env_id)
    assert env.spec.max_episode_steps == size and env.action_space == gym.spaces.Discrete(size)
    observation, _ = env.reset(seed=0)
    assert set(env.observation_space.spaces) == GOAL_KEYS
    for key in GOAL_KEYS:
        assert observation[key].dtype == np.float32 and observation[key].shape == (size,)
        assert set(np.unique(observation[key])) <= {0.0, 1.0}
    assert np.array_equal(observation["observation"], observation["achieved_goal"])


def test_flipping_the_differing_bits_reaches_the_goal() -> None:
    env, observation = bit_flip_start(seed=1)
    differing = np.flatnonzero(observation["achieved_goal"] != observation["desired_goal"])
    assert len(differing) >= 2
    for bit in differing[:-1]:
        before = observation["observation"].copy()
        observation, reward, terminated, truncated, info = env.step(bit)
        assert np.flatnonzero(observation["observation"] != before).tolist() == [bit]
        assert (reward, terminated, truncated, info["is_success"]) == (-1.0, False, False, False)
    observation, reward, terminated, truncated, info = env.step(differing[-1])
    assert np.array_equal(observation["achieved_goal"], observation["desired_goal"])
    assert (reward, terminated, info["is_success"]) == (0.0, True, True)


def test_bit_flip_is_truncated_after_n_bits_steps_without_success() -> None:
    env, observation = bit_flip_start(seed=1)
    goal = observation["desired_goal"]
    bit = int(np.flatnonzero(observation["achieved_goal"] == goal)[0])  # leave it, come back
    endings = [env.step(bit)[2:4] for _ in range(10)]
    assert endings == [(False, False)] * 9 + [(False, True)]


def test_another_bit_count_through_make() -> None:
    env = make(BIT_FLIP_IDS[10], n_bits=5, max_episode_steps=5)
    observation, _ = env.reset(seed=0)
    assert observation["desired_goal"].shape == (5,) and env.action_space.n == 5
    assert [env.step(0)[3] for _ in range(5)] == [False] * 4 + [True]


def test_point_moves_by_its_clipped_action_and_stays_in_the_square() -> None:
    env = make(POINT_REACH_ID)
    observation, _ = env.reset(seed=0)
    start = observation["observation"]
    observation, *_ = env.step(np.array([5.0, -0.5], dtype=np.float32))
    expected = np.clip(start + np.array([1.0, -0.5]) * POINT_MAX_STEP, -1, 1)
    np.testing.assert_allclose(observation["observation"], expected, atol=1e-6)
    for _ in range(25):
        observation, *_ = env.step(np.array([1.0, 1.0], dtype=np.float32))
    np.testing.assert_array_equal(observation["observation"], [1.0, 1.0])
    assert env.observation_space.contains(observation)


def test_point_succeeds_near_its_goal_and_runs_to_its_step_limit() -> None:
    env = make(POINT_REACH_ID)
    observation, _ = env.reset(seed=0)
    rewards, successes, endings = [], [], []
    for _ in range(POINT_EPISODE_STEPS):
        observation, reward, terminated, truncated, info = env.step(steer_to_goal(observation))
        rewards.append(reward)
        successes.append(info["is_success"])
        endings.append((terminated, truncated))
    distance = np.linalg.norm(observation["achieved_goal"] - observation["desired_goal"])
    assert distance < POINT_SUCCESS_DISTANCE
    assert rewards[0] == -1.0 and rewards[-1] == 0.0  # the start is farther than one step
    assert successes == [reward == 0.0 for reward in rewards]
    assert endings == [(False, False)] * (POINT_EPISODE_STEPS - 1) + [(False, True)]


def play(env: gym.Env, seed: int, steps: int) -> list[tuple[Any, ...]]:
    """``steps`` steps from a reset seeded ``seed``, half towards the goal and half random
    (the action space seeded alike): each next observation with its reward and whether
    it terminated."""
    env.action_space.seed(seed)
    observation, _ = env.reset(seed=seed)
    transitions = []
    for step in range(steps):
        steer = env.spec.id == POINT_REACH_ID and step % 2 == 0
        action = steer_to_goal(observation) if steer else env.action_space.sample()
        observation, reward, terminated, truncated, _ = env.step(action)
        transitions.append((observation, reward, terminated))
        if terminated or truncated:
            observation, _ = env.reset()
    return transitions


@pytest.mark.parametrize("env_id", [BIT_FLIP_IDS[10], POINT_REACH_ID])
def test_compute_reward_and_terminated_over_a_batch_match_the_steps(env_id: str) -> None:
    env = make(env_id)
    transitions = play(env, seed=0, steps=2_000)
    achieved = np.stack([observation["achieved_goal"] for observation, *_ in transitions])
    desired = np.stack([observation["desired_goal"] for observation, *_ in transitions])
    rewards = np.array([reward for _, reward, _ in transitions], dtype=np.float32)
    terminated = np.array([ended for *_, ended in transitions])
    infos = [{}] * len(transitions)
    batch = env.unwrapped.compute_reward(achieved, desired, infos)
    assert batch.dtype == np.float32 and batch.shape == rewards.shape
    np.testing.assert_array_equal(batch, rewards)
    assert set(rewards.tolist()) == {0.0, -1.0}
    np.testing.assert_array_equal(
        env.unwrapped.compute_terminated(achieved, desired, infos), terminated
    )
    # Bit flipping ends where its goal is reached; the point runs on.
    assert terminated.any() == (env_id != POINT_REACH_ID)


@pytest.mark.parametrize("env_id", [BIT_FLIP_IDS[10], POINT_REACH_ID])
def test_a_seeded_reset_repeats_its_episodes(env_id: str) -> None:
    def observations(seed: int) -> list[np.ndarray]:
        transitions = play(make(env_id), seed, steps=60)
        return [np.concatenate(list(observation.values())) for observation, *_ in transitions]

    assert np.array_equal(observations(7), observations(7))
    assert not np.array_equal(observations(7), observations(8))
