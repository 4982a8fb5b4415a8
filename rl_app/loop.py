"""The training loop: ``run_iterations`` takes the run ``rl_app.run.train`` built (or resumed)
and tells the story of one iteration, again and again:

    collect -> extend -> sample -> update -> write back (priorities, ...)
            -> weight sync -> evaluate -> log -> checkpoint

Metrics are logged before the checkpoint that covers them (or, when a stop left the
iteration's evaluation owed, held in it until that evaluation runs after the resume): a run
resumed from that checkpoint then neither repeats nor misses a row. With
``eval.backend=process`` or ``ray`` an evaluation plays while training goes on, and the rows
from its iteration on wait for it: they are logged in order once it ends.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import BaseCollector

from rl_app.algorithms import Algorithm
from rl_app.checkpointing import RunCheckpoints, checkpoint_frames, last_good
from rl_app.collection import (
    Devices,
    WeightSync,
    check_workers,
    collector_metrics,
    naming_dead_workers,
)
from rl_app.config import Config
from rl_app.envs import SUCCESS_KEY
from rl_app.evaluation import BackgroundEvaluator, evaluate
from rl_app.interrupts import Abandoned, StopRequest
from rl_app.logger import EVAL_KEY, PhaseTimer, RunLogger
from rl_app.replay import PRIORITY_KEY, RunReplayBuffer
from rl_app.replay.buffer import sampled_batches

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
    # The metrics row of an iteration whose evaluation a stop left owed, or that plays in
    # the background (saved with it); it was due at last_eval_frames.
    owed_eval: dict[str, float] | None = None
    # [frames, metrics row] of the iterations since, while that evaluation plays in the
    # background: logged after its row.
    held_rows: list[list[Any]] = dataclasses.field(default_factory=list)

    def record_eval(self, eval_return: float) -> None:
        self.evaluations += 1
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


@dataclass
class Run:
    """Everything one run is made of, built by :func:`rl_app.run.build_run` from its config."""

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
    # Where evaluations play beside training (eval.backend=process or ray).
    evaluator: BackgroundEvaluator | None = None

    @property
    def evaluating(self) -> bool:
        """Whether an evaluation plays beside training now."""
        return self.evaluator is not None and self.evaluator.playing

    def close(self) -> None:
        with ExitStack() as parts:  # closed in reverse (the evaluator first), each one
            if self.checkpoints.journal is not None:
                parts.callback(self.checkpoints.journal.close)
            parts.callback(self.logger.close)
            parts.callback(self.collector.shutdown)
            if self.evaluator is not None:
                parts.callback(self.evaluator.close)


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
            return finish(run, stop, on_eval)
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
                prefetch, batch_size = config.replay.prefetch, config.optim.batch_size
                with closing(sampled_batches(buffer, batch_size, updates, prefetch)) as drawn:
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
                return finish(run, stop, on_eval)


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
    stops the run.

    In the background (``eval.backend=process`` or ``ray``), a due evaluation starts once the one
    before has ended, and its iteration saves when it starts: that checkpoint holds the
    weights it plays, and gets its score when it ends (:func:`collect_evaluation`). A stop
    drops it, owed; the resume starts it again from that checkpoint's weights."""
    progress, phases = run.progress, run.phases
    complete = progress.frames >= run.config.collector.total_frames
    if run.evaluating:
        collect_evaluation(run, stop, on_eval, wait=complete)
    evaluated = eval_due and progress.owed_eval is None
    if evaluated:
        progress.last_eval_frames = progress.frames
        if run.config.eval.backend == "blocking":
            evaluate_blocking(run, metrics, stop)
        elif stop.requested:
            progress.owed_eval = metrics
        else:
            start_evaluation(run, metrics, run.algorithm.policy)
    elif progress.owed_eval is not None:
        progress.held_rows.append([progress.frames, metrics])
    if progress.owed_eval is None:
        with phases("logging"):
            run.logger.log(progress.frames, metrics)
    if stop.requested and run.evaluating:
        run.evaluator.cancel()
    interval_s = 60 * run.config.checkpoint.interval_minutes
    since_save_s = time.monotonic() - run.checkpoints.saved_at
    # (Not while an evaluation plays: the save could prune the checkpoint of its weights.)
    interval_save = since_save_s >= interval_s and not run.evaluating
    if stop.requested or evaluated or interval_save:
        with phases("saving a checkpoint"), stop.saving():
            save_checkpoint(run, metrics.get(EVAL_KEY))
    # (One that played in the background, resumed with eval.backend=blocking, is owed again.)
    blocking = run.config.eval.backend == "blocking" and not progress.held_rows
    if blocking and progress.owed_eval is not None and stop.allows(owed_evaluation_seconds(phases)):
        log.info("the evaluation owed at %d frames fits before the deadline: it runs now",
                 progress.frames)  # fmt: skip
        with stop.allowing():
            pay_owed_evaluation(run, stop, on_eval)
    if EVAL_KEY in metrics and on_eval is not None:
        if reason := on_eval(progress.frames, metrics[EVAL_KEY]):
            stop.request(reason)
    return stop.requested or complete


def evaluate_blocking(run: Run, metrics: dict[str, float], stop: StopRequest) -> None:
    """Evaluate now, training waiting; owed if a stop drops it or it raises."""
    try:
        evaluate_iteration(run, metrics, stop)
    except Abandoned:
        run.progress.owed_eval = metrics
    except Exception:
        # Evaluation changes no training state: save it, the evaluation owed, before
        # the error stops the run (named in the phase it came from: saved untimed).
        run.progress.owed_eval = metrics
        with stop.saving():
            save_checkpoint(run, None)
        raise


def start_evaluation(run: Run, metrics: dict[str, float], policy: torch.nn.Module) -> None:
    """Start the evaluation of the iteration whose ``metrics`` row waits for it, in the
    background, with ``policy``'s weights now."""
    run.progress.owed_eval = metrics
    # Copies on the CPU: a tensor sent to a process is shared with it, not copied.
    weights = {name: value.to("cpu", copy=True) for name, value in policy.state_dict().items()}
    if run.evaluator is None:  # (resumed with eval.backend=blocking)
        run.evaluator = background_evaluator(run.config, run.algorithm.policy_factory())
    with run.phases("evaluating"):
        run.evaluator.start(weights)


def background_evaluator(
    config: Config, policy_factory: Callable[..., TensorDictModuleBase]
) -> BackgroundEvaluator:
    """Where evaluations play beside training: a Ray actor (``eval.backend=ray``), else a
    process (``process``, or ``blocking`` resumed owing one that played in the background)."""
    if config.eval.backend == "ray":
        from rl_app.ray_evaluation import RayEvaluator

        return RayEvaluator(config, policy_factory)
    return BackgroundEvaluator(config, policy_factory)


def collect_evaluation(
    run: Run, stop: StopRequest, on_eval: EvalHook | None, wait: bool = False
) -> None:
    """If the evaluation playing in the background has ended (with ``wait``, once it has,
    unless a stop comes first): log the rows that waited for it, its own with its scores,
    and give its checkpoint its score."""
    progress = run.progress
    with run.phases("evaluating"):  # (a wait is time training spends on it)
        while (scores := run.evaluator.scores(timeout=0.1 if wait else 0)) is None:
            if not wait or stop.requested:
                return
    metrics, progress.owed_eval = progress.owed_eval, None
    metrics.update(scores)
    progress.record_eval(scores[EVAL_KEY])
    with run.phases("logging"):
        for frames, row in [[progress.last_eval_frames, metrics], *progress.held_rows]:
            run.logger.log(frames, row)
    progress.held_rows = []
    run.checkpoints.add_score(progress.last_eval_frames, scores[EVAL_KEY])
    if on_eval is not None and (reason := on_eval(progress.last_eval_frames, scores[EVAL_KEY])):
        stop.request(reason)


def finish(run: Run, stop: StopRequest, on_eval: EvalHook | None) -> TrainResult:
    """The run's result, once the evaluation still playing in the background has ended
    (dropped, owed, if a stop comes first)."""
    if run.evaluating:
        collect_evaluation(run, stop, on_eval, wait=True)
    if run.evaluating:
        run.evaluator.cancel()
    return summarize(run, stopped_by(run, stop))


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
    and checkpoint); True when the run stops there. One a stop dropped while it played in
    the background, iterations ago, starts again there with the weights its iteration
    saved."""
    progress = run.progress
    if progress.held_rows:
        log.info("the evaluation owed at %d frames starts again", progress.last_eval_frames)
        with torch.random.fork_rng():  # (a copy's initial weights draw from it)
            policy = run.algorithm.policy_factory()()
        run.checkpoints.load_policy(progress.last_eval_frames, policy)
        start_evaluation(run, progress.owed_eval, policy)
        return False
    metrics, progress.owed_eval = progress.owed_eval, None
    log.info("the evaluation owed at %d frames runs first", progress.frames)
    return end_iteration(run, metrics, True, stop, on_eval)


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
            f"{last_good(run.checkpoints.latest())}"
        ) from None


def refuse_non_finite(metrics: dict[str, float], run: Run) -> None:
    """Stop before a diverged model can be evaluated or saved."""
    for name, value in metrics.items():
        if not math.isfinite(value):
            raise RunFailed(
                f"{name} became {value} at iteration {run.progress.iterations} "
                f"({run.progress.frames} frames); nothing was saved from this iteration; "
                f"the last good checkpoint is {last_good(run.checkpoints.latest())}"
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
