"""``make bench`` (``python -m tools.bench``): measured speed, written to ``bench.json``.

Sections (``--only update,training,...`` picks some), measured one after the other:
- machine: platform, cores, versions, and the measured float32 matmul rate of one thread;
- update: one SAC update step of the default preset in each of ``UPDATE_VARIANTS`` (each
  speed lever alone, together, the compiled loss with our forward/backward split and with
  inductor's, and each value target), interleaved,
  next to its FLOP bound (the matrix-product FLOPs the update runs, counted as it runs, at
  the measured matmul rate), and the same update in fresh processes with glibc's
  allocator and with jemalloc;
- training: the default preset with a 1e6-capacity memmap buffer (shortened to
  ``BENCH_FRAMES`` frames unless overridden with ``ARGS="collector.total_frames=..."``):
  environment frames/s, updates/s and the mean time per iteration of each phase of the
  loop, with prioritized slice sampling + priority writes as a share of the iteration;
- checkpoint: save, verify-and-load time and size with a 100k-transition Pendulum buffer,
  and checkpointing's share of training time at the default evaluation interval;
- pixels: the ``dqn_atari`` preset at its 1M-slot capacity, its buffer filled from recorded
  Atari play: disk per stored transition, the learner's memory (RssAnon, RssFile) while
  sampling, batches/s of 32 stacked observation pairs (the loop's sampling, with and
  without the stacks), one Nature-CNN update on the CPU (and the Atari-100k preset's
  updates at that speed), checkpoint save, verify and load with the undo journal and its
  disk per evaluation interval, next to a whole copy of the buffer with its SHA-256;
- collection: frames/s of the direct, sync and async collectors (1 and 2 workers) and of
  1 and 2 SLURM collection jobs (distributed, when SLURM is here) acting with the SAC
  actor, next to the raw Gymnasium step rate of the same env (the ceiling),
  and each mode's end-to-end training frames/s at the default update-to-data ratio;
- sb3: the same SAC workload as Stable-Baselines3 (``SB3_WORKLOAD``; ours with async
  collection and the compiled loss), run interleaved
  (ours, SB3, ours, SB3), each final agent scored on the same 10 fixed reset seeds; medians
  and the wall-time ratio. SB3 runs in its own virtual environment (``.venv-sb3``);
- gpu (on a machine with CUDA): ``sac_halfcheetah`` at one update per frame, eager,
  compiled, and compiled with CUDA graphs (also with the replay data on the GPU); and
  ``dqn_atari`` and ``dqn_atari100k`` in a short run each: frames/s, ms per update.

Not part of the test suite: timings depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torchrl
from tensordict import TensorDict, TensorDictBase
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry
from torchrl.collectors import Collector
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, RandomPolicy, set_exploration_type

from rl_app.algorithms import make_algorithm
from rl_app.checkpointing import disk_size, file_sha256, verify_checkpoint
from rl_app.collection import WeightSync, decide_devices, make_collector
from rl_app.config import JOURNAL_DIR, REPLAY_DIR, Config, ConfigError, load_config
from rl_app.envs import FRAME_KEY, make_env
from rl_app.loop import PHASES, Run, run_iterations, updates_per_iteration
from rl_app.replay import TRAJECTORY_KEY, make_replay_buffer
from rl_app.replay.frames import RESET_STEP, STEP_KEY
from rl_app.replay.journal import restorable_from
from rl_app.run import build_run, train
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


class MatmulFlops(TorchDispatchMode):
    """Counts the FLOPs of every matrix product that runs inside it (torch's own formulas
    per operator: ``mm``, ``addmm``, ``bmm``, ...), whatever the code around them (vmap
    batches products into ``bmm``; a loop runs them one by one)."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = flop_registry.get(func._overloadpacket)
        if count is not None:
            self.flops += count(*args, **kwargs, out_val=out)
        return out


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


def random_play_batches(env: EnvBase, frames: int, frames_per_batch: int) -> Iterator[TensorDict]:
    """``frames`` real transitions of a random policy in ``env``, in the collector's batches
    of ``frames_per_batch``, with its trajectory ids (what the replay buffer keeps)."""
    collector = Collector(
        env, RandomPolicy(env.action_spec), frames_per_batch=frames_per_batch, total_frames=frames
    )
    yield from collector
    collector.shutdown()


def random_play(env: EnvBase, frames: int) -> TensorDict:
    """:func:`random_play_batches` in one batch."""
    (play,) = random_play_batches(env, frames, frames)
    return play


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
    code = f"import tools.bench as b; print(b.default_update_ms({base!r}))"
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
    updating = result.seconds_per_phase["updating"]
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
    for preset in GPU_ATARI_PRESETS:
        report[preset] = gpu_training(
            preset, GPU_ATARI_FRAMES, GPU_ATARI_RANDOM_FRAMES,
            [f"replay.capacity={GPU_ATARI_CAPACITY}"], run_dir / preset,
        )  # fmt: skip
    return report


def bench_training(config: Config) -> dict[str, Any]:
    started = time.perf_counter()
    result = train(config)
    wall = time.perf_counter() - started
    iterations = result.frames // config.collector.frames_per_batch
    seconds = result.seconds_per_phase
    checkpoint_share = seconds["saving a checkpoint"] / wall
    iteration_seconds = sum(seconds.values())
    replay_seconds = seconds["sampling"] + seconds["writing back"]
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
        play = random_play(make_env(config.env, config.seed), CHECKPOINT_BUFFER // 10)
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


# The dqn_atari preset at its full capacity, its buffer filled from real Atari frames.
PIXELS_PRESET = "dqn_atari"
PIXELS_SETTINGS = ["device=cpu", "threads=1", "logger.backend=none"]
PIXELS_PLAY_FRAMES = 20_000  # random play recorded once, stored again under fresh ids
PIXELS_SAMPLING_ROUNDS, PIXELS_CALLS_PER_ROUND = 5, 10
PIXELS_WARMUP_UPDATES, PIXELS_UPDATE_ROUNDS = 3, 3
ATARI100K_PRESET = "dqn_atari100k"
PIXELS_GOALS = {
    "disk_bytes_per_transition": 7_500,
    "rss_bytes": 3_000_000_000,
    "batches_per_second": 1_000,
    "save_seconds": 2.0,
    "extra_disk_per_checkpoint_to_interval_data": 2.0,
}


def recorded_atari_play(run: Run) -> list[TensorDictBase]:
    """``PIXELS_PLAY_FRAMES`` of random play in the run's game, in the loop's batches, kept
    as the buffer stores them (plus each observation's newest frame, for reset slots)."""
    env = make_env(run.config.env, run.config.seed)
    keys = [*run.algorithm.replay_keys(), TRAJECTORY_KEY, FRAME_KEY]
    frames_per_batch = run.config.collector.frames_per_batch
    return [
        batch.select(*keys)  # the frame stacks are dropped here, batch by batch
        for batch in random_play_batches(env, PIXELS_PLAY_FRAMES, frames_per_batch)
    ]


def replayed_play(chunks: list[TensorDictBase]) -> Iterator[TensorDictBase]:
    """The recorded ``chunks`` again and again, each pass under fresh trajectory ids: every
    pass stores new episodes, as collection does."""
    span = 1 + max(int(chunk[TRAJECTORY_KEY].max()) for chunk in chunks)
    for copy in itertools.count():
        for chunk in chunks:
            fresh = chunk.exclude(TRAJECTORY_KEY)
            fresh[TRAJECTORY_KEY] = chunk[TRAJECTORY_KEY] + copy * span
            yield fresh


def store_play(run: Run, play: Iterator[TensorDictBase], done: Callable[[int], bool]) -> int:
    """Store batches of ``play`` as the loop stores a collected batch (``buffer.extend``,
    reset slots included) until ``done(steps written)``; the steps written."""
    steps = 0
    while not done(steps):
        batch = next(play)
        run.buffer.extend(batch)
        steps += batch.numel()
    return steps


def files_on_disk(directory: Path) -> dict[str, int]:
    """Apparent size and disk blocks of the files under ``directory``."""
    files = [file.stat() for file in directory.rglob("*") if file.is_file()]
    return {
        "apparent_bytes": sum(stat.st_size for stat in files),
        "block_bytes": sum(stat.st_blocks * 512 for stat in files),
    }


def process_memory() -> dict[str, int]:
    """This process's resident memory by kind, in bytes (``/proc/self/status``)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {name: int(fields[name].split()[0]) * 1024
            for name in ("VmRSS", "RssAnon", "RssFile", "RssShmem")}  # fmt: skip


def mapped_resident_bytes(directory: Path) -> int:
    """Bytes of the files under ``directory`` that this process maps and holds resident
    (``/proc/self/smaps``): page cache, counted in RssFile."""
    prefix, inside, total = str(directory.resolve()), False, 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if not fields[0].endswith(":"):  # a mapping's header: its addresses ... its file
            inside = len(fields) == 6 and fields[5].startswith(prefix)
        elif fields[0] == "Rss:" and inside:
            total += int(fields[1]) * 1024
    return total


def run_updates(config: Config) -> int:
    """The updates a whole run of ``config`` makes: one iteration's worth after each
    collected batch from ``collector.init_random_frames`` on."""
    batch = config.collector.frames_per_batch
    first = max(1, math.ceil(config.collector.init_random_frames / batch))
    iterations = math.ceil(config.collector.total_frames / batch)
    return (iterations - first + 1) * updates_per_iteration(config)


def pixel_sampling(run: Run, play: Iterator[TensorDictBase]) -> dict[str, float]:
    """Batches/s of the loop's sampling: one sampler call for an iteration's updates, after
    that iteration's extend, which clears the slice sampler's cached scan of the storage's
    trajectories (the loop pays the scan every iteration). Also without frame stacks
    (sampling alone), and with stacks but no extend before the call (the scan cached).
    Interleaved round by round; medians."""
    config, buffer = run.config, run.buffer
    count = updates_per_iteration(config)

    def with_stacks() -> None:
        buffer.sample_batches(config.optim.batch_size, count)

    def sampling_alone() -> None:  # the sampler's draw and the storage's read of it
        buffer.storage[buffer.sampler.sample(buffer.storage, count * config.optim.batch_size)[0]]

    ways = {"with_stacks": (with_stacks, True), "sampling_alone": (sampling_alone, True),
            "with_stacks_scan_cached": (with_stacks, False)}  # fmt: skip
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(PIXELS_SAMPLING_ROUNDS):
        for name, (draw, extend_first) in ways.items():
            seconds = 0.0
            for _ in range(PIXELS_CALLS_PER_ROUND):
                if extend_first:
                    store_play(run, play, lambda steps: steps > 0)  # one collected batch
                started = time.perf_counter()
                draw()
                seconds += time.perf_counter() - started
            rates[name].append(count * PIXELS_CALLS_PER_ROUND / seconds)
    medians = {f"{name}_batches_per_second": statistics.median(r) for name, r in rates.items()}
    return {"batch_size": config.optim.batch_size, "batches_per_call": count, **medians}


def pixel_update(run: Run) -> dict[str, Any]:
    """One Nature-CNN update on a batch with its stacks (medians of rounds after warm-up
    updates), and what the Atari-100k preset's updates would take at that speed."""
    config = run.config
    batch = run.buffer.sample_batches(config.optim.batch_size, 1)[0]
    update = functools.partial(run.algorithm.update, batch)
    for _ in range(PIXELS_WARMUP_UPDATES):
        update()
    seconds = statistics.median(seconds_per_update(update) for _ in range(PIXELS_UPDATE_ROUNDS))
    updates = run_updates(load_config(ATARI100K_PRESET, []))
    return {"ms_per_update": 1000 * seconds, "atari100k_updates": updates,
            "atari100k_update_hours": updates * seconds / 3600}  # fmt: skip


def timed(work: Callable[[], Any]) -> tuple[Any, float]:
    """``work()``'s result and its wall time in seconds."""
    started = time.perf_counter()
    result = work()
    return result, time.perf_counter() - started


def pixel_checkpoints(
    run: Run, play: Iterator[TensorDictBase], bytes_per_transition: float
) -> dict[str, Any]:
    """Checkpoints of the full buffer: a first save (its checksums cover every slot written
    since the start), one evaluation interval of new frames (the journal that save
    starts), a second save (checksums of those frames' chunks only, as after each
    evaluation), then the first checkpoint verified and loaded (its journal undone, every
    chunk of the replay files checked)."""
    progress, checkpoints = run.progress, run.checkpoints
    journal_dir = run.run_dir / JOURNAL_DIR
    interval = run.config.eval.interval_frames
    first, first_seconds = timed(lambda: checkpoints.save(progress.frames, eval_reward=0.0))
    written, write_seconds = timed(lambda: store_play(run, play, lambda steps: steps >= interval))
    journal_bytes = disk_size(journal_dir)
    progress.frames += written
    second, save_seconds = timed(lambda: checkpoints.save(progress.frames, eval_reward=0.0))
    _, verify_seconds = timed(lambda: verify_checkpoint(first))
    restorable, restorable_seconds = timed(lambda: restorable_from(journal_dir))
    _, load_seconds = timed(lambda: checkpoints.load(first))
    checkpoint_bytes = disk_size(second)
    journal_per_frame = journal_bytes / written
    extra = checkpoint_bytes + journal_per_frame * interval
    return {
        "first_save_seconds": first_seconds,
        "save_seconds": save_seconds,
        "frames_written_after_save": written,
        "journaled_frames_per_second": written / write_seconds,
        "checkpoint_dir_bytes": checkpoint_bytes,
        "journal_bytes": journal_bytes,
        "journal_bytes_per_frame": journal_per_frame,
        "eval_interval_frames": interval,
        "journal_bytes_per_eval_interval": journal_per_frame * interval,
        "extra_disk_per_checkpoint_bytes": extra,
        "extra_disk_to_interval_data": extra / (interval * bytes_per_transition),
        "verify_checkpoint_seconds": verify_seconds,
        "restorable_from_seconds": restorable_seconds,
        "restorable_from_frames": restorable,
        "load_seconds": load_seconds,
    }


def whole_copy(run: Run) -> dict[str, float]:
    """The way checkpoints kept the buffer before the journal: a copy of it (``dumps``) and
    the SHA-256 of every file written; the copy is deleted after."""
    with tempfile.TemporaryDirectory(dir=run.run_dir) as scratch:
        _, dump_seconds = timed(lambda: run.buffer.dumps(scratch))
        files = [file for file in Path(scratch).rglob("*") if file.is_file()]
        _, sha_seconds = timed(lambda: [file_sha256(file) for file in files])
        return {
            "dumps_seconds": dump_seconds,
            "sha256_seconds": sha_seconds,
            "seconds": dump_seconds + sha_seconds,
            "bytes": disk_size(Path(scratch)),
        }


def bench_pixels(config: Config) -> dict[str, Any]:
    """The ``dqn_atari`` preset's run at its full capacity (real storage, journal and
    checkpoints), its buffer filled through ``extend_buffer`` from recorded random play,
    each pass under fresh trajectory ids: disk per transition, the learner's memory,
    sampling with frame stacks, a Nature-CNN update, and checkpoints next to a whole copy
    of the buffer. The run directory (7 GB of replay files) is deleted after."""
    started = time.perf_counter()
    run = build_run(config)
    try:
        chunks = recorded_atari_play(run)
        play = replayed_play(chunks)
        capacity = run.buffer.storage.max_size
        run.progress.frames, fill_seconds = timed(
            lambda: store_play(run, play, lambda _: len(run.buffer) == capacity)
        )
        steps = run.buffer.storage.get(slice(0, capacity))[STEP_KEY]
        transitions = int((steps != RESET_STEP).sum())
        disk = files_on_disk(run.run_dir / REPLAY_DIR)
        per_transition = disk["block_bytes"] / transitions
        sampling = pixel_sampling(run, play)  # the page cache warm: the fill wrote every page
        # Read after the sampling: freed batches stay with malloc (keep_freed_memory).
        memory = {**process_memory(),
                  "replay_files_resident": mapped_resident_bytes(run.run_dir / REPLAY_DIR),
                  "recorded_play": sum(chunk.bytes() for chunk in chunks)}  # fmt: skip
        return {
            "preset": PIXELS_PRESET,
            "capacity": capacity,
            "recorded_play_frames": PIXELS_PLAY_FRAMES,
            "stored_transitions": transitions,
            "reset_slots": capacity - transitions,
            "fill_seconds": fill_seconds,
            "disk": {
                **disk,
                "block_bytes_per_slot": disk["block_bytes"] / capacity,
                "apparent_bytes_per_slot": disk["apparent_bytes"] / capacity,
                "block_bytes_per_transition": per_transition,
            },
            "memory_while_sampling_bytes": memory,
            "sampling": sampling,
            "update": pixel_update(run),
            "checkpoints": pixel_checkpoints(run, play, per_transition),
            "whole_copy": whole_copy(run),
            "goals": PIXELS_GOALS,
            "section_seconds": time.perf_counter() - started,
        }
    finally:
        run.close()
        shutil.rmtree(run.run_dir)


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
             f"run_dir={run_dir / (name + '-training')}", "eval.interval_frames=1000000",
             "optim.compile=false"],  # in so short a run the compile would outweigh the mode
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


def print_machine(machine: dict[str, Any]) -> None:
    print(f"\n== machine: {machine['cpu_model']}, {machine['cores']} cores, one torch thread: "
          f"{machine['matmul_256_gflops']:.0f} GFLOP/s (256x256x256 float32 matmul)")  # fmt: skip


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


def print_training(training: dict[str, Any]) -> None:
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


def print_checkpoint(checkpoint: dict[str, Any]) -> None:
    print(f"\n== checkpoint with {checkpoint['transitions']} Pendulum transitions")
    print(f"save: {checkpoint['save_seconds']:.2f} s")
    print(f"verify + load: {checkpoint['verify_and_load_seconds']:.2f} s")
    print(f"size: {checkpoint['size_mb']:.1f} MB")


def print_pixels(pixels: dict[str, Any]) -> None:
    goals, disk, memory = pixels["goals"], pixels["disk"], pixels["memory_while_sampling_bytes"]
    sampling, update, saving = pixels["sampling"], pixels["update"], pixels["checkpoints"]
    copy = pixels["whole_copy"]
    print(f"\n== pixels: {pixels['preset']} at {pixels['capacity']:,} slots, filled from "
          f"{pixels['recorded_play_frames']:,} frames of random play stored again and again "
          f"({pixels['reset_slots']:,} reset slots) in "
          f"{pixels['fill_seconds']:.0f} s")  # fmt: skip
    print(f"disk: {disk['block_bytes_per_transition']:,.0f} B per stored transition "
          f"(goal <= {goals['disk_bytes_per_transition']:,}); per slot "
          f"{disk['block_bytes_per_slot']:,.0f} B in file blocks, "
          f"{disk['apparent_bytes_per_slot']:,.0f} B apparent")  # fmt: skip
    print(f"memory while sampling: RssAnon {memory['RssAnon'] / 1e9:.2f} GB "
          f"(goal RSS <= {goals['rss_bytes'] / 1e9:.0f} GB; the recorded play "
          f"{memory['recorded_play'] / 1e9:.2f} GB of it), RssFile "
          f"{memory['RssFile'] / 1e9:.2f} GB (the replay files' page cache "
          f"{memory['replay_files_resident'] / 1e9:.2f} GB of it)")  # fmt: skip
    print(f"sampling {sampling['batches_per_call']} batches of {sampling['batch_size']} per "
          f"call: {sampling['with_stacks_batches_per_second']:,.0f} batches/s with frame stacks "
          f"(goal >= {goals['batches_per_second']:,}), "
          f"{sampling['sampling_alone_batches_per_second']:,.0f} without; with the "
          f"sampler's scan of the storage cached (no extend before the call): "
          f"{sampling['with_stacks_scan_cached_batches_per_second']:,.0f}")  # fmt: skip
    print(f"Nature-CNN update, one thread: {update['ms_per_update']:.1f} ms; the Atari-100k "
          f"preset's {update['atari100k_updates']:,} updates: "
          f"{update['atari100k_update_hours']:.1f} h")  # fmt: skip
    print(f"checkpoint save: {saving['save_seconds']:.2f} s (goal <= {goals['save_seconds']} s; "
          f"the first, after the fill: {saving['first_save_seconds']:.2f} s); verify "
          f"{saving['verify_checkpoint_seconds'] + saving['restorable_from_seconds']:.2f} s; "
          f"load {saving['load_seconds']:.2f} s")  # fmt: skip
    print(f"extra disk per checkpoint: {saving['checkpoint_dir_bytes'] / 1e6:.1f} MB + journal "
          f"{saving['journal_bytes_per_eval_interval'] / 1e9:.2f} GB per "
          f"{saving['eval_interval_frames']:,}-frame interval = "
          f"{saving['extra_disk_to_interval_data']:.2f}x the interval's data "
          f"(goal <= {goals['extra_disk_per_checkpoint_to_interval_data']:.0f}x)")  # fmt: skip
    print(f"whole copy (dumps + SHA-256), as before the journal: {copy['seconds']:.1f} s, "
          f"{copy['bytes'] / 1e9:.2f} GB")  # fmt: skip
    print(f"section: {pixels['section_seconds'] / 60:.1f} min")


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


def print_sb3(sb3: dict[str, Any]) -> None:
    print(f"\n== against Stable-Baselines3 (Pendulum-v1, {SB3_WORKLOAD['frames']} frames, "
          f"UTD 1, batch 256; {SB3_ROUNDS} runs each, interleaved; medians)")  # fmt: skip
    print(f"  {'':<18} {'wall s':>8} {'frames/s':>9} {'final eval (10 fixed seeds)':>28}")
    for impl, medians in sb3["medians"].items():
        evals = ", ".join(f"{row['eval_mean']:.0f}" for row in sb3["runs"][impl])
        print(f"  {impl:<18} {medians['wall_seconds']:8.1f} {medians['frames_per_second']:9.1f} "
              f"{medians['eval_mean']:10.1f} (runs: {evals})")  # fmt: skip
    print(f"  wall time, ours / SB3: {sb3['wall_time_ratio_ours_to_sb3']:.2f}x")


def print_gpu(gpu: dict[str, Any]) -> None:
    print("\n== GPU: sac_halfcheetah, one update per frame (LeanRL: 725 frames/s with compile "
          "and CUDA graphs on an H100; CleanRL eager: 127)")  # fmt: skip
    if "not measured" in gpu:
        print(f"  not measured: {gpu['not measured']}")
        return
    print(f"  {gpu['gpu']}")
    for name in GPU_VARIANTS:
        rates = gpu[name]
        print(f"  {name:<42} {rates['frames_per_second']:7.1f} frames/s end to end, "
              f"{rates['update_steps_per_second']:7.1f} update steps/s")  # fmt: skip
    print(f"  Atari presets, {GPU_ATARI_FRAMES} frames each (learning from frame "
          f"{GPU_ATARI_RANDOM_FRAMES}, {GPU_ATARI_CAPACITY:,}-transition buffer):")  # fmt: skip
    for preset in GPU_ATARI_PRESETS:
        rates = gpu[preset]
        print(f"  {preset:<42} {rates['frames_per_second']:7.1f} frames/s end to end, "
              f"{rates['ms_per_update_step']:7.2f} ms per update")  # fmt: skip


SECTIONS = ("update", "training", "checkpoint", "pixels", "collection", "sb3", "gpu")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections: {','.join(SECTIONS)}"
    )
    parser.add_argument("overrides", nargs="*", help="key=value settings of the default preset")
    args = parser.parse_args(argv)
    sections = args.only.split(",")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        print(
            f"error: --only {','.join(unknown)}: choose from {','.join(SECTIONS)}", file=sys.stderr
        )
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    overrides = [
        f"collector.total_frames={BENCH_FRAMES}", f"replay.capacity={BENCH_CAPACITY}",
        "logger.backend=none", *args.overrides,
    ]  # fmt: skip
    if not any(item.startswith("run_dir=") for item in overrides):
        overrides.append(f"run_dir=runs/bench-{stamp}")
    try:
        config = load_config("default", overrides)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    run_dir = Path(config.run_dir)
    # Settings of every section: the user's, without where and how long the main run goes.
    base = [
        item for item in overrides if not item.startswith(("run_dir=", "collector.total_frames="))
    ]
    machine = machine_description(config.threads)
    print_machine(machine)
    report: dict[str, Any] = {"machine": machine}
    measure = {
        "update": lambda: bench_update(
            [item for item in base if not item.startswith("replay.capacity=")],
            machine["matmul_256_gflops"] * 1e9,
        ),
        "training": lambda: bench_training(config),
        "checkpoint": lambda: bench_checkpoint(
            load_config("default", overrides), run_dir / "checkpoint-bench"
        ),
        "pixels": lambda: bench_pixels(
            load_config(PIXELS_PRESET, [*PIXELS_SETTINGS, f"run_dir={run_dir / 'pixels'}"])
        ),
        "collection": lambda: bench_collection(base, run_dir / "collection"),
        "sb3": lambda: bench_against_sb3(
            [item for item in base if not item.startswith("replay.capacity=")], run_dir / "sb3"
        ),
        "gpu": lambda: bench_gpu(run_dir / "gpu"),
    }
    printers = {"update": print_update, "training": print_training,
                "checkpoint": print_checkpoint, "pixels": print_pixels,
                "collection": print_collection, "sb3": print_sb3, "gpu": print_gpu}  # fmt: skip
    for section in SECTIONS:
        if section in sections:
            report[section] = measure[section]()
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "bench.json").write_text(json.dumps(report, indent=2))  # each lands
            printers[section](report[section])
    print(f"\nresults: {run_dir / 'bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
