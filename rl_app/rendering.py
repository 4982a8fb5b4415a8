"""Whether this machine can film a run: headless rendering of an env and the encoder each
logger backend needs. Checked when a config asks for videos (``eval.video``), so that a run
that cannot film fails at start; imports nothing of rl_app."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

import numpy as np
from torchrl.render.video import encode_video

from rl_app.envs import make_gym

RENDER_MODE = "rgb_array"  # frames as arrays: no display needed
# pygame (classic-control rendering) would otherwise look for a display and a sound card
# and complain.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")


def render_problem(env_name: str) -> str | None:
    """Why ``env_name`` cannot be rendered to arrays here (None if it can): one reset and
    one rendered frame of a Gymnasium env, no TorchRL env."""
    plain = make_gym(env_name)
    plain.close()
    if RENDER_MODE not in plain.metadata.get("render_modes", []):
        return f"{env_name} does not render {RENDER_MODE!r} frames"
    try:
        probe = make_gym(env_name, render_mode=RENDER_MODE)
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
