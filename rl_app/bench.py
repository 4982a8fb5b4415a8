"""``make bench``: measured speed, printed and written to ``bench.json`` in a run directory.

Sections, each measured in the same process, one after the other:
- training: the default preset (shortened to ``BENCH_FRAMES`` frames unless overridden with
  ``ARGS="collector.total_frames=..."``): environment frames/s, updates/s and the mean
  time per iteration of each phase of the loop;
- checkpoint: save, verify-and-load time and size with a 100k-transition Pendulum buffer,
  and checkpointing's share of training time at the default evaluation interval;
- collection: frames/s of the direct, sync and async collectors (1 and 2 workers) and of
  1 and 2 SLURM collection jobs (distributed, when SLURM is here) acting with the SAC
  actor, next to the raw Gymnasium step rate of the same env (the ceiling),
  and each mode's end-to-end training frames/s at the default update-to-data ratio.

Not part of the test suite: timings depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from torchrl.collectors import Collector
from torchrl.envs.utils import RandomPolicy

from rl_app.algorithms import make_algorithm
from rl_app.checkpointing import disk_size, verify_checkpoint
from rl_app.collection import WeightSync, decide_devices, make_collector
from rl_app.config import Config, ConfigError, load_config
from rl_app.envs import make_env
from rl_app.loop import build_run, train
from rl_app.replay import TRAJECTORY_KEY

BENCH_FRAMES = 6_000
CHECKPOINT_BUFFER = 100_000
PHASES = (
    "collecting", "extending the buffer", "sampling", "updating", "writing priorities",
    "checking metrics", "syncing weights", "evaluating", "logging", "saving a checkpoint",
)  # fmt: skip


def bench_training(config: Config) -> dict[str, Any]:
    started = time.perf_counter()
    result = train(config)
    wall = time.perf_counter() - started
    iterations = result.frames // config.collector.frames_per_batch
    seconds = result.seconds_per_phase
    checkpoint_share = seconds.get("saving a checkpoint", 0.0) / wall
    return {
        "run_dir": str(result.run_dir),
        "frames": result.frames,
        "wall_seconds": wall,
        "frames_per_second": result.frames / wall,
        "updates_per_second": result.updates / wall,
        "ms_per_update_step": 1000 * seconds.get("updating", 0.0) / max(result.updates, 1),
        "ms_per_iteration": {p: 1000 * seconds.get(p, 0.0) / iterations for p in PHASES},
        "checkpoint_share_of_wall_time": checkpoint_share,
    }


def bench_checkpoint(config: Config, directory: Path) -> dict[str, Any]:
    """One save and one verified load of a run whose buffer holds 100k real transitions."""
    config.run_dir = str(directory)
    config.replay.capacity = CHECKPOINT_BUFFER
    run = build_run(config)
    try:
        env = make_env(config.env, config.seed)
        chunk = CHECKPOINT_BUFFER // 10
        collector = Collector(
            env, RandomPolicy(env.action_spec), frames_per_batch=chunk, total_frames=chunk
        )
        play = next(iter(collector))
        collector.shutdown()
        for copy in range(10):  # ten copies of real play, each with its own trajectory ids
            play[TRAJECTORY_KEY] += copy * 1_000
            run.buffer.extend(play)
        run.progress.frames = CHECKPOINT_BUFFER

        started = time.perf_counter()
        path = run.checkpoints.save(CHECKPOINT_BUFFER, eval_reward=0.0)
        save_seconds = time.perf_counter() - started
        started = time.perf_counter()
        verify_checkpoint(path)
        run.checkpoints.load(path)
        load_seconds = time.perf_counter() - started
        return {
            "transitions": len(run.buffer),
            "save_seconds": save_seconds,
            "verify_and_load_seconds": load_seconds,
            "size_mb": disk_size(path) / 1e6,
        }
    finally:
        run.close()


# Each collector measured: its name and its settings ("distributed-N": N SLURM jobs).
COLLECTION_MODES = {
    "direct": ["collector.mode=direct"],
    **{
        f"{mode}-{workers}": [f"collector.mode={mode}", f"collector.workers={workers}"]
        for mode in ("sync", "async")
        for workers in (1, 2)
    },
    **{
        f"distributed-{jobs}": ["collector.mode=distributed", f"collector.nodes={jobs}"]
        for jobs in (1, 2)
    },
}
COLLECTION_FRAMES = 4_000
MODE_TRAINING_FRAMES = 2_000


def raw_gym_steps_per_second(env_name: str, steps: int = 10_000) -> float:
    """Gymnasium alone, random actions: what no collector can beat."""
    env = gym.make(env_name)
    env.reset(seed=0)
    started = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
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
    report: dict[str, Any] = {"raw_gym_steps_per_second": raw_gym_steps_per_second("Pendulum-v1")}
    for name, settings in COLLECTION_MODES.items():
        if name.startswith("distributed") and shutil.which("sbatch") is None:
            report[name] = "not measured: no SLURM here (make slurm-up starts a local cluster)"
            continue
        mode_overrides = [
            *overrides, *settings, f"run_dir={run_dir / name}", "collector.init_random_frames=0",
        ]  # fmt: skip
        collect_fps = collector_frames_per_second(load_config("default", mode_overrides))
        training = load_config(
            "default",
            [*mode_overrides, f"collector.total_frames={MODE_TRAINING_FRAMES}",
             f"run_dir={run_dir / (name + '-training')}", "eval.interval_frames=1000000"],
        )  # fmt: skip
        started = time.perf_counter()
        result = train(training)
        report[name] = {
            "collector_frames_per_second": collect_fps,
            "training_frames_per_second": result.frames / (time.perf_counter() - started),
        }
    return report


def main(argv: list[str]) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    overrides = [f"collector.total_frames={BENCH_FRAMES}", "logger.backend=none", *argv]
    if not any(item.startswith("run_dir=") for item in overrides):
        overrides.append(f"run_dir=runs/bench-{stamp}")
    try:
        config = load_config("default", overrides)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    run_dir = Path(config.run_dir)

    report: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "threads": config.threads,
        },
        "training": bench_training(config),
    }
    report["checkpoint"] = bench_checkpoint(
        load_config("default", overrides), run_dir / "checkpoint-bench"
    )
    base = [
        item for item in overrides if not item.startswith(("run_dir=", "collector.total_frames="))
    ]
    report["collection"] = bench_collection(base, run_dir / "collection")
    (run_dir / "bench.json").write_text(json.dumps(report, indent=2))

    training, checkpoint = report["training"], report["checkpoint"]
    print(f"\n== training ({training['frames']} frames, default preset)")
    print(f"environment frames/s (end to end): {training['frames_per_second']:.1f}")
    print(f"updates/s (end to end):             {training['updates_per_second']:.1f}")
    print(f"one update step:                    {training['ms_per_update_step']:.1f} ms")
    print("time per iteration:")
    total = sum(training["ms_per_iteration"].values())
    for phase, ms in training["ms_per_iteration"].items():
        print(f"  {phase:<22} {ms:8.1f} ms  {100 * ms / total:5.1f}%")
    print(f"checkpointing: {100 * training['checkpoint_share_of_wall_time']:.2f}% of wall time")
    print(f"\n== checkpoint with {checkpoint['transitions']} Pendulum transitions")
    print(f"save: {checkpoint['save_seconds']:.2f} s")
    print(f"verify + load: {checkpoint['verify_and_load_seconds']:.2f} s")
    print(f"size: {checkpoint['size_mb']:.1f} MB")
    collection = dict(report["collection"])
    raw = collection.pop("raw_gym_steps_per_second")
    print(f"\n== collection on Pendulum-v1 (raw Gymnasium steps/s: {raw:.0f})")
    print(f"  {'mode':<10} {'collector frames/s':>19} {'of raw':>7} {'training frames/s':>18}")
    for name, rates in collection.items():
        if isinstance(rates, str):
            print(f"  {name:<10} {rates}")
            continue
        collect = rates["collector_frames_per_second"]
        training_fps = rates["training_frames_per_second"]
        print(f"  {name:<10} {collect:19.0f} {collect / raw:7.1%} {training_fps:18.1f}")
    print(f"\nresults: {run_dir / 'bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
