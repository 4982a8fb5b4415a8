"""Hyperparameter sweeps: ``python -m rl_app.sweep SWEEP.yaml [--summary]``.

A sweep file names a preset (and fixed ``overrides``), a search ``space`` in the preset's
own key names, and how many trials to run::

    preset: dqn_cartpole
    overrides: [collector.total_frames=20000]
    space:
      optim.lr: {low: 1.0e-4, high: 1.0e-3, log: true}
      optim.gamma: {choices: [0.99, 0.995]}
      replay.slice_len: {low: 4, high: 16, step: 4}
    objective: last        # a trial's value: its last or best evaluation return (maximized)
    trials: 20
    jobs: 2                # worker processes, each training one trial at a time
    pruner: median
    sweep_dir: runs/sweep-cartpole
    launcher: slurm        # the workers are SLURM jobs (default local: processes here)
    slurm: {profile: local, time_min: 120}   # train.py's slurm.* settings, but array

Every trial is a normal run directory, ``<sweep_dir>/trial-NNNN``, trained by
:func:`rl_app.loop.train`. The study is an Optuna journal file in the sweep directory (a
seeded multivariate TPE sampler), so running the command again continues it. After each
evaluation a trial reports its return; a pruned trial stops there with a checkpoint.

A worker claims a trial by locking ``<sweep_dir>/claims/<number>`` (:mod:`rl_app.runlock`)
for as long as it trains it. The journal storage has no heartbeat: a killed worker's trial
stays RUNNING, and its claim is what tells. The next worker to start takes over every
RUNNING trial whose claim no live process holds, with the same settings: its run directory
resumes from its newest checkpoint, so no trial is lost and none is counted twice.

With ``launcher: slurm`` the command checks the ``slurm:`` settings against the cluster,
submits ``jobs`` worker jobs (:class:`rl_app.launch.job.WorkerJob`, each running
:func:`work_trials`) and returns, as ``train.py launcher=slurm`` does. A USR2 stops a
worker's trial at an iteration boundary with a checkpoint and requeues the job, which
resumes the trial; the worker that finds nothing left writes the summary.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import logging
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from filelock import FileLock
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from rl_app.algorithms import RunConfig
from rl_app.checks import load_config, read_run_config
from rl_app.config import (
    DEFAULT_PRESET,
    ConfigError,
    SlurmConfig,
    check_declared,
    conform,
    conform_value,
    read_yaml,
    setting,
    settings_of,
    to_yaml,
)
from rl_app.runlock import RunDirBusy, acquire

if TYPE_CHECKING:  # torch and TorchRL: imported in workers only
    from rl_app.loop import TrainResult

# Inside a sweep directory:
SWEEP_FILE = "sweep.yaml"  # the sweep file it was started from
JOURNAL_FILE = "study.journal"  # Optuna's journal of every trial
CLAIM_LOCK = ".claim.lock"  # held while a worker picks its next trial
SUMMARY_LOCK = ".summary.lock"  # held while a worker job writes the summary
CLAIMS_DIR = "claims"  # claims/<number>/.lock: held by the worker training that trial
LOGS_DIR = "logs"  # one log per worker process
STUDY_NAME = "sweep"
SPACE_KEYS = ("low", "high", "log", "step", "choices")
# Settings that say where and how a trial runs, not what it learns.
NOT_SWEPT = ("run_dir", "launcher", "slurm.")
# A whole-number range with at most this many values is checked value by value.
CHECKED_VALUES = 64

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@dataclass
class SweepSettings:
    """A sweep file's own keys (besides ``overrides`` and ``space``)."""

    preset: str = setting(DEFAULT_PRESET, "the preset trials start from: configs/ name or file")
    objective: str = setting(
        "last", "a trial's value, maximized: its last or best evaluation return",
        choices=("last", "best"),
    )  # fmt: skip
    trials: int = setting(20, "trials run to their end (complete, pruned or failed)", at_least=1)
    jobs: int = setting(1, "worker processes, each training one trial at a time", at_least=1)
    seed: int = setting(0, "seed of the TPE sampler", at_least=0, at_most=2**32 - 1)
    pruner: str = setting(
        "none",
        "none | median: stop a trial whose evaluation return is below the median of earlier "
        "trials' at the same frame count",
        choices=("none", "median"),
    )
    startup_trials: int = setting(
        2, "median pruner: trials finished before any is pruned", at_least=0
    )
    warmup_frames: int = setting(
        0, "median pruner: frames a trial trains before it may be pruned", at_least=0
    )
    launcher: str = setting(
        "local",
        "local: worker processes here | slurm: worker jobs on SLURM (submitted, then the "
        "command returns)",
        choices=("local", "slurm"),
    )
    sweep_dir: str | None = setting(None, "where the study and trials go (runs/sweep-<file>)")
    # The worker jobs' settings (launcher: slurm), also every trial's slurm.* settings.
    slurm: SlurmConfig = field(default_factory=SlurmConfig)


@dataclass(frozen=True)
class Sweep:
    """A validated sweep file."""

    settings: SweepSettings
    overrides: list[str]
    space: dict[str, BaseDistribution]

    @property
    def dir(self) -> Path:
        return Path(self.settings.sweep_dir)

    def definition(self) -> dict[str, Any]:
        """What makes two sweeps the same study (their budget and workers aside)."""
        return {
            "settings": kept_settings(self.settings),
            "overrides": self.overrides,
            "space": self.space,
        }


def kept_settings(settings: SweepSettings) -> SweepSettings:
    """The settings that make the study: not its budget, nor where its trials run."""
    return dataclasses.replace(
        settings, trials=0, jobs=0, sweep_dir=None, launcher="", slurm=SlurmConfig()
    )


# -- the sweep file --------------------------------------------------------------------------


def load_sweep(path: Path) -> Sweep:
    """Read and check a sweep file, and every trial config its space can make alone (each
    value of a dimension, the others at the preset's); :class:`ConfigError` names the key.
    Reads only: nothing is created."""
    tree = read_yaml(path)
    accepted = [f.name for f in dataclasses.fields(SweepSettings)] + ["overrides", "space"]
    for key in tree:
        if key not in accepted:
            raise ConfigError(
                f"{path}: unknown key {key!r}: accepted keys are {', '.join(accepted)}"
            )
    settings = read_settings(tree)
    if settings.sweep_dir is None:
        settings.sweep_dir = f"runs/sweep-{path.stem}"
    sweep = Sweep(settings, read_overrides(tree.get("overrides", [])),
                  read_space(tree.get("space")))  # fmt: skip
    check_trial_configs(sweep)
    refuse_other_sweep(sweep)
    return sweep


def read_settings(tree: dict[str, Any]) -> SweepSettings:
    own = {key: value for key, value in tree.items() if key not in ("overrides", "space")}
    conformed = conform(own, SweepSettings, "")
    settings = SweepSettings(**{**conformed, "slurm": SlurmConfig(**conformed.get("slurm", {}))})
    for key, _, declared in settings_of(SweepSettings):
        value = settings
        for part in key.split("."):
            value = getattr(value, part)
        check_declared(key, value, declared)
    if settings.slurm.array is not None:
        raise ConfigError(
            f"slurm.array={settings.slurm.array!r} is not accepted in a sweep file: "
            "jobs sets how many worker jobs run"
        )
    return settings


def read_overrides(overrides: Any) -> list[str]:
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"overrides={overrides!r} is not accepted: give a list of key=value")
    for item in overrides:
        if item.startswith(NOT_SWEPT):
            raise ConfigError(
                f"overrides: {item!r} is not accepted: the sweep sets run_dir, launcher and slurm.*"
            )
    return overrides


def read_space(space: Any) -> dict[str, BaseDistribution]:
    """``space:`` as Optuna distributions, each checked against its setting's type and range."""
    if not isinstance(space, dict) or not space:
        raise ConfigError(
            "space is missing: give one or more keys to search, e.g. "
            "space: {optim.lr: {low: 1.0e-4, high: 1.0e-3, log: true}}"
        )
    schema = {key: (item, declared) for key, item, declared in settings_of(RunConfig)}
    distributions = {}
    for key, spec in space.items():
        if key not in schema or key.startswith(NOT_SWEPT):
            raise ConfigError(
                f"space: unknown key {key!r}: give a setting of the preset (train.py --help "
                "lists them), other than run_dir, launcher and slurm.*"
            )
        item, declared = schema[key]
        distributions[key] = distribution(f"space.{key}", spec, str(item.type), declared)
    return distributions


def distribution(key: str, spec: Any, kind: str, declared: dict[str, Any]) -> BaseDistribution:
    """One dimension: ``{choices: [...]}`` for any setting, ``{low, high, log?, step?}`` for
    a number; every value within what the setting accepts."""
    if not isinstance(spec, dict) or not set(spec) <= set(SPACE_KEYS):
        raise ConfigError(
            f"{key}={spec!r} is not accepted: give {{choices: [...]}} or "
            "{low: ..., high: ..., log: true|false, step: ...}"
        )
    if kind.startswith("list"):
        raise ConfigError(f"{key} is a list setting: only single values can be searched")
    if "choices" in spec:
        return choices_distribution(key, spec, kind, declared)
    if kind.removesuffix("| None").strip() not in ("int", "float"):
        raise ConfigError(f"{key} takes {kind} values: give {{choices: [...]}}")
    return range_distribution(key, spec, kind.removesuffix("| None").strip(), declared)


def choices_distribution(
    key: str, spec: dict[str, Any], kind: str, declared: dict[str, Any]
) -> CategoricalDistribution:
    choices = spec["choices"]
    if set(spec) != {"choices"} or not isinstance(choices, list) or len(choices) < 2:
        raise ConfigError(f"{key}={spec!r} is not accepted: give two or more choices, alone")
    values = [conform_value(key, choice, kind, declared) for choice in choices]
    for value in values:
        check_declared(key, value, declared)
    if len(set(values)) != len(values):
        raise ConfigError(f"{key}={spec!r} is not accepted: a choice is repeated")
    return CategoricalDistribution(values)


def range_distribution(
    key: str, spec: dict[str, Any], kind: str, declared: dict[str, Any]
) -> IntDistribution | FloatDistribution:
    if "low" not in spec or "high" not in spec:
        raise ConfigError(f"{key}={spec!r} is not accepted: give low and high (or choices)")
    low, high = (
        conform_value(f"{key}.{end}", spec[end], kind, declared) for end in ("low", "high")
    )
    for value in (low, high):
        check_declared(key, value, declared)
    if low >= high:
        raise ConfigError(f"{key}: low={low!r} is not accepted: it must be below high={high!r}")
    log = conform_value(f"{key}.log", spec.get("log", False), "bool", {})
    step = spec.get("step")
    if log and (step is not None or low <= 0):
        raise ConfigError(f"{key}: log=true is not accepted with a step or with low <= 0")
    if step is not None:
        step = conform_value(f"{key}.step", step, kind, {})
        if step <= 0 or (kind == "int" and (high - low) % step):
            raise ConfigError(
                f"{key}.step={step!r} is not accepted: it must be above 0"
                + (f" and divide high - low = {high - low}" if kind == "int" else "")
            )
    if kind == "int":
        return IntDistribution(low, high, log=log, step=step or 1)
    return FloatDistribution(low, high, log=log, step=step)


def checked_values(dist: BaseDistribution) -> list[Any]:
    """The values of a dimension that are tried alone before a sweep starts."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, IntDistribution) and not dist.log:
        values = list(range(dist.low, dist.high + 1, dist.step))
        if len(values) <= CHECKED_VALUES:
            return values
    return [dist.low, dist.high]


def check_trial_configs(sweep: Sweep) -> None:
    """The preset with the overrides, and with each checked value of each dimension, must
    make a valid config: a mistake is found now, not in the middle of the sweep."""
    fixed = fixed_overrides(sweep)
    load_config(sweep.settings.preset, fixed)
    for key, dist in sweep.space.items():
        for value in checked_values(dist):
            try:
                load_config(sweep.settings.preset, [*fixed, override(key, value)])
            except ConfigError as error:
                raise ConfigError(f"space.{key}={value!r} makes no valid run: {error}") from None


def refuse_other_sweep(sweep: Sweep) -> None:
    """A sweep directory continues the sweep it was started with; only ``trials``,
    ``jobs``, ``launcher`` and ``slurm`` may change."""
    saved = sweep.dir / SWEEP_FILE
    if saved.is_file() and saved_definition(saved) != sweep.definition():
        raise ConfigError(
            f"sweep_dir={str(sweep.dir)!r} holds another sweep ({saved}): only trials, jobs, "
            "launcher and slurm may change when continuing it; give another sweep_dir for a "
            "new one"
        )


def saved_definition(saved: Path) -> dict[str, Any]:
    tree = read_yaml(saved)
    kept = kept_settings(read_settings(tree))
    overrides = read_overrides(tree.get("overrides", []))
    return {"settings": kept, "overrides": overrides, "space": read_space(tree.get("space"))}


def override(key: str, value: Any) -> str:
    """``key=value`` as train.py takes it (JSON is YAML: numbers, text and booleans)."""
    return f"{key}={json.dumps(value)}"


def fixed_overrides(sweep: Sweep) -> list[str]:
    """What every trial overrides: the sweep's ``overrides`` and its ``slurm:`` settings
    (those given), which collection jobs of ``collector.mode=distributed`` use."""
    slurm = {k: v for k, v in dataclasses.asdict(sweep.settings.slurm).items() if v is not None}
    return [*sweep.overrides, *(override(f"slurm.{k}", v) for k, v in slurm.items())]


# -- the study -------------------------------------------------------------------------------


def open_study(sweep: Sweep, sampler_seed: int | None = None) -> optuna.Study:
    """The sweep's study, created on first use (``load_if_exists``: a re-run continues it)."""
    path = str(sweep.dir / JOURNAL_FILE)
    storage = JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))
    seed = sweep.settings.seed if sampler_seed is None else sampler_seed
    return optuna.create_study(
        storage=storage,
        study_name=STUDY_NAME,
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=seed, multivariate=True),
        pruner=make_pruner(sweep.settings),
        load_if_exists=True,
    )


def make_pruner(settings: SweepSettings) -> optuna.pruners.BasePruner:
    if settings.pruner == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=settings.startup_trials, n_warmup_steps=settings.warmup_frames
        )
    return optuna.pruners.NopPruner()


def prepare_sweep_dir(sweep: Sweep, source: Path) -> None:
    """The sweep directory with a copy of its sweep file and the study (both kept on a re-run)."""
    sweep.dir.mkdir(parents=True, exist_ok=True)
    if not (sweep.dir / SWEEP_FILE).exists():
        (sweep.dir / SWEEP_FILE).write_text(source.read_text())
    open_study(sweep)


def trial_dir(sweep: Sweep, number: int) -> Path:
    return sweep.dir / f"trial-{number:04d}"


def claim_next(study: optuna.Study, sweep: Sweep) -> tuple[Trial, FileLock] | None:
    """The trial this worker trains next, with its claim held: a RUNNING trial that no live
    worker claims (its worker died: the trial resumes), else a new one while the study has
    fewer than ``trials``; None when nothing is left. One worker picks at a time."""
    with FileLock(sweep.dir / CLAIM_LOCK):
        trials = study.get_trials(deepcopy=False)
        for frozen in trials:
            if frozen.state == TrialState.RUNNING and (claim := try_claim(sweep, frozen.number)):
                # Optuna builds a Trial from its storage id, which FrozenTrial keeps private.
                return Trial(study, frozen._trial_id), claim
        if len(trials) >= sweep.settings.trials:
            return None
        # Seeded per trial: workers started together still draw different settings.
        study.sampler = optuna.samplers.TPESampler(
            seed=sweep.settings.seed + len(trials), multivariate=True
        )
        trial = study.ask(sweep.space)
        trial.set_user_attr("run_dir", str(trial_dir(sweep, trial.number)))
        return trial, try_claim(sweep, trial.number)


def try_claim(sweep: Sweep, number: int) -> FileLock | None:
    """Trial ``number``'s claim, held; None if a live process holds it."""
    try:
        return acquire(sweep.dir / CLAIMS_DIR / str(number), wait_s=0.0)
    except RunDirBusy:
        return None


def trial_config(sweep: Sweep, trial: Trial) -> Any:
    """The trial's run config: the preset, the overrides, its sampled settings."""
    settings = [override(key, value) for key, value in trial.params.items()]
    run_dir = trial_dir(sweep, trial.number)
    return load_config(
        sweep.settings.preset, [*fixed_overrides(sweep), *settings, f"run_dir={run_dir}"]
    )


# How a worker trains a trial: train(config, on_eval=...) here, or as a SLURM job's attempt.
TrainTrial = Callable[..., "TrainResult"]


def run_trial(
    study: optuna.Study, trial: Trial, sweep: Sweep, train: TrainTrial | None = None
) -> TrainResult | None:
    """Train one trial and tell the study how it ended; returns the result of a trial a
    signal stopped early (it stays RUNNING, to resume), or None."""
    from rl_app import loop  # torch and TorchRL: in workers only

    def report(frames: int, eval_return: float) -> str | None:
        trial.report(eval_return, step=frames)
        return "pruned" if trial.should_prune() else None

    print(f"trial {trial.number}: {trial.params}", flush=True)
    try:
        result = (train or loop.train)(trial_config(sweep, trial), on_eval=report)
    except (ConfigError, loop.RunFailed) as error:
        trial.set_user_attr("error", str(error))
        study.tell(trial, state=TrialState.FAIL)
        print(f"trial {trial.number} failed: {error}", flush=True)
        return None
    if result.stopped_by == "pruned":
        study.tell(trial, state=TrialState.PRUNED)
    elif result.stopped_by is not None:
        return result
    else:
        objective = {"last": result.last_eval_reward, "best": result.best_eval_reward}
        study.tell(trial, objective[sweep.settings.objective])
    print(f"trial {trial.number}: {study.trials[trial.number].state.name}", flush=True)
    return None


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
    failed = [(code, log) for code, (_, log) in zip(codes, workers, strict=True) if code]
    for code, log_path in failed:
        print(
            f"error: a worker exited with status {code} (log: {log_path}); "
            "run the sweep again to resume its trial",
            file=sys.stderr,
        )
    return 1 if failed else 0


def submit_to_slurm(sweep: Sweep, source: Path) -> int:
    """``launcher: slurm``: check the worker jobs' settings against the cluster, then submit
    ``jobs`` worker jobs (one job array) and return once they are queued."""
    from rl_app.launch.cluster import JOB_DIR, check_cluster, check_collection_jobs, job_settings
    from rl_app.launch.job import WorkerJob
    from rl_app.launch.slurm import submit_jobs

    settings = job_settings(sweep.settings.slurm)
    check_cluster(settings)
    check_collection_jobs(load_config(sweep.settings.preset, fixed_overrides(sweep)))
    prepare_sweep_dir(sweep, source)
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
    jobs = submit_jobs(
        placed.dir / JOB_DIR, settings, f"rl_app-{sweep.dir.name}", [worker] * sweep.settings.jobs
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


# -- the summary -----------------------------------------------------------------------------

SUMMARY_FILE = "summary.md"
TRIALS_FILE = "trials.csv"
BEST_FILE = "best.yaml"
PLOTS = {
    "history.png": "plot_optimization_history",
    "importances.png": "plot_param_importances",
}


def write_summary(sweep: Sweep) -> Path:
    """``summary.md`` (the best trial, a table of all), ``trials.csv``, ``best.yaml`` (the
    best trial's settings as a preset for ``train.py --config``) and Optuna's plots."""
    study = open_study(sweep)
    trials = study.get_trials()
    rows = [trial_row(trial) for trial in trials]
    with open(sweep.dir / TRIALS_FILE, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=table_columns(sweep))
        writer.writeheader()
        writer.writerows(rows)
    complete = [trial for trial in trials if trial.state == TrialState.COMPLETE]
    lines = [f"# Sweep {sweep.dir}", ""]
    if complete:
        best = study.best_trial
        (sweep.dir / BEST_FILE).write_text(best_preset(sweep, best))
        lines += [
            f"Best: trial {best.number}, {sweep.settings.objective} evaluation return "
            f"{best.value:.2f}, {best.params}; its settings: `train.py --config "
            f"{sweep.dir / BEST_FILE}`",
            "",
        ]
    counts = {state.name: sum(t.state == state for t in trials) for state in TrialState}
    lines += [
        f"{len(trials)} of {sweep.settings.trials} trials: "
        + ", ".join(f"{n} {name.lower()}" for name, n in counts.items() if n),
        "",
        *markdown_table(table_columns(sweep), rows),
        "",
        *draw_plots(study, sweep.dir),
    ]
    (sweep.dir / SUMMARY_FILE).write_text("\n".join(lines) + "\n")
    return sweep.dir / SUMMARY_FILE


def table_columns(sweep: Sweep) -> list[str]:
    return ["number", "state", *sweep.space, "objective", "frames", "run_dir"]


def trial_row(trial: FrozenTrial) -> dict[str, Any]:
    """A trial's row; frames are those of its last evaluation."""
    return {
        "number": trial.number,
        "state": trial.state.name,
        **trial.params,
        "objective": "" if trial.value is None else round(trial.value, 3),
        "frames": max(trial.intermediate_values, default=0),
        "run_dir": trial.user_attrs.get("run_dir", ""),
    }


def markdown_table(columns: list[str], rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return lines


def best_preset(sweep: Sweep, best: FrozenTrial) -> str:
    """The best trial's resolved config, without its run directory, as a preset file."""
    config = read_run_config(Path(best.user_attrs["run_dir"]))
    config.run_dir = None
    return (
        f"# The best trial ({best.number}) of the sweep in {sweep.dir}: {sweep.settings.objective} "
        f"evaluation return {best.value:.2f}\n# with {best.params}\n" + to_yaml(config)
    )


def draw_plots(study: optuna.Study, folder: Path) -> list[str]:
    """Optuna's own plots as PNGs; returns the summary's lines about them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    lines = []
    for name, function in PLOTS.items():
        try:
            axes = getattr(plots, function)(study)
        except (ValueError, RuntimeError) as error:  # e.g. too few complete trials
            lines.append(f"{name}: not drawn ({error})")
            continue
        axes.figure.savefig(folder / name, bbox_inches="tight")
        plt.close(axes.figure)
        lines.append(f"![{function}]({name})")
    return lines


# -- the command -----------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Run a hyperparameter sweep (continues it if its sweep_dir holds one).",
        epilog="sweep file keys:\n"
        + "\n".join(f"  {key}  ({meta['doc']})" for key, _, meta in settings_of(SweepSettings))
        + "\n  overrides  (key=value settings of every trial)"
        + "\n  space  (key: {low, high, log, step} or {choices: [...]}, per setting)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sweep_file", type=Path, help="the sweep's YAML file")
    parser.add_argument("--summary", action="store_true", help="write the summary and exit")
    parser.add_argument("--worker", action="store_true", help="be one worker of a running sweep")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        sweep = load_sweep(args.sweep_file)
        if args.summary and not (sweep.dir / JOURNAL_FILE).is_file():
            raise ConfigError(f"sweep_dir={str(sweep.dir)!r} holds no sweep yet")
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.summary:
        print(f"summary: {write_summary(sweep)}")
        return 0
    if args.worker:
        return work(sweep, args.sweep_file)
    if sweep.settings.launcher == "slurm":
        try:
            return submit_to_slurm(sweep, args.sweep_file)
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    return run_sweep(sweep, args.sweep_file)


if __name__ == "__main__":
    sys.exit(main())
