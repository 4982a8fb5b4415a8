"""Cluster settings: what a SLURM job asks for, checked against the cluster, and the submitit
executor that asks for it.

A job's settings come from a profile in ``slurm/profiles/<name>.yaml`` with every ``slurm.*``
key that is set laid over it; they are checked for types and ranges, then against the
cluster (``sinfo``), before anything is submitted. Used by the SLURM launcher
(:mod:`rl_app.launch.slurm`, runs and a sweep's workers) and by collection jobs
(:mod:`rl_app.collection.distributed`, and :mod:`rl_app.collection.rpc` with
``rpc.launcher=slurm``).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import submitit
import yaml

from rl_app.config import Config, ConfigError

ROOT = Path(__file__).resolve().parents[2]
PROFILES_DIR = ROOT / "slurm" / "profiles"
# Inside a run directory: submitit's pickles and logs, and the record of every attempt.
JOB_DIR = "slurm"
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
    cpus_per_task: int = 1  # on each node
    nodes: int = 1  # more only for a Ray cluster in the job (rl_app.launch.ray_cluster)
    mem_gb: int | None = None
    constraint: str | None = None
    signal_delay_s: int = 90
    max_requeues: int = 3
    sbatch_extra: dict[str, str] = field(default_factory=dict)  # any other sbatch option


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
    """What each collection job asks for (``collector.mode=distributed``, or ``rpc`` with
    ``rpc.launcher=slurm``): the training
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
        nodes=1,
        signal_delay_s=0,
        max_requeues=0,
        **{key: value for key, value in collector_overrides.items() if value is not None},
    )
    check_settings(settings, source="slurm.collector_*")
    return settings


def check_collection_jobs(config: Config) -> None:
    """Refuse collection jobs the cluster would refuse (distributed mode, rpc mode's jobs)."""
    if config.collector.mode == "distributed":
        check_cluster(collection_job_settings(config.slurm), "collector.mode=distributed")
    elif config.collector.mode == "rpc" and config.rpc.launcher == "slurm":
        check_cluster(collection_job_settings(config.slurm), "rpc.launcher=slurm")


def check_settings(settings: JobSettings, source: str) -> None:
    """Types and ranges, before the cluster is asked anything."""
    for key in ("time_min", "gpus_per_node", "cpus_per_task", "nodes", "mem_gb",
                "signal_delay_s", "max_requeues"):  # fmt: skip
        value = getattr(settings, key)
        least = 1 if key in ("time_min", "cpus_per_task", "nodes", "mem_gb") else 0
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


def check_cluster(settings: JobSettings, asked_by: str = "launcher=slurm") -> None:
    """Refuse, in one line, what SLURM would refuse: no SLURM here, an unknown partition,
    more GPUs or CPUs than one of its nodes has. ``asked_by``: the setting that submits
    the jobs, which the refusal names."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        raise ConfigError(f"{asked_by} needs SLURM's sbatch and sinfo on PATH; none found")
    try:
        answer = subprocess.run(
            ["sinfo", "--noheader", "--format=%P|%c|%G"], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{asked_by}: the SLURM controller did not answer in 30 s") from None
    if answer.returncode != 0:
        reason = (answer.stderr.strip().splitlines() or ["no answer"])[-1]
        raise ConfigError(f"{asked_by}: cannot reach the SLURM controller ({reason})")
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


def make_executor(
    folder: Path, settings: JobSettings, name: str, setup: list[str] | None = None
) -> submitit.AutoExecutor:
    """A fresh executor per job (submitit keeps a parameter once set, even set to None);
    ``setup``: lines the job's script runs before Python starts."""
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
        nodes=settings.nodes,
        tasks_per_node=1,
        timeout_min=settings.time_min,
        cpus_per_task=settings.cpus_per_task,
        slurm_signal_delay_s=settings.signal_delay_s,
        slurm_additional_parameters=dict(settings.sbatch_extra),
        # The job unpickles rl_app.launch.job.TrainJob: make rl_app importable from any directory.
        slurm_setup=[f"export PYTHONPATH={ROOT}${{PYTHONPATH:+:$PYTHONPATH}}", *(setup or [])],
        **{key: value for key, value in optional.items() if value is not None},
    )
    return executor
