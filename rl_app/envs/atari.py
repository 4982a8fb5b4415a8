"""Which envs are Atari games, which are learned from stacks of frames as one is, and what
that asks of the rest of the config.

Importing this module imports neither ale_py nor TorchRL: :func:`is_registered` imports
ale_py at the first env id Gymnasium does not know."""

from __future__ import annotations

import importlib

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from rl_app.config import Config, ConfigError

# Gymnasium's entry point of every Atari game (ale_py).
ATARI_ENTRY_POINT = "ale_py.env:AtariEnv"
# The samplers that rebuild the frame stacks of an env observing frames (rl_app.replay.frames).
FRAME_SAMPLERS = ("prioritized_slice", "slice")


def is_registered(env_id: str) -> bool:
    """Whether Gymnasium knows ``env_id``. It learns the ids of the Atari games (e.g.
    BreakoutNoFrameskip-v4) from ale_py, imported here at the first id it does not know
    rather than by every run (it takes a quarter of a second)."""
    if env_id not in gym.envs.registry:
        import ale_py

        gym.register_envs(ale_py)
    return env_id in gym.envs.registry


def is_atari(env_name: str) -> bool:
    """Whether ``env.name`` is a game of the Arcade Learning Environment."""
    env_id = env_name.split(":")[-1]
    return is_registered(env_id) and gym.spec(env_id).entry_point == ATARI_ENTRY_POINT


def observes_frames(env_name: str) -> bool:
    """Whether ``env.name`` is learned as an Atari game is, from stacks of its frames: an
    Atari game, or an env whose class says so with ``observes_frames = True`` (its
    observation one 84x84 uint8 grayscale frame, as :mod:`rl_app.envs.pixels`'s)."""
    if is_atari(env_name):
        return True
    module, _, env_id = env_name.rpartition(":")
    if module:  # registers its ids on import, which a new process has not done yet
        importlib.import_module(module)
    if not is_registered(env_id):
        return False
    creator = gym.spec(env_id).entry_point
    if isinstance(creator, str):
        creator = load_env_creator(creator)
    return bool(getattr(creator, "observes_frames", False))


def check_atari(config: Config) -> None:
    """An Atari game, or another env observing frames (:func:`observes_frames`), is learned
    from stacks of frames that the replay buffer stores once (:mod:`rl_app.replay.frames`):
    rebuilt along sampled slices, next to one-slot reset slots that only the slice
    samplers, with slices of two steps or more, never draw."""
    if not observes_frames(config.env.name):
        return
    replay = config.replay
    if replay.sampler not in FRAME_SAMPLERS:
        raise ConfigError(
            f"replay.sampler={replay.sampler!r} is not accepted with {config.env.name}, whose "
            f"frame stacks are rebuilt along slices: choose one of {', '.join(FRAME_SAMPLERS)}"
        )
    if replay.slice_len < 2:
        raise ConfigError(
            f"replay.slice_len={replay.slice_len} is out of range with {config.env.name}, "
            "whose frames are stacked: it must be at least 2 (one-step slices would draw the "
            "buffer's reset slots)"
        )
    if config.network.recurrent != "none" or config.env.normalize_observations:
        raise ConfigError(
            f"{config.env.name} is learned by the Nature CNN from raw frames: set "
            "network.recurrent=none and env.normalize_observations=false"
        )
