"""The workers: processes here, each training trial after trial, with the signals the
command receives passed on to them; or, with ``launcher: slurm``, SLURM jobs submitted to
do the same and write the summary once no trial is left."""

from __future__ import annotations

import dataclasses
import functools
import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

from rl_app.checks import load_config
from rl_app.runlock import removed_if_refused
from rl_app.sweep.spec import LOGS_DIR, SUMMARY_LOCK, Sweep, fixed_overrides
from rl_app.sweep.study import TrainTrial, claim_next, open_study, prepare_sweep_dir, run_trial
from rl_app.sweep.summary import failed_trials, unfinished_trials, write_summary


def work(sweep: Sweep, source: Path) -> int:
    """One worker process (``--worker``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    prepare_sweep_dir(sweep, source)
    print(work_trials(sweep))
    return 0


NOTHING_LEFT = "no trial left"


def work_trials(sweep: Sweep, train: TrainTrial | None = None) -> str:
    """Train trial after trial until the study has its ``trials``, or until a signal stops
    one (it stays RUNNING and resumes later); says which."""
    study = open_study(sweep)
    while (claimed := claim_next(study, sweep)) is not None:
        trial, claim = claimed
        try:
            stopped = run_trial(study, trial, sweep, train)
        finally:
            claim.release()
        if stopped is not None:
            return f"stopped by {stopped.stopped_by}: trial {trial.number} resumes on the next run"
    return NOTHING_LEFT


def work_in_job(sweep: Sweep, train: TrainTrial) -> str:
    """A SLURM worker job's work: :func:`work_trials`, then the summary once no trial is
    left (the last worker to end writes the final one)."""
    outcome = work_trials(sweep, train)
    if outcome == NOTHING_LEFT:
        with FileLock(sweep.dir / SUMMARY_LOCK):
            print(f"summary: {write_summary(sweep)}", flush=True)
    return outcome


def start_workers(sweep: Sweep, source: Path) -> list[tuple[subprocess.Popen, Path]]:
    """``jobs`` worker processes, each writing to its own log."""
    (sweep.dir / LOGS_DIR).mkdir(exist_ok=True)
    workers = []
    for index in range(sweep.settings.jobs):
        log_path = sweep.dir / LOGS_DIR / f"worker-{index}.log"
        with open(log_path, "a") as log_file:
            command = [sys.executable, "-m", "rl_app.sweep", str(source), "--worker"]
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        workers.append((process, log_path))
    return workers


def run_sweep(sweep: Sweep, source: Path) -> int:
    """Start the workers, wait for them, write the summary. Ctrl-C reaches the workers
    (they save and stop at an iteration boundary); SIGTERM is passed on to them."""
    prepare_sweep_dir(sweep, source)
    workers = start_workers(sweep, source)
    print(f"sweep {sweep.dir}: {len(workers)} worker(s), logs in {sweep.dir / LOGS_DIR}")
    with passed_on_signals([process for process, _ in workers]):
        codes = [process.wait() for process, _ in workers]
    print(f"summary: {write_summary(sweep)}")
    if unfinished := unfinished_trials(sweep):
        print(
            f"stopped: trial(s) {', '.join(map(str, unfinished))} unfinished; the same command "
            "resumes them"
        )
    trial_failures = failed_trials(sweep)  # (its values make no valid run together, say)
    for failure in trial_failures:
        print(f"error: {failure}", file=sys.stderr)
    failed = [(code, log) for code, (_, log) in zip(codes, workers, strict=True) if code]
    for code, log_path in failed:
        print(
            f"error: a worker exited with status {code} (log: {log_path}); "
            "run the sweep again to resume its trial",
            file=sys.stderr,
        )
    return 1 if failed or trial_failures else 0


def submit_to_slurm(sweep: Sweep, source: Path) -> int:
    """``launcher: slurm``: check the worker jobs' settings against the cluster, then submit
    ``jobs`` worker jobs (one job array) and return once they are queued."""
    from rl_app.launch.cluster import JOB_DIR, check_cluster, check_collection_jobs, job_settings
    from rl_app.launch.job import WorkerJob
    from rl_app.launch.slurm import submit_jobs

    settings = job_settings(sweep.settings.slurm)
    check_cluster(settings)
    check_collection_jobs(load_config(sweep.settings.preset, fixed_overrides(sweep)))
    # A job may start in another directory: it gets absolute paths.
    placed = dataclasses.replace(
        sweep, settings=dataclasses.replace(sweep.settings, sweep_dir=str(sweep.dir.resolve()))
    )
    worker = WorkerJob(
        functools.partial(work_in_job, placed),
        record_dir=placed.dir,
        max_requeues=settings.max_requeues,
        resume_hint=f"run the sweep again to resume it: python -m rl_app.sweep {source}",
    )
    with removed_if_refused([sweep.dir]):
        prepare_sweep_dir(sweep, source)
        jobs = submit_jobs(
            placed.dir / JOB_DIR,
            settings,
            f"rl_app-{sweep.dir.name}",
            [worker] * sweep.settings.jobs,
        )
    print(f"sweep {sweep.dir}: {len(jobs)} worker job(s)")
    for job in jobs:
        print(
            f"submitted worker job {job.job_id}\n  logs: {job.paths.stdout}\n"
            f"        {job.paths.stderr}"
        )
    print(
        "watch with: squeue --me; a preempted worker is requeued and resumes its trial; the "
        f"last worker writes the summary (any time: python -m rl_app.sweep {source} --summary)"
    )
    return 0


@contextmanager
def passed_on_signals(processes: list[subprocess.Popen]) -> Iterator[None]:
    def pass_on(signum: int, frame: object) -> None:
        for process in processes:
            process.send_signal(signum)

    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),  # the terminal sends it
        signal.SIGTERM: signal.signal(signal.SIGTERM, pass_on),
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
