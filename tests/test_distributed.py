"""Collection jobs on the real local SLURM cluster (``collector.mode=distributed``): both
jobs run while the learner trains, each batch holds frames from both with distinct
trajectories, the weights the learner pushes reach both, a job that dies stops the run
with its id and log and leaves the checkpoint intact, and nothing is left in the queue."""

from __future__ import annotations

import re
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from rl_app.checkpointing import checkpoint_candidates, verify_checkpoint
from rl_app.collection.distributed import relabel_trajectory_ids
from rl_app.logger import read_metrics
from rl_app.loop import RunFailed
from rl_app.replay import TRAJECTORY_KEY
from rl_app.run import train
from rl_app.rundir import CHECKPOINTS_DIR
from tests.helpers import (
    TINY_RUN,
    acting_collector,
    actor_version,
    child_processes,
    collect_around_a_push,
    wait_for,
)

DISTRIBUTED_RUN = [
    "collector.mode=distributed",
    "collector.nodes=2",
    "collector.address=127.0.0.1",
    "collector.connect_timeout_s=120",
    "slurm.profile=local",
]


def queued(job_ids: set[str]) -> set[str]:
    """Which of ``job_ids`` are still in ``squeue`` (pending, running or completing)."""
    answer = subprocess.run(
        ["squeue", "--noheader", "--format=%i"], capture_output=True, text=True, check=True
    )
    return job_ids & set(answer.stdout.split())


def wait_until_gone(job_ids: set[str]) -> None:
    wait_for(f"jobs {sorted(job_ids)} to leave squeue", lambda: not queued(job_ids), 60)


@pytest.mark.slurm
def test_two_collection_jobs_feed_the_learner_and_act_with_its_weights(
    slurm_cluster: None,
    tiny_config,
) -> None:
    config = tiny_config(*DISTRIBUTED_RUN, "collector.init_random_frames=0")
    with acting_collector(config) as (algorithm, collector):
        job_ids = {job.job_id for job in collector.jobs}
        assert len(job_ids) == 2
        assert queued(job_ids) == job_ids  # both jobs run while the learner trains
        batches, snapshots = collect_around_a_push(
            collector, algorithm, config.env.name, moved_at=3, pushed_at=5, batches=10
        )

    per_job = config.collector.frames_per_batch // 2
    for job in range(2):
        frames = torch.cat([batch[job] for batch in batches])
        # Trajectory ids name their job (id % jobs) and stay the same across batches.
        assert (frames[TRAJECTORY_KEY] % 2 == job).all()
        assert batches[0][job][TRAJECTORY_KEY][-1] == batches[1][job][TRAJECTORY_KEY][0]
        # Each job acted with the first snapshot until the push, with the second after it,
        # and the per-frame version says so.
        acted = actor_version(frames, snapshots, algorithm.policy)
        assert (acted[: 6 * per_job] == 1).all()
        assert (acted[6 * per_job :] == 2).all()
        assert torch.equal(frames["next", "policy_version"], acted)

    wait_until_gone(job_ids)
    assert not child_processes()


@pytest.mark.slurm
def test_a_dead_collection_job_stops_the_run_and_a_resume_submits_fresh_jobs(
    slurm_cluster: None,
    tiny_config,
) -> None:
    # Far more frames than the run can collect before the cancelled job is noticed: the
    # run cannot end first; the resume finishes two iterations past where it stopped.
    config = tiny_config(*DISTRIBUTED_RUN, "collector.total_frames=1000000")
    run_dir = Path(config.run_dir)
    killed: list[str] = []

    def kill_a_job_after_the_first_checkpoint() -> None:
        wait_for("a checkpoint", lambda: checkpoint_candidates(run_dir / CHECKPOINTS_DIR), 120)
        names = subprocess.run(
            ["squeue", "--noheader", "--format=%i", f"--name={run_dir.name}-collect"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        killed.append(min(names))
        subprocess.run(["scancel", killed[0]], check=True)

    killer = threading.Thread(target=kill_a_job_after_the_first_checkpoint)
    killer.start()
    with pytest.raises(RunFailed) as failure:
        train(config)
    killer.join()

    message = str(failure.value)
    assert re.search(
        rf"collector worker \d \(SLURM job {killed[0]}\) of env Pendulum-v1 stopped: the job "
        rf"is CANCELLED; its log: \S+/{killed[0]}_0_log\.err",
        message,
    ), message
    saved = checkpoint_candidates(run_dir / CHECKPOINTS_DIR)
    assert f"last good checkpoint: {saved[0]}" in message
    verify_checkpoint(saved[0])
    first_jobs = {path.name.split("_")[0] for path in (run_dir / "slurm").rglob("*_submitted.pkl")}
    wait_until_gone(first_jobs)  # the other job was cancelled too

    end = read_metrics(run_dir)[-1]["frames"] + 400
    resumed = train(tiny_config(*DISTRIBUTED_RUN, f"collector.total_frames={end}"))
    assert resumed.frames == end
    all_jobs = {path.name.split("_")[0] for path in (run_dir / "slurm").rglob("*_submitted.pkl")}
    assert len(all_jobs - first_jobs) == 2  # fresh jobs for the resumed run
    frames = [row["frames"] for row in read_metrics(run_dir)]
    assert frames == list(range(200, end + 1, 200))  # no iteration lost or repeated
    wait_until_gone(all_jobs)


def test_trajectory_ids_are_unique_across_jobs_batches_and_resumes() -> None:
    # What TorchRL 0.14.1 hands over for 3 jobs: job i's local ids shifted by job i-1's
    # largest (shifted) id, so job 0's trajectory 2 and job 1's trajectory 0 share id 2.
    local = torch.tensor([[1, 1, 2, 2], [0, 0, 0, 1], [5, 6, 6, 6]])
    shifted = local.clone()
    for job in range(1, 3):
        shifted[job] += shifted[job - 1].max()
    ids = relabel_trajectory_ids(shifted, base=0)
    assert torch.equal(ids, local * 3 + torch.arange(3).unsqueeze(-1))
    assert len(set(ids.flatten().tolist())) == len(
        {(j, k) for j in range(3) for k in local[j].tolist()}
    )

    # A resumed run starts above every id the checkpoint saw (the collector saves the
    # next free id and relabels from there).
    again = relabel_trajectory_ids(torch.zeros(3, 4, dtype=torch.long), base=int(ids.max()) + 1)
    assert again.min() > ids.max()


@pytest.mark.slurm
def test_collection_jobs_the_cluster_would_refuse_are_refused_before_training(
    slurm_cluster: None, refused
) -> None:
    error = refused(
        *TINY_RUN, *DISTRIBUTED_RUN, "run_dir=run", "slurm.collector_partition=nosuchpartition"
    )
    assert error.startswith("error: ") and "nosuchpartition" in error
