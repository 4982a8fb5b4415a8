"""A Ray cluster inside the SLURM job: ``launcher=slurm collector.mode=ray`` with
``ray.address`` unset.

The job holds ``slurm.nodes`` nodes, one task of ``slurm.cpus_per_task`` CPUs on each, and
submitit runs :class:`RayTrainJob` in every task. Task 0 starts the Ray head on its node
(``ray start --head`` with the task's CPUs), writes where it listens into
``<run_dir>/slurm/ray/``, waits for every node to join, and trains as
:class:`~rl_app.launch.job.TrainJob` does, with ``ray.address`` set to the head. Every other
task joins the head with its node's CPUs (``ray start --address``) and stays until the head
stops. The cluster is the attempt's: the head stops when training ends, and before a
requeue (after the save at the iteration boundary); the requeued job starts a fresh one.

Apart from any Ray a user or a test runs on the same machines, each node's Ray has:

- its own temporary directory (sessions, sockets, logs), removed when it stops, and a free
  port for the head;
- its own token (Ray's token authentication), never the user's ``~/.ray/auth_token``: made
  at submission in a file only the user reads, named in the job's environment before
  anything imports Ray (Ray reads its authentication settings once, on import);
- SIGUSR2 ignored: SLURM sends it to every process of the job on preemption, and Ray's
  processes (its actors too, which inherit it) would die of it mid-iteration.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import submitit

from rl_app.config import Config
from rl_app.launch.cluster import JOB_DIR
from rl_app.launch.job import TrainJob, record_attempt, show_run_log, train_attempt

if TYPE_CHECKING:  # torch and TorchRL: imported in the job only
    from rl_app.loop import TrainResult

# In <run_dir>/slurm/: where each attempt's head says where it listens, and each node's log.
RAY_DIR = "ray"
# In the job's submitit folder: the token of the job's Ray.
TOKEN_FILE = "ray_auth_token"
# How long the head waits for its nodes, and a node for the head to start.
JOIN_TIMEOUT_S = 300.0
# How long a node's Ray is given to stop on SIGTERM before it is killed (it drains first).
STOP_TIMEOUT_S = 60.0
POLL_S = 0.5
# A shell that ignores SIGUSR2, then runs the command: an ignored signal stays ignored
# across exec, in Ray's processes and in the actors they start.
IGNORING_USR2 = ["bash", "-c", 'trap "" USR2; exec "$@"', "ray"]


class RayClusterFailed(RuntimeError):
    """The job's Ray did not start, or a node did not join it."""


class NodeRay:
    """The Ray of one node of the job: ``ray start --block`` in a process of its own."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.temp_dir = Path(tempfile.gettempdir()) / f"rl_app-ray-{attempt_tag()}"
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
                   f"--temp-dir={self.temp_dir}", f"--node-ip-address={node_ip()}",
                   f"--num-cpus={allocated_cpus()}", "--num-gpus=0", "--disable-usage-stats",
                   *args]  # fmt: skip
        # TMPDIR: Ray's own temporary files go with the rest, and tell its processes apart.
        environment = {**os.environ, "TMPDIR": str(self.temp_dir)}
        with open(log_path, "wb") as log:
            self.process: subprocess.Popen | None = subprocess.Popen(
                [*IGNORING_USR2, *command], env=environment, stdout=log, stderr=subprocess.STDOUT
            )

    def check_running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RayClusterFailed(
                f"Ray on {socket.gethostname()} exited with status {self.process.returncode} "
                f"(log: {self.log_path})"
            )

    def stop(self) -> None:
        """SIGTERM: ``ray start --block`` stops every process it started. Idempotent."""
        process, self.process = self.process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


class RayTrainJob(TrainJob):
    """:class:`~rl_app.launch.job.TrainJob` on a Ray cluster of the job's nodes."""

    def __init__(self, config: Config, max_requeues: int, nodes: int) -> None:
        super().__init__(config, max_requeues)
        self.nodes = nodes
        self.head: NodeRay | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "head": None}  # what a requeue pickles: no live process

    def __call__(self) -> TrainResult | None:
        if submitit.JobEnvironment().global_rank == 0:
            return super().__call__()
        show_run_log()
        join_head(Path(self.config.run_dir))
        return None

    def attempt(self) -> TrainResult:
        import ray  # in the job only

        run_dir = Path(self.config.run_dir)
        port = free_port()
        address = f"{node_ip()}:{port}"
        log_path = ray_dir(run_dir) / f"{attempt_tag()}-node0.log"
        self.head = NodeRay(["--head", f"--port={port}", "--include-dashboard=false"], log_path)
        try:
            wait_until("the Ray head to listen", lambda: answers(address), self.head)
            write_head_file(run_dir, address)
            # The learner's connection: the run finds it and leaves it to this job to close.
            ray.init(address=address, log_to_driver=False)
            try:
                wait_until(
                    f"{self.nodes} node(s) to join the Ray head",
                    lambda: sum(node["Alive"] for node in ray.nodes()) >= self.nodes,
                    self.head,
                )
                record_attempt(
                    run_dir, event="ray cluster", address=address, nodes=self.nodes,
                    cpus=ray.cluster_resources().get("CPU", 0.0),
                    temp_dir=str(self.head.temp_dir),
                )  # fmt: skip
                ray_config = dataclasses.replace(self.config.ray, address=address)
                return train_attempt(dataclasses.replace(self.config, ray=ray_config))
            finally:
                ray.shutdown()
        finally:
            self.stop_cluster()

    def stop_cluster(self) -> None:
        if self.head is not None:
            head_file(Path(self.config.run_dir)).unlink(missing_ok=True)
            self.head.stop()

    def _requeue(
        self, submitit_handler: Callable[..., Any], frames: int | None, record_dir: Path
    ) -> NoReturn:
        # A USR2 outside the training loop requeues at once: the cluster stops first, since
        # the requeue ends the job's processes.
        self.stop_cluster()
        super()._requeue(submitit_handler, frames, record_dir)


def join_head(run_dir: Path) -> None:
    """On every node but the head's: join this attempt's head, and stay until it stops."""
    path = head_file(run_dir)
    wait_until(f"the Ray head to write {path}", path.exists)
    head = json.loads(path.read_text())
    log_path = ray_dir(run_dir) / f"{attempt_tag()}-node{submitit.JobEnvironment().node}.log"
    node = NodeRay([f"--address={head['address']}"], log_path)
    # USR2 is the head's business: it saves, and its requeue ends this task too.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        while answers(head["address"]):
            node.check_running()
            time.sleep(POLL_S)
    finally:
        node.stop()


def wait_until(what: str, done: Callable[[], bool], node: NodeRay | None = None) -> None:
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while not done():
        if node is not None:
            node.check_running()
        if time.monotonic() > deadline:
            raise RayClusterFailed(f"gave up after {JOIN_TIMEOUT_S:g} s waiting for {what}")
        time.sleep(POLL_S)


def job_setup(folder: Path) -> list[str]:
    """Lines of the job's script, run before Python starts: the token of the job's Ray (made
    here, once per folder, readable by the user only) for its processes and the learner,
    whatever token the user's own Ray has; no usage reports."""
    token = folder / TOKEN_FILE
    if not token.exists():
        folder.mkdir(parents=True, exist_ok=True)
        write_private(token, secrets.token_hex(32))
    return [
        "unset RAY_AUTH_TOKEN",
        "export RAY_AUTH_MODE=token",
        f"export RAY_AUTH_TOKEN_PATH={shlex.quote(str(token.resolve()))}",
        "export RAY_USAGE_STATS_ENABLED=0",
    ]


def attempt_tag() -> str:
    """``<job id>-<restart count>``: this attempt's, the same in every task of the job."""
    return f"{os.environ['SLURM_JOB_ID']}-{os.environ.get('SLURM_RESTART_COUNT', '0')}"


def ray_dir(run_dir: Path) -> Path:
    return run_dir / JOB_DIR / RAY_DIR


def head_file(run_dir: Path) -> Path:
    return ray_dir(run_dir) / f"{attempt_tag()}-head.json"


def write_head_file(run_dir: Path, address: str) -> None:
    write_private(head_file(run_dir), json.dumps({"address": address}))


def write_private(path: Path, text: str) -> None:
    """Readable by the user only; whole when it appears."""
    partial = path.with_name(path.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
        file.write(text)
    partial.rename(path)


def allocated_cpus() -> int:
    """The CPUs of this node's task (one task per node)."""
    return int(os.environ.get("SLURM_CPUS_PER_TASK") or os.environ["SLURM_CPUS_ON_NODE"])


def node_ip() -> str:
    """The address other nodes reach this one at."""
    return socket.gethostbyname(socket.gethostname())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    with socket.socket() as probe:
        probe.settimeout(5)
        return probe.connect_ex((host, int(port))) == 0
