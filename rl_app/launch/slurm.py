"""Submitting a run to SLURM with submitit (``launcher=slurm``).

The validated config becomes one job, or one job array with ``slurm.array=KEY=V1,V2,...``
(a run directory per value); the cluster settings are checked first
(:mod:`rl_app.launch.cluster`). Each job runs :class:`rl_app.launch.job.TrainJob`, or, for
``collector.mode=ray`` with ``ray.address`` unset, :class:`rl_app.launch.ray_cluster.RayTrainJob`
on a Ray cluster of the job's own nodes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit

from rl_app.checks import load_config, ray_actor_cpus
from rl_app.config import Config, ConfigError, to_yaml
from rl_app.launch.cluster import (
    JOB_DIR,
    JobSettings,
    check_cluster,
    check_collection_jobs,
    job_settings,
    make_executor,
)
from rl_app.launch.job import TrainJob
from rl_app.rundir import CONFIG_FILE
from rl_app.runlock import check_run_dir_free, removed_if_refused

# Inside the parent directory of a job array: one line per task.
ARRAY_SUMMARY = "array.tsv"


@dataclass(frozen=True)
class SubmittedJob:
    job_id: str
    run_dir: Path
    stdout: Path
    stderr: Path
    label: str  # "KEY=VALUE" for an array task, "" otherwise


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


def submit(preset: str, overrides: list[str], config: Config) -> list[SubmittedJob]:
    """Validate the SLURM settings (and each array task's config), then submit: one job,
    or one job array when ``slurm.array`` is set. Raises :class:`ConfigError`."""
    settings = job_settings(config.slurm)
    check_job_ray(config, settings)
    check_cluster(settings)
    check_collection_jobs(config)
    if config.slurm.array is None:
        config = dataclasses.replace(config, run_dir=str(Path(config.run_dir).resolve()))
        tasks = [("", config)]
        folder = Path(config.run_dir) / JOB_DIR
    else:
        tasks = task_configs(preset, overrides, config)
        folder = Path(config.run_dir).resolve() / JOB_DIR
    for _, task in tasks:  # a run directory in use by a live process is refused
        check_run_dir_free(Path(task.run_dir))
    run_dirs = [Path(config.run_dir), *(Path(task.run_dir) for _, task in tasks)]
    with removed_if_refused(run_dirs):
        for _, task in tasks:
            # The run directory shows its config (and counts as a run) from submission on.
            Path(task.run_dir).mkdir(parents=True, exist_ok=True)
            (Path(task.run_dir) / CONFIG_FILE).write_text(to_yaml(task))
        setup = None
        if runs_job_ray(config):
            from rl_app.launch.ray_cluster import job_setup

            setup = job_setup(folder)
        jobs = submit_jobs(
            folder,
            settings,
            f"rl_app-{Path(config.run_dir).name}",
            [make_job(task, settings) for _, task in tasks],
            setup,
        )
    submitted = [
        SubmittedJob(job.job_id, Path(task.run_dir), job.paths.stdout, job.paths.stderr, label)
        for job, (label, task) in zip(jobs, tasks, strict=True)
    ]
    if config.slurm.array is not None:
        write_array_summary(Path(config.run_dir).resolve() / ARRAY_SUMMARY, submitted)
    return submitted


def runs_job_ray(config: Config) -> bool:
    """Whether the job starts a Ray cluster of its own (rather than join ``ray.address``)."""
    return config.collector.mode == "ray" and config.ray.address is None


def check_job_ray(config: Config, settings: JobSettings) -> None:
    """Several nodes serve a Ray cluster of the job only; its actors must fit the job's
    allocation, not this host (Ray would leave an actor it cannot place waiting for ever)."""
    if not runs_job_ray(config):
        if settings.nodes > 1:
            raise ConfigError(
                f"slurm.nodes={settings.nodes} is not accepted: a job of several nodes runs a "
                "Ray cluster for collector.mode=ray with ray.address unset; give 1"
            )
        return
    cpus = settings.nodes * settings.cpus_per_task
    asked, asking, fewer = ray_actor_cpus(config)
    if asked > cpus:
        raise ConfigError(
            f"{asking} asks {asked:g} CPUs, and the job's allocation has {cpus} "
            f"(slurm.nodes={settings.nodes} x slurm.cpus_per_task={settings.cpus_per_task}): "
            f"raise either, or {fewer}"
        )


def make_job(config: Config, settings: JobSettings) -> TrainJob:
    if runs_job_ray(config):
        from rl_app.launch.ray_cluster import RayTrainJob

        return RayTrainJob(config, settings.max_requeues, settings.nodes)
    return TrainJob(config, settings.max_requeues)


def submit_jobs(
    folder: Path,
    settings: JobSettings,
    name: str,
    callables: list[Callable[[], Any]],
    setup: list[str] | None = None,
) -> list[submitit.Job]:
    """One job array, a task per callable, each asking for ``settings`` (``setup``: lines
    its script runs first); submitit's files go to ``folder``. sbatch's refusal is a
    :class:`ConfigError`."""
    executor = make_executor(folder, settings, name=name, setup=setup)
    try:
        # Submissions in a batch make one job array. (submitit prints sbatch's refusal to
        # stderr itself: the ConfigError says it once.)
        with contextlib.redirect_stderr(io.StringIO()), executor.batch():
            jobs = [executor.submit(callable_) for callable_ in callables]
    except submitit.core.utils.FailedJobError as error:
        reason = str(error).strip().splitlines()[-1].removeprefix("sbatch: error: ")
        raise ConfigError(f"sbatch refused the job: {reason}") from None
    return jobs


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
