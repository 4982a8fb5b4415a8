"""Ray on SLURM (``launcher=slurm collector.mode=ray``, ``ray.address`` unset) on the real
local one-node cluster: the job starts a Ray head of its own, trains against it, saves and
requeues on USR2, resumes on a fresh Ray, and leaves no Ray process behind; what the job's
allocation cannot hold is refused before anything is submitted.

One actor of one CPU on the one-CPU job of ``slurm.profile=local``: every actor imports torch
(about 800 MB), and the test cluster shares two cores with the rest of the suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rl_app.launch.job import read_attempts
from tests.helpers import TINY_RUN, wait_for
from tests.test_slurm import (  # noqa: F401 (launch: the fixture)
    assert_frames_continuous,
    launch,
    preempt,
    wait_until_done,
)

pytestmark = [pytest.mark.slurm, pytest.mark.ray]

RAY_JOB = ["collector.mode=ray", "collector.workers=1", "ray.worker_cpus=1"]


def processes_of(temp_dir: str) -> list[str]:
    """Live processes of the Ray whose temporary directory is ``temp_dir``: its daemons name
    it on their command line, and every process it starts (actors too) has it as TMPDIR."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if temp_dir.encode() in cmdline or f"TMPDIR={temp_dir}".encode() in environ:
            found.append(f"{entry.name}: {cmdline[:120]!r}")
    return found


def test_a_job_runs_its_own_ray_saves_requeues_resumes_and_leaves_no_ray_behind(
    launch,  # noqa: F811 (test_slurm's fixture, imported above)
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    (job_id,) = launch(run_dir, *RAY_JOB, "collector.total_frames=4000")
    frames, gap = preempt_after_a_checkpoint(job_id, run_dir)
    print(f"USR2 to the resumed job's first new iteration: {gap:.1f} s")
    assert wait_until_done(job_id, timeout=180) == "COMPLETED"

    attempts = read_attempts(run_dir)
    assert [(row["event"], row["restart_count"]) for row in attempts] == [
        ("ray cluster", 0), ("start", 0), ("preempted", 0),
        ("ray cluster", 1), ("start", 1), ("finished", 1),
    ]  # fmt: skip
    clusters = [row for row in attempts if row["event"] == "ray cluster"]
    # A head inside the job, with the allocation's CPUs; a fresh one for the requeued job.
    assert all(row["nodes"] == 1 and row["cpus"] == 1.0 for row in clusters)
    assert clusters[0]["address"] != clusters[1]["address"]
    assert 0 < frames < 4000
    assert_frames_continuous(run_dir, 200, 4000)
    # Each attempt's Ray stopped with it: no daemon, no actor, no temporary directory left.
    for cluster in clusters:
        assert processes_of(cluster["temp_dir"]) == []
        assert not os.path.exists(cluster["temp_dir"])
    assert not list((run_dir / "slurm" / "ray").glob("*-head.json"))


def preempt_after_a_checkpoint(job_id: str, run_dir: Path) -> tuple[int, float]:
    wait_for("a checkpoint", lambda: any((run_dir / "checkpoints").glob("c*")), 120, job_id)
    (cluster,) = [row for row in read_attempts(run_dir) if row["event"] == "ray cluster"]
    assert processes_of(cluster["temp_dir"])  # the job's Ray, found as the check finds it
    return preempt(job_id, run_dir, restart_count=0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            [*RAY_JOB, "collector.workers=4", "slurm.cpus_per_task=1", "slurm.nodes=2"],
            "asks 4 CPUs, and the job's allocation has 2 (slurm.nodes=2 x slurm.cpus_per_task=1)",
        ),
        (["slurm.nodes=2"], "slurm.nodes=2 is not accepted"),
    ],
    ids=["more_actor_cpus_than_the_allocation", "several_nodes_without_ray"],
)
def test_what_the_job_cannot_run_is_refused_before_submitting(
    slurm_cluster: None, refused, settings: list[str], message: str
) -> None:
    error = refused("launcher=slurm", "slurm.profile=local", *TINY_RUN, "run_dir=run", *settings)
    assert message in error
