"""On a machine with CUDA: ``sac_halfcheetah`` at one update per frame, eager, compiled and
with CUDA graphs, beside Stable-Baselines3's SAC with the same settings on the same GPU; the
Atari presets in a short run each."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from rl_app.checks import load_config
from rl_app.run import train
from tools.bench.shared import phase_seconds
from tools.sb3_baseline import run_sb3_sac

# sac_halfcheetah at one update per frame on a GPU (LeanRL publishes 725 frames/s for its
# compiled + CUDA-graph SAC on an H100, and 127 for CleanRL's eager one).
GPU_VARIANTS = {
    "eager": [],
    "compiled": ["optim.compile=true"],
    "compiled + CUDA graphs": ["optim.compile=true", "optim.cudagraphs=true"],
    "compiled + CUDA graphs, replay on the GPU": [
        "optim.compile=true", "optim.cudagraphs=true", "replay.device=cuda",
    ],
}  # fmt: skip
GPU_FRAMES, GPU_RANDOM_FRAMES = 20_000, 5_000
# The Atari presets, each in a short run with a small buffer: frames/s and ms per update.
GPU_ATARI_PRESETS = ("dqn_atari", "dqn_atari100k")
GPU_ATARI_FRAMES, GPU_ATARI_RANDOM_FRAMES, GPU_ATARI_CAPACITY = 4_000, 1_000, 20_000


def gpu_training(
    preset: str, frames: int, random_frames: int, settings: list[str], run_dir: Path
) -> dict[str, float]:
    """``preset`` trained on the GPU for ``frames`` frames, evaluated once at the end:
    end-to-end frames/s (a compile included) and the updating phase's speed."""
    config = load_config(
        preset,
        ["device=cuda", f"collector.total_frames={frames}",
         f"collector.init_random_frames={random_frames}", "logger.backend=none",
         f"eval.interval_frames={frames}", "eval.episodes=1", f"run_dir={run_dir}", *settings],
    )  # fmt: skip
    started = time.perf_counter()
    result = train(config)
    wall = time.perf_counter() - started
    updating = phase_seconds(result.seconds_per_phase, "updating")
    return {
        "frames_per_second": result.frames / wall,
        "update_steps_per_second": result.updates / updating,
        "ms_per_update_step": 1000 * updating / result.updates,
    }


def bench_gpu(run_dir: Path) -> dict[str, Any]:
    """Each of ``GPU_VARIANTS`` trains ``sac_halfcheetah`` for ``GPU_FRAMES`` frames, and
    each of ``GPU_ATARI_PRESETS`` trains for ``GPU_ATARI_FRAMES`` frames."""
    if not torch.cuda.is_available():
        return {"not measured": "no CUDA GPU here"}
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name()}
    for name, settings in GPU_VARIANTS.items():
        report[name] = gpu_training(
            "sac_halfcheetah", GPU_FRAMES, GPU_RANDOM_FRAMES, settings,
            run_dir / name.replace(" ", "_"),
        )  # fmt: skip
    sb3 = run_sb3_sac(0, GPU_FRAMES, GPU_RANDOM_FRAMES, 3600, "HalfCheetah-v5", "cuda")
    report["stable-baselines3"] = {"frames_per_second": sb3["frames_per_second"]}
    for preset in GPU_ATARI_PRESETS:
        report[preset] = gpu_training(
            preset, GPU_ATARI_FRAMES, GPU_ATARI_RANDOM_FRAMES,
            [f"replay.capacity={GPU_ATARI_CAPACITY}"], run_dir / preset,
        )  # fmt: skip
    return report


def print_gpu(gpu: dict[str, Any]) -> None:
    print("\n== GPU: sac_halfcheetah, one update per frame (LeanRL: 725 frames/s with compile "
          "and CUDA graphs on an H100; CleanRL eager: 127)")  # fmt: skip
    if "not measured" in gpu:
        print(f"  not measured: {gpu['not measured']}")
        return
    print(f"  {gpu['gpu']}")
    sb3 = gpu["stable-baselines3"]["frames_per_second"]
    for name in GPU_VARIANTS:
        rates = gpu[name]
        print(f"  {name:<42} {rates['frames_per_second']:7.1f} frames/s end to end "
              f"({rates['frames_per_second'] / sb3:.2f}x SB3), "
              f"{rates['ms_per_update_step']:6.2f} ms per update")  # fmt: skip
    print(f"  {'Stable-Baselines3 SAC, same settings':<42} {sb3:7.1f} frames/s end to end")
    print(f"  Atari presets, {GPU_ATARI_FRAMES} frames each (learning from frame "
          f"{GPU_ATARI_RANDOM_FRAMES}, {GPU_ATARI_CAPACITY:,}-transition buffer):")  # fmt: skip
    for preset in GPU_ATARI_PRESETS:
        rates = gpu[preset]
        print(f"  {preset:<42} {rates['frames_per_second']:7.1f} frames/s end to end, "
              f"{rates['ms_per_update_step']:7.2f} ms per update")  # fmt: skip
