"""The training loop: ``train(config)`` builds a run from its factories, then tells the
story of one iteration, again and again:

    collect -> extend -> sample -> update -> priorities -> weight sync
            -> evaluate -> checkpoint -> log
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchrl.checkpoint import GlobalRNGState
from torchrl.collectors import BaseCollector, Evaluator
from torchrl.data import TensorDictReplayBuffer

from rl_app.algorithms import Algorithm, make_algorithm
from rl_app.checkpointing import RunCheckpoints
from rl_app.collection import Devices, decide_devices, make_collector, sync_weights
from rl_app.config import Config, to_yaml
from rl_app.envs import EVAL_SEED_OFFSET, env_factory, make_env
from rl_app.evaluation import evaluate, make_evaluator
from rl_app.logger import RunLogger
from rl_app.replay import make_replay_buffer

CONFIG_FILE = "config.yaml"


@dataclass
class Progress:
    """The counters of a run; saved in every checkpoint."""

    frames: int = 0
    iterations: int = 0
    updates: int = 0
    episodes: int = 0
    best_eval_reward: float = float("-inf")
    last_eval_reward: float = float("nan")

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
    seconds_per_phase: dict[str, float]


class PhaseTimer:
    """Wall time spent in each phase of the loop: ``lap(name)`` charges the time since
    the previous lap to ``name``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] += now - self._last
        self._last = now


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Run:
    """Everything one run is made of, built by :func:`build_run` from its config."""

    config: Config
    run_dir: Path
    devices: Devices
    algorithm: Algorithm
    buffer: TensorDictReplayBuffer
    collector: BaseCollector
    evaluator: Evaluator
    progress: Progress
    checkpoints: RunCheckpoints
    logger: RunLogger

    def close(self) -> None:
        self.collector.shutdown()
        self.evaluator.shutdown()
        self.logger.close()


def build_run(config: Config) -> Run:
    """Create the run directory and every part of the run, each from its factory."""
    torch.set_num_threads(config.threads)
    seed_everything(config.seed)
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(to_yaml(config))

    devices = decide_devices(config)
    spec_env = make_env(config.env, config.seed)
    algorithm = make_algorithm(config, spec_env, devices.learner)
    spec_env.close()
    buffer = make_replay_buffer(
        config.replay, config.optim.batch_size, run_dir / "replay", config.seed
    )
    collector = make_collector(
        config, env_factory(config.env, config.seed), algorithm.policy, devices
    )
    evaluator = make_evaluator(
        config.eval,
        env_factory(config.env, config.seed + EVAL_SEED_OFFSET),
        algorithm.policy_factory(),
    )
    progress = Progress()
    checkpoints = RunCheckpoints(
        run_dir / "checkpoints",
        config.checkpoint.keep_last,
        {
            **algorithm.checkpoint_components(),
            "replay_buffer": buffer,
            "rng": GlobalRNGState(),
            "progress": progress,
            "config": dataclasses.asdict(config),
        },
    )
    logger = RunLogger(config.logger, run_dir, config.collector.total_frames)
    return Run(
        config,
        run_dir,
        devices,
        algorithm,
        buffer,
        collector,
        evaluator,
        progress,
        checkpoints,
        logger,
    )


def train(config: Config) -> TrainResult:
    """Train one run as ``config`` describes; its files land in ``config.run_dir``."""
    run = build_run(config)
    try:
        return run_iterations(run)
    finally:
        run.close()


def run_iterations(run: Run) -> TrainResult:
    """The training loop itself, one iteration per collected batch."""
    config, progress, algorithm, buffer = run.config, run.progress, run.algorithm, run.buffer
    updates_per_iteration = max(
        1, round(config.collector.frames_per_batch * config.optim.utd_ratio)
    )
    next_eval_at = config.eval.interval_frames
    phases = PhaseTimer()
    for batch in run.collector:
        phases.lap("collect")
        progress.frames += batch.numel()
        progress.iterations += 1
        algorithm.after_collect(progress.frames)
        buffer.extend(batch.reshape(-1))
        phases.lap("extend")

        update_metrics = []
        if progress.frames >= config.collector.init_random_frames:
            for _ in range(updates_per_iteration):
                sample = buffer.sample().to(run.devices.learner)
                phases.lap("sample")
                update_metrics.append(algorithm.update(sample))
                phases.lap("update")
                buffer.update_tensordict_priority(sample)
                phases.lap("priority")
            progress.updates += updates_per_iteration

        if progress.iterations % config.collector.sync_every == 0:
            sync_weights(run.collector)
            phases.lap("sync")

        metrics = iteration_metrics(batch, update_metrics, progress)
        finished = progress.frames >= config.collector.total_frames
        if progress.frames >= next_eval_at or finished:
            next_eval_at += config.eval.interval_frames
            eval_reward = evaluate(run.evaluator, algorithm.policy, progress.frames)
            progress.last_eval_reward = eval_reward
            progress.best_eval_reward = max(progress.best_eval_reward, eval_reward)
            metrics["eval/return"] = eval_reward
            phases.lap("eval")
            run.checkpoints.save(progress.frames, eval_reward)
            phases.lap("checkpoint")
            run.logger.log_eval(progress.frames, eval_reward)

        run.logger.log(progress.frames, metrics)
        phases.lap("log")

    return TrainResult(
        run_dir=run.run_dir,
        frames=progress.frames,
        updates=progress.updates,
        best_eval_reward=progress.best_eval_reward,
        last_eval_reward=progress.last_eval_reward,
        best_checkpoint=run.checkpoints.best(),
        seconds_per_phase=dict(phases.seconds),
    )


def iteration_metrics(
    batch: Any, update_metrics: list[Any], progress: Progress
) -> dict[str, float]:
    """Scalars of one iteration: mean update losses, finished training episodes, counters."""
    metrics: dict[str, float] = {
        "iteration": progress.iterations,
        "updates": progress.updates,
    }
    if update_metrics:
        means = torch.stack(update_metrics).float().mean(dim=0)
        metrics.update({f"train/{name}": value.item() for name, value in means.items()})
    episode_ends = batch["next", "done"].reshape(-1)
    if episode_ends.any():
        progress.episodes += int(episode_ends.sum())
        returns = batch["next", "episode_reward"].reshape(-1)[episode_ends]
        metrics["train/episode_return"] = returns.mean().item()
    metrics["episodes"] = progress.episodes
    return metrics
