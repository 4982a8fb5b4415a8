"""Collection by TorchRL's RPC collector (``collector.mode=rpc``) on real local processes:
workers act with the weights the learner sent, a dead worker stops the run naming it and a
resume finishes the run, no process is left behind, and what the RPC collector cannot run
is refused before anything is created.

torch's RPC runs one group per process (:class:`rl_app.collection.rpc.RPCAlreadyUsed`): one
test here builds a collector in the test process, the others run ``train.py``."""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rl_app.checkpointing import checkpoint_candidates, verify_checkpoint
from rl_app.collection import decide_devices, make_collector
from rl_app.collection.rpc import RPCAlreadyUsed
from rl_app.logger import read_metrics
from rl_app.replay import TRAJECTORY_KEY
from tests import faulty_envs
from tests.helpers import (
    FINAL_STATES,
    TINY_RUN,
    acting_collector,
    actor_version,
    alive,
    child_processes,
    collect_around_a_push,
    job_state,
    kill_the_second_worker,
    named_checkpoint,
    run_train,
    stop_a_run,
    wait_for,
)

pytestmark = pytest.mark.rpc

RPC_RUN = ["collector.mode=rpc", "collector.workers=2"]
# As tests/test_collection.py: batches of 130 frames straddle episode ends.
ACTING_RUN = [*RPC_RUN, "collector.init_random_frames=0", "collector.frames_per_batch=130"]


def test_workers_act_with_the_weights_the_learner_sent(tiny_config) -> None:
    before = child_processes()
    config = tiny_config(*ACTING_RUN)
    with acting_collector(config) as (algorithm, collector):
        collected, snapshots = collect_around_a_push(
            collector, algorithm, config.env.name, moved_at=3, pushed_at=5, batches=10
        )
    assert child_processes() == before
    data = torch.cat(collected)
    acted = actor_version(data, snapshots, algorithm.policy)
    # Whole snapshots only: never a blend of two versions, never weights that were not sent.
    assert (acted >= 1).all(), f"{int((acted == 0).sum())} frames match no sent snapshot"
    pushed_at = sum(len(batch) for batch in collected[:6])
    assert (acted[:pushed_at] == 1).all()
    assert (acted[pushed_at:] == 2).all()  # gathered batches: a push lands between two
    assert torch.equal(data["next", "policy_version"], acted)
    # Trajectory ids tell the workers apart (worker w numbers k * 2 + w): each batch holds
    # 65 frames of each, both acted with both versions, and an id is one worker's episode.
    for batch in collected:
        assert (batch[TRAJECTORY_KEY] % 2).bincount().tolist() == [65, 65]
    for worker in range(2):
        assert set(acted[data[TRAJECTORY_KEY] % 2 == worker].tolist()) == {1, 2}
    for trajectory in data[TRAJECTORY_KEY].unique():
        frames = data[data[TRAJECTORY_KEY] == trajectory]
        assert frames["next", "done"].sum() <= 1
    # torch's RPC cannot start a second group in this process: refused, not waited for.
    with pytest.raises(RPCAlreadyUsed, match="one RPC collector per process"):
        make_collector(config, algorithm, decide_devices(config))


def test_a_dead_worker_stops_the_run_naming_it_and_a_resume_finishes_the_run(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    args = [*TINY_RUN, *RPC_RUN, f"run_dir={run_dir}"]
    # The resume ends two iterations past its stop.
    workers, stderr, named = stop_a_run(tmp_path, run_dir, args, kill_the_second_worker)
    killed = f"collector worker 1 (worker process, pid {workers[1]}) of env Pendulum-v1 stopped"
    assert f"{killed}: killed by SIGKILL" in stderr
    assert named in checkpoint_candidates(run_dir / "checkpoints")
    assert not any(alive(worker) for worker in workers)  # the other one was stopped too
    end = read_metrics(run_dir)[-1]["frames"] + 400

    resumed = run_train(tmp_path, *args, f"collector.total_frames={end}")
    assert resumed.returncode == 0, resumed.stderr
    rows = read_metrics(run_dir)
    assert [row["frames"] for row in rows] == list(range(200, end + 1, 200))  # none repeated
    # Gathered batches, weights pushed every iteration: every frame acted with the newest.
    assert {row["collector/policy_lag"] for row in rows} == {0}
    # Each trajectory id is one episode of one worker: its frames, in the order stored,
    # follow one another (a resumed worker starting a new episode under an id of before, or
    # two workers sharing one, would break the chain).
    stored = TensorDict.load_memmap(run_dir / "replay")[:end]
    for trajectory in stored[TRAJECTORY_KEY].unique():
        episode = stored[stored[TRAJECTORY_KEY] == trajectory]
        ended = episode["next", "done"].reshape(-1)[:-1]
        follows = (episode["next", "observation"][:-1] == episode["observation"][1:]).all(-1)
        assert (ended | follows).all(), f"trajectory {int(trajectory)} holds two episodes"


def test_a_worker_that_raises_is_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_train(
        tmp_path, *TINY_RUN, *RPC_RUN, f"run_dir={run_dir}", "collector.total_frames=4000",
        f"env.name=tests.faulty_envs:{faulty_envs.RAISES_AT_1100}",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert re.search(
        r"collector worker \d \(RPC\) of env .* stopped: .*simulated physics", result.stderr
    )
    # Each worker steps 100 frames per batch: the fault comes at 2,200 frames, after the
    # checkpoint at 2,000.
    named = named_checkpoint(result.stderr)
    assert named.name == "checkpoint-000000002000"
    verify_checkpoint(named)


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("collector.device=cuda", "collector.device='cuda'"),
        ("rpc.sync=false", "rpc.sync=false"),
    ],
)
def test_what_the_rpc_collector_cannot_run_is_refused_before_anything_is_created(
    refused: Callable[..., str], tmp_path: Path, setting: str, named: str
) -> None:
    assert named in refused(*TINY_RUN, *RPC_RUN, f"run_dir={tmp_path / 'run'}", setting)


@pytest.mark.slurm
def test_rpc_workers_as_slurm_jobs_feed_a_run_and_end_with_it(
    slurm_cluster: None, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    result = run_train(
        tmp_path, *TINY_RUN, *RPC_RUN, f"run_dir={run_dir}", "collector.total_frames=800",
        "rpc.launcher=slurm", "slurm.profile=local", "collector.address=127.0.0.1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [row["frames"] for row in read_metrics(run_dir)] == [200, 400, 600, 800]
    jobs = sorted(path.name.split("_")[0] for path in (run_dir / "slurm").rglob("*_submitted.pkl"))
    assert len(jobs) == 2  # one job per worker, in the run directory's slurm/collectors
    # Each job ends by itself once the learner shuts the collector down.
    for job in jobs:
        ended = functools.partial(lambda job: job_state(job) in FINAL_STATES, job)
        wait_for(f"job {job} to be recorded as ended", ended, 60)
        assert job_state(job) == "COMPLETED"


@pytest.mark.slurm
def test_a_cancelled_rpc_job_stops_the_run_naming_it(slurm_cluster: None, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = [*TINY_RUN, *RPC_RUN, f"run_dir={run_dir}", "rpc.launcher=slurm",
            "slurm.profile=local", "collector.address=127.0.0.1"]  # fmt: skip

    def cancel_a_job(run: subprocess.Popen) -> list[str]:
        jobs = subprocess.run(
            ["squeue", "--noheader", "--format=%i", f"--name={run_dir.name}-collect"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        subprocess.run(["scancel", min(jobs)], check=True)
        return jobs

    jobs, stderr, _ = stop_a_run(tmp_path, run_dir, args, cancel_a_job)
    assert re.search(
        rf"collector worker \d \(SLURM job {min(jobs)}\) of env Pendulum-v1 stopped: the job "
        rf"is CANCELLED; its log: \S+/{min(jobs)}_0_log\.err",
        stderr,
    ), stderr
    wait_for("the other job to be cancelled too", lambda: not queued(set(jobs)), 60)


def queued(jobs: set[str]) -> set[str]:
    """Which of ``jobs`` are still in ``squeue`` (pending, running or completing)."""
    answer = subprocess.run(
        ["squeue", "--noheader", "--format=%i"], capture_output=True, text=True, check=True
    )
    return jobs & set(answer.stdout.split())
