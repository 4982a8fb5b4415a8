"""Launching on a real SLURM cluster (slurm/local-cluster/, started once per session):
jobs run to completion, preemption saves at an iteration boundary, requeues and resumes
exactly, arrays give one run per value, GPU requests schedule, bad settings are refused.

Without root or package access the cluster cannot start and these tests are skipped with
the reason; with ``CI`` set they fail instead."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rl_app.launch.job import read_attempts
from rl_app.launch.slurm import read_array_summary
from rl_app.logger import read_metrics
from rl_app.run import train
from tests.helpers import (
    FINAL_STATES,
    PYTHON,
    RECURRENT_DQN,
    TINY_RUN,
    TRAIN_PY,
    hold_lock_in_another_process,
    job_state,
    saved_progress,
    strip_wall_time,
    wait_for,
)
from tests.slow_eval_envs import (
    FIRST_ATTEMPT_ONLY_VARIABLE,
    SLOW_EVAL,
    SLOW_STEP_S,
    STEP_SECONDS_VARIABLE,
)

pytestmark = pytest.mark.slurm


@pytest.fixture
def launch(slurm_cluster: None) -> Iterator[Callable[..., list[str]]]:
    """``launch(run_dir, *overrides)``: ``train.py launcher=slurm`` with a tiny run; returns
    the job ids it printed. Jobs still queued or running at teardown are cancelled."""
    job_ids: list[str] = []

    def submit(run_dir: Path, *overrides: str) -> list[str]:
        result = subprocess.run(
            [PYTHON, str(TRAIN_PY), "launcher=slurm", "slurm.profile=local", *TINY_RUN,
             f"run_dir={run_dir}", *overrides],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        ids = re.findall(r"^submitted job (\S+)", result.stdout, flags=re.MULTILINE)
        assert ids, result.stdout
        job_ids.extend(ids)
        return ids

    yield submit
    if job_ids:
        subprocess.run(["scancel", *{job.split("_")[0] for job in job_ids}], check=False)


def wait_until_done(job_id: str, timeout: float) -> str:
    return wait_for(
        f"job {job_id} to end",
        lambda: job_state(job_id) if job_state(job_id) in FINAL_STATES else None,
        timeout,
    )


def events(run_dir: Path, event: str, restart_count: int | None = None) -> list[dict]:
    return [
        row
        for row in read_attempts(run_dir)
        if row["event"] == event and restart_count in (None, row["restart_count"])
    ]


def safe_metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl while a job may be writing it (a half-written last line reads as none)."""
    try:
        return read_metrics(run_dir)
    except json.JSONDecodeError:
        return []


def assert_frames_continuous(run_dir: Path, step: int, last: int) -> list[dict]:
    rows = read_metrics(run_dir)
    assert [row["frames"] for row in rows] == list(range(step, last + 1, step))
    assert [row["iteration"] for row in rows] == list(range(1, last // step + 1))
    return rows


def logged_until(run_dir: Path, frames: int) -> int:
    """The last row a run stopped at ``frames`` logged: the one before when the evaluation
    due there is owed, its row waiting for it in the checkpoint."""
    owed = saved_progress(run_dir / "checkpoints" / f"checkpoint-{frames:012d}").owed_eval
    return frames if owed is None else frames - 200


# -- a job that runs to the end -----------------------------------------------------------


@pytest.mark.parametrize("agent", [[], RECURRENT_DQN], ids=["sac", "recurrent_dqn"])
def test_a_submitted_job_trains_to_the_end_with_metrics_and_checkpoints(
    agent: list[str], launch, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    (job_id,) = launch(run_dir, *agent)
    assert (run_dir / "config.yaml").is_file()  # the run directory exists from submission on
    assert wait_until_done(job_id, timeout=120) == "COMPLETED"

    assert_frames_continuous(run_dir, 200, 1200)
    assert (run_dir / "checkpoints" / "checkpoint-000000001200").is_dir()
    assert (run_dir / "slurm" / f"{job_id}_0_log.err").is_file()
    attempts = read_attempts(run_dir)
    assert [(row["event"], row["restart_count"]) for row in attempts] == [
        ("start", 0),
        ("finished", 0),
    ]
    assert attempts[0]["resumed_from_frames"] == 0 and attempts[0]["job_id"] == job_id
    assert attempts[1]["frames"] == 1200


# -- preemption ----------------------------------------------------------------------------


def preempt(job_id: str, run_dir: Path, restart_count: int) -> tuple[int, float]:
    """USR2 to a running job; returns the frames it saved at and the seconds from the
    signal to the requeued job's first new iteration."""
    sent = time.monotonic()
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    (stop,) = wait_for(
        "the job to save and stop", lambda: events(run_dir, "preempted", restart_count), 60
    )
    # Saved at an iteration boundary: whole batches, checkpointed right there, logged up to
    # it (an evaluation due there is owed, with its row, to the requeued job).
    frames = stop["frames"]
    assert stop["requeued"] and frames % 200 == 0
    assert (run_dir / "checkpoints" / f"checkpoint-{frames:012d}").is_dir()
    assert read_metrics(run_dir)[-1]["frames"] == logged_until(run_dir, frames)

    (start,) = wait_for(
        "the requeued job to start", lambda: events(run_dir, "start", restart_count + 1), 90
    )
    assert start["job_id"] == job_id  # the same job, requeued
    assert start["resumed_from_frames"] == frames
    wait_for(
        "the resumed job's first iteration",
        lambda: any(row["frames"] > frames for row in safe_metrics(run_dir)),
        60,
        job_id,
    )
    return frames, time.monotonic() - sent


def test_usr2_twice_saves_at_a_boundary_requeues_and_resumes_exactly(
    launch, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    (job_id,) = launch(
        run_dir,
        "collector.total_frames=4000",
        "eval.interval_frames=1000",
        "logger.backend=wandb",
    )
    wait_for("a checkpoint", lambda: any((run_dir / "checkpoints").glob("c*")), 120, job_id)

    first, first_gap = preempt(job_id, run_dir, restart_count=0)
    second, second_gap = preempt(job_id, run_dir, restart_count=1)
    print(f"USR2 to the resumed job's first new iteration: {first_gap:.1f} s, {second_gap:.1f} s")
    assert wait_until_done(job_id, timeout=120) == "COMPLETED"

    assert 0 < first < second < 4000
    assert [(row["event"], row["restart_count"]) for row in read_attempts(run_dir)] == [
        ("start", 0), ("preempted", 0), ("start", 1), ("preempted", 1), ("start", 2),
        ("finished", 2),
    ]  # fmt: skip
    # No gap and no duplicate across both requeues.
    assert_frames_continuous(run_dir, 200, 4000)
    # The same wandb run continued by every attempt.
    wandb_runs = list((run_dir / "logs" / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 3
    assert len({path.name.rsplit("-", 1)[1] for path in wandb_runs}) == 1


def test_usr2_during_a_slow_evaluation_saves_at_once_and_the_requeued_job_pays_it(
    launch, tiny_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    slow_first_attempt = {STEP_SECONDS_VARIABLE: SLOW_STEP_S, FIRST_ATTEMPT_ONLY_VARIABLE: "1"}
    for name, value in slow_first_attempt.items():
        monkeypatch.setenv(name, value)  # sbatch hands them to the job
    (job_id,) = launch(run_dir, *SLOW_EVAL)
    for name in slow_first_attempt:
        monkeypatch.delenv(name)
    # Iteration 1 is logged: USR2 comes in iteration 2, whose 20 s evaluation is due.
    wait_for("the first iteration", lambda: safe_metrics(run_dir), 120, job_id)
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    (stop,) = wait_for("the job to save and stop", lambda: events(run_dir, "preempted", 0), 60)
    assert stop["frames"] == 400 and stop["requeued"]
    owed = saved_progress(run_dir / "checkpoints" / "checkpoint-000000000400").owed_eval
    assert owed is not None and owed["iteration"] == 2
    assert wait_until_done(job_id, timeout=240) == "COMPLETED"

    (start,) = events(run_dir, "start", restart_count=1)
    assert start["resumed_from_frames"] == 400
    rows = assert_frames_continuous(run_dir, 200, 1200)
    alone = tiny_config(*SLOW_EVAL, f"threads={start['threads']}", run_dir=tmp_path / "alone")
    train(alone)
    assert [strip_wall_time(row) for row in rows] == [
        strip_wall_time(row) for row in read_metrics(tmp_path / "alone")
    ]  # the owed evaluation's row included


def test_a_preempted_learner_ends_its_collection_job_and_resumes_with_a_fresh_one(
    launch, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    # The learner job and one collection job: one CPU each on the two-core test cluster.
    (job_id,) = launch(
        run_dir,
        "collector.total_frames=4000",
        "collector.mode=distributed",
        "collector.nodes=1",
        "collector.address=127.0.0.1",
    )

    def collection_jobs() -> set[str]:
        return {path.name.split("_")[0] for path in run_dir.glob("slurm/collectors/*.pkl")}

    wait_for("a checkpoint", lambda: any((run_dir / "checkpoints").glob("c*")), 120, job_id)
    (first,) = collection_jobs()
    frames, _ = preempt(job_id, run_dir, restart_count=0)
    assert job_state(first) == "COMPLETED"  # ended by the learner before it requeued
    assert wait_until_done(job_id, timeout=120) == "COMPLETED"
    assert len(collection_jobs() - {first}) == 1  # the resumed learner submitted a fresh one
    assert 0 < frames < 4000
    assert_frames_continuous(run_dir, 200, 4000)
    assert not subprocess.run(["squeue", "--noheader"], capture_output=True, text=True).stdout


def test_preemptions_beyond_max_requeues_stop_with_the_checkpoint_saved(
    launch, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    (job_id,) = launch(
        run_dir, "collector.total_frames=4000", "eval.interval_frames=1000", "slurm.max_requeues=0"
    )
    wait_for("a checkpoint", lambda: any((run_dir / "checkpoints").glob("c*")), 120, job_id)
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    assert wait_until_done(job_id, timeout=60) == "FAILED"

    attempts = read_attempts(run_dir)
    assert [row["event"] for row in attempts] == ["start", "preempted"]
    frames = attempts[1]["frames"]
    assert not attempts[1]["requeued"] and 0 < frames < 4000
    assert (run_dir / "checkpoints" / f"checkpoint-{frames:012d}").is_dir()
    assert_frames_continuous(run_dir, 200, logged_until(run_dir, frames))
    assert "slurm.max_requeues=0" in (run_dir / "slurm" / f"{job_id}_0_log.err").read_text()


# -- arrays, GPUs --------------------------------------------------------------------------


def test_a_job_array_over_seeds_gives_one_run_directory_per_seed(launch, tmp_path: Path) -> None:
    parent = tmp_path / "sweep"
    job_ids = launch(parent, "collector.total_frames=800", "slurm.array=seed=1,2,3")
    assert len(job_ids) == 3 and len({job.split("_")[0] for job in job_ids}) == 1  # one array

    tasks = read_array_summary(parent / "array.tsv")
    assert [task["task"] for task in tasks] == ["seed=1", "seed=2", "seed=3"]
    assert [task["job_id"] for task in tasks] == job_ids
    for job_id in job_ids:
        assert wait_until_done(job_id, timeout=180) == "COMPLETED"
    returns = []
    for seed, task in enumerate(tasks, start=1):
        run_dir = Path(task["run_dir"])
        assert run_dir == parent / f"seed={seed}"
        assert f"seed: {seed}\n" in (run_dir / "config.yaml").read_text()
        assert [row["job_id"] for row in read_attempts(run_dir)] == [task["job_id"]] * 2
        rows = assert_frames_continuous(run_dir, 200, 800)
        returns.append(tuple(row["eval/return"] for row in rows if "eval/return" in row))
    assert len(set(returns)) == 3, returns  # different seeds, different results


def test_a_gpu_request_schedules_and_training_falls_back_to_the_cpu(launch, tmp_path: Path) -> None:
    cpus = min(2, os.cpu_count() or 1)
    run_dir = tmp_path / "run"
    (job_id,) = launch(
        run_dir,
        "collector.total_frames=400",
        "slurm.gpus_per_node=1",
        f"slurm.cpus_per_task={cpus}",
    )
    assert wait_until_done(job_id, timeout=120) == "COMPLETED"

    start = events(run_dir, "start")[0]
    assert start["cuda_visible_devices"] == "0"  # SLURM gave the job the (fake) GPU
    assert start["cuda_available"] is False and start["device"] == "cpu"
    assert start["threads"] == cpus  # threads follow the allocation, not the host
    assert_frames_continuous(run_dir, 200, 400)


# -- bad settings --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("slurm.profile=nope", "accepted profiles are example-gpu-cluster, local"),
        ("slurm.gpus_per_node=2", "have at most 1 GPU(s)"),
        ("slurm.partition=nope", "accepted partitions are debug"),
        ("slurm.array=seed", "e.g. slurm.array=seed=1,2,3"),
        ("slurm.array=seed=1,-1", "seed=-1 is out of range"),
        ("slurm.constraint=nosuchfeature", "sbatch refused the job"),
        # (the directories made for the array's runs are removed again)
        ("slurm.constraint=nosuchfeature slurm.array=seed=1,2", "sbatch refused the job"),
    ],
)
def test_bad_slurm_settings_are_refused_in_one_line(
    slurm_cluster: None, refused, setting: str, message: str
) -> None:
    assert message in refused("launcher=slurm", *TINY_RUN, "run_dir=runs/a", *setting.split())


def test_a_run_directory_in_use_is_refused_before_submitting(
    slurm_cluster: None, command, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    holder = hold_lock_in_another_process(run_dir, seconds=120)
    try:
        result = command("launcher=slurm", "slurm.profile=local", *TINY_RUN, f"run_dir={run_dir}")
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 2, result.stderr
    assert f"pid {holder.pid}" in result.stderr and "Traceback" not in result.stderr
    assert not (run_dir / "slurm").exists()  # nothing was submitted
