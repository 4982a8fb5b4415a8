"""Multi-process and asynchronous collection on real worker processes: the policy workers
act with is the one the learner sent, slices never mix workers' trajectories, late
priorities never land on new records, and a failing worker takes nobody down with it."""

from __future__ import annotations

import copy
import multiprocessing
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rl_app.checkpointing import choose_checkpoint
from rl_app.collection import WeightSync, WorkerDied, ended_worker, naming_dead_workers
from rl_app.config import ReplayConfig
from rl_app.logger import read_metrics
from rl_app.loop import Progress, RunFailed, iteration_metrics
from rl_app.replay import PRIORITY_KEY, TRAJECTORY_KEY, make_replay_buffer, write_priorities
from rl_app.run import train
from tests import faulty_envs
from tests.helpers import (
    TINY_RUN,
    acting_collector,
    actor_version,
    child_processes,
    collect_around_a_push,
    kill_the_second_worker,
    move_on,
    named_checkpoint,
    run_train,
    stop_a_run,
)

# Batches of 130 frames straddle episode ends (200 steps) for the first 2,600 frames of a
# worker, so consecutive batches of one worker share a trajectory.
MP_RUN = ["collector.workers=2", "collector.init_random_frames=0", "collector.frames_per_batch=130"]


def group_by_worker(batches: list[TensorDict]) -> list[list[int]]:
    """Indices of the batches each worker collected: a trajectory is played by one worker,
    so batches that share a trajectory id share a worker."""
    groups: list[tuple[set[int], list[int]]] = []  # (trajectory ids, batch indices)
    for index, batch in enumerate(batches):
        ids = set(batch[TRAJECTORY_KEY].unique().tolist())
        touching = [group for group in groups if group[0] & ids]
        merged = (
            ids.union(*(g[0] for g in touching)),
            [index, *(i for g in touching for i in g[1])],
        )
        groups = [group for group in groups if all(group is not t for t in touching)] + [merged]
    return [sorted(indices) for _, indices in groups]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_workers_act_with_the_weights_the_learner_sent(tiny_config, mode: str) -> None:
    config = tiny_config(f"collector.mode={mode}", *MP_RUN)
    with acting_collector(config) as (algorithm, collector):
        collected, snapshots = collect_around_a_push(
            collector, algorithm, config.env.name, moved_at=5, pushed_at=9, batches=20
        )
    batches = [batch.reshape(-1) for batch in collected]

    data = torch.cat(batches)
    acted = actor_version(data, snapshots, algorithm.policy)
    # Whole snapshots only: never a blend of two versions, never weights that were not sent.
    assert (acted >= 1).all(), f"{int((acted == 0).sum())} frames match no sent snapshot"
    # Until the push, workers kept the first snapshot although the learner had moved on.
    pushed_at = sum(len(batch) for batch in batches[:10])
    assert (acted[:pushed_at] == 1).all()
    assert (acted[pushed_at:] == 2).any()

    # The version TorchRL writes with each step (under "next") names the weights the
    # action was taken with. Async workers receive weights in the background, and the
    # version number follows the weights within a frame or so.
    tags = data["next", "policy_version"]
    if mode == "sync":
        assert torch.equal(tags, acted)
    else:
        assert (tags == acted).float().mean() > 0.99

    # Every worker acted with both versions, and never went back to the old one.
    if mode == "sync":
        rows = [[b.view(2, -1)[worker] for b in batches] for worker in range(2)]
    else:
        rows = [[batches[i] for i in group] for group in group_by_worker(batches)]
    assert len(rows) == 2
    for row in rows:
        versions = torch.cat([actor_version(b, snapshots, algorithm.policy) for b in row])
        assert set(versions.tolist()) == {1, 2}
        assert (versions.diff() >= 0).all()


def test_a_push_to_one_worker_leaves_the_other_workers_weights_alone(tiny_config) -> None:
    # TorchRL hands workers on one device one shared copy of the initial weights: a worker
    # applying a push would rewrite the weights another worker is acting with.
    config = tiny_config("collector.mode=sync", *MP_RUN)
    with acting_collector(config) as (algorithm, collector):
        WeightSync(collector, algorithm, config.env.name)  # version 1, to both workers
        snapshots = {1: copy.deepcopy(algorithm.policy.state_dict())}
        collected = []
        for index, batch in enumerate(collector):
            collected.append(batch)
            if index == 1:
                move_on(algorithm.policy)
                collector.update_policy_weights_(algorithm.policy, worker_ids=[0])
                snapshots[2] = copy.deepcopy(algorithm.policy.state_dict())
            if index == 5:
                break
    after_push = torch.cat(collected[3:], dim=1)  # (workers, frames)
    versions = [actor_version(frames, snapshots, algorithm.policy) for frames in after_push]
    assert (versions[0] == 2).all()
    assert (versions[1] == 1).all()


def test_policy_lag_is_learner_version_minus_the_stalest_frame() -> None:
    batch = TensorDict(
        {
            ("next", "policy_version"): torch.tensor([3, 3, 2, 3]),
            ("next", "done"): torch.zeros(4, 1, dtype=torch.bool),
            ("next", "episode_reward"): torch.zeros(4, 1),
        },
        [4],
    )
    assert iteration_metrics(batch, [], Progress(), policy_version=5)["collector/policy_lag"] == 3


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_training_with_workers_logs_policy_lag_and_leaves_no_process(tiny_config, mode) -> None:
    before = child_processes()
    config = tiny_config(f"collector.mode={mode}", "collector.workers=2", "collector.sync_every=2")
    train(config)
    rows = read_metrics(Path(config.run_dir))
    assert [row["frames"] for row in rows] == list(range(200, 1201, 200))
    lags = [row["collector/policy_lag"] for row in rows]
    assert all(lag >= 0 for lag in lags)
    if mode == "sync":
        # Pushes every second iteration, and a sync batch is gathered before the push that
        # follows it: never more than two pushes behind.
        assert max(lags) <= 2
    assert child_processes() == before


def test_slices_from_two_workers_never_mix_trajectories(tiny_config, tmp_path: Path) -> None:
    config = tiny_config("collector.mode=sync", *MP_RUN)
    buffer = make_replay_buffer(ReplayConfig(capacity=5_000, slice_len=8), tmp_path, seed=0)
    with acting_collector(config) as (algorithm, collector):
        WeightSync(collector, algorithm, config.env.name)
        for index, batch in enumerate(collector):
            # (workers, frames): each worker's frames stay contiguous in the buffer
            buffer.extend(batch.reshape(-1))
            if index == 29:
                break
    stored = buffer[:]
    per_worker = stored.view(30, 2, 65)[:, :, 0][TRAJECTORY_KEY]
    assert not set(per_worker[:, 0].tolist()) & set(per_worker[:, 1].tolist())  # ids are unique
    for _ in range(100):
        slices = buffer.sample(256).reshape(32, 8)
        assert (slices[TRAJECTORY_KEY] == slices[TRAJECTORY_KEY][:, :1]).all()
        assert (slices["step_count"].squeeze(-1).diff(dim=1) == 1).all()


def test_priorities_for_overwritten_records_are_dropped(tmp_path: Path) -> None:
    buffer = make_replay_buffer(
        ReplayConfig(capacity=400, slice_len=8, alpha=1.0), tmp_path, seed=0
    )
    play = TensorDict(
        {
            "observation": torch.arange(600.0).unsqueeze(-1),
            TRAJECTORY_KEY: torch.arange(600) // 100,
            ("next", "done"): (torch.arange(600) % 100 == 99).unsqueeze(-1),
        },
        [600],
    )
    buffer.extend(play[:400])
    sample = buffer.sample(64)
    buffer.extend(play[400:600])  # wraps: slots 0-199 now hold new records
    sample[PRIORITY_KEY] = torch.full((64,), 1_000.0)
    dropped = write_priorities(buffer, sample)

    index = sample["index"].reshape(64, -1)[:, 0]
    overwritten = index < 200
    assert dropped == int(overwritten.sum()) and 0 < dropped < 64
    priorities = buffer.sampler.state_dict()["_sum_tree"]
    fresh = torch.tensor([priorities[int(i)] for i in index[~overwritten]])
    renewed = torch.tensor([priorities[int(i)] for i in range(200)])
    assert torch.allclose(fresh, torch.tensor(1_000.0))  # the live records took the update
    assert (renewed < 1_000.0).all()  # the new records keep their own priorities


@pytest.mark.parametrize(
    "env",
    [
        faulty_envs.RAISES_AT_1100,
        # TorchRL terminates the other workers and gives them 0.1 s to exit.
        faulty_envs.RAISES_AT_1100_BESIDE_A_SLOW_STOP,
    ],
    ids=["every_worker_fails", "another_worker_slow_to_stop"],
)
def test_a_failing_worker_stops_the_run_cleanly(tiny_config, env: str) -> None:
    before = child_processes()
    config = tiny_config(
        f"env.name=tests.faulty_envs:{env}",
        # Sync workers step in lockstep with the learner (100 frames each per batch): the
        # fault comes at 2,200 frames however busy the machine is. Async workers run ahead
        # by as much as the machine lets them.
        "collector.mode=sync",
        "collector.workers=2",
        "collector.total_frames=4000",
    )
    with pytest.raises(
        RunFailed,
        match=r"while collecting .* worker \d \(worker process, pid \d+\) .*: exit code 1;",
    ) as failure:
        train(config)
    message = str(failure.value)
    # The newest checkpoint before the fault, intact.
    named = named_checkpoint(message)
    assert named.name == "checkpoint-000000002000"
    assert named == choose_checkpoint(Path(config.run_dir) / "checkpoints")[0]
    assert child_processes() == before


@pytest.mark.parametrize("phase", ["collecting", "pushing"])
def test_a_killed_worker_is_named_with_its_pid_and_signal(tiny_config, phase: str) -> None:
    config = tiny_config("collector.mode=async", *MP_RUN)
    with acting_collector(config) as (algorithm, collector):
        weight_sync = WeightSync(collector, algorithm, config.env.name)
        batches = iter(collector)
        next(batches)
        worker = collector.procs[1]
        os.kill(worker.pid, signal.SIGKILL)
        worker.join()
        with pytest.raises(WorkerDied) as died:
            if phase == "pushing":
                weight_sync.push()
            with naming_dead_workers(collector, config.env.name):
                for _ in batches:  # the batches already waiting, then the dead worker
                    pass
    assert str(died.value).startswith(
        f"collector worker 1 (worker process, pid {worker.pid}) of env Pendulum-v1 stopped: "
        "killed by SIGKILL;"
    )


def test_a_killed_async_worker_stops_the_run_naming_it_and_a_resume_finishes_it(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    args = [*TINY_RUN, "collector.mode=async", "collector.workers=2", f"run_dir={run_dir}"]
    workers, stderr, _ = stop_a_run(tmp_path, run_dir, args, kill_the_second_worker)
    assert re.search(
        rf"collector worker \d \(worker process, pid {workers[1]}\) of env Pendulum-v1 "
        r"stopped: killed by SIGKILL;",
        stderr,
    ), stderr
    end = read_metrics(run_dir)[-1]["frames"] + 400

    resumed = run_train(tmp_path, *args, f"collector.total_frames={end}")
    assert resumed.returncode == 0, resumed.stderr
    assert [row["frames"] for row in read_metrics(run_dir)] == list(range(200, end + 1, 200))


def test_the_worker_named_is_one_that_ended_by_itself() -> None:
    # As TorchRL leaves them after a worker failed: the others shut down (exit code 0),
    # terminated or closed.
    context = multiprocessing.get_context("spawn")
    closed, shut_down, terminated, failed = (
        context.Process(target=time.sleep, args=(60,)),
        context.Process(target=os._exit, args=(0,)),
        context.Process(target=time.sleep, args=(60,)),
        context.Process(target=os._exit, args=(1,)),
    )
    for process in (closed, shut_down, terminated, failed):
        process.start()
    for process in (shut_down, failed):
        process.join()
    for process in (closed, terminated):
        process.terminate()
        process.join()
    closed.close()
    assert ended_worker([closed, shut_down, terminated, failed], timeout=60) == (3, failed)
    assert ended_worker([closed, terminated], timeout=60) == (1, terminated)


def test_a_batch_of_envs_keeps_each_envs_trajectories_apart_and_trains(tiny_config) -> None:
    config = tiny_config("env.num_envs=4", "collector.init_random_frames=0")
    with acting_collector(config) as (_, collector):
        batches = [batch for _, batch in zip(range(5), collector, strict=False)]
    data = torch.cat(batches, dim=1)  # (envs, frames): 4 envs x 250 steps, episodes of 200
    assert data.shape == (4, 250)
    ids = data[TRAJECTORY_KEY]
    ends = data["next", "done"].squeeze(-1)
    for env in range(4):
        # Each env's frames follow one another until its episode ends, under one id...
        follows = (data["observation"][env, 1:] == data["next", "observation"][env, :-1]).all(-1)
        assert (follows | ends[env, :-1]).all()
        assert ends[env].sum() == 1 and (ids[env, 1:] == ids[env, :-1]).sum() == 248
    # ... that no other env's frames carry, and the flat buffer order keeps them whole.
    assert not set(ids[0].tolist()) & set(ids[1:].flatten().tolist())
    flat = data.reshape(-1)[TRAJECTORY_KEY]
    assert (flat.diff() != 0).sum() == len(flat.unique()) - 1

    result = train(tiny_config("env.num_envs=4", run_dir=Path(config.run_dir).with_name("train")))
    assert result.frames == config.collector.total_frames
    assert [row["frames"] for row in read_metrics(result.run_dir)] == list(range(200, 1201, 200))


def test_a_compiled_policy_acts_as_the_learners_policy(tiny_config) -> None:
    config = tiny_config(
        "collector.compile_policy=true", "env.num_envs=4", "collector.init_random_frames=0"
    )
    with acting_collector(config) as (algorithm, collector):
        first = next(iter(collector)).reshape(-1)
        move_on(algorithm.policy)  # seen by the compiled direct policy
        second = next(iter(collector)).reshape(-1)
    weights = {1: copy.deepcopy(algorithm.policy.state_dict())}
    assert (actor_version(second, weights, algorithm.policy) == 1).all()
    assert (actor_version(first, weights, algorithm.policy) == 0).all()
