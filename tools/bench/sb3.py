"""The same SAC workload as Stable-Baselines3, interleaved: wall time and final returns."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rl_app.checks import load_config
from rl_app.play import load_policy
from rl_app.run import train
from tools.bench.shared import BENCH_CAPACITY
from tools.sb3_baseline import evaluate_on_fixed_seeds, run_sb3_sac

# The matched workload: Pendulum-v1, 20,000 frames, one update per frame from frame 1,000,
# batch 256, two 256-unit hidden layers, two Q-nets, a 1e6 buffer, one torch thread. Ours
# steps its env in one worker process (async collection) while the learner updates with its
# compiled loss (the compile counts in its wall time).
SB3_WORKLOAD = {"frames": 20_000, "learning_starts": 1_000}
SB3_ROUNDS = 2


def run_ours(seed: int, run_dir: Path, base: list[str]) -> dict[str, Any]:
    """Our trainer on the matched workload; wall time of the training loop, the sum of its
    phases' times (construction excluded, as for SB3), then the final policy (the run's
    last checkpoint) scored on the fixed seeds."""
    frames = SB3_WORKLOAD["frames"]
    config = load_config(
        "default",
        [*base, f"seed={seed}", f"collector.total_frames={frames}",
         f"collector.init_random_frames={SB3_WORKLOAD['learning_starts']}",
         "collector.mode=async", "collector.workers=1", f"replay.capacity={BENCH_CAPACITY}",
         "optim.compile=true",
         f"eval.interval_frames={frames}", f"run_dir={run_dir}"],
    )  # fmt: skip
    wall = sum(train(config).seconds_per_phase.values())
    policy = load_policy(run_dir, checkpoint="last")
    returns = evaluate_on_fixed_seeds(deterministic_actor(policy), "Pendulum-v1")
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


def print_sb3(sb3: dict[str, Any]) -> None:
    print(f"\n== against Stable-Baselines3 (Pendulum-v1, {SB3_WORKLOAD['frames']} frames, "
          f"UTD 1, batch 256; {SB3_ROUNDS} runs each, interleaved; medians)")  # fmt: skip
    print(f"  {'':<18} {'wall s':>8} {'frames/s':>9} {'final eval (10 fixed seeds)':>28}")
    for impl, medians in sb3["medians"].items():
        evals = ", ".join(f"{row['eval_mean']:.0f}" for row in sb3["runs"][impl])
        print(f"  {impl:<18} {medians['wall_seconds']:8.1f} {medians['frames_per_second']:9.1f} "
              f"{medians['eval_mean']:10.1f} (runs: {evals})")  # fmt: skip
    print(f"  wall time, ours / SB3: {sb3['wall_time_ratio_ours_to_sb3']:.2f}x")
