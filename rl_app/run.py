"""Building a run and training it: ``train(config)`` checks that the run fits this machine,
locks its directory, builds every part from its factory (or resumes the newest good
checkpoint), then hands it to the loop (:func:`rl_app.loop.run_iterations`). A fault during
training becomes :class:`~rl_app.loop.RunFailed`, naming the phase and the last good
checkpoint, with the traceback in the run directory's ``error.log``."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import re
import shutil
import traceback
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.checkpoint import GlobalRNGState
from torchrl.envs import EnvBase

from rl_app.algorithms import Algorithm, make_algorithm
from rl_app.checkpointing import (
    POLICY_COMPONENT,
    CorruptCheckpoint,
    RunCheckpoints,
    checkpoint_frames,
    choose_checkpoint,
    last_good,
)
from rl_app.collection import (
    CollectorState,
    CollectorStopped,
    Devices,
    WeightSync,
    decide_devices,
    make_collector,
)
from rl_app.config import Config, ConfigError, holds_checkpoint, to_yaml
from rl_app.envs import make_env
from rl_app.fit import check_fit, size
from rl_app.logger import CURVE_FILE, LOGS_DIR, METRICS_FILE, PhaseTimer, RunLogger
from rl_app.loop import (
    EvalHook,
    Progress,
    Run,
    RunFailed,
    TrainResult,
    background_evaluator,
    run_iterations,
    summarize,
)
from rl_app.replay import (
    RunReplayBuffer,
    allocate_storage,
    make_replay_buffer,
    nstep_gamma,
    stored_transition,
)
from rl_app.replay.journal import (
    JournaledStorage,
    ReplayState,
    StorageDamaged,
    UndoJournal,
    restorable_from,
)
from rl_app.rundir import CHECKPOINTS_DIR, CONFIG_FILE, JOURNAL_DIR, REPLAY_DIR
from rl_app.runlock import RunDirUnwritable, run_dir_lock
from rl_app.upstream.glibc import keep_freed_memory
from rl_app.upstream.tensordict import ignore_inline_modules_deprecation, skip_pandas_lookups
from rl_app.upstream.torch import quiet_cuda_home_warning

log = logging.getLogger("rl_app")

ERROR_LOG = "error.log"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def prepare_run_dir(run_dir: Path, resuming: bool) -> None:
    """Make sure the run directory is writable and, on a fresh start, clear what an
    earlier attempt that never saved a checkpoint left: its replay files and journals,
    metrics and logs. A resume keeps them: its checkpoint restores the replay files."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".writable"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise RunFailed(f"run_dir {run_dir} is not writable: {error.strerror}") from None
    if resuming:
        return
    metrics = run_dir / METRICS_FILE
    if metrics.is_file() and (rows := metrics.read_text().count("\n")):  # (checkpoints deleted?)
        log.warning(
            "%s holds no checkpoint: training starts again from frame 0, replacing the %d "
            "metrics rows logged there before",
            run_dir,
            rows,
        )
    stale = (REPLAY_DIR, JOURNAL_DIR, METRICS_FILE, CURVE_FILE, LOGS_DIR, CHECKPOINTS_DIR)
    for path in (run_dir / name for name in stale):
        if path.is_dir():  # empty it but keep it: it may be a mount point of its own
            for child in path.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        elif path.exists():
            path.unlink()


def build_run(config: Config, resuming: bool = False) -> Run:
    """Create every part of the run, each from its factory, in a prepared run directory."""
    run_dir = Path(config.run_dir)
    skip_pandas_lookups()  # every env step and eager update runs faster (rl_app.upstream)
    # A log shows the project's own lines unless something is wrong (rl_app.upstream).
    ignore_inline_modules_deprecation()
    quiet_cuda_home_warning()
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # it logs each storage it lays out
    keep_freed_memory()  # sampled batches reuse freed memory (rl_app.upstream)
    torch.set_num_threads(config.threads)
    seed_everything(config.seed)

    devices = decide_devices(config)
    spec_env = make_env(config.env, config.seed, network=config.network)
    algorithm = make_networks(config, spec_env, devices.learner)
    prepare_run_dir(run_dir, resuming)
    (run_dir / CONFIG_FILE).write_text(to_yaml(config))
    keys = algorithm.replay_keys()
    transition = stored_transition(spec_env, keys)
    # What is built is closed again if a later part fails (a worker dying at the first
    # weight push, a logger that cannot start): its workers would outlive the error.
    with contextlib.ExitStack() as built:
        if config.replay.service == "ray":
            from rl_app.replay.service import ServiceReplay, ServiceReplayState

            spec_env.close()
            # The collector's actors write into the service it owns (rl_app.replay.service).
            collector = make_collector(config, algorithm, devices)
            built.callback(collector.shutdown)
            buffer = ServiceReplay(collector.service, devices.learner)
            try:
                buffer.client.allocate(keys, transition, run_dir / JOURNAL_DIR)
            except OSError as error:
                raise RunFailed(
                    f"the replay buffer cannot take its space: {error.strerror}"
                ) from None
            # Its checkpoints journal in its actor: the replay state is the journal too.
            journal = replay_state = ServiceReplayState(buffer, collector.drain)
        else:
            buffer, journal = make_local_replay(config, algorithm, devices, spec_env, transition)
            if journal is not None:
                built.callback(journal.close)
            collector = make_collector(config, algorithm, devices)
            built.callback(collector.shutdown)
            replay_state = ReplayState(buffer, journal)
        progress = Progress()
        logger = RunLogger(config.logger, run_dir, config.collector.total_frames)
        built.callback(logger.close)
        checkpoints = RunCheckpoints(
            run_dir / CHECKPOINTS_DIR,
            config.checkpoint.keep_last,
            {
                **algorithm.checkpoint_components(),
                POLICY_COMPONENT: algorithm.policy,
                "replay_buffer": replay_state,
                "collector": CollectorState(collector),
                "rng": GlobalRNGState(),
                "progress": progress,
                "logger": logger,
                "config": dataclasses.asdict(config),
            },
            journal,
        )
        weight_sync = WeightSync(collector, algorithm, config.env.name)
        # Started with the run, so that its imports are paid while training starts.
        evaluator = None
        if config.eval.backend != "blocking":
            evaluator = background_evaluator(config, algorithm.policy_factory())
            built.callback(evaluator.close)  # (first: before the collector leaves Ray)
        built.pop_all()  # from here on, Run.close closes them
    return Run(
        config, run_dir, devices, algorithm, buffer, collector, weight_sync, progress,
        checkpoints, logger, PhaseTimer(), evaluator,
    )  # fmt: skip


def make_networks(config: Config, spec_env: EnvBase, device: torch.device) -> Algorithm:
    """The algorithm, its networks built; :class:`ConfigError` naming
    ``network.hidden_sizes`` if they do not fit in memory (the fit check counts the
    replay buffer only)."""
    try:
        return make_algorithm(config, spec_env, device)
    except RuntimeError as error:  # CUDA's OutOfMemoryError is one too
        asked = re.search(r"tried to allocate (\d+) bytes", str(error))  # the CPU allocator's
        if asked is None and not isinstance(error, torch.OutOfMemoryError):
            raise
        spec_env.close()
        reason = f"{size(int(asked[1]))} asked for at once" if asked else str(error).split(".")[0]
        memory = "RAM" if device.type == "cpu" else f"{device}'s memory"
        raise ConfigError(
            f"network.hidden_sizes={config.network.hidden_sizes}: the networks do not fit in "
            f"{memory} ({reason}); choose smaller layers"
        ) from None


def make_local_replay(
    config: Config,
    algorithm: Algorithm,
    devices: Devices,
    spec_env: EnvBase,
    transition: TensorDictBase,
) -> tuple[RunReplayBuffer, UndoJournal | None]:
    """The replay buffer in the learner's process, its storage laid out, and the undo
    journal checkpoints restore its files with (None in GPU memory). Closes ``spec_env``."""
    # A goal env's reward and termination for other goals are functions of the goals alone,
    # which hindsight relabelling asks of this env after it is closed.
    buffer = make_replay_buffer(
        config.replay,
        Path(config.run_dir) / REPLAY_DIR,
        config.seed,
        spec_env,
        keys=algorithm.replay_keys(),
        device=devices.learner,
        recurrent_states=algorithm.recurrent_states if config.network.recurrent != "none" else None,
        nstep_gamma=nstep_gamma(config.optim),
    )
    spec_env.close()
    try:
        allocate_storage(buffer, transition)
    except OSError as error:
        raise RunFailed(f"the replay buffer cannot take its space: {error.strerror}") from None
    journal = None
    if isinstance(buffer.storage, JournaledStorage):
        journal = UndoJournal(buffer.storage, Path(config.run_dir) / JOURNAL_DIR)
    return buffer, journal


def train(
    config: Config,
    lock_wait_s: float = 0.0,
    on_eval: EvalHook | None = None,
    usr2_grace_s: float | None = None,
) -> TrainResult:
    """Train the run ``config`` describes, resuming it if its directory holds a checkpoint.

    The run directory is locked for the whole run, before anything in it is touched
    (:mod:`rl_app.runlock`); :class:`~rl_app.runlock.RunDirBusy` if another process holds
    it for longer than ``lock_wait_s``. ``on_eval`` may stop the run after an evaluation
    (:data:`EvalHook`). ``usr2_grace_s``: the time SIGUSR2 leaves before a kill, where
    known (a SLURM job's), within which a stop still runs the evaluation it owes."""
    run_dir = Path(config.run_dir)
    estimate = check_fit(config)  # refuses, before anything exists, what cannot fit here
    try:
        with run_dir_lock(run_dir, lock_wait_s):
            log.info("%s", estimate)
            collector = config.collector
            if collector.init_random_frames > collector.total_frames:  # (a first segment?)
                log.warning(
                    "collector.init_random_frames=%d exceeds collector.total_frames=%d: the "
                    "run acts at random and makes no update",
                    collector.init_random_frames, collector.total_frames,
                )  # fmt: skip
            return train_locked(config, run_dir, on_eval, usr2_grace_s)
    except RunDirUnwritable as error:
        raise RunFailed(f"run_dir {run_dir} is not writable: {error}") from None


def train_locked(
    config: Config, run_dir: Path, on_eval: EvalHook | None, usr2_grace_s: float | None
) -> TrainResult:
    resume_from = find_resume_point(run_dir) if holds_checkpoint(run_dir) else None
    trained = checkpoint_frames(resume_from) if resume_from is not None else 0
    if trained > config.collector.total_frames:
        raise ConfigError(
            f"collector.total_frames={config.collector.total_frames} is below the {trained} "
            f"frames this run has trained ({resume_from.name}): give at least {trained}"
        )
    in_files = config.replay.device == "cpu" and config.replay.service == "none"
    replay_files = run_dir / REPLAY_DIR
    if resume_from is not None and in_files and not any(replay_files.rglob("*.memmap")):
        # (a copy of the run without them: a file or two missing reads as damaged)
        raise RunFailed(cannot_resume(f"the replay buffer's files in {replay_files}/ are missing"))
    try:
        run = build_run(config, resuming=resume_from is not None)
    except CollectorStopped as error:  # a worker died while the collectors started
        raise RunFailed(
            f"training stopped while starting the collectors: {error}\n"
            f"last good checkpoint: {last_good(resume_from)}; {kept_traceback(run_dir)}"
        ) from error
    try:
        if resume_from is not None:
            try:
                run.checkpoints.load(resume_from)
            except StorageDamaged as error:
                raise RunFailed(cannot_resume(str(error))) from None
            run.checkpoints.record_best()  # a fallback may have set the best one aside
            # A row logged at an owed evaluation's own frames (one in the background that
            # ended after its checkpoint) goes too: it is logged again when it runs.
            owed = run.progress.owed_eval is not None and not run.progress.held_rows
            run.logger.rewind(run.progress.frames - 1 if owed else run.progress.frames)
            log.info("resumed from %s at %d frames", resume_from, run.progress.frames)
            done = run.progress.frames >= config.collector.total_frames
            if done and run.progress.owed_eval is None:  # (an owed evaluation runs first)
                log.info("the run already has its %d frames", config.collector.total_frames)
                return summarize(run, stopped_by=None)
        return run_iterations(run, on_eval, usr2_grace_s)
    except RunFailed:
        raise
    except Exception as error:
        raise RunFailed(describe_failure(run, error)) from error
    finally:
        run.close()


def cannot_resume(why: str) -> str:
    return (
        f"cannot resume: {why}; its checkpoints still play (rl_app.play), and a new run_dir "
        "trains afresh"
    )


def find_resume_point(run_dir: Path) -> Path:
    """The newest checkpoint that verifies. Damaged newer ones are set aside as
    ``corrupt-*`` with the reason logged; if none verifies, nothing is touched."""
    try:
        chosen, passed_over = choose_checkpoint(
            run_dir / CHECKPOINTS_DIR, restorable_from(run_dir / JOURNAL_DIR)
        )
    except CorruptCheckpoint as error:
        raise RunFailed(f"cannot resume: {error}") from None
    for damaged, why in passed_over:
        log.warning(
            "checkpoint %s is unusable: %s; falling back to %s", damaged.name, why, chosen.name
        )
        damaged.rename(damaged.with_name(f"corrupt-{damaged.name}"))
    return chosen


def kept_traceback(run_dir: Path) -> str:
    """Write the traceback of the error being handled to ``error.log`` in ``run_dir``, and
    say where it is, or why it is not there (a full disk)."""
    try:
        (run_dir / ERROR_LOG).write_text(traceback.format_exc())
    except OSError as error:
        return f"its traceback could not be written to {ERROR_LOG} ({error.strerror})"
    return f"traceback in {run_dir / ERROR_LOG}"


def describe_failure(run: Run, error: Exception) -> str:
    """One paragraph for the user; the traceback goes to ``error.log`` in the run directory
    (:func:`kept_traceback`)."""
    kept = kept_traceback(run.run_dir)
    latest = run.checkpoints.latest()
    # An evaluation's fault: the training was saved when it was due, the evaluation owed.
    owed = (
        run.progress.owed_eval is not None
        and latest is not None
        and checkpoint_frames(latest) == run.progress.last_eval_frames
    )
    # The iteration's counter goes up once its batch is collected.
    iteration = run.progress.iterations + (run.phases.current in ("starting", "collecting"))
    return (
        f"training stopped while {run.phases.current} at iteration {iteration} "
        f"({run.progress.frames} frames): "
        f"{type(error).__name__}: {error}\n"
        f"last good checkpoint: {last_good(latest)}"
        f"{' (the evaluation runs first when it resumes)' if owed else ''}; {kept}"
    )
