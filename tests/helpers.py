"""What several test modules share: paths, a tiny real run, and helpers to watch worker
processes, weights and SLURM jobs. Fixtures are in conftest.py."""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.envs.utils import RandomPolicy

from rl_app.algorithms import Algorithm, make_algorithm
from rl_app.checkpointing import (
    checkpoint_candidates,
    choose_checkpoint,
    load_component,
    verify_checkpoint,
)
from rl_app.collection import WeightSync, decide_devices, make_collector
from rl_app.config import Config, EnvConfig
from rl_app.envs import make_env
from rl_app.logger import read_metrics
from rl_app.loop import Progress, Run, run_iterations
from rl_app.run import build_run

ROOT = Path(__file__).resolve().parent.parent
TRAIN_PY = ROOT / "train.py"
PYTHON = sys.executable
UP_SCRIPT = ROOT / "slurm" / "local-cluster" / "up.sh"

# A run of a few seconds: small networks, a few evaluations, real env, real buffer on disk.
TINY_RUN = [
    "network.hidden_sizes=[32,32]",
    "collector.total_frames=1200",
    "collector.frames_per_batch=200",
    "collector.init_random_frames=400",
    "optim.utd_ratio=0.1",
    "optim.batch_size=64",
    "replay.capacity=5000",
    "eval.interval_frames=400",
    "eval.episodes=2",
    "logger.backend=none",
    "optim.compile=false",  # a compile would take longer than the whole run
]
# TINY_RUN's overrides for a recurrent DQN learning from Sequence windows, on MountainCar,
# whose random episodes all last 200 steps (a batch, as Pendulum's do).
RECURRENT_DQN = [
    "algo=dqn",
    "env.name=MountainCar-v0",
    "network.recurrent=lstm",
    "network.lstm_size=8",
    "replay.sampler=prioritized_sequence",
    "replay.burn_in=4",
    "optim.target=td_lambda",
]
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")
# Waits on real processes and SLURM jobs are given this many times what they take on the
# machine the suite is measured on: room for one 2.5 times slower, its other core busy
# with the rest of the suite.
SLOW_MACHINE_MARGIN = 3


def run_train(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, str(TRAIN_PY), *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def refusal(result: subprocess.CompletedProcess, cwd: Path) -> str:
    """The error line of a command (``train.py``, the sweep command) that had to refuse:
    exit 2 with that one line, no traceback, nothing on stdout and nothing created in
    ``cwd``."""
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert list(cwd.iterdir()) == []  # no run directory, no files
    return result.stderr


def stop_a_run(
    cwd: Path, run_dir: Path, args: list[str], stop: Callable[[subprocess.Popen], Any]
) -> tuple[Any, str, Path]:
    """Start ``train.py`` with ``args`` in the background, for far more frames than it
    collects before ``stop(run)``, called once it has saved a checkpoint, makes it fail;
    wait for it to end with exit status 1. Returns what ``stop`` returned, the run's stderr
    and the checkpoint it names as its last good one, verified."""
    run = subprocess.Popen(
        [PYTHON, str(TRAIN_PY), *args, "collector.total_frames=1000000"],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for("a checkpoint", lambda: checkpoint_candidates(run_dir / "checkpoints"), 120)
        stopped = stop(run)
        _, stderr = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1, stderr
    named = named_checkpoint(stderr)
    verify_checkpoint(named)
    return stopped, stderr, named


def named_checkpoint(message: str) -> Path:
    """The checkpoint a failed run's ``message`` names as its last good one."""
    return Path(re.search(r"last good checkpoint: (\S+);", message).group(1))


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def workers_of(pid: int) -> list[int]:
    """The worker processes of the ``train.py`` process ``pid`` (its children but the
    multiprocessing resource tracker), in the order they were started."""
    workers = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, NotADirectoryError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"resource_tracker" not in cmdline:
            workers.append(int(entry.name))
    return sorted(workers)


def kill_the_second_worker(run: subprocess.Popen) -> list[int]:
    """SIGKILL the second of the two worker processes of ``train.py`` process ``run``;
    the workers' pids."""
    workers = workers_of(run.pid)
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGKILL)
    return workers


def child_processes() -> set[int]:
    """Live child processes of this process (the multiprocessing resource tracker aside)."""
    children = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        state = stat.rsplit(")", 1)[1].split()[0]
        if parent == os.getpid() and state != "Z" and b"resource_tracker" not in cmdline:
            children.add(int(entry.name))
    return children


def actor_outputs(policy, weights, observation: torch.Tensor) -> TensorDict:
    """loc/scale the actor computes with ``weights`` on ``observation``."""
    copy_ = copy.deepcopy(policy)
    copy_.load_state_dict(weights)
    with torch.no_grad():
        return copy_.module[0](TensorDict({"observation": observation}, observation.shape[:1]))


@contextmanager
def acting_collector(config: Config) -> Iterator[tuple[Algorithm, Any]]:
    """A fresh algorithm and the collector ``config`` names, acting with its policy; the
    collector is shut down on leaving."""
    algorithm = make_algorithm(config, make_env(config.env, 0), torch.device("cpu"))
    collector = make_collector(config, algorithm, decide_devices(config))
    try:
        yield algorithm, collector
    finally:
        collector.shutdown()


def collect_around_a_push(
    collector, algorithm, env_name: str, moved_at: int, pushed_at: int, batches: int
) -> tuple[list[TensorDict], dict[int, dict]]:
    """Collect ``batches`` batches: the learner's weights change after batch ``moved_at``
    without a push, and are pushed after batch ``pushed_at``. Returns the batches and the
    weights of each version sent (1: the initial push, 2: the later one)."""
    weight_sync = WeightSync(collector, algorithm, env_name)  # version 1
    snapshots = {1: copy.deepcopy(algorithm.policy.state_dict())}
    collected = []
    for index, batch in enumerate(collector):
        collected.append(batch)
        if index == moved_at:
            move_on(algorithm.policy)  # the collector must not see it yet
        if index == pushed_at:
            weight_sync.push()  # version 2
            snapshots[2] = copy.deepcopy(algorithm.policy.state_dict())
        if index == batches - 1:
            return collected, snapshots
    raise AssertionError("unreachable: collectors run until stopped")


def move_on(policy) -> None:
    """Change ``policy``'s weights in place, as a learner's update does."""
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))


def actor_version(batch: TensorDict, snapshots: dict, policy) -> torch.Tensor:
    """The snapshot version each frame of ``batch`` acted with (0: none). The actor's
    loc/scale are a function of the observation and the weights: recompute them with
    every snapshot."""
    acted = torch.zeros(len(batch), dtype=torch.long)
    for version, weights in snapshots.items():
        expected = actor_outputs(policy, weights, batch["observation"])
        same = ((batch["loc"] - expected["loc"]).abs() < 1e-5).squeeze(-1)
        same &= ((batch["scale"] - expected["scale"]).abs() < 1e-5).squeeze(-1)
        acted[same] = version
    return acted


def wait_for(
    what: str, predicate: Callable[[], Any], timeout: float, job_id: str | None = None
) -> Any:
    """Poll ``predicate`` until it returns something truthy, for ``timeout`` seconds (as
    measured here) times ``SLOW_MACHINE_MARGIN``; fail naming ``what``, and at once if job
    ``job_id`` ends in the meantime."""
    timeout *= SLOW_MACHINE_MARGIN
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if job_id is not None and job_state(job_id) in FINAL_STATES:
            raise AssertionError(f"job {job_id} ended ({job_state(job_id)}) before {what}")
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def job_state(job_id: str) -> str:
    """The job's state in accounting, e.g. RUNNING, COMPLETED ('' until it is recorded)."""
    answer = subprocess.run(
        ["sacct", "--noheader", "--parsable2", "--allocations", "--jobs", job_id,
         "--format=State"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    states = answer.stdout.split()
    return states[-1].split()[0] if states else ""


def hold_lock_in_another_process(run_dir: Path, seconds: float) -> subprocess.Popen:
    """A process holding ``run_dir``'s lock for ``seconds``, returned once it holds it."""
    program = (
        "import sys, time; from pathlib import Path; from rl_app.runlock import run_dir_lock\n"
        f"with run_dir_lock(Path({str(run_dir)!r})):\n"
        "    print('held', flush=True); time.sleep(float(sys.argv[1]))\n"
    )
    holder = subprocess.Popen(
        [PYTHON, "-c", program, str(seconds)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def random_play(env_name: str, frames: int) -> TensorDict:
    """Real transitions of a random policy, with the collector's trajectory ids: the same
    ones whatever ran before (the policy draws from torch's seeded generator)."""
    return random_play_batches(env_name, frames, frames)[0]


def random_play_batches(
    env_name: str, frames: int, frames_per_batch: int, **env_settings: Any
) -> list[TensorDict]:
    """:func:`random_play` as the collector's batches of ``frames_per_batch``, in order;
    ``env_settings`` are ``env.*`` settings (e.g. ``max_episode_steps=100``)."""
    env = make_env(EnvConfig(name=env_name, **env_settings), seed=0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        collector = Collector(
            env,
            RandomPolicy(env.action_spec),
            frames_per_batch=frames_per_batch,
            total_frames=frames,
        )
        batches = list(collector)
    collector.shutdown()
    return batches


def run_files(run_dir: Path) -> dict[str, tuple[int, int]]:
    """Size and mtime of every file a run writes (its lock files aside)."""
    return {
        str(path.relative_to(run_dir)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in run_dir.rglob("*")
        if path.is_file() and not path.name.startswith(".lock")
    }


# -- runs trained in this process, to compare an interrupted and resumed run with one
# trained without a stop ----------------------------------------------------------------


def final_state(run: Run) -> dict[str, torch.Tensor]:
    """Every tensor a resume restores of the algorithm (networks, optimizer, exploration)."""
    state = {}
    for name, component in run.algorithm.checkpoint_components().items():
        for key, value in component.state_dict().items():
            if isinstance(value, torch.Tensor):
                state[f"{name}.{key}"] = value.clone()
    return state


def train_in_process(config: Config) -> tuple[dict, TensorDict, list[dict]]:
    """Train ``config``'s run to its end: its final state, replay buffer and metrics."""
    run = build_run(config)
    try:
        run_iterations(run)
        return final_state(run), run.buffer[:].clone(), read_metrics(run.run_dir)
    finally:
        run.close()


def strip_wall_time(row: dict) -> dict:
    return {key: value for key, value in row.items() if key != "wall_seconds"}


def resume_in_process(config: Config) -> tuple[dict, TensorDict, list[dict]]:
    """Resume ``config``'s run from its newest checkpoint and train it to its end."""
    run = build_run(config, resuming=True)
    try:
        run.checkpoints.load(choose_checkpoint(Path(config.run_dir) / "checkpoints")[0])
        run.logger.rewind(run.progress.frames)
        run_iterations(run)
        return final_state(run), run.buffer[:].clone(), read_metrics(run.run_dir)
    finally:
        run.close()


def assert_same_run(alone: tuple, resumed: tuple) -> None:
    """The same parameters, replay buffer and metrics (wall time aside)."""
    for key in alone[0]:
        assert torch.equal(alone[0][key], resumed[0][key]), key
    assert (alone[1] == resumed[1]).all()
    assert [strip_wall_time(row) for row in alone[2]] == [
        strip_wall_time(row) for row in resumed[2]
    ]


def saved_progress(checkpoint: Path) -> Progress:
    """The counters (and any owed evaluation) the checkpoint at ``checkpoint`` holds."""
    progress = Progress()
    load_component(checkpoint, "progress", progress)
    return progress


class SavedState:
    """Takes a checkpoint component's saved state, to read it."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict, **options) -> None:
        self.state = state


def saved_state(checkpoint: Path, component: str) -> dict:
    """The state the component ``component`` of the checkpoint at ``checkpoint`` holds."""
    saved = SavedState()
    load_component(checkpoint, component, saved)
    return saved.state
