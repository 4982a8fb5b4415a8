"""The study and the claims on its trials: an Optuna journal file in the sweep directory,
the trial a worker trains next, and one trial trained to its end, pruned or failed."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from filelock import FileLock
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage
from optuna.trial import Trial, TrialState

from rl_app.checks import load_config
from rl_app.config import ConfigError
from rl_app.runlock import RunDirBusy, acquire, make_writable_directory
from rl_app.sweep.spec import (
    CLAIM_LOCK,
    CLAIMS_DIR,
    JOURNAL_FILE,
    SWEEP_FILE,
    Sweep,
    SweepSettings,
    fixed_overrides,
    override,
)
from rl_app.upstream.optuna import resumed_trial

if TYPE_CHECKING:  # torch and TorchRL: imported in workers only
    from rl_app.loop import TrainResult

STUDY_NAME = "sweep"

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


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
    """The sweep directory with a copy of its sweep file and the study (both kept on a re-run);
    :class:`ConfigError` if it cannot be made and written."""
    make_writable_directory(sweep.dir, "sweep_dir")
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
                return resumed_trial(study, frozen), claim
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
    from rl_app import run  # torch and TorchRL: in workers only
    from rl_app.loop import RunFailed

    def report(frames: int, eval_return: float) -> str | None:
        trial.report(eval_return, step=frames)
        return "pruned" if trial.should_prune() else None

    print(f"trial {trial.number}: {trial.params}", flush=True)
    try:
        result = (train or run.train)(trial_config(sweep, trial), on_eval=report)
    except (ConfigError, RunFailed) as error:
        trial.set_user_attr("error", str(error))
        study.tell(trial, state=TrialState.FAIL)
        print(f"trial {trial.number} failed: {error}", flush=True)
        return None
    if result.stopped_by == "pruned":
        study.tell(trial, state=TrialState.PRUNED)
    elif result.stopped_by is not None:
        return result
    else:
        objective = {"last": result.last_eval_return, "best": result.best_eval_return}
        study.tell(trial, objective[sweep.settings.objective])
    print(f"trial {trial.number}: {study.trials[trial.number].state.name}", flush=True)
    return None
