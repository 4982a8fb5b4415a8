"""What several benchmarks share: the run they start from, random play, timers."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.envs import EnvBase
from torchrl.envs.utils import RandomPolicy

# The run the sections start from: the default preset shortened to BENCH_FRAMES frames
# (unless ``collector.total_frames=`` is given), with a 1e6-capacity memmap buffer.
BENCH_FRAMES = 6_000
BENCH_CAPACITY = 1_000_000


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


def timed(work: Callable[[], Any]) -> tuple[Any, float]:
    """``work()``'s result and its wall time in seconds."""
    started = time.perf_counter()
    result = work()
    return result, time.perf_counter() - started


def phase_seconds(seconds_per_phase: dict[str, float], *phases: str) -> float:
    """The seconds a run spent in the loop's ``phases``, from its result's
    ``seconds_per_phase``: NaN where the loop has no phase of that name (the loop names its
    phases for itself; a benchmark follows)."""
    return sum(seconds_per_phase.get(phase, math.nan) for phase in phases)
