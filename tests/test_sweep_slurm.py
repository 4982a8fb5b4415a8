"""Sweeps whose workers are SLURM jobs (``launcher: slurm``), on the real local cluster: a
worker preempted with USR2 and one killed with SIGKILL lose no trial and count none twice,
and settings the cluster cannot satisfy are refused before anything is created.

Without root or package access the cluster cannot start and these tests are skipped with
the reason; with ``CI`` set they fail instead."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_app.launch.job import read_attempts
from rl_app.logger import read_metrics
from rl_app.rundir import HOLDER_FILE
from rl_app.sweep.__main__ import main as sweep_command
from rl_app.sweep.spec import load_sweep
from rl_app.sweep.study import open_study
from tests.gate_envs import GATE_VARIABLE, GATED
from tests.helpers import FINAL_STATES, PYTHON, ROOT, TINY_RUN, job_state, refusal, wait_for

pytestmark = pytest.mark.slurm

# Six iterations of 200 frames, a checkpoint every 400, on CartPole that waits at a gate
# after 700 frames (tests/gate_envs.py): the test signals a trial that is known to be
# training, however long the second worker takes to start.
TRIAL_FRAMES = 1200
TRIAL_RUN = [*TINY_RUN, *GATED, "optim.batch_size=48", f"collector.total_frames={TRIAL_FRAMES}"]


def write_sweep(tmp_path: Path, **changes: Any) -> Path:
    tree = {
        "preset": "dqn_cartpole",
        "overrides": TRIAL_RUN,
        "space": {"optim.lr": {"low": 1e-4, "high": 1e-3, "log": True}},
        "trials": 3,
        "jobs": 2,
        "launcher": "slurm",
        "slurm": {"profile": "local"},
        "sweep_dir": str(tmp_path / "sweep"),
        **changes,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest.fixture
def submit_sweep(slurm_cluster: None) -> Iterator[Callable[[Path], list[str]]]:
    """``submit_sweep(sweep_file)``: the sweep command; returns the worker job ids it printed.
    Jobs still queued or running at teardown are cancelled."""
    job_ids: list[str] = []

    def submit(source: Path) -> list[str]:
        result = subprocess.run(
            [PYTHON, "-m", "rl_app.sweep", str(source)],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        ids = re.findall(r"^submitted worker job (\S+)", result.stdout, flags=re.MULTILINE)
        job_ids.extend(ids)
        return ids

    yield submit
    if job_ids:
        subprocess.run(["scancel", *{job.split("_")[0] for job in job_ids}], check=False)


def trial_attempts(trial: Path) -> list[tuple[str, str, int]]:
    """(event, job id, restart count) of each attempt at a trial, in order."""
    return [(row["event"], row["job_id"], row["restart_count"]) for row in read_attempts(trial)]


def checkpoint_frames(trial: Path) -> list[int]:
    return sorted(int(path.name.split("-")[1]) for path in trial.glob("checkpoints/checkpoint-*"))


def worker_of(trial: Path) -> str:
    """The job id of the worker that started training ``trial``, once it has a checkpoint."""
    wait_for(f"{trial.name}'s first checkpoint", lambda: checkpoint_frames(trial), 60)
    (start,) = read_attempts(trial)[:1]
    return start["job_id"]


def stderr_of(job_id: str, sweep_dir: Path) -> str:
    """What worker job ``job_id`` wrote to its stderr so far."""
    return "".join(path.read_text() for path in sweep_dir.rglob(f"{job_id}_*log.err"))


def test_a_preempted_and_a_killed_worker_lose_no_trial_and_count_none_twice(
    submit_sweep, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = write_sweep(tmp_path)
    sweep_dir = tmp_path / "sweep"
    gate = tmp_path / "gate"  # while it exists, the trials wait after 700 frames
    gate.touch()
    monkeypatch.setenv(GATE_VARIABLE, str(gate))  # sbatch hands it to the jobs
    job_ids = submit_sweep(source)
    assert len(job_ids) == 2 and len({job.split("_")[0] for job in job_ids}) == 1  # one array

    first, second = sweep_dir / "trial-0000", sweep_dir / "trial-0001"
    preempted_job, killed_job = worker_of(first), worker_of(second)
    assert {preempted_job, killed_job} == set(job_ids)  # one trial each, side by side
    # kill -9 of the worker process training trial 1 (it holds the trial's run directory).
    os.kill(json.loads((second / HOLDER_FILE).read_text())["pid"], signal.SIGKILL)
    subprocess.run(["scancel", "--signal=USR2", preempted_job], check=True)
    wait_for(
        f"job {preempted_job} to take the USR2",
        lambda: "SIGUSR2: saving a checkpoint" in stderr_of(preempted_job, sweep_dir),
        60,
    )
    gate.unlink()

    for job_id in job_ids:
        wait_for(f"job {job_id} to end", lambda j=job_id: job_state(j) in FINAL_STATES, 180)
    assert job_state(preempted_job) == "COMPLETED"
    assert job_state(killed_job) == "FAILED"

    # The study has its 3 trials, each complete once, in its own run directory.
    trials = open_study(load_sweep(source)).get_trials()
    assert [(t.number, t.state.name) for t in trials] == [(n, "COMPLETE") for n in range(3)]
    assert sorted(p.name for p in sweep_dir.glob("trial-*")) == [f"trial-000{n}" for n in range(3)]
    for trial in sweep_dir.glob("trial-*"):
        # No iteration lost or repeated: the trials resumed, none restarted from 0.
        logged = [row["frames"] for row in read_metrics(trial)]
        assert logged == list(range(200, TRIAL_FRAMES + 1, 200))

    # Trial 0 stopped at an iteration boundary with a checkpoint; its requeued job resumed it.
    preempted = [row for row in read_attempts(first) if row["event"] == "preempted"]
    assert len(preempted) == 1 and preempted[0]["requeued"]
    frames = preempted[0]["frames"]
    assert frames in (600, 800)  # the end of the iteration the USR2 came in: before the gate
    assert trial_attempts(first) == [
        ("start", preempted_job, 0), ("preempted", preempted_job, 0),
        ("start", preempted_job, 1), ("finished", preempted_job, 1),
    ]  # fmt: skip
    assert read_attempts(first)[2]["resumed_from_frames"] == frames
    # Trial 1's worker died mid-trial: the requeued worker took it over from its checkpoint.
    assert trial_attempts(second) == [
        ("start", killed_job, 0), ("start", preempted_job, 1), ("finished", preempted_job, 1),
    ]  # fmt: skip
    assert read_attempts(second)[1]["resumed_from_frames"] == 400

    workers = [(row["event"], row["job_id"], row["restart_count"])
               for row in read_attempts(sweep_dir)]  # fmt: skip
    assert sorted(workers) == sorted([
        ("start", preempted_job, 0), ("start", killed_job, 0), ("start", preempted_job, 1),
        ("ended", preempted_job, 1),
    ])  # fmt: skip
    # The last worker to end wrote the summary.
    assert "3 of 3 trials: 3 complete" in (sweep_dir / "summary.md").read_text()


@pytest.mark.parametrize(
    ("slurm", "message"),
    [
        ({"gpus_per_node": 2}, "slurm.gpus_per_node=2 is out of range: the nodes of partition"),
        ({"partition": "nope"}, "accepted partitions are debug"),
        ({"cpus_per_task": 4096}, "slurm.cpus_per_task=4096 is out of range"),
        # (sbatch refuses it: the sweep directory made for the submission is removed again)
        ({"constraint": "nosuchfeature"}, "sbatch refused the job"),
    ],
)
def test_worker_settings_the_cluster_cannot_satisfy_are_refused_before_anything_is_created(
    slurm_cluster: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    slurm: dict[str, Any],
    message: str,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    sweep_file = write_sweep(tmp_path, slurm=slurm, sweep_dir=str(out / "sweep"))
    code = sweep_command([str(sweep_file)])  # in this process: no imports paid again
    printed = capsys.readouterr()
    result = subprocess.CompletedProcess(["rl_app.sweep"], code, printed.out, printed.err)
    assert message in refusal(result, out)
