"""Collection on Ray actors (``collector.mode=ray``) on a real local Ray: a run starts and
stops its own Ray, actors act with the weights the learner sent, a stopped actor is named and
leaves the last checkpoint intact, a run resumes, and what Ray cannot run is refused before
anything is created. After the first test, the tests share one Ray (each actor imports torch:
about 800 MB), as a process that already joined one does."""

from __future__ import annotations

import copy
import glob
import http.server
import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from rl_app.checkpointing import (
    checkpoint_candidates,
    checkpoint_frames,
    choose_checkpoint,
)
from rl_app.checks import machine_cpus
from rl_app.collection import WeightSync
from rl_app.collection.ray import ACTOR_START_S, ActorStopped, connect_ray
from rl_app.config.schema import RayConfig
from rl_app.logger import read_metrics
from rl_app.loop import RunFailed
from rl_app.replay import TRAJECTORY_KEY
from rl_app.run import train
from tests import faulty_envs
from tests.helpers import (
    PYTHON,
    ROOT,
    TINY_RUN,
    TRAIN_PY,
    acting_collector,
    actor_version,
    collect_around_a_push,
    move_on,
    named_checkpoint,
    refusal,
    resume_in_process,
    run_train,
    stop_a_run,
    wait_for,
)

pytestmark = pytest.mark.ray

# Two actors of half a CPU each: they fit a 2-core machine.
RAY_RUN = ["collector.mode=ray", "collector.workers=2", "ray.worker_cpus=0.5"]
# As tests/test_collection.py: batches of 130 frames straddle episode ends.
ACTING_RUN = [*RAY_RUN, "collector.init_random_frames=0", "collector.frames_per_batch=130"]


def test_a_run_starts_its_own_ray_and_shuts_it_down(tiny_config) -> None:
    assert not ray.is_initialized()
    config = tiny_config(*RAY_RUN, "collector.sync_every=2")
    train(config)
    rows = read_metrics(Path(config.run_dir))
    assert [row["frames"] for row in rows] == list(range(200, 1201, 200))
    # Pushes every second iteration, and a sync batch is gathered before the push that
    # follows it: never more than two pushes behind.
    assert all(0 <= row["collector/policy_lag"] <= 2 for row in rows)
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def shared_ray() -> Iterator[None]:
    """One local Ray for the tests below; runs find it and leave it up."""
    connect_ray(None)
    yield
    ray.shutdown()


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_actors_act_with_the_weights_the_learner_sent(shared_ray, tiny_config, sync) -> None:
    config = tiny_config(*ACTING_RUN, f"ray.sync={sync}")
    with acting_collector(config) as (algorithm, collector):
        collected, snapshots = collect_around_a_push(
            collector, algorithm, config.env.name, moved_at=3, pushed_at=5, batches=10
        )
    assert ray.is_initialized()  # the shared Ray stays up
    batches = [batch.reshape(-1) for batch in collected]
    data = torch.cat(batches)
    acted = actor_version(data, snapshots, algorithm.policy)
    # Whole snapshots only: never a blend of two versions, never weights that were not sent.
    assert (acted >= 1).all(), f"{int((acted == 0).sum())} frames match no sent snapshot"
    pushed_at = sum(len(batch) for batch in batches[:6])
    assert (acted[:pushed_at] == 1).all()
    assert (acted[pushed_at:] == 2).any()
    # An actor takes a push between two batches (a batch in flight keeps its version): the
    # version written with each step names the weights exactly.
    assert torch.equal(data["next", "policy_version"], acted)

    # Trajectory ids tell the actors apart (actor w numbers k * 2 + w): each acted with both
    # versions, and never went back to the old one.
    ids = data[TRAJECTORY_KEY]
    if sync:  # a sync batch holds one row per actor
        for batch in batches:
            assert (batch[TRAJECTORY_KEY].view(2, -1) % 2 == torch.tensor([[0], [1]])).all()
    for worker in range(2):
        versions = acted[ids % 2 == worker]
        assert set(versions.tolist()) == {1, 2}
        assert (versions.diff() >= 0).all()


def test_a_killed_actor_is_named(shared_ray, tiny_config) -> None:
    config = tiny_config(*ACTING_RUN, "ray.max_actor_replacements=0")
    with acting_collector(config) as (algorithm, collector):
        collector.update_policy_weights_(algorithm.policy)
        batches = iter(collector)
        next(batches)
        ray.kill(collector.remote_collectors[1])
        with pytest.raises(ActorStopped, match=r"collector worker 1 \(Ray actor[,)]"):
            next(batches)


def kill_actor(actor) -> int:
    """SIGKILL the process of Ray actor ``actor``; its pid."""
    pid = ray.get(actor.__ray_call__.remote(lambda collector: os.getpid()))
    os.kill(pid, signal.SIGKILL)
    return pid


def test_an_actor_killed_between_batches_is_named_by_the_next_weight_push(
    shared_ray, tiny_config
) -> None:
    config = tiny_config(*ACTING_RUN, "ray.max_actor_replacements=0")
    with acting_collector(config) as (algorithm, collector):
        weight_sync = WeightSync(collector, algorithm, config.env.name)
        next(iter(collector))
        pid = kill_actor(collector.remote_collectors[1])
        with pytest.raises(ActorStopped) as stopped:
            weight_sync.push()
    named = re.fullmatch(
        rf"collector worker 1 \(Ray actor, pid {pid} on (\S+)\) of env Pendulum-v1 stopped: its "
        r"process ended \(worker exit type SYSTEM_ERROR\); its log: (\S+) on (\S+)",
        str(stopped.value),
    )
    assert named is not None, str(stopped.value)
    node, log, log_node = named.groups()
    assert node == log_node == ray.util.get_node_ip_address()
    assert len(glob.glob(log)) == 1  # the killed actor's own log, on this machine


@pytest.mark.parametrize(
    "sync, phase", [(True, "collecting"), (False, "collecting"), (False, "pushing")]
)
def test_a_replaced_actor_joins_the_weight_sync_of_the_survivors(
    shared_ray, tiny_config, sync: bool, phase: str
) -> None:
    config = tiny_config(*ACTING_RUN, f"ray.sync={sync}")
    with acting_collector(config) as (algorithm, collector):
        weight_sync = WeightSync(collector, algorithm, config.env.name)  # version 1
        snapshots = {1: copy.deepcopy(algorithm.policy.state_dict())}
        batches = iter(collector)
        # Asynchronous batches are each one actor's, whichever is ready first: collected
        # until actor 1 (odd trajectory ids) has sent one, and later until its new actor has.
        before = batches_until(batches, lambda frames: (frames[TRAJECTORY_KEY] % 2 == 1).any())
        kill_actor(collector.remote_collectors[1])
        move_on(algorithm.policy)  # not pushed: a new actor acts with version 1
        if phase == "pushing":
            weight_sync.push()  # finds the dead actor, replaces it, then pushes version 2
            snapshots[2] = copy.deepcopy(algorithm.policy.state_dict())
        # Actor 1's frames: the dead one's, in the batches before and perhaps one it had
        # sent when killed (130 frames: at most one more 200-step Pendulum episode, id + 2),
        # then the new one's, under ids no dead one used.
        seen = before[TRAJECTORY_KEY]
        dead_ids = seen[seen % 2 == 1].max() + 2

        def of_the_new_actor(frames: torch.Tensor) -> torch.Tensor:
            ids = frames[TRAJECTORY_KEY]
            return frames[(ids % 2 == 1) & (ids > dead_ids)]

        after = batches_until(batches, lambda frames: len(of_the_new_actor(frames)) >= 130)
        assert collector.metrics() == {"collector/replaced_actors": 1}
    version = weight_sync.version
    new_actor = of_the_new_actor(after)
    assert len(new_actor) >= 130
    # It acts with the weights the others have, under their version.
    assert (new_actor["next", "policy_version"] == version).all()
    assert (actor_version(new_actor, snapshots, algorithm.policy) == version).all()


def batches_until(batches: Iterator, enough: Callable[[Any], Any], most: int = 100) -> Any:
    """The frames of the next batches of ``batches``, concatenated, up to the first for
    which ``enough(frames)`` holds (``most`` batches at most)."""
    taken = []
    while not taken or not enough(frames := torch.cat(taken)):
        assert len(taken) < most, f"not enough after {most} batches"
        taken.append(next(batches).reshape(-1))
    return frames


def collector_actors(pid: int) -> set[int]:
    """The processes of the collector actors of the Ray that process ``pid`` started (its
    raylet's children)."""
    parents, titles = {}, {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            titles[int(entry.name)] = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])

    def descends(process: int) -> bool:
        while process > 1:
            process = parents.get(process, 0)
            if process == pid:
                return True
        return False

    return {
        process
        for process, title in titles.items()
        if title.startswith(b"ray::ActorCollector") and descends(process)
    }


def saved_after_replacing(run_dir: Path) -> bool:
    """Whether a checkpoint was saved after an iteration that logged a replaced actor."""
    rows = read_metrics(run_dir)
    replaced = [row["frames"] for row in rows if row["collector/replaced_actors"] == 1]
    saved = [checkpoint_frames(path) for path in checkpoint_candidates(run_dir / "checkpoints")]
    return bool(replaced) and max(saved) >= replaced[0]


def test_a_killed_actor_is_replaced_until_it_keeps_dying_and_a_resume_reaches_the_end(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    args = [*TINY_RUN, *RAY_RUN, f"run_dir={run_dir}", "ray.max_actor_replacements=1"]

    def kill_an_actor_then_its_replacement(run: subprocess.Popen) -> tuple[set[int], set[int]]:
        wait_for("two actors", lambda: len(collector_actors(run.pid)) == 2, 60)
        first = collector_actors(run.pid)
        os.kill(min(first), signal.SIGKILL)
        new = wait_for("a new actor", lambda: collector_actors(run.pid) - first, 120)
        wait_for("a checkpoint after the replacement", lambda: saved_after_replacing(run_dir), 120)
        os.kill(min(new), signal.SIGKILL)
        return first, new

    (first, new), stderr, _ = stop_a_run(
        tmp_path, run_dir, args, kill_an_actor_then_its_replacement
    )
    assert re.search(rf"\(Ray actor, pid {min(first)} on .*a new actor takes its place", stderr)
    assert re.search(
        rf"collector worker \d \(Ray actor, pid {min(new)} on \S+\) of env Pendulum-v1 stopped: "
        r"its process ended .*; a new actor took its place 1 times already, as many as "
        r"ray.max_actor_replacements=1 allows",
        stderr,
    ), stderr
    rows = read_metrics(run_dir)
    # Every iteration logged once, the policy versions going on across the replacement.
    assert [row["frames"] for row in rows] == list(range(200, rows[-1]["frames"] + 1, 200))
    assert all(0 <= row["collector/policy_lag"] <= 1 for row in rows)
    assert max(row["collector/replaced_actors"] for row in rows) == 1
    stopped_at, end = rows[-1]["frames"], rows[-1]["frames"] + 2000

    def saved_after(frames: int) -> bool:
        saved = checkpoint_candidates(run_dir / "checkpoints")
        return max(checkpoint_frames(path) for path in saved) > frames

    # The resumed run counts its replacements afresh: an actor killed once it has saved a
    # checkpoint past the stop (an evaluation every two iterations, of 10) is replaced, and
    # the run reaches its end.
    resumed = subprocess.Popen(
        [PYTHON, str(TRAIN_PY), *args, f"collector.total_frames={end}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        saved = wait_for("a checkpoint of the resumed run", lambda: saved_after(stopped_at), 120)
        os.kill(min(collector_actors(resumed.pid)), signal.SIGKILL)
        _, stderr = resumed.communicate(timeout=300)
    finally:
        if resumed.poll() is None:
            resumed.kill()
    assert saved and resumed.returncode == 0, stderr
    assert "a new actor takes its place (replacement 1 of at most 1)" in stderr
    rows = read_metrics(run_dir)
    assert [row["frames"] for row in rows] == list(range(200, end + 1, 200))
    after_resume = [row for row in rows if row["frames"] > stopped_at]
    assert all(0 <= row["collector/policy_lag"] <= 1 for row in after_resume)
    assert after_resume[-1]["collector/replaced_actors"] == 1


def test_the_docs_state_the_replacement_settings_the_code_has() -> None:
    doc = " ".join((ROOT / "docs" / "scale-out.md").read_text().split())
    default = RayConfig().max_actor_replacements
    assert f"up to `ray.max_actor_replacements` times (default {default})" in doc
    assert f"(replacement 1 of at most {default})" in doc
    assert f"within {ACTOR_START_S:.0f} s" in doc


def test_an_actor_that_fails_stops_the_run_cleanly(shared_ray, tiny_config) -> None:
    config = tiny_config(
        f"env.name=tests.faulty_envs:{faulty_envs.RAISES_AT_1100}",
        *RAY_RUN,
        "collector.total_frames=4000",
    )
    with pytest.raises(RunFailed, match=r"while collecting .* worker \d \(Ray actor\)") as failure:
        train(config)
    assert "simulated physics failure" in str(failure.value)
    # Sync actors step in lockstep with the learner (100 frames each per batch): the fault
    # comes at 2,200 frames, after the checkpoint at 2,000, which is intact.
    named = named_checkpoint(str(failure.value))
    assert named.name == "checkpoint-000000002000"
    assert named == choose_checkpoint(Path(config.run_dir) / "checkpoints")[0]


def test_an_actor_lost_as_the_collectors_start_is_named_and_the_run_stops(
    shared_ray, tiny_config
) -> None:
    env_name = f"tests.faulty_envs:{faulty_envs.DIES_IN_RAY_ACTORS}"
    with pytest.raises(RunFailed) as failure:
        train(tiny_config(f"env.name={env_name}", *RAY_RUN))
    assert re.search(
        r"^training stopped while starting the collectors: collector worker \d \(Ray actor, "
        rf"pid \d+ on \S+\) of env {env_name} stopped: as the "
        r"collectors started, its process ended \(worker exit type \w+\); its log: ",
        str(failure.value),
    ), failure.value
    assert (
        str(failure.value)
        .splitlines()[1]
        .startswith("last good checkpoint: none yet (the same command starts the run afresh);")
    )


def test_an_actor_whose_constructor_raises_is_named_and_train_py_exits(tmp_path: Path) -> None:
    env_name = f"tests.faulty_envs:{faulty_envs.RAISES_IN_RAY_ACTORS}"
    args = [*TINY_RUN, *RAY_RUN, f"run_dir={tmp_path / 'run'}", f"env.name={env_name}"]
    result = run_train(ROOT, *args)  # the process and the Ray it started end
    assert result.returncode == 1, result.stderr
    assert re.search(
        r"training stopped while starting the collectors: collector worker \d \(Ray actor, "
        rf"pid \d+ on \S+\) of env {env_name} stopped: as the collectors started, its "
        r"constructor raised ValueError: no simulator licence on this node\n"
        r"last good checkpoint: none yet \(the same command starts the run afresh\); "
        r"traceback in ",
        result.stderr,
    ), result.stderr
    assert "Traceback" not in result.stderr


def test_a_run_resumes_on_new_actors_under_new_trajectory_ids(shared_ray, tiny_config) -> None:
    train(tiny_config(*RAY_RUN, "collector.total_frames=600"))  # episodes cut mid-way
    config = tiny_config(*RAY_RUN)
    _, stored, rows = resume_in_process(config)
    assert [row["frames"] for row in rows] == list(range(200, 1201, 200))
    assert len(stored) == 1200
    # Each trajectory id is one episode: its frames, in the order stored, follow one another
    # (a resumed actor starting a new episode under an id of before would break the chain).
    for trajectory in stored[TRAJECTORY_KEY].unique():
        frames = stored[stored[TRAJECTORY_KEY] == trajectory]
        ended = frames["next", "done"].reshape(-1)[:-1]
        follows = (frames["next", "observation"][:-1] == frames["observation"][1:]).all(-1)
        assert (ended | follows).all(), f"trajectory {int(trajectory)} holds two episodes"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answers(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_a_run_joins_a_running_cluster_and_leaves_it_running(tmp_path: Path, monkeypatch) -> None:
    # A cluster of this test alone: without Ray's token authentication, whose one token per
    # user (~/.ray/auth_token) other Ray clusters of this user may hold.
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    port = free_port()
    head = subprocess.Popen(
        [PYTHON, "-m", "ray.scripts.scripts", "start", "--head", "--block",
         "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", "--disable-usage-stats"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for("the Ray head to answer", lambda: answers(port), timeout=30)
        run_dir = tmp_path / "run"
        done = run_train(
            tmp_path, *TINY_RUN, *RAY_RUN, f"ray.address=127.0.0.1:{port}",
            f"run_dir={run_dir}", "collector.total_frames=400",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert [row["frames"] for row in read_metrics(run_dir)] == [200, 400]
        assert head.poll() is None and answers(port)  # the cluster is still up
    finally:
        head.terminate()
        head.wait(timeout=60)
        # The head leaves its address where a later ray.init() without one would look.
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["ray.address=127.0.0.1:{port}"], "ray.address='127.0.0.1:{port}' is unreachable"),
        (["ray.address=ray://127.0.0.1:10001"], "Ray Client addresses are not supported"),
        (["ray.address=127.0.0.1:99999"], "the port in [1, 65535]"),
        (
            [f"collector.workers={machine_cpus() + 1}", "ray.worker_cpus=1", "ray.sync=false"],
            "ray.worker_cpus",
        ),
        (
            [
                f"collector.workers={machine_cpus()}",
                "ray.worker_cpus=1",
                "ray.sync=false",
                "eval.backend=ray",
            ],
            f"collector.workers={machine_cpus()} and eval.backend=ray (one actor more) with "
            f"ray.worker_cpus=1 asks {machine_cpus() + 1} CPUs",
        ),
        (["collector.device=cuda"], "collector.device"),
    ],
    ids=[
        "unreachable_address",
        "a_ray_client_address",
        "a_port_out_of_range",
        "more_cpus_than_the_machine",
        "an_evaluation_actor_too",
        "actors_on_a_gpu",
    ],
)
def test_what_ray_cannot_run_is_refused_before_anything_is_created(
    refused: Callable[..., str], tmp_path: Path, args: list[str], named: str
) -> None:
    port = free_port()
    args = [arg.format(port=port) for arg in args]
    error = refused(*TINY_RUN, *RAY_RUN, f"run_dir={tmp_path / 'run'}", *args)
    assert named.format(port=port) in error


def test_an_address_that_answers_but_not_as_ray_is_refused_at_once(
    refused: Callable[..., str], tmp_path: Path
) -> None:
    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # its log would be train.py's stderr
            pass

    # A web server, as Ray's dashboard is: Ray's own connect would retry it for ever.
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet) as web:
        threading.Thread(target=web.serve_forever, daemon=True).start()
        port = web.server_address[1]
        error = refused(
            *TINY_RUN, *RAY_RUN, f"run_dir={tmp_path / 'run'}", f"ray.address=127.0.0.1:{port}"
        )
        web.shutdown()
    assert f"ray.address='127.0.0.1:{port}' answers, but not as a Ray cluster" in error


# Runs train.py where Python's path finder finds no module ``ray``, as on a machine without it.
WITHOUT_RAY = """
import importlib.machinery, sys
class PathFinderWithoutRay(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            return None
        return super().find_spec(name, path, target)
sys.meta_path = [
    PathFinderWithoutRay if finder is importlib.machinery.PathFinder else finder
    for finder in sys.meta_path
]
sys.path.insert(0, {root!r})
import train
sys.exit(train.main({args!r}))
"""


def test_a_ray_run_without_ray_installed_is_refused(tmp_path: Path) -> None:
    args = [*TINY_RUN, *RAY_RUN, f"run_dir={tmp_path / 'run'}"]
    program = WITHOUT_RAY.format(root=str(ROOT), args=args)
    result = subprocess.run(
        [PYTHON, "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert "collector.mode=ray needs Ray" in refusal(result, tmp_path)
