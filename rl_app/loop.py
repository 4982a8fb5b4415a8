"""The training loop: ``train(config)`` builds a run from its factories (or resumes one
from its newest good checkpoint), then tells the story of one iteration, again and again:

    collect -> extend -> sample -> update -> priorities (-> recurrent states)
            -> weight sync -> evaluate -> log -> checkpoint

Metrics are logged before the checkpoint that covers them: a run resumed from that
checkpoint then neither repeats nor misses a row.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import math
import random
import shutil
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.checkpoint import GlobalRNGState
from torchrl.collectors import BaseCollector
from torchrl.data import TensorDictReplayBuffer

from rl_app.algorithms import Algorithm, make_algorithm
from rl_app.checkpointing import (
    POLICY_COMPONENT,
    CorruptCheckpoint,
    RunCheckpoints,
    choose_checkpoint,
)
from rl_app.collection import (
    CollectorState,
    Devices,
    WeightSync,
    check_workers,
    decide_devices,
    make_collector,
    naming_dead_workers,
)
from rl_app.config import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    JOURNAL_DIR,
    REPLAY_DIR,
    Config,
    holds_checkpoint,
    to_yaml,
)
from rl_app.envs import SUCCESS_KEY, make_env
from rl_app.evaluation import evaluate
from rl_app.fit import check_fit
from rl_app.frames import extend_buffer, stack_frames
from rl_app.interrupts import StopRequest
from rl_app.journal import (
    JournaledStorage,
    ReplayState,
    StorageDamaged,
    UndoJournal,
    restorable_from,
)
from rl_app.logger import CURVE_FILE, EVAL_KEY, LOGS_DIR, METRICS_FILE, RunLogger
from rl_app.replay import (
    allocate_storage,
    make_replay_buffer,
    recurrent_state_drift,
    sample_batches,
    stored_transition,
    write_priorities,
    write_recurrent_states,
)
from rl_app.runlock import RunDirUnwritable, run_dir_lock
from rl_app.upstream import skip_pandas_lookups
from rl_app.video import record_evaluation_video

log = logging.getLogger("rl_app")

ERROR_LOG = "error.log"

# Called after each evaluation's checkpoint with (frames, evaluation return); a reason it
# returns stops the run there, as a stop request would (a sweep's pruner).
EvalHook = Callable[[int, float], str | None]


class RunFailed(Exception):
    """A run stopped by a fault; the message says what, where, and which checkpoint is safe."""


@dataclass
class Progress:
    """The counters of a run; saved in every checkpoint."""

    frames: int = 0
    iterations: int = 0
    updates: int = 0
    episodes: int = 0
    last_eval_frames: int = 0
    evaluations: int = 0
    best_eval_reward: float = float("-inf")
    last_eval_reward: float = float("nan")

    def record_eval(self, eval_reward: float) -> None:
        self.evaluations += 1
        self.last_eval_frames = self.frames
        self.last_eval_reward = eval_reward
        self.best_eval_reward = max(self.best_eval_reward, eval_reward)

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)


@dataclass
class TrainResult:
    run_dir: Path
    frames: int
    updates: int
    best_eval_reward: float
    last_eval_reward: float
    best_checkpoint: Path | None
    last_checkpoint: Path | None
    stopped_by: str | None  # the signal that stopped the run early, if any
    seconds_per_phase: dict[str, float]


# The phases of an iteration, in order: wall time is kept per phase (``make bench`` reads
# these names), and an error message names the phase it happened in.
PHASES = (
    "collecting", "extending the buffer", "sampling", "updating", "writing priorities",
    "refreshing recurrent states", "checking metrics", "syncing weights", "evaluating",
    "recording a video", "logging", "saving a checkpoint",
)  # fmt: skip


class PhaseTimer:
    """Wall time per phase of the loop: ``with phases("sampling"): ...``. ``current``
    names the phase in progress, or the last one entered (for error messages)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.current = "starting"

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if phase not in self.seconds:
            raise KeyError(f"unknown phase {phase!r}: the phases are {', '.join(PHASES)}")
        self.current = phase
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - started


@dataclass
class Run:
    """Everything one run is made of, built by :func:`build_run` from its config."""

    config: Config
    run_dir: Path
    devices: Devices
    algorithm: Algorithm
    buffer: TensorDictReplayBuffer
    collector: BaseCollector
    weight_sync: WeightSync
    progress: Progress
    checkpoints: RunCheckpoints
    logger: RunLogger
    phases: PhaseTimer

    def close(self) -> None:
        self.collector.shutdown()
        self.logger.close()
        if self.checkpoints.journal is not None:
            self.checkpoints.journal.close()


# glibc's malloc settings (mallopt): blocks up to this size come from its heap, and it
# keeps up to this much freed memory instead of handing it back to the system.
M_MMAP_THRESHOLD, M_TRIM_THRESHOLD = -3, -1
KEPT_BYTES = 1 << 30


def keep_freed_memory() -> None:
    """Have glibc's malloc keep freed memory for reuse: by default it returns every block
    over 128 kB to the system when freed, so each iteration's sampled batches (tens of MB
    of frames on Atari) are faulted back in page by page. Rebuilding frame stacks ran 2x
    faster with it (docs/speed.md). Nothing changes without glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(M_MMAP_THRESHOLD, KEPT_BYTES)
    libc.mallopt(M_TRIM_THRESHOLD, 2 * KEPT_BYTES)


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
    skip_pandas_lookups()  # every env step and eager update runs faster (upstream.py)
    keep_freed_memory()
    prepare_run_dir(run_dir, resuming)
    (run_dir / CONFIG_FILE).write_text(to_yaml(config))
    torch.set_num_threads(config.threads)
    seed_everything(config.seed)

    devices = decide_devices(config)
    spec_env = make_env(config.env, config.seed, network=config.network)
    algorithm = make_algorithm(config, spec_env, devices.learner)
    transition = stored_transition(spec_env, algorithm.replay_keys())
    # A goal env's reward and termination for other goals are functions of the goals alone,
    # which hindsight relabelling asks of this env after it is closed.
    buffer = make_replay_buffer(config.replay, run_dir / REPLAY_DIR, config.seed, spec_env)
    spec_env.close()
    try:
        allocate_storage(buffer, transition)
    except OSError as error:
        raise RunFailed(f"the replay buffer cannot take its space: {error.strerror}") from None
    journal = None
    if isinstance(buffer.storage, JournaledStorage):
        journal = UndoJournal(buffer.storage, run_dir / JOURNAL_DIR)
    collector = make_collector(config, algorithm, devices)
    progress = Progress()
    logger = RunLogger(config.logger, run_dir, config.collector.total_frames)
    checkpoints = RunCheckpoints(
        run_dir / CHECKPOINTS_DIR,
        config.checkpoint.keep_last,
        {
            **algorithm.checkpoint_components(),
            POLICY_COMPONENT: algorithm.policy,
            "replay_buffer": ReplayState(buffer, journal),
            "collector": CollectorState(collector),
            "rng": GlobalRNGState(),
            "progress": progress,
            "logger": logger,
            "config": dataclasses.asdict(config),
        },
        journal,
    )
    weight_sync = WeightSync(collector, algorithm, config.env.name)
    return Run(
        config, run_dir, devices, algorithm, buffer, collector, weight_sync, progress,
        checkpoints, logger, PhaseTimer(),
    )  # fmt: skip


def train(config: Config, lock_wait_s: float = 0.0, on_eval: EvalHook | None = None) -> TrainResult:
    """Train the run ``config`` describes, resuming it if its directory holds a checkpoint.

    The run directory is locked for the whole run, before anything in it is touched
    (:mod:`rl_app.runlock`); :class:`~rl_app.runlock.RunDirBusy` if another process holds
    it for longer than ``lock_wait_s``. ``on_eval`` may stop the run after an evaluation
    (:data:`EvalHook`)."""
    run_dir = Path(config.run_dir)
    estimate = check_fit(config)  # refuses, before anything exists, what cannot fit here
    try:
        with run_dir_lock(run_dir, lock_wait_s):
            log.info("%s", estimate)
            return train_locked(config, run_dir, on_eval)
    except RunDirUnwritable as error:
        raise RunFailed(f"run_dir {run_dir} is not writable: {error}") from None


def train_locked(config: Config, run_dir: Path, on_eval: EvalHook | None) -> TrainResult:
    resume_from = find_resume_point(run_dir) if holds_checkpoint(run_dir) else None
    run = build_run(config, resuming=resume_from is not None)
    try:
        if resume_from is not None:
            try:
                run.checkpoints.load(resume_from)
            except StorageDamaged as error:
                raise RunFailed(
                    f"cannot resume: {error}; its checkpoints still play (rl_app.play), "
                    "and a new run_dir trains afresh"
                ) from None
            run.checkpoints.record_best()  # a fallback may have set the best one aside
            run.logger.rewind(run.progress.frames)
            log.info("resumed from %s at %d frames", resume_from, run.progress.frames)
            if run.progress.frames >= config.collector.total_frames:
                log.info("the run already has its %d frames", config.collector.total_frames)
                return summarize(run, stopped_by=None)
        return run_iterations(run, on_eval)
    except RunFailed:
        raise
    except Exception as error:
        raise RunFailed(describe_failure(run, error)) from error
    finally:
        run.close()


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


def describe_failure(run: Run, error: Exception) -> str:
    """One paragraph for the user; the traceback goes to ``error.log`` in the run directory."""
    (run.run_dir / ERROR_LOG).write_text(traceback.format_exc())
    return (
        f"training stopped while {run.phases.current} at iteration {run.progress.iterations + 1} "
        f"({run.progress.frames} frames): {type(error).__name__}: {error}\n"
        f"last good checkpoint: {run.checkpoints.latest()}; traceback in {run.run_dir / ERROR_LOG}"
    )


def run_iterations(run: Run, on_eval: EvalHook | None = None) -> TrainResult:
    """The training loop itself, one iteration per collected batch."""
    config, progress, algorithm, buffer, phases = (
        run.config, run.progress, run.algorithm, run.buffer, run.phases,
    )  # fmt: skip
    updates = updates_per_iteration(config)
    batches = iter(run.collector)
    with StopRequest().installed() as stop:
        while True:
            with phases("collecting"), naming_dead_workers(run.collector, config.env.name):
                batch = next(batches)
            check_workers(run.collector, config.env.name)
            progress.frames += batch.numel()
            progress.iterations += 1
            progress.episodes += episodes_ended(batch)
            algorithm.after_collect(batch.numel())
            with phases("extending the buffer"):
                extend_buffer(buffer, batch, algorithm.replay_keys())

            update_metrics, state_metrics = [], {}
            if config.optim.anneal_lr:
                set_learning_rate(algorithm.optimizer, annealed_lr(config, progress.frames))
            if progress.frames >= config.collector.init_random_frames:
                with phases("sampling"):
                    samples = sample_batches(
                        buffer,
                        config.replay,
                        config.optim.batch_size,
                        updates,
                        run.devices.learner,
                        functools.partial(stack_frames, buffer),
                    )
                for sample in samples:
                    with phases("updating"):
                        update_metrics.append(algorithm.update(sample))
                sampled = torch.cat(samples)
                with phases("writing priorities"):
                    write_priorities(buffer, sampled)
                with phases("refreshing recurrent states"):
                    state_metrics = refresh_recurrent_states(run, sampled)
                progress.updates += updates
            with phases("checking metrics"):
                metrics = iteration_metrics(
                    batch, update_metrics, progress, run.weight_sync.version
                )
                metrics["train/lr"] = algorithm.optimizer.param_groups[0]["lr"]
                metrics.update(state_metrics)
                refuse_non_finite(metrics, run)

            if progress.iterations % config.collector.sync_every == 0:
                with phases("syncing weights"):
                    run.weight_sync.push()

            # Decided once per iteration: a signal arriving after this point waits for the
            # next boundary, so that a stop always evaluates and saves first.
            stopping = progress.frames >= config.collector.total_frames or stop.requested
            eval_due = progress.frames - progress.last_eval_frames >= config.eval.interval_frames
            # Evaluation and videos build policy copies, whose initial weights draw from
            # torch's generator: drawn from a fork of it, so that how often a run evaluates
            # or films never changes what it learns.
            if eval_due or stopping:
                with phases("evaluating"), torch.random.fork_rng():
                    metrics.update(evaluate(config, algorithm.policy_factory(), algorithm.policy))
                progress.record_eval(metrics[EVAL_KEY])
                if config.eval.video and (progress.evaluations - 1) % config.eval.video_every == 0:
                    with phases("recording a video"), torch.random.fork_rng():
                        record_evaluation_video(
                            config,
                            algorithm.policy_factory(),
                            algorithm.policy,
                            run.logger.backend,
                            progress.frames,
                        )
            with phases("logging"):
                run.logger.log(progress.frames, metrics)
            if EVAL_KEY in metrics:
                with phases("saving a checkpoint"):
                    save_checkpoint(run, metrics[EVAL_KEY])
                if on_eval is not None and (reason := on_eval(progress.frames, metrics[EVAL_KEY])):
                    stop.request(reason)
                    break
            if stopping:
                break
    # A signal that came with the last iteration stopped nothing: the run is complete.
    return summarize(run, stop.reason if progress.frames < config.collector.total_frames else None)


def updates_per_iteration(config: Config) -> int:
    """Gradient updates after each collected batch: ``optim.utd_ratio`` per frame."""
    return max(1, round(config.collector.frames_per_batch * config.optim.utd_ratio))


def refresh_recurrent_states(run: Run, sequences: TensorDictBase) -> dict[str, float]:
    """Recompute the recurrent states of the sampled records with the current weights and,
    with ``replay.refresh_states``, write them back into the records still in the buffer,
    so that later samples start from fresher states. Returns how far the stored states
    were from the recomputed ones (``train/state_drift``), and how many records were
    refreshed; nothing without a recurrent network."""
    states = run.algorithm.recurrent_states(sequences)
    if states is None:
        return {}
    metrics = {"train/state_drift": recurrent_state_drift(sequences, states)}
    if run.config.replay.refresh_states:
        metrics["train/states_refreshed"] = write_recurrent_states(run.buffer, sequences, states)
    return metrics


def summarize(run: Run, stopped_by: str | None) -> TrainResult:
    return TrainResult(
        run_dir=run.run_dir,
        frames=run.progress.frames,
        updates=run.progress.updates,
        best_eval_reward=run.progress.best_eval_reward,
        last_eval_reward=run.progress.last_eval_reward,
        best_checkpoint=run.checkpoints.best(),
        last_checkpoint=run.checkpoints.latest(),
        stopped_by=stopped_by,
        seconds_per_phase=dict(run.phases.seconds),
    )


def save_checkpoint(run: Run, eval_reward: float) -> None:
    # Saving asks worker processes for their state: a stopped worker is the error to report.
    check_workers(run.collector, run.config.env.name)
    try:
        run.checkpoints.save(run.progress.frames, eval_reward)
    except OSError as error:
        check_workers(run.collector, run.config.env.name)
        raise RunFailed(
            f"could not save the checkpoint at {run.progress.frames} frames "
            f"({error.strerror}); the last good checkpoint is intact: "
            f"{run.checkpoints.latest()}"
        ) from None


def refuse_non_finite(metrics: dict[str, float], run: Run) -> None:
    """Stop before a diverged model can be evaluated or saved."""
    for name, value in metrics.items():
        if not math.isfinite(value):
            raise RunFailed(
                f"{name} became {value} at iteration {run.progress.iterations} "
                f"({run.progress.frames} frames); nothing was saved from this iteration; "
                f"the last good checkpoint is {run.checkpoints.latest()}"
            )


def annealed_lr(config: Config, frames: int) -> float:
    """``optim.lr`` decayed linearly to 0 at ``collector.total_frames``: a function of the
    frame count alone, so a resumed run continues the schedule exactly."""
    return config.optim.lr * max(0.0, 1 - frames / config.collector.total_frames)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def episodes_ended(batch: TensorDictBase) -> int:
    return int(batch["next", "done"].sum())


def iteration_metrics(
    batch: TensorDictBase,
    update_metrics: list[TensorDictBase],
    progress: Progress,
    policy_version: int,
) -> dict[str, float]:
    """Scalars of one iteration: mean update losses, the return (and in a goal env the
    success rate) of training episodes that ended, counters, and how many weight pushes
    behind the learner the batch's stalest frame was."""
    metrics: dict[str, float] = {
        "iteration": progress.iterations,
        "updates": progress.updates,
        "episodes": progress.episodes,
    }
    if ("next", "policy_version") in batch.keys(include_nested=True):
        # TorchRL writes the version with the env's output: the version a frame's action was
        # taken with is the one written by the step that frame made, under "next".
        acted_with = batch["next", "policy_version"]
        metrics["collector/policy_lag"] = policy_version - int(acted_with.min())
    if update_metrics:
        means = torch.stack(update_metrics).float().mean(dim=0)
        metrics.update({f"train/{name}": value.item() for name, value in means.items()})
    episode_ends = batch["next", "done"].reshape(-1)
    if episode_ends.any():
        returns = batch["next", "episode_reward"].reshape(-1)[episode_ends]
        metrics["train/episode_return"] = returns.mean().item()
        if ("next", SUCCESS_KEY) in batch.keys(include_nested=True):
            reached = batch["next", SUCCESS_KEY].reshape(-1)[episode_ends]
            metrics["train/success_rate"] = reached.float().mean().item()
    return metrics
