"""Videos of a policy playing, made with TorchRL's own parts: ``PixelRenderTransform`` and
``VideoRecorder`` (evaluation videos, sent through the logger's ``log_video``), and
``torchrl.render`` (the files ``rl_app.play --video`` writes). The one place that knows how
an env is rendered headless and which encoder each logger backend needs."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tensordict.nn import TensorDictModuleBase
from torchrl.envs import EnvBase, ExcludeTransform
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.record import PixelRenderTransform, VideoRecorder
from torchrl.record.loggers import Logger
from torchrl.render import RenderConfig, RenderResult, write_render_artifact
from torchrl.render.video import encode_video

from rl_app.config import Config
from rl_app.evaluation import evaluation_env

RENDER_MODE = "rgb_array"  # frames as arrays: no display needed
# pygame (classic-control rendering) would otherwise look for a display and complain.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
VIDEO_TAG = "eval/video"


def render_problem(env_name: str) -> str | None:
    """Why ``env_name`` cannot be rendered to arrays here (None if it can): one reset and
    one rendered frame of a Gymnasium env, no TorchRL env."""
    env_id = env_name.split(":")[-1]
    plain = gym.make(env_id)
    plain.close()
    if RENDER_MODE not in plain.metadata.get("render_modes", []):
        return f"{env_name} does not render {RENDER_MODE!r} frames"
    try:
        probe = gym.make(env_id, render_mode=RENDER_MODE)
    except Exception as error:  # Gymnasium raises various errors for unsupported modes
        return f"{env_name} cannot be made with render_mode={RENDER_MODE!r} ({error})"
    try:
        probe.reset(seed=0)
        frame = probe.render()
    except Exception as error:  # pygame, OpenGL or MuJoCo without a display, ...
        return f"{env_name} cannot render here ({type(error).__name__}: {error})"
    finally:
        probe.close()
    if not isinstance(frame, np.ndarray) or frame.ndim != 3:
        return f"{env_name} rendered {type(frame).__name__}, not an RGB image"
    return None


def encoder_problem(backend: str) -> str | None:
    """Why the logger ``backend`` cannot encode videos here (None if it can). The CSV logger
    writes MP4 through torchcodec (FFmpeg's libraries); wandb and TensorBoard use moviepy."""
    if backend in ("wandb", "tensorboard"):
        # TensorBoard imports moviepy.editor, which moviepy 2 no longer has.
        module = "moviepy.editor" if backend == "tensorboard" else "moviepy"
        if importlib.util.find_spec("moviepy") is None or importlib.util.find_spec(module) is None:
            return (
                f"logger.backend={backend} encodes videos with {module}: "
                "install the moviepy pinned in requirements.txt"
            )
        return None
    return mp4_problem()


def mp4_problem() -> str | None:
    """Why no MP4 can be encoded here (None if one can): encodes two tiny frames."""
    frames = [np.zeros((16, 16, 3), dtype=np.uint8)] * 2
    with tempfile.TemporaryDirectory() as scratch:
        try:
            encode_video(frames, Path(scratch) / "probe.mp4", fps=1)
        except Exception as error:  # torchcodec missing, or FFmpeg's libraries missing
            return (
                f"no MP4 encoder ({type(error).__name__}: {str(error).splitlines()[0]}); "
                "MP4 needs torchcodec and FFmpeg's libraries (e.g. apt install ffmpeg)"
            )
    return None


def render_fps(env_name: str) -> int:
    """The frame rate the env is meant to be watched at."""
    probe = gym.make(env_name.split(":")[-1])
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
) -> None:
    """Play the evaluation's first episode with a copy of ``policy`` (deterministic, as the
    evaluation acts) and log its video at ``step``. The learner's modules are not touched."""
    env, recorder = recording_env(config, logger)
    actor = policy_factory()
    actor.load_state_dict(policy.state_dict())
    try:
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            env.rollout(episode_horizon(config.env.name), actor, break_when_any_done=True)
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
