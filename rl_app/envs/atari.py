"""Atari games, and the envs learned from stacks of frames as one is: the game as DQN plays
it, the frame stacks, and what that asks of the rest of the config. Imported only for an env
that observes frames (:func:`rl_app.envs.observes_frames`)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.wrappers import AtariPreprocessing
from torchrl.envs import CatFrames, RenameTransform, Transform, UnsqueezeTransform

from rl_app.config import Config, ConfigError, EnvConfig
from rl_app.envs import (
    ATARI_MAX_FRAMES,
    FRAME_KEY,
    FRAME_SIZE,
    FRAME_SKIP,
    FRAME_STACK,
    LIFE_LOST,
    PIXELS_KEY,
)

# The samplers that rebuild the frame stacks of an env observing frames (rl_app.replay.frames).
FRAME_SAMPLERS = ("prioritized_slice", "slice")


def check_atari(config: Config) -> None:
    """An Atari game, or another env observing frames
    (:func:`rl_app.envs.observes_frames`), is learned from stacks of frames that the replay
    buffer stores once (:mod:`rl_app.replay.frames`): rebuilt along sampled slices, next to
    one-slot reset slots that only the slice samplers, with slices of two steps or more,
    never draw."""
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


class LifeLoss(gym.Wrapper):
    """Says in ``info[LIFE_LOST]`` whether an Atari game's step lost a life (its lives are
    read before and after it: nothing to save mid-episode)."""

    holds_episode_state = False  # rl_app.envs.resumable

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        ale = self.unwrapped.ale
        lives = ale.lives()
        observation, reward, terminated, truncated, info = self.env.step(action)
        return observation, reward, terminated, truncated, {**info, LIFE_LOST: ale.lives() < lives}


def make_atari_env(env: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """The Atari game ``env.name`` as DQN plays it (Mnih et al., 2015): up to 30 no-op actions
    after each reset, each action repeated for FRAME_SKIP emulator frames, the last two of
    which are max-pooled (sprites flicker), grayscale, resized to 84x84; episodes end at
    ATARI_MAX_FRAMES. A lost life is not a terminal: Machado et al. (2018) recommend it, and
    the evaluation return is then the score of a whole game (``env.life_loss_terminal``
    ends only the learner's targets there: :class:`LifeLoss`)."""
    game = gym.make(
        env.name,
        render_mode=render_mode,
        frameskip=1,  # FRAME_SKIP is AtariPreprocessing's, which needs the raw frames
        max_num_frames_per_episode=ATARI_MAX_FRAMES,
    )
    game = AtariPreprocessing(
        game,
        noop_max=30,
        frame_skip=FRAME_SKIP,
        screen_size=FRAME_SIZE,
        grayscale_obs=True,
        terminal_on_life_loss=False,
    )
    return LifeLoss(game) if env.life_loss_terminal else game


def frame_stacking() -> list[Transform]:
    """The game's frame under FRAME_KEY, and the newest FRAME_STACK frames under
    PIXELS_KEY, [FRAME_STACK, 84, 84]: CatFrames fills the stack of an episode's first step
    with copies of its first frame."""
    return [
        RenameTransform(["observation"], [FRAME_KEY]),
        UnsqueezeTransform(-3, in_keys=[FRAME_KEY], out_keys=[PIXELS_KEY]),
        CatFrames(N=FRAME_STACK, dim=-3, in_keys=[PIXELS_KEY]),
    ]
