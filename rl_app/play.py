"""Play a trained run's policy from one of its checkpoints, optionally filming it.

``python -m rl_app.play RUN_DIR [--checkpoint best|last|PATH] [--episodes N] [--seed S]
[--video PATH]``.

Only the acting policy is built (no loss, optimizer, replay buffer or collector), from the
run's ``config.yaml``, and its weights come from the checkpoint's ``policy`` component
alone, checked against its checksums and read onto the CPU. By default it plays the
episodes of the run's evaluation (same seed, same count, deterministic actions), so its
returns are those the checkpoint was ranked by. A mistake exits with status 2 and one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from tensordict.nn import TensorDictModule
from torchrl.checkpoint import Checkpoint, CheckpointError
from torchrl.render import RenderConfig, collect_render_rollouts

from rl_app.algorithms import make_policy
from rl_app.checkpointing import (
    BEST_INDEX,
    POLICY_COMPONENT,
    CorruptCheckpoint,
    choose_checkpoint,
    load_component,
    recorded_best,
)
from rl_app.config import MAX_SEED, Config, ConfigError, read_run_config
from rl_app.envs import make_env
from rl_app.evaluation import evaluation_env, play_episodes
from rl_app.rendering import RENDER_MODE, render_problem
from rl_app.rundir import CHECKPOINTS_DIR, CONFIG_FILE
from rl_app.runlock import make_writable_directory
from rl_app.video import episode_horizon, render_fps, write_play_video


class PlayError(Exception):
    """A mistake in what to play: reported as one line, exit status 2."""


@dataclass
class PlayResult:
    checkpoint: Path
    returns: list[float]
    mean_return: float
    video: Path | None
    video_note: str | None  # why the video is a GIF, when it is


def run_config(run_dir: Path) -> Config:
    if not run_dir.exists():
        raise PlayError(f"run directory {str(run_dir)!r} does not exist")
    if not run_dir.is_dir():
        raise PlayError(f"{str(run_dir)!r} is a file: give a run directory")
    if not (run_dir / CONFIG_FILE).is_file():
        raise PlayError(f"{str(run_dir)!r} is not a run directory: it has no {CONFIG_FILE}")
    try:
        return read_run_config(run_dir)
    except ConfigError as error:
        raise PlayError(str(error)) from None


def trained(config: Config) -> str:
    return f"{config.algo} on {config.env.name}, network.hidden_sizes={config.network.hidden_sizes}"


def whose(checkpoint: Path) -> str | None:
    """What the run a checkpoint was saved by trained, where its directory says."""
    try:
        return f"it was saved by a run of {trained(read_run_config(checkpoint.parent.parent))}"
    except (OSError, ConfigError):
        return None


def resolve_checkpoint(run_dir: Path, checkpoint: str) -> Path:
    """``best`` (the one the run's ``best.json`` names), ``last`` (the newest that
    verifies), a checkpoint's name in the run, or a checkpoint directory's path."""
    directory = run_dir / CHECKPOINTS_DIR
    if checkpoint in ("best", "last") and not any(directory.glob("checkpoint-*")):
        raise PlayError(f"{str(run_dir)!r} holds no checkpoint (none in {directory})")
    if checkpoint == "best":
        best = recorded_best(directory)
        if best is None:
            index = directory / BEST_INDEX
            why = (
                "is unreadable" if index.exists() else "is missing: a run writes it as it evaluates"
            )
            raise PlayError(
                f"{str(run_dir)!r} names no best checkpoint ({index} {why}): play --checkpoint last"
            )
        if not Checkpoint.is_checkpoint(best):
            raise PlayError(
                f"the best checkpoint {directory / BEST_INDEX} names, {best.name}, is missing "
                "or damaged: play --checkpoint last"
            )
        return best
    if checkpoint == "last":
        try:
            return choose_checkpoint(directory)[0]
        except CorruptCheckpoint as error:
            raise PlayError(str(error)) from None
    for candidate in (Path(checkpoint), directory / checkpoint):
        if Checkpoint.is_checkpoint(candidate):
            return candidate
    raise PlayError(
        f"--checkpoint {checkpoint!r} is not accepted: give best, last, the name of a "
        f"checkpoint in {directory} or the path of a checkpoint directory"
    )


def load_policy(run_dir: str | Path, checkpoint: str = "best") -> TensorDictModule:
    """The trained acting policy of the run in ``run_dir``, on the CPU, in eval mode.

    ``checkpoint``: ``"best"`` (highest evaluation return), ``"last"``, a checkpoint's
    name, or a checkpoint directory's path. Act deterministically with
    ``torchrl.envs.utils.set_exploration_type(ExplorationType.DETERMINISTIC)``."""
    run_dir = Path(run_dir)
    config = run_config(run_dir)
    path = resolve_checkpoint(run_dir, checkpoint)
    single = dataclasses.replace(config.env, num_envs=1)
    env = make_env(single, config.seed, network=config.network)  # for its specs
    policy = make_policy(config, env)
    env.close()
    try:
        load_component(path, POLICY_COMPONENT, policy, map_location="cpu")
    except CorruptCheckpoint as error:
        raise PlayError(f"checkpoint {path} cannot be played: {error}") from None
    except (CheckpointError, RuntimeError) as error:
        raise PlayError(
            f"checkpoint {path} does not fit this run's policy ({trained(config)}): "
            f"{whose(path) or str(error).splitlines()[0]}"
        ) from None
    return policy.eval()


def play(
    run_dir: str | Path,
    checkpoint: str = "best",
    episodes: int | None = None,
    seed: int | None = None,
    video: Path | None = None,
) -> PlayResult:
    """Play ``episodes`` deterministic episodes (default: as many as an evaluation) from the
    env seeded ``seed`` (default: the evaluation's); with ``video``, film the first one."""
    run_dir = Path(run_dir)
    config = run_config(run_dir)
    episodes = config.eval.episodes if episodes is None else episodes
    if episodes < 1:
        raise PlayError(f"--episodes {episodes} is out of range: it must be > 0")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise PlayError(f"--seed {seed} is out of range: it must be in [0, {MAX_SEED}]")
    if video is not None:
        check_video_target(video, config.env.name)
    path = resolve_checkpoint(run_dir, checkpoint)
    policy = load_policy(run_dir, str(path))
    if video is not None:
        try:
            make_writable_directory(video.parent, "--video's folder")
        except ConfigError as error:
            raise PlayError(str(error)) from None
    returns = play_episodes(config, policy, episodes, seed).returns
    written, note = None, None
    if video is not None:
        written, note = film_first_episode(config, policy, path, seed, video)
    return PlayResult(path, returns.tolist(), returns.mean().item(), written, note)


def film_first_episode(
    config: Config, policy: TensorDictModule, checkpoint: Path, seed: int | None, video: Path
) -> tuple[Path, str | None]:
    """Film the first of the episodes played; a policy that explores (``dqn.eval_eps``)
    draws its exploration apart from the batch's, so its filmed episode may differ."""
    env = evaluation_env(config, seed, render_mode=RENDER_MODE)
    render = render_config(config, checkpoint, video)
    try:
        filmed = collect_render_rollouts(env, policy, render)
    finally:
        env.close()
    return write_play_video(filmed, render)


def check_video_target(video: Path, env_name: str) -> None:
    if video.suffix not in (".mp4", ".gif"):
        raise PlayError(
            f"--video {str(video)!r} is not accepted: give a path ending in .mp4 or .gif"
        )
    if video.is_dir():
        raise PlayError(f"--video {str(video)!r} is a directory: give a file's path")
    problem = render_problem(env_name)
    if problem is not None:
        raise PlayError(f"--video cannot work here: {problem}")


def render_config(config: Config, checkpoint: Path, video: Path) -> RenderConfig:
    """What ``torchrl.render`` needs to film one episode into ``video``."""
    return RenderConfig(
        ckpt=checkpoint,
        policy=load_policy,
        env=make_env,
        max_steps=episode_horizon(config.env.name),
        seed=None,  # the env is seeded once, as the evaluation's is
        fps=render_fps(config.env.name),
        render_backend="env",
        format="gif" if video.suffix == ".gif" else "mp4",
        out=video,
        artifact_dir=video.parent,
        overwrite=True,
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run directory (runs/...)")
    parser.add_argument(
        "--checkpoint", default="best", help="best (default), last, a checkpoint name or path"
    )
    parser.add_argument("--episodes", type=int, help="episodes to play (default: eval.episodes)")
    parser.add_argument("--seed", type=int, help="env seed (default: the evaluation's)")
    parser.add_argument("--video", type=Path, help="write the first episode here (.mp4 or .gif)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result = play(args.run_dir, args.checkpoint, args.episodes, args.seed, args.video)
    except PlayError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"checkpoint: {result.checkpoint}")
    for index, value in enumerate(result.returns):
        print(f"episode {index}: return {value:.2f}")
    print(f"mean return over {len(result.returns)} episodes: {result.mean_return:.2f}")
    if result.video_note is not None:
        print(f"wrote a GIF instead of an MP4: {result.video_note}")
    if result.video is not None:
        print(f"video: {result.video}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
