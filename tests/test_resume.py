"""Resume and fault tolerance on real processes and real files: a run that is killed,
stopped or fed damaged state loses nothing and continues where it stopped."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rl_app.checkpointing import (
    CorruptCheckpoint,
    checkpoint_candidates,
    checkpoint_frames,
    choose_checkpoint,
)
from rl_app.checks import load_config
from rl_app.config import ConfigError, to_yaml
from rl_app.logger import METRICS_FILE, read_metrics
from rl_app.loop import RunFailed, run_iterations
from rl_app.replay.journal import restorable_from
from rl_app.run import build_run, train
from tests import faulty_envs
from tests.helpers import (
    PYTHON,
    RECURRENT_DQN,
    TINY_RUN,
    TRAIN_PY,
    assert_same_run,
    resume_in_process,
    run_files,
    saved_progress,
    strip_wall_time,
    train_in_process,
    wait_for,
)


def start_training(run_dir: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [PYTHON, str(TRAIN_PY), *TINY_RUN, f"run_dir={run_dir}", *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_checkpoints(run_dir: Path, count: int) -> None:
    checkpoints = run_dir / "checkpoints"
    wait_for(
        f"{count} checkpoints", lambda: len(list(checkpoints.glob("checkpoint-*"))) >= count, 120
    )


def logged_frames(run_dir: Path) -> int:
    """The frames of the run's last complete metrics row (0 before the first)."""
    path = run_dir / METRICS_FILE
    text = path.read_text() if path.exists() else ""
    rows = text[: text.rfind("\n") + 1].splitlines()
    return json.loads(rows[-1])["frames"] if rows else 0


def wait_past_the_newest_checkpoint(run_dir: Path) -> None:
    """Wait until the run has logged an iteration past its newest checkpoint: work that a
    kill then loses."""
    newest = checkpoint_frames(checkpoint_candidates(run_dir / "checkpoints")[0])
    wait_for(
        "an iteration past the newest checkpoint", lambda: logged_frames(run_dir) > newest, 120
    )


def assert_frames_continuous(rows: list[dict], step: int, last: int) -> None:
    assert [row["frames"] for row in rows] == list(range(step, last + 1, step))
    # The run's wall time goes on across resumes: it never restarts from zero.
    wall = [row["wall_seconds"] for row in rows]
    assert wall == sorted(wall)


# -- determinism and exact resume --------------------------------------------------------


# Value targets, one per estimator family: one-step, and multi-step over each slice; and a
# recurrent DQN on sequences.
TARGETS = {
    "td0": ["optim.target=td0"],
    "td_lambda": ["optim.target=td_lambda"],
    "recurrent_dqn": RECURRENT_DQN,
    # The buffer wraps before the stop and after it; refreshed recurrent states patch it.
    "recurrent_dqn_wrapping": [*RECURRENT_DQN, "replay.capacity=600"],
}


@pytest.mark.parametrize("target", TARGETS.values(), ids=TARGETS)
def test_same_seed_gives_identical_parameters_and_metrics(
    target: list[str], tiny_config, tmp_path: Path
) -> None:
    first = train_in_process(tiny_config(*target, run_dir=tmp_path / "a"))
    second = train_in_process(tiny_config(*target, run_dir=tmp_path / "b"))
    assert first[0].keys() == second[0].keys()
    for key in first[0]:
        assert torch.equal(first[0][key], second[0][key]), key
    assert (first[1] == second[1]).all()
    assert [strip_wall_time(row) for row in first[2]] == [strip_wall_time(row) for row in second[2]]


def test_how_often_a_run_evaluates_does_not_change_what_it_learns(
    tiny_config, tmp_path: Path
) -> None:
    often = train_in_process(tiny_config("eval.interval_frames=200", run_dir=tmp_path / "a"))
    once = train_in_process(tiny_config("eval.interval_frames=1200", run_dir=tmp_path / "b"))
    assert len([row for row in often[2] if "eval/return" in row]) == 6
    assert len([row for row in once[2] if "eval/return" in row]) == 1
    for key in often[0]:
        assert torch.equal(often[0][key], once[0][key]), key
    assert (often[1] == once[1]).all()


@pytest.mark.parametrize("target", TARGETS.values(), ids=TARGETS)
def test_resume_at_an_episode_boundary_matches_the_uninterrupted_run(
    target: list[str], tiny_config, tmp_path: Path
) -> None:
    # Pendulum's and random MountainCar's episodes last 200 steps and batches hold 200
    # frames: the stop at 800 frames falls on an episode boundary.
    alone = train_in_process(
        tiny_config(*target, "collector.total_frames=1600", run_dir=tmp_path / "a")
    )

    interrupted = tmp_path / "b"
    train(tiny_config(*target, "collector.total_frames=800", run_dir=interrupted))
    resumed = load_config(None, [f"run_dir={interrupted}", "collector.total_frames=1600"])
    assert resumed.network.hidden_sizes == [32, 32]  # the saved config, not the preset
    assert_same_run(alone, resume_in_process(resumed))


# Bit flipping with hindsight relabelling, small: 15 steps per episode, none reached by the
# near-random policy of the first 600 frames, so that the stop at 600 falls on an episode
# boundary; relabelling and updates run from 300 frames on.
SMALL_BIT_FLIP = [
    "network.hidden_sizes=[32,32]",
    "collector.frames_per_batch=150",
    "collector.init_random_frames=300",
    "optim.utd_ratio=0.2",
    "optim.batch_size=64",
    "replay.capacity=5000",
    "eval.interval_frames=300",
    "eval.episodes=2",
    "logger.backend=none",
]


@pytest.mark.parametrize(
    "sampling",
    [[], ["replay.sampler=prioritized_slice", "replay.slice_len=4", "optim.target=nstep"]],
    ids=["transitions", "prioritized-slices"],
)
def test_resume_with_hindsight_relabelling_matches_the_uninterrupted_run(
    sampling: list[str], tmp_path: Path
) -> None:
    def config(run_dir: Path, frames: int):
        overrides = [*SMALL_BIT_FLIP, *sampling, f"collector.total_frames={frames}"]
        overrides.append(f"run_dir={run_dir}")
        return load_config("dqn_bitflip", overrides)

    alone = train_in_process(config(tmp_path / "a", 1200))
    interrupted = tmp_path / "b"
    train(config(interrupted, 600))
    assert read_metrics(interrupted)[-1]["episodes"] == 600 // 15  # whole episodes only
    resumed = resume_in_process(config(interrupted, 1200))
    assert_same_run(alone, resumed)
    assert all("eval/success_rate" in row for row in resumed[2] if "eval/return" in row)


# -- kill -9, SIGTERM --------------------------------------------------------------------


def test_kill_9_then_resume_continues_counters_buffer_and_metrics(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = start_training(run_dir, "collector.total_frames=4000")
    wait_for_checkpoints(run_dir, 2)
    wait_past_the_newest_checkpoint(run_dir)  # so that some work is lost
    process.kill()
    process.wait()
    scratch_rows = len(read_metrics(run_dir))

    config = load_config("default", [f"run_dir={run_dir}"])
    chosen, _ = choose_checkpoint(run_dir / "checkpoints")
    killed_buffer = TensorDict.load_memmap(run_dir / "replay").clone()  # before its restore
    run = build_run(config, resuming=True)
    try:
        run.checkpoints.load(chosen)
        frames = run.progress.frames
        assert frames == int(chosen.name.split("-")[1])
        assert len(run.buffer) == frames  # nothing past the checkpoint
        assert (run.buffer[:] == killed_buffer[:frames]).all()
    finally:
        run.close()
    assert scratch_rows * 200 >= frames  # the killed run had logged up to or past it

    result = subprocess.run(
        [PYTHON, str(TRAIN_PY), f"run_dir={run_dir}"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert f"resumed from {chosen}" in result.stderr
    rows = read_metrics(run_dir)
    assert_frames_continuous(rows, 200, 4000)
    assert [row["iteration"] for row in rows] == list(range(1, 21))


def test_sigterm_saves_at_an_iteration_boundary_and_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = start_training(run_dir, "collector.total_frames=4000", "eval.interval_frames=1000")
    wait_for_checkpoints(run_dir, 1)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert f"resume with: python train.py run_dir={run_dir}" in stdout
    stopped_at = int(re.search(r"stopped by SIGTERM at (\d+) frames", stdout)[1])
    assert stopped_at < 4000
    checkpoint = run_dir / "checkpoints" / f"checkpoint-{stopped_at:012d}"
    # Logged up to it, unless the evaluation due there is owed, its row waiting with it.
    owed = saved_progress(checkpoint).owed_eval is not None
    assert read_metrics(run_dir)[-1]["frames"] == stopped_at - 200 * owed

    result = subprocess.run(
        [PYTHON, str(TRAIN_PY), f"run_dir={run_dir}"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert_frames_continuous(read_metrics(run_dir), 200, 4000)


def test_a_second_ctrl_c_stops_at_once_with_the_resume_command_and_no_traceback(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    process = start_training(run_dir, "collector.total_frames=1000000")
    wait_for_checkpoints(run_dir, 1)
    process.send_signal(signal.SIGINT)
    stderr = ""  # the second once the first is seen: two sent at once may arrive as one
    while "saving a checkpoint, then stopping" not in stderr:
        line = process.stderr.readline()
        assert line, stderr
        stderr += line
    process.send_signal(signal.SIGINT)
    stdout, rest = process.communicate(timeout=120)
    stderr += rest
    assert process.returncode == 130, stderr
    assert "second Ctrl-C: stopping" in stderr and "Traceback" not in stderr
    assert f"resume with: python train.py run_dir={run_dir}" in stdout
    choose_checkpoint(run_dir / "checkpoints")  # the last good one verifies


@pytest.mark.parametrize(
    ("signum", "returncode", "said"),
    [
        (signal.SIGINT, 130, ""),
        (signal.SIGTERM, -signal.SIGTERM, "stopped by SIGTERM before training started\n"),
    ],
)
def test_a_stop_while_torch_is_imported_ends_the_command_quietly(
    tmp_path: Path, signum: int, returncode: int, said: str
) -> None:
    run_dir = tmp_path / "run"
    process = subprocess.Popen(  # -X importtime: a line on stderr as each module is imported
        [PYTHON, "-X", "importtime", str(TRAIN_PY), *TINY_RUN, f"run_dir={run_dir}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = "none"
    while line.rpartition("|")[2].strip() != "torch":  # tensordict's and TorchRL's to come
        line = process.stderr.readline()
        assert line, "train.py ended before it had imported torch"
    process.send_signal(signum)
    stdout, rest = process.communicate(timeout=120)
    assert process.returncode == returncode, rest
    assert "Traceback" not in stdout + rest and not run_dir.exists()
    assert [line for line in rest.splitlines(True) if "import time:" not in line] == (
        [said] if said else []
    )


def test_a_run_whose_checkpoints_are_gone_says_it_starts_again_from_frame_0(
    tiny_config, caplog: pytest.LogCaptureFixture
) -> None:
    config = tiny_config("collector.total_frames=400")
    train(config)
    shutil.rmtree(Path(config.run_dir) / "checkpoints")  # deleted to free the disk, say
    train(load_config(None, [f"run_dir={config.run_dir}", "collector.total_frames=600"]))
    assert (
        f"{config.run_dir} holds no checkpoint: training starts again from frame 0, "
        "replacing the 2 metrics rows logged there before" in caplog.text
    )
    assert [row["frames"] for row in read_metrics(Path(config.run_dir))] == [200, 400, 600]


def test_a_metrics_row_cut_short_by_a_kill_is_dropped_on_resume(tiny_config) -> None:
    config = tiny_config("collector.total_frames=600", "eval.interval_frames=400")
    train(config)
    metrics = Path(config.run_dir) / METRICS_FILE
    rows = metrics.read_text()
    metrics.write_text(rows + rows.splitlines()[-1][:30])  # as a kill -9 mid-write leaves it
    train(load_config(None, [f"run_dir={config.run_dir}", "collector.total_frames=1000"]))
    assert_frames_continuous(read_metrics(Path(config.run_dir)), 200, 1000)


# -- resume rules --------------------------------------------------------------------------


def test_a_resume_below_the_frames_trained_is_refused(tiny_config, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(tiny_config("collector.total_frames=400", run_dir=run_dir))
    shorter = load_config(None, [f"run_dir={run_dir}", "collector.total_frames=200"])
    below = r"collector.total_frames=200 is below the 400 frames this run has trained"
    with pytest.raises(ConfigError, match=rf"^{below} \(checkpoint-000000000400\): give at"):
        train(shorter)


def test_resume_refuses_experiment_changes_and_allows_budget_changes(
    tiny_config, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    train(tiny_config("collector.total_frames=400", run_dir=run_dir))
    with pytest.raises(ConfigError, match=r"optim\.lr.*cannot change when resuming"):
        load_config("default", [f"run_dir={run_dir}", "optim.lr=0.1"])
    resumed = load_config(
        "default", [f"run_dir={run_dir}", "collector.total_frames=800", "logger.backend=csv"]
    )
    assert resumed.collector.total_frames == 800 and resumed.optim.batch_size == 64


def test_new_run_in_a_directory_without_checkpoints_starts_clean(tiny_config, tmp_path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "replay").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("seed: 0\n")
    (run_dir / "metrics.jsonl").write_text('{"frames": 99999}\n')
    (run_dir / "replay" / "stale.memmap").write_bytes(b"\xff" * 4096)
    train(tiny_config("collector.total_frames=400", run_dir=run_dir))
    assert not (run_dir / "replay" / "stale.memmap").exists()
    assert [row["frames"] for row in read_metrics(run_dir)] == [200, 400]


# -- damaged checkpoints -------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A finished tiny run with checkpoints at 800 and 1200 frames (and the best)."""
    run_dir = tmp_path_factory.mktemp("saved") / "run"
    train(load_config("default", [*TINY_RUN, f"run_dir={run_dir}"]))
    return run_dir


def damageable_files(run_dir: Path) -> list[str]:
    newest = sorted((run_dir / "checkpoints").glob("checkpoint-*"))[-1]
    files = ["manifest.json"]
    for component in sorted((newest / "components").iterdir()):
        largest = max(
            (f for f in component.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size
        )
        files.append(largest.relative_to(newest).as_posix())
    return files


def damage(path: Path, how: str) -> None:
    size = path.stat().st_size
    if how == "truncate":
        os.truncate(path, size // 2)
    elif how == "zero":
        path.write_bytes(b"\0" * size)
    else:
        path.unlink()


@pytest.mark.parametrize("how", ["truncate", "zero", "delete"])
def test_every_damaged_file_is_detected_and_the_previous_checkpoint_used(
    saved_run: Path, tmp_path: Path, how: str
) -> None:
    files = damageable_files(saved_run)
    assert any("replay_buffer" in f for f in files)
    assert any("sac_networks" in f for f in files) and any("optimizer" in f for f in files)
    for relative in files:
        copy = tmp_path / f"{how}-{relative.replace('/', '_')}"
        shutil.copytree(saved_run, copy)
        checkpoints = sorted((copy / "checkpoints").glob("checkpoint-*"))
        damage(checkpoints[-1] / relative, how)
        chosen, passed_over = choose_checkpoint(copy / "checkpoints")
        assert chosen == checkpoints[-2], relative
        assert [damaged for damaged, _ in passed_over] == [checkpoints[-1]]


def test_resume_falls_back_and_says_why(saved_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(saved_run, run_dir)
    newest = sorted((run_dir / "checkpoints").glob("checkpoint-*"))[-1]
    damage(next((newest / "components").glob("*replay_buffer/state.pt")), "zero")
    result = subprocess.run(
        [PYTHON, str(TRAIN_PY), f"run_dir={run_dir}", "collector.total_frames=1600"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"{newest.name}" in result.stderr and "checksum mismatch" in result.stderr
    assert "resumed from" in result.stderr and "at 800 frames" in result.stderr
    assert_frames_continuous(read_metrics(run_dir), 200, 1600)


def test_damaged_replay_files_stop_a_resume_with_a_clear_message(
    saved_run: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(saved_run, run_dir)
    with open(run_dir / "replay" / "observation.memmap", "r+b") as file:
        file.seek(100)
        file.write(b"\xff" * 4)
    result = subprocess.run(
        [PYTHON, str(TRAIN_PY), f"run_dir={run_dir}", "collector.total_frames=1600"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    assert "cannot resume: the replay buffer's files" in result.stderr
    assert "observation slots 0-1023" in result.stderr and "Traceback" not in result.stderr


def test_a_copy_of_a_run_without_its_replay_files_is_refused_saying_so(
    saved_run: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(saved_run, run_dir, ignore=shutil.ignore_patterns("replay"))
    resumed = load_config(None, [f"run_dir={run_dir}", "collector.total_frames=1600"])
    missing = f"cannot resume: the replay buffer's files in {run_dir / 'replay'}/ are missing;"
    with pytest.raises(RunFailed, match=re.escape(missing)):
        train(resumed)
    assert not (run_dir / "replay").exists()  # refused before anything was built


def test_no_good_checkpoint_exits_with_an_error_and_touches_nothing(
    saved_run: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(saved_run, run_dir)
    for checkpoint in (run_dir / "checkpoints").glob("checkpoint-*"):
        damage(checkpoint / "manifest.json", "truncate")
    before = run_files(run_dir)
    with pytest.raises(CorruptCheckpoint):
        choose_checkpoint(run_dir / "checkpoints")
    result = subprocess.run(
        [PYTHON, str(TRAIN_PY), f"run_dir={run_dir}"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1
    assert "cannot resume: no usable checkpoint" in result.stderr
    assert "Traceback" not in result.stderr
    assert run_files(run_dir) == before


# -- faults during a run -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        (faulty_envs.RAISES_AT_1100, "while collecting.*simulated physics failure"),
        (faulty_envs.NAN_AT_1100, "became nan at iteration"),
    ],
)
def test_faults_stop_the_run_with_the_last_checkpoint_intact(
    tiny_config, env_id: str, message: str
) -> None:
    config = tiny_config(f"env.name={env_id}", "collector.total_frames=2000")
    with pytest.raises(RunFailed, match=message) as failure:
        train(config)
    assert "checkpoint-000000000800" in str(failure.value)
    chosen, passed_over = choose_checkpoint(Path(config.run_dir) / "checkpoints")
    assert chosen.name == "checkpoint-000000000800" and passed_over == []


def test_a_fault_before_the_first_checkpoint_says_the_same_command_starts_afresh(
    tiny_config, tmp_path: Path
) -> None:
    faulty = (f"env.name={faulty_envs.NAN_AT_1100}", "collector.total_frames=2000")
    overrides = (*faulty, "eval.interval_frames=2000")  # no checkpoint before the fault
    with pytest.raises(RunFailed, match="became nan") as failure:
        train(tiny_config(*overrides))
    assert str(failure.value).endswith(
        "the last good checkpoint is none yet (the same command starts the run afresh)"
    )
    # As its resume command would: it starts again as it was set (not as the default preset).
    again = load_config(None, [f"run_dir={tmp_path / 'run'}", "collector.total_frames=1000"])
    assert again.network.hidden_sizes == [32, 32] and again.env.name == faulty_envs.NAN_AT_1100
    assert train(again).frames == 1000  # (before the fault)


def test_disk_full_during_a_save_keeps_the_previous_checkpoint(
    tiny_config, tmp_path: Path, tmpfs
) -> None:
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    # Room for about one checkpoint (each ~0.2 MB here) in a file system of its own.
    tmpfs(checkpoints, "size=320k")
    (run_dir / "config.yaml").write_text("")  # a run directory prepared by hand
    config = tiny_config(run_dir=run_dir)
    (run_dir / "config.yaml").write_text(to_yaml(config))  # as train() writes it
    # Built and run past train()'s check at the start, which would refuse a run whose
    # checkpoints cannot all fit: here the disk fills during a save.
    run = build_run(config)
    with pytest.raises(RunFailed, match=r"could not save the checkpoint at \d+ frames") as failure:
        try:
            run_iterations(run)
        finally:
            run.close()
    assert "No space left on device" in str(failure.value)
    chosen, _ = choose_checkpoint(checkpoints)
    assert str(chosen) in str(failure.value)
    run = build_run(load_config("default", [f"run_dir={run_dir}"]), resuming=True)
    try:
        run.checkpoints.load(chosen)
        assert run.progress.frames == int(chosen.name.split("-")[1])
    finally:
        run.close()


def test_disk_full_while_journaling_leaves_the_last_checkpoint_restorable(
    tiny_config, tmp_path: Path, tmpfs
) -> None:
    run_dir = tmp_path / "run"
    # The buffer wraps after the first checkpoint: the next 1,000 frames journal ~45 kB.
    tmpfs(run_dir / "replay-journal", "size=32k")
    (run_dir / "config.yaml").write_text("")  # a run directory prepared by hand
    settings = ["replay.capacity=1200", "collector.total_frames=4000", "eval.interval_frames=1000"]
    config = tiny_config(*settings, run_dir=run_dir)
    (run_dir / "config.yaml").write_text(to_yaml(config))  # as train() writes it
    run = build_run(config)
    with pytest.raises(OSError, match="No space left on device"):
        try:
            run_iterations(run)
        finally:
            run.close()
    assert run.phases.current == "extending the buffer"
    chosen, _ = choose_checkpoint(
        run_dir / "checkpoints", restorable_from(run_dir / "replay-journal")
    )
    run = build_run(load_config("default", [f"run_dir={run_dir}"]), resuming=True)
    try:
        run.checkpoints.load(chosen)  # restored through the journal, every chunk checked
        assert run.progress.frames == int(chosen.name.split("-")[1])
    finally:
        run.close()


def test_unwritable_run_dir_is_reported_before_any_work(tiny_config, tmp_path: Path, tmpfs):
    read_only = tmp_path / "read-only"
    tmpfs(read_only, "ro,size=1m")
    with pytest.raises(RunFailed, match="is not writable: Read-only file system"):
        train(tiny_config(run_dir=read_only / "run"))


def test_resume_continues_the_same_wandb_run_and_csv_logs(
    tiny_config, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # offline: no account needed
    run_dir = tmp_path / "run"
    train(tiny_config("logger.backend=wandb", "collector.total_frames=800", run_dir=run_dir))
    resumed = load_config("default", [f"run_dir={run_dir}", "collector.total_frames=1200"])
    train(resumed)
    run_ids = {
        path.name.rsplit("-", 1)[1] for path in (run_dir / "logs/wandb").glob("offline-run-*")
    }
    assert len(list((run_dir / "logs/wandb").glob("offline-run-*"))) == 2
    assert len(run_ids) == 1, run_ids  # one wandb run, continued

    csv_dir = tmp_path / "csv"
    process = start_training(csv_dir, "logger.backend=csv", "collector.total_frames=4000")
    wait_for_checkpoints(csv_dir, 2)
    wait_past_the_newest_checkpoint(csv_dir)
    process.kill()
    process.wait()
    train(load_config("default", [f"run_dir={csv_dir}"]))
    (scalars,) = csv_dir.glob("logs/*/scalars/iteration.csv")
    steps = [int(line.split(",")[0]) for line in scalars.read_text().splitlines()]
    assert steps == list(range(200, 4001, 200))  # no step repeated or missing
