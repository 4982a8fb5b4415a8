"""Videos of a policy playing, made with TorchRL's own parts: ``PixelRenderTransform`` and
``VideoRecorder`` (evaluation videos, sent through the logger's ``log_video``), and
``torchrl.render`` (the files ``rl_app.play --video`` writes). How an env is rendered
headless, and which encoder each logger backend needs, is :mod:`rl_app.rendering`'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import torch
from tensordict.nn import TensorDictModuleBase
from torchrl.envs import EnvBase, ExcludeTransform
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.record import PixelRenderTransform, VideoRecorder
from torchrl.record.loggers import Logger
from torchrl.render import RenderConfig, RenderResult, write_render_artifact

from rl_app.config import Config
from rl_app.envs import make_gym
from rl_app.evaluation import evaluation_env, no_stop
from rl_app.rendering import RENDER_MODE, mp4_problem

VIDEO_TAG = "eval/video"


def render_fps(env_name: str) -> int:
    """The frame rate the env is meant to be watched at."""
    probe = make_gym(env_name)
    probe.close()
    return int(probe.metadata.get("render_fps", 30))


def episode_horizon(env_name: str) -> int:
    """Steps a rollout may take: the env's time limit (episodes end at it anyway)."""
    return gym.spec(env_name.split(":")[-1]).max_episode_steps or 100_000


def recording_env(config: Config, logger: Logger) -> tuple[EnvBase, VideoRecorder]:
    """The evaluation's env (its next episode is the evaluation's first), rendering every
    step into a ``VideoRecorder`` that hands the episode to ``logger``; frames are not kept
    in the rollout itself."""
    env = evaluation_env(config, render_mode=RENDER_MODE)
    recorder = VideoRecorder(
        logger, tag=VIDEO_TAG, skip=1, make_grid=False, fps=render_fps(config.env.name)
    )
    env.append_transform(PixelRenderTransform())
    env.append_transform(recorder)
    env.append_transform(ExcludeTransform("pixels"))
    return env, recorder


def record_evaluation_video(
    config: Config,
    policy_factory: Callable[..., TensorDictModuleBase],
    policy: TensorDictModuleBase,
    logger: Logger,
    step: int,
    abandon_point: Callable[[], None] = no_stop,
) -> None:
    """Play the evaluation's first episode with a copy of ``policy`` (deterministic, as the
    evaluation acts) and log its video at ``step``. The learner's modules are not touched.
    ``abandon_point`` is called after every frame (:func:`rl_app.evaluation.evaluate`)."""
    env, recorder = recording_env(config, logger)
    try:
        actor = policy_factory()
        abandon_point()
        actor.load_state_dict(policy.state_dict())
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            env.rollout(
                episode_horizon(config.env.name),
                actor,
                callback=lambda *_: abandon_point(),
                break_when_any_done=True,
            )
        abandon_point()  # before the encoding, seconds for a long episode
        recorder.dump(step=step)
    finally:
        env.close()


def write_play_video(result: RenderResult, render: RenderConfig) -> tuple[Path, str | None]:
    """Write the rendered episodes to ``render.out`` as MP4, or as GIF beside it when no
    MP4 encoder is available; returns the file and, for a GIF, why."""
    problem = mp4_problem() if render.format == "mp4" else None
    if problem is not None:
        render = dataclasses.replace(render, format="gif", out=Path(render.out).with_suffix(".gif"))
    written = write_render_artifact(result, render)
    return Path(written.artifact_path), problem
