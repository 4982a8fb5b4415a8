"""The ``dqn_atari`` preset at its 1M-slot capacity, its buffer filled from recorded Atari
play: disk, memory, sampling with frame stacks, a Nature-CNN update, checkpoints."""

from __future__ import annotations

import functools
import itertools
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tensordict import TensorDictBase
from torchrl.data.replay_buffers.samplers import Sampler

from rl_app.checkpointing import disk_size, file_sha256, verify_checkpoint
from rl_app.checks import load_config
from rl_app.config import Config
from rl_app.envs import FRAME_KEY, make_env
from rl_app.loop import Run, updates_per_iteration
from rl_app.replay import TRAJECTORY_KEY, RunReplayBuffer, make_sampler
from rl_app.replay.frames import RESET_STEP, STEP_KEY
from rl_app.replay.journal import restorable_from
from rl_app.run import build_run
from rl_app.rundir import JOURNAL_DIR, REPLAY_DIR
from rl_app.upstream.torchrl import load_sampler_state, replay_generator, sampler_state
from tools.bench.shared import random_play_batches, timed
from tools.bench.update import seconds_per_update

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
    that iteration's extend (TorchRL's slice sampler then finds again which slots may start
    a slice, over the whole storage; rl_app's updated them during the extend). The same
    with TorchRL's own ``PrioritizedSliceSampler`` in the buffer (the samplers hand each
    other their state), without frame stacks (sampling alone), and with stacks but no
    extend before the call. Interleaved round by round; medians, and the extend's median
    time with each sampler."""
    config, buffer = run.config, run.buffer
    count = updates_per_iteration(config)
    samplers = {"rl_app": buffer.sampler, "torchrl": make_sampler(config.replay, torchrl_own=True)}

    def with_stacks() -> None:
        buffer.sample_batches(config.optim.batch_size, count)

    def sampling_alone() -> None:  # the sampler's draw and the storage's read of it
        buffer.storage[buffer.sampler.sample(buffer.storage, count * config.optim.batch_size)[0]]

    ways = {"with_stacks": (with_stacks, True, "rl_app"),
            "sampling_alone": (sampling_alone, True, "rl_app"),
            "with_stacks_no_extend": (with_stacks, False, "rl_app"),
            "with_stacks_torchrl": (with_stacks, True, "torchrl")}  # fmt: skip
    rates: dict[str, list[float]] = {name: [] for name in ways}
    extends: dict[str, list[float]] = {name: [] for name in samplers}
    for _ in range(PIXELS_SAMPLING_ROUNDS):
        for name, (draw, extend_first, sampler) in ways.items():
            if buffer.sampler is not samplers[sampler]:
                hand_over(buffer, samplers[sampler])
                store_play(run, play, lambda steps: steps > 0)  # its first draw, not timed
                draw()
            seconds = 0.0
            for _ in range(PIXELS_CALLS_PER_ROUND):
                if extend_first:
                    _, extend_seconds = timed(lambda: store_play(run, play, lambda s: s > 0))
                    extends[sampler].append(extend_seconds)
                started = time.perf_counter()
                draw()
                seconds += time.perf_counter() - started
            rates[name].append(count * PIXELS_CALLS_PER_ROUND / seconds)
    hand_over(buffer, samplers["rl_app"])
    medians = {f"{name}_batches_per_second": statistics.median(r) for name, r in rates.items()}
    return {
        "batch_size": config.optim.batch_size,
        "batches_per_call": count,
        "frames_per_extend": config.collector.frames_per_batch,
        **medians,
        "to_torchrl": medians["with_stacks_batches_per_second"]
        / medians["with_stacks_torchrl_batches_per_second"],
        **{f"extend_ms_{name}": 1000 * statistics.median(s) for name, s in extends.items()},
    }


def hand_over(buffer: RunReplayBuffer, sampler: Sampler) -> None:
    """Sample ``buffer`` with ``sampler`` from now on, in the state of the one it had (its
    priorities; the buffer's generator)."""
    load_sampler_state(sampler, sampler_state(buffer.set_sampler(sampler)))
    buffer.set_rng(replay_generator(buffer))


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
    first, first_seconds = timed(lambda: checkpoints.save(progress.frames, eval_return=0.0))
    written, write_seconds = timed(lambda: store_play(run, play, lambda steps: steps >= interval))
    journal_bytes = disk_size(journal_dir)
    progress.frames += written
    second, save_seconds = timed(lambda: checkpoints.save(progress.frames, eval_return=0.0))
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
    checkpoints), its buffer filled through ``buffer.extend`` from recorded random play,
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
          f"call after each extend: {sampling['with_stacks_batches_per_second']:,.0f} batches/s "
          f"with frame stacks (goal >= {goals['batches_per_second']:,}); TorchRL's "
          f"PrioritizedSliceSampler in the same run "
          f"{sampling['with_stacks_torchrl_batches_per_second']:,.0f}: "
          f"{sampling['to_torchrl']:.1f}x; "
          f"{sampling['sampling_alone_batches_per_second']:,.0f} without stacks, "
          f"{sampling['with_stacks_no_extend_batches_per_second']:,.0f} with no extend before "
          f"the call; an extend of {sampling['frames_per_extend']} frames: "
          f"{sampling['extend_ms_rl_app']:.1f} ms, "
          f"{sampling['extend_ms_torchrl']:.1f} ms with TorchRL's")  # fmt: skip
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
