"""Frames/s of each collection mode acting with the SAC actor, next to the raw Gymnasium
step rate of the same env, and each mode's end-to-end training frames/s."""

from __future__ import annotations

import multiprocessing
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from rl_app.algorithms import make_algorithm
from rl_app.checks import load_config
from rl_app.collection import WeightSync, decide_devices, make_collector
from rl_app.config import Config
from rl_app.envs import make_env
from rl_app.run import train

# Each collector measured: its name and its settings ("distributed-N": N SLURM jobs,
# "ray-sync-N": N Ray actors, "rpc-slurm-N": N RPC workers as SLURM jobs).
BATCHED_ENVS = 8
RAY_ACTORS = ["collector.mode=ray", "collector.workers=2", "ray.worker_cpus=0.5"]
COLLECTION_MODES = {
    "direct": ["collector.mode=direct"],
    f"direct-{BATCHED_ENVS}envs": ["collector.mode=direct", f"env.num_envs={BATCHED_ENVS}"],
    f"direct-{BATCHED_ENVS}envs-compiled": [
        "collector.mode=direct",
        f"env.num_envs={BATCHED_ENVS}",
        "collector.compile_policy=true",
    ],
    **{
        f"{mode}-{workers}": [f"collector.mode={mode}", f"collector.workers={workers}"]
        for mode in ("sync", "async")
        for workers in (1, 2)
    },
    **{
        f"distributed-{jobs}": ["collector.mode=distributed", f"collector.nodes={jobs}"]
        for jobs in (1, 2)
    },
    # Two Ray actors of half a CPU each: they fit a 2-core machine.
    **{f"ray-{kind}-2": [*RAY_ACTORS, f"ray.sync={kind == 'sync'}"] for kind in ("sync", "async")},
    **{
        f"rpc-{workers}": ["collector.mode=rpc", f"collector.workers={workers}"]
        for workers in (1, 2)
    },
    "rpc-slurm-2": ["collector.mode=rpc", "collector.workers=2", "rpc.launcher=slurm"],
}
# The modes that submit SLURM jobs.
ON_SLURM = ("distributed", "rpc-slurm")
COLLECTION_FRAMES = 4_000
MODE_TRAINING_FRAMES = 2_000


def raw_gym_steps_per_second(env_name: str, num_envs: int, steps: int = 20_000) -> float:
    """Gymnasium alone (a ``SyncVectorEnv`` of ``num_envs``), random actions: the ceiling
    of a collector stepping as many envs in one process."""
    env = gym.make_vec(env_name, num_envs=num_envs, vectorization_mode="sync")
    env.reset(seed=0)
    started = time.perf_counter()
    for _ in range(steps // num_envs):
        env.step(env.action_space.sample())  # ended episodes reset on the next step
    return steps / (time.perf_counter() - started)


def collector_frames_per_second(config: Config) -> float:
    """Frames/s of the collector ``config`` describes, acting with a fresh SAC actor; the
    clock starts after the first batch (process start-up is not collection)."""
    algorithm = make_algorithm(config, make_env(config.env, config.seed), torch.device("cpu"))
    collector = make_collector(config, algorithm, decide_devices(config))
    try:
        WeightSync(collector, algorithm, config.env.name)
        frames, started = 0, None
        for batch in collector:
            if started is None:
                started = time.perf_counter()
                continue
            frames += batch.numel()
            if frames >= COLLECTION_FRAMES:
                return frames / (time.perf_counter() - started)
    finally:
        collector.shutdown()
    raise AssertionError("unreachable: collectors run until stopped")


def bench_collection(overrides: list[str], run_dir: Path) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for name, settings in COLLECTION_MODES.items():
        if name.startswith(ON_SLURM) and shutil.which("sbatch") is None:
            report[name] = "not measured: no SLURM here (make slurm-up starts a local cluster)"
            continue
        mode_overrides = [
            *overrides, *settings, f"run_dir={run_dir / name}", "collector.init_random_frames=0",
        ]  # fmt: skip
        training_overrides = [
            *mode_overrides, f"collector.total_frames={MODE_TRAINING_FRAMES}",
            f"run_dir={run_dir / (name + '-training')}", "eval.interval_frames=1000000",
            "optim.compile=false",  # in so short a run the compile would outweigh the mode
        ]  # fmt: skip
        report[name] = {
            **in_a_new_process(collection_rates, mode_overrides),
            "training_frames_per_second": in_a_new_process(training_rate, training_overrides),
        }
    return report


def in_a_new_process(measure: Callable[[list[str]], Any], overrides: list[str]) -> Any:
    """``measure(overrides)`` in a fresh process: a process starts torch's RPC once, and no
    measurement inherits another's threads, workers or Ray."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as process:
        return process.submit(measure, overrides).result()


def collection_rates(overrides: list[str]) -> dict[str, float]:
    config = load_config("default", overrides)
    return {
        "raw_gym_steps_per_second": raw_gym_steps_per_second(config.env.name, config.env.num_envs),
        "collector_frames_per_second": collector_frames_per_second(config),
    }


def training_rate(overrides: list[str]) -> float:
    started = time.perf_counter()
    result = train(load_config("default", overrides))
    return result.frames / (time.perf_counter() - started)


def print_collection(collection: dict[str, Any]) -> None:
    print("\n== collection on Pendulum-v1, acting with the SAC actor (raw: Gymnasium alone with "
          "as many envs in one process, random actions)")  # fmt: skip
    print(f"  {'mode':<14} {'raw steps/s':>12} {'collector frames/s':>19} {'of raw':>7} "
          f"{'training frames/s':>18}")  # fmt: skip
    for name, rates in collection.items():
        if isinstance(rates, str):
            print(f"  {name:<14} {rates}")
            continue
        raw, collect = rates["raw_gym_steps_per_second"], rates["collector_frames_per_second"]
        print(f"  {name:<14} {raw:12.0f} {collect:19.0f} {collect / raw:7.1%} "
              f"{rates['training_frames_per_second']:18.1f}")  # fmt: skip
