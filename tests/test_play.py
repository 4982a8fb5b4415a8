"""Playing a trained run: the policy alone from a checkpoint, the same episodes as the
evaluation, videos (play --video and eval.video), and clear errors for bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control.pendulum import PendulumEnv
from PIL import Image
from torchrl.checkpoint import Checkpoint

from rl_app.checkpointing import BEST_INDEX, recorded_best
from rl_app.checks import load_config
from rl_app.config import ConfigError, to_yaml
from rl_app.logger import EVAL_KEY, read_metrics
from rl_app.play import load_policy, main, play
from rl_app.rendering import mp4_problem
from rl_app.run import train
from tests.helpers import PYTHON, ROOT, TINY_RUN

PENDULUM_FRAMES = 201  # a 200-step episode: the first observation and one per step


class UnrenderablePendulum(PendulumEnv):
    metadata: ClassVar[dict] = {**PendulumEnv.metadata, "render_modes": []}


NO_RENDER_ENV = "rl_app_test/UnrenderablePendulum-v0"
if NO_RENDER_ENV not in gym.envs.registry:
    gym.register(NO_RENDER_ENV, entry_point=UnrenderablePendulum, max_episode_steps=200)


def trained(root: Path, preset: str, *overrides: str) -> Path:
    run_dir = root / preset
    train(load_config(preset, [*TINY_RUN, f"run_dir={run_dir}", *overrides]))
    return run_dir


@pytest.fixture(scope="module")
def sac_run(tmp_path_factory) -> Path:
    """A tiny SAC run on Pendulum that recorded a video at each evaluation (CSV backend),
    where MP4 can be written (the tests of its videos need ``mp4``)."""
    root = tmp_path_factory.mktemp("sac")
    filming = ["eval.video=true"] if mp4_problem() is None else []
    return trained(root, "default", *filming, "logger.backend=csv")


@pytest.fixture(scope="module")
def dqn_run(tmp_path_factory) -> Path:
    return trained(tmp_path_factory.mktemp("dqn"), "dqn_cartpole")


@pytest.fixture(scope="module")
def recurrent_dqn_run(tmp_path_factory) -> Path:
    """Recurrent DQN on masked CartPole: evaluation and play carry its LSTM state."""
    small = ["network.hidden_sizes=[16]", "network.lstm_size=8", "replay.burn_in=2"]
    return trained(tmp_path_factory.mktemp("rdqn"), "rdqn_cartpole_masked", *small)


def listing(run_dir: Path) -> dict[str, tuple[int, int]]:
    return {
        str(path.relative_to(run_dir)): (path.stat().st_mtime_ns, path.stat().st_size)
        for path in sorted(run_dir.rglob("*"))
    }


def recorded_eval(checkpoint: Path) -> float:
    return Checkpoint.manifest(checkpoint)["metadata"][EVAL_KEY]


def play_in_a_fresh_process(run_dir: Path, checkpoint: str) -> dict:
    """Play in its own process, reporting the returns and which rl_app modules it loaded."""
    code = (
        "import json, sys; from rl_app.play import play; "
        f"result = play({str(run_dir)!r}, {checkpoint!r}); "
        "print(json.dumps({'mean': result.mean_return, 'checkpoint': str(result.checkpoint), "
        "'modules': sorted(m for m in sys.modules if m.startswith('rl_app'))}))"
    )
    done = subprocess.run(
        [PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("run", ["sac_run", "dqn_run", "recurrent_dqn_run"])
def test_playing_a_checkpoint_gives_the_returns_its_evaluation_recorded(run, request) -> None:
    run_dir: Path = request.getfixturevalue(run)
    before = listing(run_dir.parent)  # the run and anything that could appear beside it
    best = play_in_a_fresh_process(run_dir, "best")
    # The best checkpoint is the one with the highest evaluation, as best.json says.
    evals = [row["eval/return"] for row in read_metrics(run_dir) if "eval/return" in row]
    assert Path(best["checkpoint"]) == recorded_best(run_dir / "checkpoints")
    assert best["mean"] == recorded_eval(Path(best["checkpoint"])) == max(evals)
    last = play(run_dir, "last")
    assert last.mean_return == recorded_eval(last.checkpoint) == evals[-1]
    assert len(last.returns) == 2  # eval.episodes of the tiny run
    # Only the policy was built: no training loop, no collector, no replay buffer (no new
    # memmap file: the listing below is unchanged).
    assert not {"rl_app.loop", "rl_app.collection"} & set(best["modules"])
    assert listing(run_dir.parent) == before


def test_best_index_follows_rotation_and_a_fallback_after_corruption(tiny_config) -> None:
    config = tiny_config("checkpoint.keep_last=2")
    train(config)
    directory = Path(config.run_dir) / "checkpoints"
    kept = sorted(directory.glob("checkpoint-*"))
    best = recorded_best(directory)
    assert best in kept and recorded_eval(best) == max(recorded_eval(path) for path in kept)
    # Damage the newest checkpoint: resuming sets it aside (corrupt-*), and the index then
    # names the best of the checkpoints left, the resumed run's new ones included.
    newest = kept[-1]
    policy_file = next((newest / "components").glob("*-policy/state.pt"))
    policy_file.write_bytes(b"\0" * policy_file.stat().st_size)
    train(tiny_config("checkpoint.keep_last=2", "collector.total_frames=1600"))
    assert (directory / f"corrupt-{newest.name}").is_dir()
    best = recorded_best(directory)
    remaining = list(directory.glob("checkpoint-*"))
    assert best in remaining
    assert recorded_eval(best) == max(recorded_eval(path) for path in remaining)
    assert json.loads((directory / BEST_INDEX).read_text())["checkpoint"] == best.name


def test_a_checkpoint_without_a_policy_component_still_resumes(tiny_config) -> None:
    """Checkpoints saved before the policy had its own component restore it from the
    algorithm's networks."""
    config = tiny_config()
    train(config)
    for checkpoint in Path(config.run_dir, "checkpoints").glob("checkpoint-*"):
        manifest = json.loads((checkpoint / "manifest.json").read_text())
        record = manifest["components"].pop("policy")
        shutil.rmtree(checkpoint / record["path"])
        (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    result = train(tiny_config("collector.total_frames=1600"))
    assert result.frames == 1600


def decoded_mp4(path: Path) -> torch.Tensor:
    # Imported here: torchcodec loads FFmpeg's libraries, which a machine may lack (mp4).
    from torchcodec.decoders import VideoDecoder

    return VideoDecoder(str(path))[:]  # [frames, channels, height, width]


def assert_episode_video(frames: torch.Tensor, count: int, height: int, width: int) -> None:
    assert frames.shape[0] == count
    assert tuple(frames.shape[-2:]) == (height, width)
    assert not torch.equal(frames[0], frames[-1])


def test_play_video_is_the_episode_in_mp4_and_gif(sac_run: Path, tmp_path: Path, mp4) -> None:
    result = play(sac_run, episodes=1, video=tmp_path / "episode.mp4")
    assert result.video == tmp_path / "episode.mp4" and result.video_note is None
    assert_episode_video(decoded_mp4(result.video), PENDULUM_FRAMES, 500, 500)
    record = json.loads((tmp_path / "episode.mp4.metadata.json").read_text())  # the renderer's
    assert [episode["return"] for episode in record["trajectories"]] == pytest.approx(
        result.returns[:1]
    )
    gif = play(sac_run, episodes=1, video=tmp_path / "episode.gif").video
    with Image.open(gif) as image:
        frames, durations = [], []
        for index in range(image.n_frames):
            image.seek(index)
            frames.append(np.asarray(image.convert("RGB")))
            durations.append(image.info["duration"])
    # Pillow merges identical consecutive frames into one shown longer: count by duration.
    frame_ms = round(1000 / 30) // 10 * 10  # 30 frames/s, stored in hundredths of a second
    assert sum(durations) == PENDULUM_FRAMES * frame_ms
    assert frames[0].shape == (500, 500, 3) and not np.array_equal(frames[0], frames[-1])
    # Filming does not change what is played.
    assert result.returns == play(sac_run, episodes=1).returns


def test_eval_video_logs_one_episode_per_evaluation_to_the_csv_backend(sac_run: Path, mp4) -> None:
    videos = sorted((sac_run / "logs").rglob("*.mp4"))
    eval_frames = [row["frames"] for row in read_metrics(sac_run) if "eval/return" in row]
    assert sorted(int(path.stem.split("_")[-1]) for path in videos) == eval_frames
    for video in videos:
        assert_episode_video(decoded_mp4(video), PENDULUM_FRAMES, 500, 500)


def test_eval_video_every_nth_evaluation(tiny_config, mp4) -> None:
    config = tiny_config("eval.video=true", "eval.video_every=2", "logger.backend=csv")
    train(config)
    videos = sorted(Path(config.run_dir, "logs").rglob("*.mp4"))
    assert sorted(int(path.stem.split("_")[-1]) for path in videos) == [400, 1200]


def test_eval_video_goes_to_tensorboard_and_wandb(tiny_config, tmp_path: Path, mp4) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tensorboard = tiny_config(
        "eval.video=true", "eval.video_every=3", "logger.backend=tensorboard",
        run_dir=tmp_path / "tb",
    )  # fmt: skip
    train(tensorboard)
    events = EventAccumulator(str(next(Path(tensorboard.run_dir, "logs").rglob("events.*"))))
    events.Reload()
    assert [image.step for image in events.Images("eval/video")] == [400]
    wandb = tiny_config(
        "eval.video=true", "eval.video_every=3", "logger.backend=wandb", run_dir=tmp_path / "wb"
    )
    train(wandb)
    videos = list(Path(wandb.run_dir, "logs").rglob("media/videos/eval/video_*.mp4"))
    assert len(videos) == 1
    assert_episode_video(decoded_mp4(videos[0]), PENDULUM_FRAMES, 500, 500)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU to train on")
def test_a_run_trained_on_a_gpu_plays_on_a_cpu_only_machine(tiny_config) -> None:
    config = tiny_config("device=cuda")
    train(config)
    done = subprocess.run(
        [PYTHON, "-m", "rl_app.play", config.run_dir],
        cwd=ROOT, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    best = recorded_best(Path(config.run_dir) / "checkpoints")
    assert f"{recorded_eval(best):.2f}" in done.stdout.splitlines()[-1]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["eval.video=true", "logger.backend=none"], "needs a logger backend"),
        (
            ["eval.video=true", "logger.backend=csv", f"env.name={NO_RENDER_ENV}"],
            "does not render 'rgb_array'",
        ),
        (["eval.video_every=0"], "eval.video_every=0 is out of range"),
    ],
)
def test_a_run_that_cannot_record_videos_stops_at_validation(tiny_config, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(*overrides)


def test_load_policy_readme_example(dqn_run: Path) -> None:
    from torchrl.envs import DoubleToFloat, GymEnv, TransformedEnv
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    policy = load_policy(dqn_run)  # the best checkpoint's policy, on the CPU
    env = TransformedEnv(GymEnv("CartPole-v1"), DoubleToFloat())
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        episode = env.rollout(500, policy)
    assert episode["next", "reward"].sum() > 0


def run_play_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "rl_app.play", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_play_cli_prints_each_return_and_the_mean(dqn_run: Path) -> None:
    done = run_play_cli(str(dqn_run), "--episodes", "3", "--seed", "7")
    assert done.returncode == 0, done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines() if "episode " in line] == [
        "episode 0", "episode 1", "episode 2",
    ]  # fmt: skip
    assert "mean return over 3 episodes" in done.stdout


def test_bad_input_exits_2_with_one_line(
    dqn_run: Path, sac_run: Path, tmp_path: Path, tiny_config, capsys: pytest.CaptureFixture
) -> None:
    no_checkpoint = tmp_path / "fresh"
    no_checkpoint.mkdir()
    (no_checkpoint / "config.yaml").write_text(to_yaml(tiny_config(run_dir=no_checkpoint)))
    a_file, a_folder = tmp_path / "a-file", tmp_path / "a-folder.gif"
    a_file.write_text("")
    a_folder.mkdir()
    best_unreadable, best_removed = tmp_path / "best-unreadable", tmp_path / "best-removed"
    empty_config, not_evaluated = tmp_path / "empty-config", tmp_path / "not-evaluated"
    for copy in (best_unreadable, best_removed, empty_config, not_evaluated):
        shutil.copytree(dqn_run, copy)
    (not_evaluated / "checkpoints" / BEST_INDEX).unlink()  # as before its first evaluation
    (empty_config / "config.yaml").write_text("")
    (best_unreadable / "checkpoints" / BEST_INDEX).write_text("{not json")
    shutil.rmtree(recorded_best(best_removed / "checkpoints"))
    cases = {
        (str(tmp_path / "missing"),): "does not exist",
        (str(a_file),): "is a file: give a run directory",
        (str(no_checkpoint),): "holds no checkpoint",
        (str(empty_config),): "config.yaml: holds no settings",
        (str(dqn_run), "--checkpoint", "checkpoint-nope"): "--checkpoint 'checkpoint-nope'",
        (str(sac_run), "--checkpoint", str(recorded_best(dqn_run / "checkpoints"))): (
            "does not fit this run's policy (sac on Pendulum-v1, network.hidden_sizes=[32, 32]): "
            "it was saved by a run of dqn on"
        ),
        (str(best_unreadable),): "best.json is unreadable): play --checkpoint last",
        (str(not_evaluated),): "is missing: a run writes it as it evaluates): play --checkpoint",
        (str(best_removed),): "is missing or damaged: play --checkpoint last",
        (str(dqn_run), "--episodes", "0"): "--episodes 0 is out of range",
        (str(dqn_run), "--seed", "-5"): "--seed -5 is out of range: it must be in [0, ",
        (str(dqn_run), "--seed", str(2**32)): f"--seed {2**32} is out of range",
        (str(dqn_run), "--video", str(a_folder)): "is a directory: give a file's path",
        (str(dqn_run), "--video", str(a_file / "x.gif")): f"cannot be made: '{a_file}' is a file",
    }
    for args, message in cases.items():  # through the command line's main, in this process
        assert main(list(args)) == 2, args
        error = capsys.readouterr().err
        assert "Traceback" not in error and len(error.strip().splitlines()) == 1
        assert message in error, (args, error)
