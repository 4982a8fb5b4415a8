"""One SAC update step of the default preset in each speed variant, against its FLOP bound,
and in fresh processes with glibc's allocator and with jemalloc; one Nature-CNN DQN update
of the Atari-100k preset in each speed variant, with and without random shifts."""

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

from rl_app.algorithms import Algorithm, make_algorithm
from rl_app.checks import load_config
from rl_app.envs import FRAME_KEY, PIXELS_KEY, make_env
from rl_app.replay import (
    TRAJECTORY_KEY,
    allocate_storage,
    make_replay_buffer,
    nstep_gamma,
    stored_transition,
)
from rl_app.upstream.torch import MatmulFlops
from tools.bench.shared import random_play, random_play_batches

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
        algorithm.loss.compile(options={"fallback_random": True})
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
    report["nature_cnn"] = bench_nature_update([])
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
    print_nature_update(update["nature_cnn"])


# The Nature-CNN update of the Atari-100k preset (batch 30: 3 slices of 10, n-step targets
# along the slices, Huber loss, Adam, a target copy after every update).
NATURE_PRESET = "dqn_atari100k"
NATURE_GOAL_MS = 25.0
NATURE_PLAY_FRAMES = 320  # random Pong play the batch is sampled from
NATURE_ROUNDS, NATURE_UPDATES_PER_ROUND = 7, 5
NATURE_BEFORE = "before: per-pixel gather, online-net pick"
NATURE_DEFAULT = "+ channels-last: rl_app defaults"
NATURE_TWO_THREADS = "two threads"
STACKS = (PIXELS_KEY, ("next", PIXELS_KEY))


def gather_shift(pixels: torch.Tensor, pad: int) -> torch.Tensor:
    """``rl_app.replay.frames.random_shift`` as it was before its row copies: one gather
    per pixel of the clamped, shifted coordinates. The same shifts drawn give the same
    pixels (the tests' reference)."""
    batch_shape, (height, width) = pixels.shape[:-3], pixels.shape[-2:]
    images = pixels.reshape(-1, *pixels.shape[-3:])
    shifts = torch.randint(-pad, pad + 1, (len(images), 2), device=pixels.device)
    rows = (torch.arange(height, device=pixels.device) + shifts[:, :1]).clamp(0, height - 1)
    columns = (torch.arange(width, device=pixels.device) + shifts[:, 1:]).clamp(0, width - 1)
    shifted = images[
        torch.arange(len(images), device=pixels.device)[:, None, None, None],
        torch.arange(images.shape[1], device=pixels.device)[None, :, None, None],
        rows[:, None, :, None],
        columns[:, None, None, :],
    ]
    return shifted.reshape(*batch_shape, *shifted.shape[1:])


def as_before(algorithm: Algorithm, pad: int) -> Callable[[Any], Any]:
    """The update as rl_app made it before: the gather shift, and the loss running double
    DQN's pick of the next action by the online network (one forward pass more)."""
    algorithm.loss.double_dqn = True

    def update(batch: Any) -> Any:
        for key in STACKS if pad else ():
            batch[key] = gather_shift(batch[key], pad)
        metrics = algorithm.gradient_step(batch)  # the step without DQN's own shift
        algorithm.target_updater.step()
        return metrics

    return update


def as_before_but_row_copies(algorithm: Algorithm, pad: int) -> Callable[[Any], Any]:
    """The update as before with today's shift: double DQN's online pick."""
    algorithm.loss.double_dqn = True
    return algorithm.update


def without_mkldnn(algorithm: Algorithm, pad: int) -> Callable[[Any], Any]:
    """The default update with oneDNN's convolutions off (ATen's im2col and matmul)."""

    def update(batch: Any) -> Any:
        with torch.backends.mkldnn.flags(enabled=False):
            return algorithm.update(batch)

    return update


def default_update(algorithm: Algorithm, pad: int) -> Callable[[Any], Any]:
    """The update as ``algorithm`` makes it."""
    return algorithm.update


# Nature-CNN update variants: settings, how the update is called, intra-op threads.
NatureVariant = tuple[list[str], Callable[[Algorithm, int], Callable[[Any], Any]], int]
NATURE_VARIANTS: dict[str, NatureVariant] = {
    NATURE_BEFORE: (["dqn.channels_last=false"], as_before, 1),
    "row-copy shift": (["dqn.channels_last=false"], as_before_but_row_copies, 1),
    "+ plain DQN's target (one forward pass fewer)": (
        ["dqn.channels_last=false"], default_update, 1),
    NATURE_DEFAULT: ([], default_update, 1),
    NATURE_TWO_THREADS: ([], default_update, 2),
    "oneDNN convolutions off": ([], without_mkldnn, 1),
    "compiled loss (optim.compile=true)": (["optim.compile=true"], default_update, 1),
}  # fmt: skip


def nature_batch(base: list[str]) -> Any:
    """A batch of the Atari-100k preset sampled as training samples it (stacks rebuilt
    from stored frames, one n-step transition per sampled slice) from random play."""
    config = load_config(NATURE_PRESET, [*base, "device=cpu", "replay.capacity=1000"])
    env = make_env(config.env, config.seed)
    keys = make_algorithm(config, env, torch.device("cpu")).replay_keys()
    with tempfile.TemporaryDirectory() as scratch:
        gamma = nstep_gamma(config.optim)
        buffer = make_replay_buffer(
            config.replay, Path(scratch), config.seed, env, keys=keys, nstep_gamma=gamma
        )
        allocate_storage(buffer, stored_transition(env, keys))
        frames = config.collector.frames_per_batch
        for play in random_play_batches(env, NATURE_PLAY_FRAMES, frames):
            buffer.extend(play.select(*keys, TRAJECTORY_KEY, FRAME_KEY))
        return buffer.sample_batches(config.optim.batch_size, 1)[0].clone()


def bench_nature_update(base: list[str]) -> dict[str, Any]:
    """One Nature-CNN update of the Atari-100k preset in each variant (one thread unless
    it names two), with and without random shifts, interleaved round by round (medians), against the
    update as it was before and the 25 ms goal."""
    base = [*base, "device=cpu", "threads=1", "logger.backend=none"]
    batch = nature_batch(base)
    torch.set_num_threads(1)
    updates, first_seconds = {}, {}
    for name, (overrides, wrap, threads) in NATURE_VARIANTS.items():
        torch.set_num_threads(threads)
        for shift in (0, load_config(NATURE_PRESET, []).dqn.random_shift):
            config = load_config(NATURE_PRESET, [*base, *overrides, f"dqn.random_shift={shift}"])
            env = make_env(config.env, config.seed)
            algorithm = make_algorithm(config, env, torch.device("cpu"))
            update = functools.partial(wrap(algorithm, shift), batch.clone())
            started = time.perf_counter()
            update()
            first_seconds[name, shift] = time.perf_counter() - started  # compiled: the compile
            for _ in range(3):
                update()
            updates[name, shift] = update
    # Wall time, and the CPU time of the process (both threads' where two run): on a
    # machine shared with other work, the second moves less with the load.
    wall: dict[tuple[str, int], list[float]] = {key: [] for key in updates}
    cpu: dict[tuple[str, int], list[float]] = {key: [] for key in updates}
    for _ in range(NATURE_ROUNDS):
        for key, update in updates.items():
            torch.set_num_threads(NATURE_VARIANTS[key[0]][2])
            started, started_cpu = time.perf_counter(), time.process_time()
            for _ in range(NATURE_UPDATES_PER_ROUND):
                update()
            wall[key].append((time.perf_counter() - started) / NATURE_UPDATES_PER_ROUND)
            cpu[key].append((time.process_time() - started_cpu) / NATURE_UPDATES_PER_ROUND)
    torch.set_num_threads(1)
    report: dict[str, Any] = {"goal_ms": NATURE_GOAL_MS, "batch_size": batch.numel()}
    for name, shift in updates:
        step, step_cpu = statistics.median(wall[name, shift]), statistics.median(cpu[name, shift])
        report.setdefault(name, {})[f"shift_{shift}"] = {
            "ms_per_update": 1000 * step,
            "cpu_ms_per_update": 1000 * step_cpu,
            "ratio_to_before": step / statistics.median(wall[NATURE_BEFORE, shift]),
            "cpu_ratio_to_before": step_cpu / statistics.median(cpu[NATURE_BEFORE, shift]),
            "first_update_seconds": first_seconds[name, shift],
        }
    return report


def print_nature_update(nature: dict[str, Any]) -> None:
    shifts = list(nature[NATURE_BEFORE])
    print(
        f"\n== Nature-CNN DQN update ({NATURE_PRESET}: {nature['batch_size']} n-step "
        "transitions, a dueling head, Huber loss, Adam, a target copy after every update; one "
        "thread unless named; medians; ratios against the first row, in the same run)"
    )
    titles = ["no shift" if key == "shift_0" else f"shifts of {key[6:]} px" for key in shifts]
    print(f"  {'variant':<48} " + "  ".join(f"{title:<33}" for title in titles))
    for name in NATURE_VARIANTS:
        cells = []
        for key in shifts:
            step = nature[name][key]
            wall = f"{step['ms_per_update']:6.1f} ms {step['ratio_to_before']:.2f}x"
            cpu = f"{step['cpu_ms_per_update']:5.1f} ms {step['cpu_ratio_to_before']:.2f}x"
            cells.append(f"{wall} (CPU {cpu})")
        first = max(nature[name][key]["first_update_seconds"] for key in shifts)
        compile_time = f"  first update {first:.0f} s" if first > 1 else ""
        print(f"  {name:<48} " + "  ".join(cells) + compile_time)
    goal, verdicts = nature["goal_ms"], []
    for name, threads in ((NATURE_DEFAULT, "one thread"), (NATURE_TWO_THREADS, "two threads")):
        wall = nature[name][shifts[-1]]["ms_per_update"]
        verdicts.append(f"{threads} {wall:.1f} ms, {'met' if wall <= goal else 'missed'}")
    print(f"  goal: the default update with shifts <= {goal:.0f} ms: {'; '.join(verdicts)}")
