"""End to end on real parts: a short run writes everything a user looks at, and its
checkpoint restores into freshly built objects with equal state."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from rl_app.logger import read_metrics
from rl_app.loop import run_iterations
from rl_app.replay import TRAJECTORY_KEY
from rl_app.run import build_run, train
from tests.helpers import TINY_RUN, run_train


def test_short_run_writes_config_metrics_curve_and_checkpoints(tiny_config) -> None:
    config = tiny_config()
    result = train(config)
    run_dir = Path(config.run_dir)

    assert (
        yaml.safe_load((run_dir / "config.yaml").read_text())["collector"]["total_frames"] == 1200
    )
    rows = read_metrics(run_dir)
    assert [row["frames"] for row in rows] == list(range(200, 1201, 200))
    evals = [row["eval/return"] for row in rows if "eval/return" in row]
    assert len(evals) == 3  # at 400, 800 and 1200 frames
    assert result.best_eval_return == max(evals)
    assert any("train/loss_qvalue" in row for row in rows)
    assert (run_dir / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    best_frames = 400 * (evals.index(max(evals)) + 1)
    expected = {f"checkpoint-{frames:012d}" for frames in (800, 1200, best_frames)}
    assert set(checkpoints) == {*expected, "best.json"}  # keep_last=2, plus the best
    assert result.best_checkpoint.name == f"checkpoint-{best_frames:012d}"


def test_a_run_that_ends_within_its_random_frames_says_it_makes_no_update(
    tiny_config, caplog: pytest.LogCaptureFixture
) -> None:
    result = train(tiny_config("collector.total_frames=400", "collector.init_random_frames=600"))
    assert result.updates == 0
    assert (
        "collector.init_random_frames=600 exceeds collector.total_frames=400: the run acts at "
        "random and makes no update"
    ) in caplog.text


def test_sac_halfcheetah_preset_trains_on_the_cpu_out_of_the_box(tiny_config) -> None:
    # MuJoCo comes with the pinned requirements: the GPU preset runs anywhere, briefly.
    config = tiny_config(
        "collector.total_frames=400", "collector.init_random_frames=200",
        "eval.episodes=1", preset="sac_halfcheetah",
    )  # fmt: skip
    result = train(config)
    assert result.frames == 400 and result.updates > 0
    assert torch.isfinite(torch.tensor(result.last_eval_return))
    assert result.last_checkpoint is not None


def test_checkpoint_restores_into_fresh_objects(tiny_config, tmp_path: Path) -> None:
    config = tiny_config(run_dir=tmp_path / "trained")
    trained = build_run(config)
    try:
        run_iterations(trained)
    finally:
        trained.close()
    latest = trained.checkpoints.latest()

    # The run's own directory: its replay files are the buffer a checkpoint restores.
    fresh = build_run(config, resuming=True)
    try:
        fresh.checkpoints.load(latest)
    finally:
        fresh.close()

    for name, component in trained.algorithm.checkpoint_components().items():
        restored = fresh.algorithm.checkpoint_components()[name].state_dict()
        assert_equal_state(component.state_dict(), restored, name)
    assert fresh.progress == trained.progress

    assert len(fresh.buffer) == len(trained.buffer) == 1200
    assert (fresh.buffer[:] == trained.buffer[:]).all()
    assert fresh.buffer[:][TRAJECTORY_KEY].unique().numel() == 6  # six 200-step episodes
    everything = torch.arange(len(trained.buffer))
    trained_priorities = trained.buffer.sampler.state_dict()["_sum_tree"][everything]
    fresh_priorities = fresh.buffer.sampler.state_dict()["_sum_tree"][everything]
    assert torch.equal(trained_priorities, fresh_priorities)
    assert trained_priorities.unique().numel() > 100  # updated from TD errors, not all default
    # The restored buffer's sampler draws exactly what the trained one would have drawn next.
    batch_size = trained.config.optim.batch_size
    assert (fresh.buffer.sample(batch_size) == trained.buffer.sample(batch_size)).all()


def assert_equal_state(expected, actual, where: str) -> None:
    if isinstance(expected, torch.Tensor):
        assert torch.equal(expected, actual), where
    elif isinstance(expected, dict):
        assert expected.keys() == actual.keys(), where
        for key in expected:
            assert_equal_state(expected[key], actual[key], f"{where}.{key}")
    elif isinstance(expected, list | tuple):
        assert len(expected) == len(actual), where
        for index, (left, right) in enumerate(zip(expected, actual, strict=True)):
            assert_equal_state(left, right, f"{where}[{index}]")
    else:
        assert expected == actual, where


@pytest.mark.parametrize(
    ("backend", "written"),
    [
        ("csv", "logs/*/scalars/eval/return.csv"),
        ("tensorboard", "logs/*/events.out.tfevents.*"),
        ("wandb", "logs/wandb/offline-run-*/run-*.wandb"),
    ],
)
def test_logger_backends_write_their_files(
    tiny_config, backend: str, written: str, monkeypatch
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # no account: wandb must run offline
    config = tiny_config(
        f"logger.backend={backend}", "collector.total_frames=400", "eval.interval_frames=400"
    )
    train(config)
    assert list(Path(config.run_dir).glob(written)), sorted(Path(config.run_dir).rglob("*"))


def test_a_compiled_cpu_run_prints_only_the_projects_own_lines(tmp_path: Path) -> None:
    # On a CPU machine, tensordict's deprecation warning, torch's CUDA_HOME line and
    # TorchRL's storage line used to come with every compiled run.
    short = ["collector.total_frames=600", "eval.interval_frames=600", "eval.episodes=1"]
    run_dir = f"run_dir={tmp_path / 'run'}"
    result = run_train(tmp_path, *TINY_RUN, *short, "optim.compile=true", run_dir)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip() and "frame/s" not in line]
    assert lines and all(" rl_app: " in line for line in lines), lines
