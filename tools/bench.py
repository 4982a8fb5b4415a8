"""``make bench`` (``python -m tools.bench``): measured speed, written to ``bench.json``.

Sections, each measured in the same process, one after the other:
- machine: platform, cores, versions, and the measured float32 matmul rate of one thread;
- update: one SAC update step of the default networks, eager and with ``optim.compile``,
  next to its FLOP bound (the update's matrix-product FLOPs, from the network sizes, at the
  measured matmul rate);
- training: the default preset with a 1e6-capacity memmap buffer (shortened to
  ``BENCH_FRAMES`` frames unless overridden with ``ARGS="collector.total_frames=..."``):
  environment frames/s, updates/s and the mean time per iteration of each phase of the
  loop, with prioritized slice sampling + priority writes as a share of the iteration;
- checkpoint: save, verify-and-load time and size with a 100k-transition Pendulum buffer,
  and checkpointing's share of training time at the default evaluation interval;
- collection: frames/s of the direct, sync and async collectors (1 and 2 workers) and of
  1 and 2 SLURM collection jobs (distributed, when SLURM is here) acting with the SAC
  actor, next to the raw Gymnasium step rate of the same env (the ceiling),
  and each mode's end-to-end training frames/s at the default update-to-data ratio;
- sb3: the same SAC workload as Stable-Baselines3 (``SB3_WORKLOAD``; ours with async
  collection and the compiled loss), run interleaved
  (ours, SB3, ours, SB3), each final agent scored on the same 10 fixed reset seeds; medians
  and the wall-time ratio. SB3 runs in its own virtual environment (``.venv-sb3``).

Not part of the test suite: timings depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torchrl
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.envs.utils import ExplorationType, RandomPolicy, set_exploration_type

from rl_app.algorithms import make_algorithm
from rl_app.checkpointing import disk_size, verify_checkpoint
from rl_app.collection import WeightSync, decide_devices, make_collector
from rl_app.config import Config, ConfigError, load_config
from rl_app.envs import make_env
from rl_app.loop import PHASES, build_run, run_iterations, train
from rl_app.replay import TRAJECTORY_KEY
from tools.sb3_baseline import evaluate_on_fixed_seeds, run_sb3_sac

BENCH_FRAMES = 6_000
BENCH_CAPACITY = 1_000_000
CHECKPOINT_BUFFER = 100_000


def matmul_flops_per_second(size: int = 256, repeats: int = 400) -> float:
    """float32 ``size``-cubed matrix products per second, on this process's threads."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(20):
        a @ b
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - started)


def machine_description(threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchrl": torchrl.__version__,
        "threads": threads,
        "matmul_256_gflops": matmul_flops_per_second() / 1e9,
    }


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.machine()


def sac_update_flops(observation_dim: int, action_dim: int, hidden: list[int], batch: int) -> int:
    """FLOPs of the matrix products in one SAC update (2 per multiply-add).

    With ``F`` one forward pass of an MLP, a backward pass costs about ``2F`` (input and
    weight gradients): the actor loss runs the actor forward and backward (3 actor F) and
    both Q-nets forward with input gradients (2 x 2 Q F); the value target runs the actor
    on the next observation (1 actor F) and both target Q-nets (2 Q F); the Q loss runs both
    Q-nets forward and backward (2 x 3 Q F). In all: 4 actor F + 12 Q F."""

    def forward(inputs: int, outputs: int) -> int:
        sizes = [inputs, *hidden, outputs]
        return 2 * batch * sum(a * b for a, b in itertools.pairwise(sizes))

    actor = forward(observation_dim, 2 * action_dim)
    qvalue = forward(observation_dim + action_dim, 1)
    return 4 * actor + 12 * qvalue


def bench_update(config: Config, matmul_rate: float, repeats: int = 200) -> dict[str, Any]:
    """One SAC update step on a real sampled batch, eager and compiled, against its FLOP
    bound."""
    env = make_env(config.env, config.seed)
    flops = sac_update_flops(
        env.observation_spec["observation"].shape[-1],
        env.action_spec.shape[-1],
        config.network.hidden_sizes,
        config.optim.batch_size,
    )
    bound = flops / matmul_rate
    report: dict[str, Any] = {"update_matmul_mflop": flops / 1e6, "flop_bound_ms": 1000 * bound}
    batch = env.rollout(config.optim.batch_size, break_when_any_done=False)  # one for both
    for name, compile in (("eager", False), ("compiled", True)):
        optim = dataclasses.replace(config.optim, compile=compile)
        algorithm = make_algorithm(
            dataclasses.replace(config, optim=optim), env, torch.device("cpu")
        )
        started = time.perf_counter()
        algorithm.update(batch.clone())
        first = time.perf_counter() - started
        for _ in range(10):
            algorithm.update(batch.clone())
        started = time.perf_counter()
        for _ in range(repeats):
            algorithm.update(batch.clone())
        step = (time.perf_counter() - started) / repeats
        report[name] = {
            "ms_per_update_step": 1000 * step,
            "ratio_to_flop_bound": step / bound,
            "first_update_seconds": first,  # compiled: the compile, less with a warm cache
        }
    return report


def bench_training(config: Config) -> dict[str, Any]:
    started = time.perf_counter()
    result = train(config)
    wall = time.perf_counter() - started
    iterations = result.frames // config.collector.frames_per_batch
    seconds = result.seconds_per_phase
    checkpoint_share = seconds["saving a checkpoint"] / wall
    iteration_seconds = sum(seconds.values())
    replay_seconds = seconds["sampling"] + seconds["writing priorities"]
    return {
        "replay_capacity": config.replay.capacity,
        "sampling_and_priority_share_of_iteration": replay_seconds / iteration_seconds,
        "run_dir": str(result.run_dir),
        "frames": result.frames,
        "wall_seconds": wall,
        "frames_per_second": result.frames / wall,
        "updates_per_second": result.updates / wall,
        "ms_per_update_step": 1000 * seconds["updating"] / max(result.updates, 1),
        "ms_per_iteration": {p: 1000 * seconds[p] / iterations for p in PHASES},
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
BATCHED_ENVS = 8
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
}
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
        if name.startswith("distributed") and shutil.which("sbatch") is None:
            report[name] = "not measured: no SLURM here (make slurm-up starts a local cluster)"
            continue
        mode_overrides = [
            *overrides, *settings, f"run_dir={run_dir / name}", "collector.init_random_frames=0",
        ]  # fmt: skip
        collecting = load_config("default", mode_overrides)
        raw = raw_gym_steps_per_second(collecting.env.name, collecting.env.num_envs)
        collect_fps = collector_frames_per_second(collecting)
        training = load_config(
            "default",
            [*mode_overrides, f"collector.total_frames={MODE_TRAINING_FRAMES}",
             f"run_dir={run_dir / (name + '-training')}", "eval.interval_frames=1000000"],
        )  # fmt: skip
        started = time.perf_counter()
        result = train(training)
        report[name] = {
            "raw_gym_steps_per_second": raw,
            "collector_frames_per_second": collect_fps,
            "training_frames_per_second": result.frames / (time.perf_counter() - started),
        }
    return report


# The matched workload: Pendulum-v1, 20,000 frames, one update per frame from frame 1,000,
# batch 256, two 256-unit hidden layers, two Q-nets, a 1e6 buffer, one torch thread. Ours
# steps its env in one worker process (async collection) while the learner updates with its
# compiled loss (the compile counts in its wall time).
SB3_WORKLOAD = {"frames": 20_000, "learning_starts": 1_000}
SB3_ROUNDS = 2


def run_ours(seed: int, run_dir: Path, base: list[str]) -> dict[str, Any]:
    """Our trainer on the matched workload; wall time of the training loop (construction
    excluded, as for SB3), then the final policy scored on the fixed seeds."""
    frames = SB3_WORKLOAD["frames"]
    config = load_config(
        "default",
        [*base, f"seed={seed}", f"collector.total_frames={frames}",
         f"collector.init_random_frames={SB3_WORKLOAD['learning_starts']}",
         "collector.mode=async", "collector.workers=1", f"replay.capacity={BENCH_CAPACITY}",
         "optim.compile=true",
         f"eval.interval_frames={frames}", f"run_dir={run_dir}"],
    )  # fmt: skip
    run = build_run(config)
    try:
        started = time.perf_counter()
        run_iterations(run)
        wall = time.perf_counter() - started
        returns = evaluate_on_fixed_seeds(deterministic_actor(run.algorithm.policy), "Pendulum-v1")
    finally:
        run.close()
    return {"impl": "rl_app", "seed": seed, "frames": frames, "wall_seconds": wall,
            "frames_per_second": frames / wall, "eval_returns": returns,
            "eval_mean": statistics.mean(returns)}  # fmt: skip


def deterministic_actor(policy: Any) -> Callable[[np.ndarray], np.ndarray]:
    def act(observation: np.ndarray) -> np.ndarray:
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            step = policy(TensorDict({"observation": torch.as_tensor(observation)}, []))
        return step["action"].numpy()

    return act


def bench_against_sb3(base: list[str], run_dir: Path) -> dict[str, Any]:
    """Ours and SB3 interleaved, ``SB3_ROUNDS`` times each, seeds 0, 1, ..."""
    runs: dict[str, list[dict[str, Any]]] = {"rl_app": [], "stable-baselines3": []}
    for seed in range(SB3_ROUNDS):
        runs["rl_app"].append(run_ours(seed, run_dir / f"ours-{seed}", base))
        runs["stable-baselines3"].append(
            run_sb3_sac(seed, SB3_WORKLOAD["frames"], SB3_WORKLOAD["learning_starts"], 3600)
        )
    medians = {
        impl: {key: statistics.median(row[key] for row in rows)
               for key in ("wall_seconds", "frames_per_second", "eval_mean")}
        for impl, rows in runs.items()
    }  # fmt: skip
    return {
        "workload": SB3_WORKLOAD,
        "runs": runs,
        "medians": medians,
        "wall_time_ratio_ours_to_sb3": (
            medians["rl_app"]["wall_seconds"] / medians["stable-baselines3"]["wall_seconds"]
        ),
    }


def main(argv: list[str]) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    overrides = [
        f"collector.total_frames={BENCH_FRAMES}", f"replay.capacity={BENCH_CAPACITY}",
        "logger.backend=none", *argv,
    ]  # fmt: skip
    if not any(item.startswith("run_dir=") for item in overrides):
        overrides.append(f"run_dir=runs/bench-{stamp}")
    try:
        config = load_config("default", overrides)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    run_dir = Path(config.run_dir)

    machine = machine_description(config.threads)
    report: dict[str, Any] = {
        "machine": machine,
        "update": bench_update(config, machine["matmul_256_gflops"] * 1e9),
        "training": bench_training(config),
    }
    report["checkpoint"] = bench_checkpoint(
        load_config("default", overrides), run_dir / "checkpoint-bench"
    )
    base = [
        item for item in overrides if not item.startswith(("run_dir=", "collector.total_frames="))
    ]
    report["collection"] = bench_collection(base, run_dir / "collection")
    (run_dir / "bench.json").write_text(json.dumps(report, indent=2))  # each section lands
    report["sb3"] = bench_against_sb3(
        [item for item in base if not item.startswith("replay.capacity=")], run_dir / "sb3"
    )
    (run_dir / "bench.json").write_text(json.dumps(report, indent=2))

    training, checkpoint, update = report["training"], report["checkpoint"], report["update"]
    print(f"\n== machine: {machine['cpu_model']}, {machine['cores']} cores, one torch thread: "
          f"{machine['matmul_256_gflops']:.0f} GFLOP/s (256x256x256 float32 matmul)")  # fmt: skip
    print(f"\n== SAC update step (default networks, batch {config.optim.batch_size})")
    print(f"FLOP bound: {update['flop_bound_ms']:.1f} ms ({update['update_matmul_mflop']:.0f} "
          "MFLOP of matrix products)")  # fmt: skip
    for name in ("eager", "compiled"):
        step = update[name]
        print(f"{name + ':':<11} {step['ms_per_update_step']:.1f} ms, "
              f"{step['ratio_to_flop_bound']:.2f}x the bound "
              f"(first update {step['first_update_seconds']:.1f} s)")  # fmt: skip
    print(f"\n== training ({training['frames']} frames, default preset, "
          f"{training['replay_capacity']:,}-transition memmap buffer)")  # fmt: skip
    print(f"environment frames/s (end to end): {training['frames_per_second']:.1f}")
    print(f"updates/s (end to end):             {training['updates_per_second']:.1f}")
    print(f"one update step:                    {training['ms_per_update_step']:.1f} ms")
    print("time per iteration:")
    total = sum(training["ms_per_iteration"].values())
    for phase, ms in training["ms_per_iteration"].items():
        print(f"  {phase:<22} {ms:8.1f} ms  {100 * ms / total:5.1f}%")
    share = training["sampling_and_priority_share_of_iteration"]
    print(f"prioritized slice sampling + priority writes: {share:.1%} of an iteration")
    print(f"checkpointing: {100 * training['checkpoint_share_of_wall_time']:.2f}% of wall time")
    print(f"\n== checkpoint with {checkpoint['transitions']} Pendulum transitions")
    print(f"save: {checkpoint['save_seconds']:.2f} s")
    print(f"verify + load: {checkpoint['verify_and_load_seconds']:.2f} s")
    print(f"size: {checkpoint['size_mb']:.1f} MB")
    print("\n== collection on Pendulum-v1, acting with the SAC actor (raw: Gymnasium alone with "
          "as many envs in one process, random actions)")  # fmt: skip
    print(f"  {'mode':<14} {'raw steps/s':>12} {'collector frames/s':>19} {'of raw':>7} "
          f"{'training frames/s':>18}")  # fmt: skip
    for name, rates in report["collection"].items():
        if isinstance(rates, str):
            print(f"  {name:<14} {rates}")
            continue
        raw, collect = rates["raw_gym_steps_per_second"], rates["collector_frames_per_second"]
        print(f"  {name:<14} {raw:12.0f} {collect:19.0f} {collect / raw:7.1%} "
              f"{rates['training_frames_per_second']:18.1f}")  # fmt: skip
    sb3 = report["sb3"]
    print(f"\n== against Stable-Baselines3 (Pendulum-v1, {SB3_WORKLOAD['frames']} frames, "
          f"UTD 1, batch 256; {SB3_ROUNDS} runs each, interleaved; medians)")  # fmt: skip
    print(f"  {'':<18} {'wall s':>8} {'frames/s':>9} {'final eval (10 fixed seeds)':>28}")
    for impl, medians in sb3["medians"].items():
        evals = ", ".join(f"{row['eval_mean']:.0f}" for row in sb3["runs"][impl])
        print(f"  {impl:<18} {medians['wall_seconds']:8.1f} {medians['frames_per_second']:9.1f} "
              f"{medians['eval_mean']:10.1f} (runs: {evals})")  # fmt: skip
    print(f"  wall time, ours / SB3: {sb3['wall_time_ratio_ours_to_sb3']:.2f}x")
    print(f"\nresults: {run_dir / 'bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
