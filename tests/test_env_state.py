"""An episode saved mid-way continues exactly: each env kind's state round trip on real
envs (ALE, MuJoCo, classic control, the goal envs), and runs resumed from a checkpoint
taken mid-episode that equal the uninterrupted run."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torchrl.collectors import Collector
from torchrl.envs.utils import RandomPolicy

from rl_app.checkpointing import choose_checkpoint
from rl_app.checks import load_config
from rl_app.collection import CollectorState
from rl_app.config import EnvConfig
from rl_app.envs import make_env, make_gym_env
from rl_app.envs.goals import BIT_FLIP_IDS, POINT_REACH_ID
from rl_app.envs.resumable import ResumableEnv
from rl_app.run import train
from tests import faulty_envs
from tests.helpers import (
    TINY_RUN,
    assert_same_run,
    resume_in_process,
    saved_state,
    train_in_process,
)

# Episodes cut short, so that the steps after a restore cross an episode end and the next
# reset (whose random start comes from the restored generator).
EPISODE_STEPS = 12
STEPS_BEFORE = 7
STEPS_AFTER = 2 * EPISODE_STEPS
ENV_KINDS = {
    "atari": "PongNoFrameskip-v4",
    "mujoco": "HalfCheetah-v5",
    "mujoco-terminating": "Hopper-v5",
    "mujoco-pendulum": "InvertedPendulum-v5",
    "mujoco-ant": "Ant-v5",
    "mujoco-humanoid": "Humanoid-v5",
    "cartpole": "CartPole-v1",
    "pendulum": "Pendulum-v1",
    "mountaincar": "MountainCarContinuous-v0",
    "acrobot": "Acrobot-v1",
    "bitflip": BIT_FLIP_IDS[10],
    "pointreach": POINT_REACH_ID,
}


def resumable(name: str, seed: int) -> ResumableEnv:
    env = ResumableEnv(make_gym_env(EnvConfig(name=name, max_episode_steps=EPISODE_STEPS)))
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def play(env: gym.Env, actions: list) -> list[tuple]:
    """(observation, reward, terminated, truncated) of each step, and the observation of
    each reset at an episode end (with reward 0, neither flag)."""
    steps = []
    for action in actions:
        observation, reward, terminated, truncated, _ = env.step(action)
        steps.append((observation, reward, terminated, truncated))
        if terminated or truncated:
            steps.append((env.reset()[0], 0.0, False, False))
    return steps


def through_a_checkpoint_file(state: dict) -> dict:
    """``state`` as a checkpoint stores and loads it (``weights_only``: tensors and plain
    values only)."""
    file = io.BytesIO()
    torch.save(state, file)
    file.seek(0)
    return torch.load(file, weights_only=True)


def same_steps(first: list[tuple], second: list[tuple]) -> bool:
    return len(first) == len(second) and all(
        np.array_equal(flat(a), flat(b))
        for one, other in zip(first, second, strict=True)
        for a, b in zip(one, other, strict=True)
    )


def flat(value) -> np.ndarray:
    """A value of a step as one array (a goal env's dict observation: its entries, by name)."""
    if isinstance(value, dict):
        return np.concatenate([np.ravel(value[key]) for key in sorted(value)])
    return np.asarray(value)


@pytest.mark.parametrize("name", ENV_KINDS.values(), ids=ENV_KINDS)
def test_an_env_state_restored_into_another_env_continues_exactly(name: str) -> None:
    env = resumable(name, seed=0)
    actions = [env.action_space.sample() for _ in range(STEPS_BEFORE + STEPS_AFTER)]
    play(env, actions[:STEPS_BEFORE])
    state = through_a_checkpoint_file(env.get_state())
    assert state["steps_since_reset"] > 0  # mid-episode
    expected = play(env, actions[STEPS_BEFORE:])

    other = resumable(name, seed=1)  # another episode, another random state
    play(other, actions[:STEPS_BEFORE])
    assert not same_steps(expected, play(other, actions[STEPS_BEFORE:]))  # without a restore
    other.set_state(state)
    assert same_steps(expected, play(other, actions[STEPS_BEFORE:]))
    env.close()
    other.close()


def test_an_env_that_cannot_give_its_state_replays_its_reset_at_an_episode_start() -> None:
    # A subclass of Pendulum that counts steps of its own: not a kind whose state is known.
    env = resumable(faulty_envs.RAISES_AT_1100, seed=0)
    assert env.unsaved_part() == "FaultyPendulum"
    play(env, [env.action_space.sample() for _ in range(EPISODE_STEPS)])  # up to a reset
    at_start = through_a_checkpoint_file(env.get_state())
    actions = [env.action_space.sample() for _ in range(STEPS_BEFORE)]
    expected = play(env, actions)
    assert env.get_state() is None  # mid-episode

    other = resumable(faulty_envs.RAISES_AT_1100, seed=1)
    other.set_state(at_start)
    assert same_steps(expected, play(other, actions))


# -- runs resumed from a checkpoint taken mid-episode ------------------------------------


def saved_step_count(run_dir: Path) -> int:
    """The step of the episode in progress at the newest checkpoint of ``run_dir``."""
    saved = saved_state(choose_checkpoint(run_dir / "checkpoints")[0], "collector")
    return int(saved["next_step"]["step_count"])


# Batches of 100 frames, learning from 200 on.
SHORT_BATCHES = [*TINY_RUN, "collector.frames_per_batch=100", "collector.init_random_frames=200"]
# The Atari 100k preset shrunk: a buffer of 150 slots that wraps, 4 updates per batch.
SMALL_ATARI = [
    "replay.capacity=150",
    "collector.init_random_frames=64",
    "optim.utd_ratio=0.125",
    "eval.episodes=1",
    "logger.backend=none",
]
# Per env kind: the preset, its overrides, where the interrupted run stops (an evaluation
# and a checkpoint there, which the uninterrupted run makes too), and its end.
MID_EPISODE_RUNS = {
    # Pendulum's episodes last 200 steps: the stop at 300 falls at step 100 of the second.
    "classic-control": ("default", SHORT_BATCHES, 300, 600),
    # HalfCheetah cut at 120 steps: the stop at 300 falls at step 60 of the third episode,
    # whose time limit the resumed run reaches.
    "mujoco": (
        "default",
        [*SHORT_BATCHES, "env.name=HalfCheetah-v5", "env.max_episode_steps=120"],
        300,
        500,
    ),
    # Pong cut at 80 steps: the stop at 128 falls at step 48 of the second episode, whose
    # time limit the resumed run reaches (and the next reset's random no-ops).
    "atari": ("dqn_atari100k", [*SMALL_ATARI, "env.max_episode_steps=80"], 128, 192),
}


@pytest.mark.parametrize(
    ("preset", "overrides", "stop", "end"), MID_EPISODE_RUNS.values(), ids=MID_EPISODE_RUNS
)
def test_resume_mid_episode_matches_the_uninterrupted_run(
    preset: str, overrides: list[str], stop: int, end: int, tmp_path: Path
) -> None:
    def config(run_dir: Path, frames: int):
        settings = [*overrides, f"eval.interval_frames={stop}", f"collector.total_frames={frames}"]
        return load_config(preset, [*settings, f"run_dir={run_dir}"])

    alone = train_in_process(config(tmp_path / "a", end))
    interrupted = tmp_path / "b"
    train(config(interrupted, stop))
    assert saved_step_count(interrupted) > 0  # mid-episode
    assert_same_run(alone, resume_in_process(config(interrupted, end)))


@pytest.mark.parametrize(
    ("env_config", "why"),
    [
        (EnvConfig(name=faulty_envs.RAISES_AT_1100), "FaultyPendulum cannot give its state"),
        (EnvConfig(num_envs=2), "the env is a batch of envs"),
    ],
    ids=["unknown-env", "batch-of-envs"],
)
def test_a_checkpoint_without_the_episode_says_why_once(
    env_config: EnvConfig, why: str, caplog
) -> None:
    env = make_env(env_config, seed=0)
    collector = Collector(env, RandomPolicy(env.action_spec), frames_per_batch=6, total_frames=-1)
    state = CollectorState(collector)
    next(iter(collector))  # mid-episode
    with caplog.at_level(logging.INFO, logger="rl_app"):
        assert "env" not in state.state_dict() and "env" not in state.state_dict()
    assert [why in message for message in caplog.messages] == [True]
    collector.shutdown()
