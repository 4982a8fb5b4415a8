"""The replay buffer as a Ray service (``replay.service=ray``) on a real local Ray: the
collector actors write into it, the learner samples what they wrote and its priorities
change what it samples next, a run through ``train.py`` counts and reports its frames
truthfully, a resume restores exactly what was stored (through the undo journal, with no
copy of the storage in the checkpoint) or refuses damaged files in one line, a service whose
process died is named whoever finds it dead, and what the service cannot run is refused
before anything is created. After the
first test, the tests share one Ray, as tests/test_ray.py's do."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import ray
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import GymEnv

from rl_app.algorithms import make_algorithm
from rl_app.checkpointing import choose_checkpoint, load_component
from rl_app.checks import load_config, machine_cpus
from rl_app.collection.ray import connect_ray
from rl_app.envs import make_env
from rl_app.logger import read_metrics
from rl_app.loop import Progress, RunFailed, run_iterations
from rl_app.replay import PRIORITY_KEY, TRAJECTORY_KEY, stored_transition
from rl_app.replay.journal import ReplayState
from rl_app.replay.service import (
    STORED_METRIC,
    ServiceReplayBuffer,
    ServiceStopped,
    service_parts,
)
from rl_app.run import build_run, train
from rl_app.upstream.ray import TruthfulCollector, warm_up_frames
from tests.helpers import (
    TINY_RUN,
    alive,
    named_checkpoint,
    random_play,
    run_train,
    saved_state,
    wait_for,
)

pytestmark = pytest.mark.ray

# Two actors of half a CPU each, and the service's actor, which reserves none.
SERVICE_RUN = [
    "collector.mode=ray", "collector.workers=2", "ray.worker_cpus=0.5", "replay.service=ray",
]  # fmt: skip
BATCH = 200  # TINY_RUN's collector.frames_per_batch


def test_a_run_through_train_py_counts_what_it_collected_and_reports_what_it_stored(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    done = run_train(
        tmp_path, *TINY_RUN, *SERVICE_RUN, "ray.sync=false", f"run_dir={run_dir}",
        "collector.total_frames=800",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = read_metrics(run_dir)
    # Frames counted as their batches landed: one row per batch, and the run stops on time.
    assert [row["frames"] for row in rows] == list(range(BATCH, 801, BATCH))
    # Asynchronous actors keep collecting while the learner learns: the service holds the
    # counted frames and up to one batch per other actor, no more.
    learning = [row for row in rows if row["frames"] >= 400]  # after the random warm-up
    assert all(row["frames"] <= row[STORED_METRIC] <= row["frames"] + BATCH for row in learning), (
        learning
    )
    checkpoint = choose_checkpoint(run_dir / "checkpoints")[0]
    progress = Progress()
    load_component(checkpoint, "progress", progress)
    assert progress.frames == 800


class Push(nn.Module):
    """A policy that always pushes with 0.5, which a random Pendulum action never is."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.full((*observation.shape[:-1], 1), 0.5)


def test_collectors_sharing_a_buffer_store_the_random_frames_asked_for() -> None:
    # Two of the collectors the actors run, extending one buffer as they would the service,
    # each handed what RayCollector hands an actor of init_random_frames=400.
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(1000))
    share = warm_up_frames(400, 2, shared_buffer=True) // 2
    policy = TensorDictModule(Push(), in_keys=["observation"], out_keys=["action"])
    collectors = [
        TruthfulCollector(
            lambda: GymEnv("Pendulum-v1"),
            policy,
            frames_per_batch=100,
            total_frames=-1,
            init_random_frames=share,
            replay_buffer=buffer,
        )
        for _ in range(2)
    ]
    try:
        for _ in range(4):  # in turn, as synchronous actors
            for collector in collectors:
                assert collector.next() is None  # it stored its batch
    finally:
        for collector in collectors:
            collector.shutdown()
    assert len(buffer) == 800
    assert int((buffer[:]["action"] != 0.5).sum()) == 400


@pytest.fixture(scope="module")
def shared_ray() -> Iterator[None]:
    """One local Ray for the tests below; runs find it and leave it up."""
    connect_ray(None)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def service_run(shared_ray, tmp_path_factory):
    """A run whose 2 sync actors have written 3 batches into the service (no warm-up)."""
    run_dir = tmp_path_factory.mktemp("service") / "run"
    config = load_config(
        "default",
        [*TINY_RUN, *SERVICE_RUN, f"run_dir={run_dir}", "collector.init_random_frames=0"],
    )
    run = build_run(config)
    try:
        batches = iter(run.collector)
        landed = [next(batches) for _ in range(3)]
        yield run, landed
    finally:
        run.close()


def test_the_learner_samples_the_frames_the_actors_wrote(service_run) -> None:
    run, landed = service_run
    # The service's actor took no CPU from the collector actors.
    free = ray.available_resources().get("CPU", 0.0)
    assert free == pytest.approx(ray.cluster_resources()["CPU"] - 2 * 0.5)
    counted = sum(batch.numel() for batch in landed)
    assert counted == 3 * BATCH
    assert run.collector.drain() == len(run.buffer) == counted  # sync: nothing in flight
    stored = run.buffer[:]
    written = torch.cat([batch[TRAJECTORY_KEY].reshape(-1) for batch in landed])
    assert set(stored[TRAJECTORY_KEY].tolist()) == set(written.tolist())
    assert set(written.remainder(2).tolist()) == {0, 1}  # both actors wrote
    [sample] = run.buffer.sample_batches(64, 1)
    steps = sample.reshape(-1)
    index = steps["index"].reshape(-1)
    assert torch.equal(steps["observation"], stored["observation"][index])
    assert torch.equal(steps[TRAJECTORY_KEY], stored[TRAJECTORY_KEY][index])


def test_priorities_written_back_change_what_the_learner_samples(service_run) -> None:
    run, _ = service_run

    def share_of(slots: set[int]) -> float:
        [sample] = run.buffer.sample_batches(256, 1)  # 32 slices of 8 steps
        starts = sample["index"].reshape(sample.shape)[:, 0].tolist()
        return sum(start in slots for start in starts) / len(starts)

    [chosen] = run.buffer.sample_batches(64, 1)
    slots = set(chosen["index"].reshape(-1).tolist())
    before = share_of(slots)
    # Every step of a slice takes its priority, and a slice is drawn by its start's.
    chosen[PRIORITY_KEY] = torch.full(chosen.shape, 1e4)
    metrics = run.buffer.write_back([chosen])
    assert metrics[STORED_METRIC] == len(run.buffer)
    after = share_of(slots)
    # 64 slots of ~600 at priority 1e4, the others at 1 (alpha 0.6): most draws.
    assert before < 0.3 < 0.8 < after, (before, after)


def test_a_resume_restores_every_stored_transition(shared_ray, tiny_config) -> None:
    # Asynchronous actors: batches still in flight at each save land before it is written.
    config = tiny_config(*SERVICE_RUN, "ray.sync=false", "collector.total_frames=600")
    run = build_run(config)
    try:
        run_iterations(run)
        # Nothing is collected after the last save: what is stored now is what it holds.
        at_save = run.buffer[:].clone()
        saved_frames = run.progress.frames
        # Writes after the save, which the resume must undo: 12 x 400 transitions, which
        # fill the 5,000-slot buffer and wrap over its oldest slots.
        later = at_save[:400].apply(lambda leaf: ~leaf if leaf.dtype == torch.bool else leaf + 1)
        for _ in range(12):
            run.buffer.client.extend(later)
        assert len(run.buffer) == 5000
    finally:
        run.close()
    assert saved_frames == 600 and len(at_save) >= 600
    run_dir = Path(config.run_dir)
    # The files stay in place; the checkpoint holds no copy of them, but the journal that
    # brings them back to it.
    saved = saved_state(run_dir / "checkpoints" / "checkpoint-000000000600", "replay_buffer")
    assert "storage" not in saved and saved["journal"] == 600
    assert (run_dir / "replay-journal" / "undo-000000000600.bin").stat().st_size > 0

    config = tiny_config(*SERVICE_RUN, "ray.sync=false", "collector.total_frames=1000")
    run = build_run(config, resuming=True)
    try:
        run.checkpoints.load(choose_checkpoint(Path(config.run_dir) / "checkpoints")[0])
        assert run.progress.frames == saved_frames
        resumed = run.buffer[:]
        assert len(resumed) == len(at_save)
        assert (resumed == at_save).all()  # the later writes undone
        run.logger.rewind(run.progress.frames)
        run_iterations(run)
        assert run.progress.frames == 1000
        assert len(run.buffer) >= 1000 and (run.buffer[: len(at_save)] == at_save).all()
    finally:
        run.close()


def test_damaged_replay_files_of_the_service_refuse_the_resume_in_one_line(
    shared_ray, tiny_config
) -> None:
    config = tiny_config(*SERVICE_RUN, "collector.total_frames=400")
    train(config)
    with open(Path(config.run_dir) / "replay" / "action.memmap", "r+b") as file:
        file.write(b"damaged!")  # slot 0's action, written at the first batch
    resumed = tiny_config(*SERVICE_RUN, "collector.total_frames=600")
    # Raised in the service's actor, told as in-process: no remote traceback.
    with pytest.raises(
        RunFailed,
        match=r"^cannot resume: the replay buffer's files in .* are "
        r"damaged \(checksum mismatch: action slots 0-1023\);",
    ) as failure:
        train(resumed)
    assert "Traceback" not in str(failure.value)


def test_a_service_checkpoint_holding_its_storage_whole_restores_and_journals_on(
    tiny_config, tmp_path: Path
) -> None:
    # The buffer of the service's actor, built here: a checkpoint that copied the storage
    # (its "storage" entry) restores, checks, and saves journaled checkpoints after it.
    config = tiny_config(*SERVICE_RUN)
    env = make_env(config.env, 0)
    keys = make_algorithm(config, env, torch.device("cpu")).replay_keys()

    def service_buffer(name: str) -> ServiceReplayBuffer:
        buffer = ServiceReplayBuffer(**service_parts(config.replay, tmp_path / name, seed=0))
        buffer.allocate(keys, stored_transition(env, keys), tmp_path / f"{name}-journal")
        return buffer

    saved = service_buffer("saved")
    saved.extend(random_play(config.env.name, 600))
    whole = ReplayState(saved, None).state_dict()
    assert "storage" in whole

    resumed = service_buffer("resumed")
    resumed.restore(whole)
    resumed.verify_storage()  # its files checksummed as restored
    assert len(resumed) == 600 and (resumed[:] == saved[:]).all()
    assert "storage" not in resumed.checkpoint(600)


def actor_processes(class_name: str) -> set[int]:
    """The processes of Ray actors of class ``class_name`` on this machine (Ray titles each
    ``ray::<class>``)."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # ended since
            continue
        if command.startswith(f"ray::{class_name}".encode()):
            found.add(int(pid))
    return found


def test_a_service_whose_process_died_is_named_and_the_last_checkpoint_stays(
    shared_ray, tiny_config
) -> None:
    config = tiny_config(*SERVICE_RUN)
    earlier_services = actor_processes("ServiceReplayBuffer")

    def kill_the_service(frames: int, score: float) -> None:
        [service] = actor_processes("ServiceReplayBuffer") - earlier_services
        os.kill(service, signal.SIGKILL)

    # The first evaluation and its checkpoint come at 400 frames; then the actors find the
    # service gone as they store their next batch.
    with pytest.raises(
        RunFailed,
        match=r"while collecting .* the replay service \(Ray actor\) "
        r"stopped: collector worker \d could not reach it \(ActorDiedError",
    ) as failure:
        train(config, on_eval=kill_the_service)
    named = named_checkpoint(str(failure.value))
    assert named.name == "checkpoint-000000000400"
    assert named == choose_checkpoint(Path(config.run_dir) / "checkpoints")[0]


def test_a_collector_actor_killed_while_writing_into_the_service_is_replaced(
    shared_ray, tiny_config
) -> None:
    config = tiny_config(*SERVICE_RUN)  # 1,200 frames
    earlier_actors = actor_processes("ActorCollector")
    killed = []

    def kill_an_actor(frames: int, score: float) -> None:
        if not killed:  # at the first evaluation, 400 frames in
            killed.append(min(actor_processes("ActorCollector") - earlier_actors))
            os.kill(killed[0], signal.SIGKILL)

    result = train(config, on_eval=kill_an_actor)
    assert killed and result.frames == 1200 and result.stopped_by is None
    rows = read_metrics(Path(config.run_dir))
    assert [row["frames"] for row in rows] == list(range(200, 1201, 200))
    assert rows[-1]["collector/replaced_actors"] == 1
    assert all(0 <= row["collector/policy_lag"] <= 1 for row in rows)


def test_a_service_that_died_before_the_learners_own_call_is_named(shared_ray, tiny_config) -> None:
    config = tiny_config(*SERVICE_RUN, "collector.total_frames=400")
    earlier_services = actor_processes("ServiceReplayBuffer")
    run = build_run(config)
    try:
        run_iterations(run)  # its checkpoint at 400 frames
        [service] = actor_processes("ServiceReplayBuffer") - earlier_services
        os.kill(service, signal.SIGKILL)
        wait_for("the service's process to end", lambda: not alive(service), 60)
        named = r"the replay service \(Ray actor\) stopped: the learner could not reach it"
        with pytest.raises(ServiceStopped, match=named):
            run.buffer.sample_batches(64, 1)
        with pytest.raises(ServiceStopped, match=named):
            run.checkpoints.save(600, eval_return=None)
    finally:
        run.close()
    # The failed save wrote nothing: the last good checkpoint is the one a resume takes.
    checkpoints = Path(config.run_dir) / "checkpoints"
    assert [path.name for path in checkpoints.glob("checkpoint-*")] == ["checkpoint-000000000400"]
    assert choose_checkpoint(checkpoints)[0].name == "checkpoint-000000000400"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["collector.mode=async"], "replay.service=ray needs collector.mode=ray"),
        (["replay.sampler=prioritized_sequence"],
         "replay.sampler='prioritized_sequence' is not accepted with replay.service=ray"),
        (["optim.target=nstep_transition"],
         "optim.target='nstep_transition' is not accepted with replay.service=ray"),
        ([f"collector.workers={machine_cpus() + 1}", "ray.worker_cpus=1", "ray.sync=false"],
         "ray.worker_cpus"),
    ],
    ids=["without_ray_actors", "a_sampler_it_cannot_run", "n_step_transitions",
         "more_cpus_than_the_machine"],
)  # fmt: skip
def test_what_the_service_cannot_run_is_refused_before_anything_is_created(
    refused: Callable[..., str], tmp_path: Path, args: list[str], named: str
) -> None:
    assert named in refused(*TINY_RUN, *SERVICE_RUN, f"run_dir={tmp_path / 'run'}", *args)
