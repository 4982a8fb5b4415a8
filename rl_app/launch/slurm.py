"""Submitting a run to SLURM with submitit (``launcher=slurm``).

The validated config becomes one job, or one job array with ``slurm.array=KEY=V1,V2,...``
(a run directory per value); the cluster settings are checked first
(:mod:`rl_app.launch.cluster`). Each job runs :class:`rl_app.launch.job.TrainJob`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit

from rl_app.checks import load_config
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
from rl_app.runlock import check_run_dir_free

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
    for _, task in tasks:
        # The run directory shows its config (and counts as a run) from submission on.
        Path(task.run_dir).mkdir(parents=True, exist_ok=True)
        (Path(task.run_dir) / CONFIG_FILE).write_text(to_yaml(task))

    jobs = submit_jobs(
        folder,
        settings,
        f"rl_app-{Path(config.run_dir).name}",
        [TrainJob(task, settings.max_requeues) for _, task in tasks],
    )
    submitted = [
        SubmittedJob(job.job_id, Path(task.run_dir), job.paths.stdout, job.paths.stderr, label)
        for job, (label, task) in zip(jobs, tasks, strict=True)
    ]
    if config.slurm.array is not None:
        write_array_summary(Path(config.run_dir).resolve() / ARRAY_SUMMARY, submitted)
    return submitted


def submit_jobs(
    folder: Path, settings: JobSettings, name: str, callables: list[Callable[[], Any]]
) -> list[submitit.Job]:
    """One job array, a task per callable, each asking for ``settings``; submitit's files
    go to ``folder``. sbatch's refusal is a :class:`ConfigError`."""
    executor = make_executor(folder, settings, name=name)
    try:
        with executor.batch():  # several submissions in a batch make one job array
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
