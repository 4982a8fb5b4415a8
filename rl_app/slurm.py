"""Launching on SLURM with submitit (``launcher=slurm``).

The submitting side turns a validated :class:`~rl_app.config.Config` into SLURM jobs: the
cluster settings come from a profile in ``slurm/profiles/<name>.yaml`` with every ``slurm.*``
key that is set overriding it, they are checked against the cluster (``sinfo``) before
anything is submitted, and ``slurm.array=KEY=V1,V2,...`` makes one job array with a run
directory per value.

The job side is :class:`TrainJob`. It trains with ``rl_app.loop.train``, which resumes by
itself when the run directory holds a checkpoint. On SIGUSR2 (a preemption, or the time
limit coming: SLURM sends it ``slurm.signal_delay_s`` ahead) the loop finishes its iteration
and saves a checkpoint; only then is submitit's own handler called, which asks
:meth:`TrainJob.checkpoint` for what to run next (the same job: same config, same run
directory), requeues the job and exits. Each attempt is recorded in
``<run_dir>/slurm/attempts.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import submitit
import yaml

from rl_app.config import CHECKPOINTS_DIR, CONFIG_FILE, Config, ConfigError, load_config, to_yaml

ROOT = Path(__file__).resolve().parent.parent
PROFILES_DIR = ROOT / "slurm" / "profiles"
# Inside a run directory: submitit's pickles and logs, and the record of every attempt.
JOB_DIR = "slurm"
ATTEMPTS_FILE = "attempts.jsonl"
# Inside the parent directory of a job array: one line per task.
ARRAY_SUMMARY = "array.tsv"
# slurm.* keys that are not the training job's cluster settings.
NOT_IN_PROFILES = ("profile", "array", "collector_partition", "collector_cpus_per_task",
                   "collector_mem_gb", "collector_time_min")  # fmt: skip


@dataclass(frozen=True)
class JobSettings:
    """What one job asks SLURM for: a profile merged with the ``slurm.*`` overrides."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_min: int = 60
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    mem_gb: int | None = None
    constraint: str | None = None
    signal_delay_s: int = 90
    max_requeues: int = 3
    sbatch_extra: dict[str, str] = field(default_factory=dict)  # any other sbatch option


@dataclass(frozen=True)
class SubmittedJob:
    job_id: str
    run_dir: Path
    stdout: Path
    stderr: Path
    label: str  # "KEY=VALUE" for an array task, "" otherwise


# -- settings ------------------------------------------------------------------------------


def available_profiles() -> list[str]:
    return sorted(path.stem for path in PROFILES_DIR.glob("*.yaml"))


def job_settings(slurm: Any) -> JobSettings:
    """The profile ``slurm.profile`` with every ``slurm.*`` key that is set laid over it."""
    path = PROFILES_DIR / f"{slurm.profile}.yaml"
    if not path.is_file():
        raise ConfigError(
            f"slurm.profile={slurm.profile!r} is not a profile in {PROFILES_DIR}: accepted "
            f"profiles are {', '.join(available_profiles())}"
        )
    # A key left null in the profile is unset: the default (or the cluster's) applies.
    profile = yaml.safe_load(path.read_text()) or {}
    if not isinstance(profile, dict):
        raise ConfigError(f"profile {path} must be a mapping of setting to value")
    profile = {key: value for key, value in profile.items() if value is not None}
    known = [f.name for f in dataclasses.fields(JobSettings)]
    unknown = sorted(set(profile) - set(known))
    if unknown:
        raise ConfigError(
            f"profile {path} has unknown key {unknown[0]!r}: accepted keys are {', '.join(known)}"
        )
    overrides = {
        key: value
        for key, value in dataclasses.asdict(slurm).items()
        if key not in NOT_IN_PROFILES and value is not None
    }
    settings = JobSettings(**{**profile, **overrides})
    check_settings(settings, source=f"slurm.profile={slurm.profile}")
    return settings


def collection_job_settings(slurm: Any) -> JobSettings:
    """What each collection job asks for (``collector.mode=distributed``): the training
    job's settings with ``slurm.collector_*`` laid over them, no GPU, no requeue (a
    resumed learner submits fresh collection jobs)."""
    collector_overrides = {
        "partition": slurm.collector_partition,
        "cpus_per_task": slurm.collector_cpus_per_task,
        "mem_gb": slurm.collector_mem_gb,
        "time_min": slurm.collector_time_min,
    }
    settings = dataclasses.replace(
        job_settings(slurm),
        gpus_per_node=0,
        signal_delay_s=0,
        max_requeues=0,
        **{key: value for key, value in collector_overrides.items() if value is not None},
    )
    check_settings(settings, source="slurm.collector_*")
    return settings


def check_collection_jobs(config: Config) -> None:
    """In distributed mode, refuse collection jobs the cluster would refuse."""
    if config.collector.mode == "distributed":
        check_cluster(collection_job_settings(config.slurm))


def check_settings(settings: JobSettings, source: str) -> None:
    """Types and ranges, before the cluster is asked anything."""
    for key in ("time_min", "gpus_per_node", "cpus_per_task", "mem_gb", "signal_delay_s",
                "max_requeues"):  # fmt: skip
        value = getattr(settings, key)
        least = 1 if key in ("time_min", "cpus_per_task", "mem_gb") else 0
        if value is not None and (not isinstance(value, int) or value < least):
            raise ConfigError(
                f"slurm.{key}={value!r} ({source}) is out of range: give an integer >= {least}"
            )
    if settings.signal_delay_s >= settings.time_min * 60:
        raise ConfigError(
            f"slurm.signal_delay_s={settings.signal_delay_s} ({source}) is out of range: it must "
            f"be shorter than the time limit, slurm.time_min={settings.time_min} (minutes)"
        )
    if not isinstance(settings.sbatch_extra, dict):
        raise ConfigError(f"sbatch_extra ({source}) must be a mapping of sbatch option to value")


def check_cluster(settings: JobSettings) -> None:
    """Refuse, in one line, what SLURM would refuse: no SLURM here, an unknown partition,
    more GPUs or CPUs than one of its nodes has."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        raise ConfigError("launcher=slurm needs SLURM's sbatch and sinfo on PATH; none found")
    try:
        answer = subprocess.run(
            ["sinfo", "--noheader", "--format=%P|%c|%G"], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        raise ConfigError("launcher=slurm: the SLURM controller did not answer in 30 s") from None
    if answer.returncode != 0:
        reason = (answer.stderr.strip().splitlines() or ["no answer"])[-1]
        raise ConfigError(f"launcher=slurm: cannot reach the SLURM controller ({reason})")
    partitions: dict[str, list[tuple[str, str]]] = {}
    default = None
    for line in answer.stdout.split():
        name, cpus, gres = line.split("|")
        if name.endswith("*"):
            name = default = name[:-1]
        partitions.setdefault(name, []).append((cpus, gres))
    partition = settings.partition or default
    if partition not in partitions:
        raise ConfigError(
            f"slurm.partition={settings.partition!r} is not a partition of this cluster: "
            f"accepted partitions are {', '.join(sorted(partitions))}"
        )
    most_gpus = max(gpu_count(gres) for _, gres in partitions[partition])
    if settings.gpus_per_node > most_gpus:
        raise ConfigError(
            f"slurm.gpus_per_node={settings.gpus_per_node} is out of range: the nodes of "
            f"partition {partition} have at most {most_gpus} GPU(s)"
        )
    sizes = [int(cpus) for cpus, _ in partitions[partition] if cpus.isdigit()]  # "64+": mixed
    if sizes and settings.cpus_per_task > max(sizes):
        raise ConfigError(
            f"slurm.cpus_per_task={settings.cpus_per_task} is out of range: the nodes of "
            f"partition {partition} have at most {max(sizes)} CPUs"
        )


def gpu_count(gres: str) -> int:
    """GPUs in a ``sinfo %G`` field such as ``gpu:1``, ``gpu:a100:4(S:0-1)`` or ``(null)``."""
    return max((int(n) for n in re.findall(r"gpu(?::[\w.-]+)?:(\d+)", gres)), default=0)


# -- arrays --------------------------------------------------------------------------------


def parse_array(spec: str) -> tuple[str, list[str]]:
    """``KEY=V1,V2,...`` into the key and its values (commas inside [...] stay in a value)."""
    key, _, values_text = spec.partition("=")
    values = [value.strip() for value in re.split(r",(?![^\[]*\])", values_text)]
    if not key or not all(values):
        raise ConfigError(
            f"slurm.array={spec!r} is not accepted: give one key and its values, "
            "e.g. slurm.array=seed=1,2,3"
        )
    if key.split(".")[0] in ("slurm", "launcher", "run_dir"):
        raise ConfigError(
            f"slurm.array={spec!r} is not accepted: {key} cannot vary across an array"
        )
    if len(set(values)) != len(values):
        raise ConfigError(f"slurm.array={spec!r} is not accepted: a value is repeated")
    return key, values


def task_configs(preset: str, overrides: list[str], config: Config) -> list[tuple[str, Config]]:
    """One validated config per array value, each in ``<run_dir>/<KEY>=<VALUE>``."""
    key, values = parse_array(config.slurm.array)
    parent = Path(config.run_dir).resolve()
    tasks = []
    for value in values:
        label = f"{key}={value}"
        run_dir = parent / re.sub(r"[^\w.=+-]", "_", label)
        task = load_config(preset, [*overrides, label, f"run_dir={run_dir}", "slurm.array=null"])
        tasks.append((label, task))
    return tasks


# -- submission ----------------------------------------------------------------------------


def make_executor(folder: Path, settings: JobSettings, name: str) -> submitit.AutoExecutor:
    """A fresh executor per job (submitit keeps a parameter once set, even set to None)."""
    executor = submitit.AutoExecutor(
        folder=folder, cluster="slurm", slurm_max_num_timeout=settings.max_requeues
    )
    optional = {
        "slurm_partition": settings.partition,
        "slurm_account": settings.account,
        "slurm_qos": settings.qos,
        "slurm_constraint": settings.constraint,
        "mem_gb": settings.mem_gb,
        # Asking for zero GPUs is an error on clusters without GPUs: leave the option out.
        "gpus_per_node": settings.gpus_per_node or None,
    }
    executor.update_parameters(
        name=name,
        nodes=1,
        tasks_per_node=1,
        timeout_min=settings.time_min,
        cpus_per_task=settings.cpus_per_task,
        slurm_signal_delay_s=settings.signal_delay_s,
        slurm_additional_parameters=dict(settings.sbatch_extra),
        # The job unpickles rl_app.slurm.TrainJob: make rl_app importable from any directory.
        slurm_setup=[f"export PYTHONPATH={ROOT}${{PYTHONPATH:+:$PYTHONPATH}}"],
        **{key: value for key, value in optional.items() if value is not None},
    )
    return executor


def submit(preset: str, overrides: list[str], config: Config) -> list[SubmittedJob]:
    """Validate the SLURM settings (and each array task's config), then submit: one job,
    or one job array when ``slurm.array`` is set. Raises :class:`ConfigError`."""
    settings = job_settings(config.slurm)
    check_cluster(settings)
    check_collection_jobs(config)
    if config.slurm.array is None:
        config = dataclasses.replace(config, run_dir=str(Path(config.run_dir).resolve()))
        tasks = [("", config)]
        folder = Path(config.run_dir) / JOB_DIR
    else:
        tasks = task_configs(preset, overrides, config)
        folder = Path(config.run_dir).resolve() / JOB_DIR
    for _, task in tasks:
        # The run directory shows its config (and counts as a run) from submission on.
        Path(task.run_dir).mkdir(parents=True, exist_ok=True)
        (Path(task.run_dir) / CONFIG_FILE).write_text(to_yaml(task))

    executor = make_executor(folder, settings, name=f"rl_app-{Path(config.run_dir).name}")
    try:
        with executor.batch():  # several submissions in a batch make one job array
            jobs = [executor.submit(TrainJob(task, settings.max_requeues)) for _, task in tasks]
    except submitit.core.utils.FailedJobError as error:
        reason = str(error).strip().splitlines()[-1].removeprefix("sbatch: error: ")
        raise ConfigError(f"sbatch refused the job: {reason}") from None
    submitted = [
        SubmittedJob(job.job_id, Path(task.run_dir), job.paths.stdout, job.paths.stderr, label)
        for job, (label, task) in zip(jobs, tasks, strict=True)
    ]
    if config.slurm.array is not None:
        write_array_summary(Path(config.run_dir).resolve() / ARRAY_SUMMARY, submitted)
    return submitted


def write_array_summary(path: Path, jobs: list[SubmittedJob]) -> None:
    lines = ["task\tjob_id\trun_dir\tstdout\tstderr"]
    lines += [f"{j.label}\t{j.job_id}\t{j.run_dir}\t{j.stdout}\t{j.stderr}" for j in jobs]
    path.write_text("\n".join(lines) + "\n")


def read_array_summary(path: Path) -> list[dict[str, str]]:
    header, *rows = path.read_text().splitlines()
    return [dict(zip(header.split("\t"), row.split("\t"), strict=True)) for row in rows]


def describe(jobs: list[SubmittedJob]) -> str:
    """What ``train.py launcher=slurm`` prints: job ids, run directories and log paths."""
    lines = []
    for job in jobs:
        task = f" ({job.label})" if job.label else ""
        lines += [
            f"submitted job {job.job_id}{task}",
            f"  run directory: {job.run_dir}",
            f"  logs: {job.stdout}",
            f"        {job.stderr}",
        ]
    if jobs[0].label:
        lines.append(f"array summary: {jobs[0].run_dir.parent / ARRAY_SUMMARY}")
    lines.append("watch with: squeue --me; the run resumes by itself when requeued")
    return "\n".join(lines)


# -- the job -------------------------------------------------------------------------------


class RequeueLimitReached(RuntimeError):
    """Preempted once more than ``slurm.max_requeues`` allows; the checkpoint is saved."""


class TrainJob:
    """What a SLURM job runs: ``train(config)`` in the run's directory, requeued on
    preemption (submitit requeues callables that have a ``checkpoint`` method)."""

    def __init__(self, config: Config, max_requeues: int) -> None:
        self.config = config
        self.max_requeues = max_requeues

    def __call__(self) -> Any:
        import torch  # heavy imports: in the job only

        from rl_app.collection import decide_devices
        from rl_app.loop import train

        show_run_log()
        # Threads follow the job's allocation, not the host's core count.
        threads = int(os.environ.get("SLURM_CPUS_PER_TASK", self.config.threads))
        config = dataclasses.replace(self.config, threads=threads)
        run_dir = Path(config.run_dir)
        record_attempt(
            run_dir,
            event="start",
            resumed_from_frames=newest_checkpoint_frames(run_dir),
            cuda_available=torch.cuda.is_available(),
            device=str(decide_devices(config).learner),
            threads=threads,
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
        submitit_handler = signal.getsignal(signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, self._usr2_handler(submitit_handler))
        try:
            result = train(config)
        finally:
            signal.signal(signal.SIGUSR2, submitit_handler)
        finished = result.frames >= config.collector.total_frames
        if result.stopped_by == "SIGUSR2" and not finished:
            self._requeue(submitit_handler, frames=result.frames)
        record_attempt(run_dir, event="finished" if finished else "stopped",
                       frames=result.frames, stopped_by=result.stopped_by)  # fmt: skip
        return result

    def checkpoint(self) -> submitit.helpers.DelayedSubmission:
        """Called by submitit before it requeues: run this same job again. The run
        directory already holds the checkpoint saved at the iteration boundary."""
        return submitit.helpers.DelayedSubmission(self)

    def _usr2_handler(self, submitit_handler: Callable[..., Any]) -> Callable[..., None]:
        def on_usr2(signum: int, frame: Any) -> None:
            # The training loop replaces this handler with its own while it runs, and saves
            # at the next iteration boundary. Outside the loop (starting up, closing down)
            # nothing is in flight: requeue at once; the run resumes from its newest
            # checkpoint.
            self._requeue(submitit_handler, frames=None)

        return on_usr2

    def _requeue(self, submitit_handler: Callable[..., Any], frames: int | None) -> NoReturn:
        """Requeue through submitit, unless this job was requeued ``max_requeues`` times
        already (submitit itself limits timeouts only, not preemptions)."""
        run_dir = Path(self.config.run_dir)
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", 0))
        requeue = restarts < self.max_requeues
        # frames=None: preempted while starting up, before any new iteration.
        record_attempt(run_dir, event="preempted", frames=frames, requeued=requeue)
        if not requeue:
            raise RequeueLimitReached(
                f"preempted after {restarts} requeue(s), the limit (slurm.max_requeues="
                f"{self.max_requeues}); the checkpoint in {run_dir} is saved: "
                f"resume with python train.py run_dir={run_dir}"
            )
        # submitit calls self.checkpoint(), runs `scontrol requeue` and exits.
        submitit_handler(signal.SIGUSR2, None)
        raise RuntimeError("submitit's handler returned without requeueing the job")


def show_run_log() -> None:
    """The loop's log lines ("resumed from ...") in the job's stderr. Only rl_app's logger:
    submitit's has its own handler, and the root's would print its lines twice."""
    run_log = logging.getLogger("rl_app")
    if not run_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        run_log.addHandler(handler)
        run_log.setLevel(logging.INFO)


def newest_checkpoint_frames(run_dir: Path) -> int:
    """Frames of the newest checkpoint, the one a resume starts from (0: a fresh start)."""
    from rl_app.checkpointing import checkpoint_candidates  # torchrl: in the job only

    newest = checkpoint_candidates(run_dir / CHECKPOINTS_DIR)
    return int(newest[0].name.split("-")[1]) if newest else 0


def job_id() -> str | None:
    """The id ``train.py`` printed: ``<array id>_<task>`` for an array task."""
    if "SLURM_ARRAY_JOB_ID" in os.environ:
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def record_attempt(run_dir: Path, event: str, **details: Any) -> None:
    """Append one line to ``<run_dir>/slurm/attempts.jsonl``: which job, which attempt."""
    row = {
        "event": event,
        "time": time.time(),
        "job_id": job_id(),
        "restart_count": int(os.environ.get("SLURM_RESTART_COUNT", 0)),
        "host": socket.gethostname(),
        **details,
    }
    path = run_dir / JOB_DIR / ATTEMPTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as file:
        file.write(json.dumps(row) + "\n")
    print(f"rl_app.slurm: {json.dumps(row)}", file=sys.stderr, flush=True)


def read_attempts(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / JOB_DIR / ATTEMPTS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
