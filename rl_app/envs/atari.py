"""Which envs are Atari games, and what learning one asks of the rest of the config.

Importing this module imports neither ale_py nor TorchRL: :func:`is_registered` imports
ale_py at the first env id Gymnasium does not know."""

from __future__ import annotations

import gymnasium as gym

from rl_app.config import Config, ConfigError

# Gymnasium's entry point of every Atari game (ale_py).
ATARI_ENTRY_POINT = "ale_py.env:AtariEnv"
# The samplers that rebuild an Atari game's frame stacks (rl_app.replay.frames).
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


def check_atari(config: Config) -> None:
    """An Atari game is learned from stacks of frames that the replay buffer stores once
    (:mod:`rl_app.replay.frames`): rebuilt along sampled slices, next to one-slot reset slots
    that only the slice samplers, with slices of two steps or more, never draw."""
    if not is_atari(config.env.name):
        return
    replay = config.replay
    if replay.sampler not in FRAME_SAMPLERS:
        raise ConfigError(
            f"replay.sampler={replay.sampler!r} is not accepted with an Atari game, whose frame "
            f"stacks are rebuilt along slices: choose one of {', '.join(FRAME_SAMPLERS)}"
        )
    if replay.slice_len < 2:
        raise ConfigError(
            f"replay.slice_len={replay.slice_len} is out of range with an Atari game: it must "
            "be at least 2 (one-step slices would draw the buffer's reset slots)"
        )
    if config.network.recurrent != "none" or config.env.normalize_observations:
        raise ConfigError(
            f"{config.env.name} is learned by the Nature CNN from raw frames: set "
            "network.recurrent=none and env.normalize_observations=false"
        )
