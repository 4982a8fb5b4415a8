"""One SAC update step of the default preset in each speed variant, against its FLOP bound,
and in fresh processes with glibc's allocator and with jemalloc."""

from __future__ import annotations

import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rl_app.algorithms import make_algorithm
from rl_app.checks import load_config
from rl_app.envs import make_env
from rl_app.replay import TRAJECTORY_KEY, make_replay_buffer
from rl_app.upstream.torch import MatmulFlops
from tools.bench.shared import random_play

EAGER = "vmap-free Q-nets + fused Adam, eager"  # the variant whose FLOPs are counted
INDUCTOR_SPLIT = "compiled loss, inductor's split"
# Update variants measured side by side: each lever alone against TorchRL's defaults.
UPDATE_VARIANTS = {
    "TorchRL defaults (vmap, Adam)": [
        "sac.vmap_qnets=true", "optim.fused_adam=false", "optim.compile=false"],
    "vmap-free Q-nets": ["sac.vmap_qnets=false", "optim.fused_adam=false", "optim.compile=false"],
    "fused Adam": ["sac.vmap_qnets=true", "optim.fused_adam=true", "optim.compile=false"],
    EAGER: ["optim.compile=false"],
    "rl_app defaults (compiled loss)": [],
    # inductor's own forward/backward split (see upstream.EAGER_SPLIT), for what ours is worth
    INDUCTOR_SPLIT: [],
    # The value targets, each next to the default TD(0) (EAGER).
    "n-step targets (nstep)": ["optim.target=nstep", "optim.compile=false"],
    "TD(lambda) targets (td_lambda)": ["optim.target=td_lambda", "optim.compile=false"],
}  # fmt: skip
UPDATE_ROUNDS, UPDATES_PER_ROUND = 10, 20
UPDATE_PLAY_FRAMES = 2_000  # random play the update's batch is sampled from
JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")


def update_step(overrides: list[str], inductor_split: bool = False) -> Callable[[], Any]:
    """One update of a SAC of the default preset (with ``overrides``) on a batch sampled as
    training samples it (``[slices, slice_len]`` from the preset's slice sampler, so that a
    multi-step target runs over slices) from random play. ``inductor_split``: the loss
    compiled with inductor's own split into forward and backward instead of ours."""
    config = load_config("default", ["logger.backend=none", *overrides])
    torch.set_num_threads(config.threads)
    env = make_env(config.env, config.seed)
    algorithm = make_algorithm(config, env, torch.device("cpu"))
    if inductor_split:
        algorithm.compute_losses = torch.compile(algorithm.loss, options={"fallback_random": True})
    play = random_play(env, UPDATE_PLAY_FRAMES)
    with tempfile.TemporaryDirectory() as scratch:
        buffer = make_replay_buffer(config.replay, Path(scratch), config.seed)
        buffer.extend(play.select(*algorithm.replay_keys(), TRAJECTORY_KEY))
        batch = buffer.sample_batches(config.optim.batch_size, 1)[0].clone()
    return functools.partial(algorithm.update, batch)


def seconds_per_update(update: Callable[[], Any]) -> float:
    """One round: the mean time of ``UPDATES_PER_ROUND`` calls of ``update``."""
    started = time.perf_counter()
    for _ in range(UPDATES_PER_ROUND):
        update()
    return (time.perf_counter() - started) / UPDATES_PER_ROUND


def bench_update(base: list[str], matmul_rate: float) -> dict[str, Any]:
    """One SAC update step of the default preset in each variant, interleaved round by
    round (medians), against its FLOP bound: the matrix-product FLOPs the update really
    runs, at the measured matmul rate."""
    updates, first_seconds, flops = {}, {}, {}
    for name, overrides in UPDATE_VARIANTS.items():
        updates[name] = update_step([*base, *overrides], inductor_split=name == INDUCTOR_SPLIT)
        started = time.perf_counter()
        updates[name]()
        first_seconds[name] = time.perf_counter() - started  # compiled: the compile
        for _ in range(5):
            updates[name]()
        if "optim.compile=false" in overrides:  # a compiled graph hides its operators
            with MatmulFlops() as counter:
                updates[name]()
            flops[name] = counter.flops
    bound = flops[EAGER] / matmul_rate
    times: dict[str, list[float]] = {name: [] for name in updates}
    for _ in range(UPDATE_ROUNDS):
        for name, update in updates.items():
            times[name].append(seconds_per_update(update))
    baseline = statistics.median(times["TorchRL defaults (vmap, Adam)"])
    report: dict[str, Any] = {
        "update_matmul_mflop": flops[EAGER] / 1e6,
        "flop_bound_ms": 1000 * bound,
    }
    for name, samples in times.items():
        step = statistics.median(samples)
        report[name] = {
            "matmul_mflop": flops[name] / 1e6 if name in flops else None,
            "ms_per_update_step": 1000 * step,
            "ratio_to_torchrl_defaults": step / baseline,
            "ratio_to_flop_bound": step / bound,
            "first_update_seconds": first_seconds[name],
        }
    report["allocator"] = bench_allocator(base)
    return report


def default_update_ms(overrides: list[str]) -> float:
    """The median time of the default update, for :func:`bench_allocator`'s processes."""
    update = update_step(overrides)
    for _ in range(10):
        update()
    return 1000 * statistics.median(seconds_per_update(update) for _ in range(UPDATE_ROUNDS))


def bench_allocator(base: list[str], rounds: int = 3) -> dict[str, Any]:
    """The default update in fresh processes with glibc's allocator and with jemalloc
    preloaded, alternating; medians. jemalloc is Debian's libjemalloc2, when installed."""
    if not JEMALLOC.exists():
        return {"jemalloc": f"not measured: {JEMALLOC} is not installed (apt install libjemalloc2)"}
    code = f"import tools.bench.update as b; print(b.default_update_ms({base!r}))"
    times: dict[str, list[float]] = {"glibc": [], "jemalloc": []}
    for _ in range(rounds):
        for name, preload in (("glibc", None), ("jemalloc", str(JEMALLOC))):
            env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
            if preload:
                env["LD_PRELOAD"] = preload
            done = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            )
            times[name].append(float(done.stdout.split()[-1]))
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    return {**{f"{name}_ms": ms for name, ms in medians.items()},
            "jemalloc_to_glibc": medians["jemalloc"] / medians["glibc"]}  # fmt: skip


def print_update(update: dict[str, Any]) -> None:
    print("\n== SAC update step (default preset: batch 256, 2x256, two Q-nets; medians)")
    print(f"FLOP bound: {update['flop_bound_ms']:.1f} ms ({update['update_matmul_mflop']:.0f} "
          "MFLOP of matrix products, counted as they run)")  # fmt: skip
    for name in UPDATE_VARIANTS:
        step = update[name]
        print(f"  {name:<38} {step['ms_per_update_step']:6.1f} ms  "
              f"{step['ratio_to_torchrl_defaults']:.2f}x TorchRL's defaults  "
              f"{step['ratio_to_flop_bound']:.2f}x the bound  "
              f"(first update {step['first_update_seconds']:.1f} s)")  # fmt: skip
    allocator = update["allocator"]
    if "jemalloc_to_glibc" in allocator:
        glibc, jemalloc = allocator["glibc_ms"], allocator["jemalloc_ms"]
        print(f"  allocator, fresh processes: glibc {glibc:.1f} ms, jemalloc {jemalloc:.1f} ms "
              f"({allocator['jemalloc_to_glibc']:.2f}x)")  # fmt: skip
    else:
        print(f"  allocator: {allocator['jemalloc']}")
