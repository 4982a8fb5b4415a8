"""The training loop: ``train(config)`` builds a run from its factories (or resumes one
from its newest good checkpoint), then tells the story of one iteration, again and again:

    collect -> extend -> sample -> update -> write back (priorities, ...)
            -> weight sync -> evaluate -> log -> checkpoint

Metrics are logged before the checkpoint that covers them (or, when a stop left the
iteration's evaluation owed, held in it until that evaluation runs after the resume): a run
resumed from that checkpoint then neither repeats nor misses a row.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.collectors import BaseCollector

from rl_app.algorithms import Algorithm
from rl_app.checkpointing import RunCheckpoints, checkpoint_frames
from rl_app.collection import (
    Devices,
    WeightSync,
    check_workers,
    collector_metrics,
    naming_dead_workers,
)
from rl_app.config import Config
from rl_app.envs import SUCCESS_KEY
from rl_app.evaluation import evaluate
from rl_app.interrupts import Abandoned, StopRequest
from rl_app.logger import EVAL_KEY, RunLogger
from rl_app.replay import PRIORITY_KEY, RunReplayBuffer

log = logging.getLogger("rl_app")

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
    best_eval_return: float = float("-inf")
    last_eval_return: float = float("nan")
    # The metrics row of an iteration whose evaluation a stop left owed (saved with it).
    owed_eval: dict[str, float] | None = None

    def record_eval(self, eval_return: float) -> None:
        self.evaluations += 1
        self.last_eval_frames = self.frames
        self.last_eval_return = eval_return
        self.best_eval_return = max(self.best_eval_return, eval_return)

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = set(state) - {item.name for item in dataclasses.fields(self)}
        if unknown:  # a checkpoint of another layout: say so rather than resume half of it
            raise ValueError(f"the checkpoint's progress holds unknown counters {sorted(unknown)}")
        for name, value in state.items():
            setattr(self, name, value)


@dataclass
class TrainResult:
    run_dir: Path
    frames: int
    updates: int
    best_eval_return: float
    last_eval_return: float
    best_checkpoint: Path | None
    last_checkpoint: Path | None
    stopped_by: str | None  # the signal that stopped the run early, if any
    seconds_per_phase: dict[str, float]


# An evaluation runs after a stop only if this many times the latest one fits before the
# deadline: its episodes may last longer than the latest evaluation's.
EVAL_TIME_ROOM = 1.5

# The phases of an iteration, in order: wall time is kept per phase (a run's result holds
# it: ``TrainResult.seconds_per_phase``), and an error message names the phase it happened in.
PHASES = (
    "collecting", "extending the buffer", "sampling", "updating", "writing back",
    "checking metrics", "syncing weights", "evaluating",
    "recording a video", "logging", "saving a checkpoint",
)  # fmt: skip


class PhaseTimer:
    """Wall time per phase of the loop: ``with phases("sampling"): ...``. ``current``
    names the phase in progress, or the last one entered (for error messages)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.last: dict[str, float] = {}  # the latest time of each phase that completed
        self.current = "starting"

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if phase not in self.seconds:
            raise KeyError(f"unknown phase {phase!r}: the phases are {', '.join(PHASES)}")
        self.current = phase
        started = time.perf_counter()
        try:
            yield
            self.last[phase] = time.perf_counter() - started
        finally:
            self.seconds[phase] += time.perf_counter() - started


@dataclass
class Run:
    """Everything one run is made of, built by :func:`build_run` from its config."""

    config: Config
    run_dir: Path
    devices: Devices
    algorithm: Algorithm
    # In this process, or a Ray service's with the same calls (rl_app.replay.service).
    buffer: RunReplayBuffer
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


def run_iterations(
    run: Run, on_eval: EvalHook | None = None, usr2_grace_s: float | None = None
) -> TrainResult:
    """The training loop itself, one iteration per collected batch. ``usr2_grace_s``: how
    long a SIGUSR2 comes before the process is killed (a SLURM job's signal delay)."""
    config, progress, algorithm, buffer, phases = (
        run.config, run.progress, run.algorithm, run.buffer, run.phases,
    )  # fmt: skip
    updates = updates_per_iteration(config)
    stop = StopRequest(functools.partial(unsaved_work, run), usr2_grace_s)
    with stop.installed():
        if progress.owed_eval is not None and pay_owed_evaluation(run, stop, on_eval):
            return summarize(run, stopped_by(run, stop))
        batches = iter(run.collector)
        while True:
            with phases("collecting"), naming_dead_workers(run.collector, config.env.name):
                batch = next(batches)
            check_workers(run.collector, config.env.name)
            progress.frames += batch.numel()
            progress.iterations += 1
            progress.episodes += episodes_ended(batch)
            if algorithm.exploration is not None:
                algorithm.exploration.step(batch.numel())
            with phases("extending the buffer"):
                buffer.extend(batch)

            update_metrics, replay_metrics = [], {}
            if config.optim.anneal_lr:
                set_learning_rate(algorithm.optimizer, annealed_lr(config, progress.frames))
            if progress.frames >= config.collector.init_random_frames:
                samples = []
                with closing(sampled_batches(buffer, config, updates)) as drawn:
                    for _ in range(updates):
                        with phases("sampling"):  # with replay.prefetch, the wait for it
                            samples.append(next(drawn))
                        with phases("updating"):
                            update_metrics.append(algorithm.update(samples[-1]))
                        # The TD errors: what the write-back makes new priorities of.
                        samples[-1][PRIORITY_KEY] = update_metrics[-1].pop(PRIORITY_KEY)
                with phases("writing back"):
                    replay_metrics = buffer.write_back(samples)
                progress.updates += updates
            with phases("checking metrics"):
                metrics = iteration_metrics(
                    batch, update_metrics, progress, run.weight_sync.version
                )
                metrics["train/lr"] = algorithm.optimizer.param_groups[0]["lr"]
                metrics.update(replay_metrics)
                metrics.update(collector_metrics(run.collector))
                refuse_non_finite(metrics, run)

            if progress.iterations % config.collector.sync_every == 0:
                with phases("syncing weights"):
                    run.weight_sync.push()

            eval_due = (
                progress.frames >= config.collector.total_frames
                or progress.frames - progress.last_eval_frames >= config.eval.interval_frames
            )
            if end_iteration(run, metrics, eval_due, stop, on_eval):
                break
    return summarize(run, stopped_by(run, stop))


def end_iteration(
    run: Run, metrics: dict[str, float], eval_due: bool, stop: StopRequest, on_eval: EvalHook | None
) -> bool:
    """Evaluate if due, log the iteration's ``metrics``, save a checkpoint after an
    evaluation, on a stop, or ``checkpoint.interval_minutes`` after the last save; True when
    the run stops here.

    A stop saves first: an evaluation due when it comes, or in progress, is dropped and
    owed (``Progress.owed_eval``, the iteration's metrics row waiting with it in the
    checkpoint), and runs first thing after the resume with the result it would have had.
    An evaluation that raises is owed too: the training state is saved before the error
    stops the run."""
    progress, phases = run.progress, run.phases
    if eval_due:
        try:
            evaluate_iteration(run, metrics, stop)
        except Abandoned:
            progress.owed_eval = metrics
        except Exception:
            # Evaluation changes no training state: save it, the evaluation owed, before
            # the error stops the run (named in the phase it came from: saved untimed).
            progress.owed_eval = metrics
            with stop.saving():
                save_checkpoint(run, None)
            raise
    if progress.owed_eval is None:
        with phases("logging"):
            run.logger.log(progress.frames, metrics)
    interval_s = 60 * run.config.checkpoint.interval_minutes
    since_save_s = time.monotonic() - run.checkpoints.saved_at
    if stop.requested or EVAL_KEY in metrics or since_save_s >= interval_s:
        with phases("saving a checkpoint"), stop.saving():
            save_checkpoint(run, metrics.get(EVAL_KEY))
    if progress.owed_eval is not None and stop.allows(owed_evaluation_seconds(phases)):
        log.info("the evaluation owed at %d frames fits before the deadline: it runs now",
                 progress.frames)  # fmt: skip
        with stop.allowing():
            pay_owed_evaluation(run, stop, on_eval)
    if EVAL_KEY in metrics and on_eval is not None:
        if reason := on_eval(progress.frames, metrics[EVAL_KEY]):
            stop.request(reason)
    return stop.requested or progress.frames >= run.config.collector.total_frames


def evaluate_iteration(run: Run, metrics: dict[str, float], stop: StopRequest) -> None:
    """Add the evaluation's scores to ``metrics`` (and film it, every ``eval.video_every``-th
    time); :class:`~rl_app.interrupts.Abandoned` if a stop comes before it ends.

    Evaluation and videos build policy copies, whose initial weights draw from torch's
    generator: drawn from a fork of it, so that how often a run evaluates or films (or
    whether a stop made it owed) never changes what it learns."""
    config, algorithm, progress, phases = run.config, run.algorithm, run.progress, run.phases
    with stop.abandonable():
        with phases("evaluating"), torch.random.fork_rng():
            scores = evaluate(
                config, algorithm.policy_factory(), algorithm.policy, stop.abandon_point
            )
        if config.eval.video and progress.evaluations % config.eval.video_every == 0:
            from rl_app.video import record_evaluation_video

            with phases("recording a video"), torch.random.fork_rng():
                record_evaluation_video(
                    config,
                    algorithm.policy_factory(),
                    algorithm.policy,
                    run.logger.backend,
                    progress.frames,
                    stop.abandon_point,
                )
    metrics.update(scores)
    progress.record_eval(scores[EVAL_KEY])


def owed_evaluation_seconds(phases: PhaseTimer) -> float | None:
    """How long paying an owed evaluation is expected to take: the latest evaluation and
    save, with room for episodes longer than that evaluation's; None before any."""
    if "evaluating" not in phases.last:
        return None
    return EVAL_TIME_ROOM * phases.last["evaluating"] + phases.last.get("saving a checkpoint", 0)


def pay_owed_evaluation(run: Run, stop: StopRequest, on_eval: EvalHook | None) -> bool:
    """After a resume, the evaluation a stop left owed (with its iteration's metrics row
    and checkpoint); True when the run stops there."""
    metrics, run.progress.owed_eval = run.progress.owed_eval, None
    log.info("the evaluation owed at %d frames runs first", run.progress.frames)
    return end_iteration(run, metrics, True, stop, on_eval)


def sampled_batches(
    buffer: RunReplayBuffer, config: Config, count: int
) -> Generator[TensorDictBase, None, None]:
    """An iteration's ``count`` batches, drawn at the first ``next`` in one sampler call or,
    with ``replay.prefetch``, one call per batch in a background thread, each batch drawn
    while the update before it runs. Either way every draw sees the priorities as they stood
    before the iteration's first update (they are written back after the last). Closing it
    waits for a draw in flight."""
    batch_size = config.optim.batch_size
    if not config.replay.prefetch:
        yield from buffer.sample_batches(batch_size, count)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="rl_app-sampling") as sampling:
        drawn = sampling.submit(buffer.sample_batches, batch_size, 1)
        for left in reversed(range(count)):
            (batch,) = drawn.result()
            if left:
                drawn = sampling.submit(buffer.sample_batches, batch_size, 1)
            yield batch


def stopped_by(run: Run, stop: StopRequest) -> str | None:
    """What stopped the run early: none when it has its frames and owes no evaluation."""
    complete = run.progress.frames >= run.config.collector.total_frames
    return None if complete and run.progress.owed_eval is None else stop.reason


def updates_per_iteration(config: Config) -> int:
    """Gradient updates after each collected batch: ``optim.utd_ratio`` per frame."""
    return max(1, round(config.collector.frames_per_batch * config.optim.utd_ratio))


def summarize(run: Run, stopped_by: str | None) -> TrainResult:
    return TrainResult(
        run_dir=run.run_dir,
        frames=run.progress.frames,
        updates=run.progress.updates,
        best_eval_return=run.progress.best_eval_return,
        last_eval_return=run.progress.last_eval_return,
        best_checkpoint=run.checkpoints.best(),
        last_checkpoint=run.checkpoints.latest(),
        stopped_by=stopped_by,
        seconds_per_phase=dict(run.phases.seconds),
    )


def unsaved_work(run: Run) -> str:
    """What stopping now loses: the frames since the newest checkpoint, this iteration's."""
    latest = run.checkpoints.latest()
    since = checkpoint_frames(latest) if latest is not None else 0
    return (
        f"the {run.progress.frames - since} frames since "
        f"{latest.name if latest is not None else 'the start'} and the iteration in progress"
    )


def save_checkpoint(run: Run, eval_return: float | None) -> None:
    # Saving asks worker processes for their state: a stopped worker is the error to report.
    check_workers(run.collector, run.config.env.name)
    try:
        run.checkpoints.save(run.progress.frames, eval_return)
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
            metrics["train/success_rate"] = reached.double().mean().item()
    return metrics
