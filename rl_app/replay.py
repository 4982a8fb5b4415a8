"""The replay buffer: memmap storage on disk inside the run directory, and a sampler
chosen by ``replay.sampler`` (prioritized slices of whole trajectories by default)."""

from __future__ import annotations

from pathlib import Path

import torch
from tensordict import TensorDictBase
from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    SliceSampler,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
)
from torchrl.data.replay_buffers.samplers import Sampler

from rl_app.config import ReplayConfig

# The collector numbers every trajectory; slices are cut within one id.
TRAJECTORY_KEY = ("collector", "traj_ids")
# Where an algorithm's update writes one new priority per sampled transition.
PRIORITY_KEY = "td_error"
# R2D2's mix of a slice's largest and mean step priority (Kapturowski et al., 2019).
SLICE_PRIORITY_ETA = 0.9


def make_sampler(replay: ReplayConfig) -> Sampler:
    """The sampler named by ``replay.sampler``."""
    slices = {
        "slice_len": replay.slice_len,
        "traj_key": TRAJECTORY_KEY,
        "strict_length": True,
        # Trajectory boundaries are found by scanning the whole storage; cached, that scan
        # runs once per extend (which clears the cache) instead of once per sample. Exact
        # here: the learner is the buffer's only writer, and it writes through extend.
        "cache_values": True,
    }
    prioritized = {"max_capacity": replay.capacity, "alpha": replay.alpha, "beta": replay.beta}
    # A one-step slice is a transition; TorchRL 0.14.1's PrioritizedSliceSampler masks every
    # start when slice_len is 1 (it then raises "non-positive p_sum").
    one_step = replay.slice_len == 1
    if replay.sampler == "prioritized" or (replay.sampler == "prioritized_slice" and one_step):
        return PrioritizedSampler(**prioritized)
    if replay.sampler == "prioritized_slice":
        return PrioritizedSliceSampler(**prioritized, **slices)
    if replay.sampler == "slice":
        return SliceSampler(**slices)
    return RandomSampler()


def make_replay_buffer(
    replay: ReplayConfig, scratch_dir: Path, seed: int
) -> TensorDictReplayBuffer:
    """A buffer of ``replay.capacity`` transitions memory-mapped under ``scratch_dir``, or
    held in GPU memory when ``replay.device`` is a GPU (a memory map lives on the host).

    The buffer draws from its own seeded generator, so sampling is reproducible and its
    state travels with the buffer's checkpoint."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    if replay.device.startswith("cuda"):
        storage = LazyTensorStorage(replay.capacity, device=replay.device)
    else:
        storage = LazyMemmapStorage(replay.capacity, scratch_dir=scratch_dir)
    return TensorDictReplayBuffer(
        storage=storage,
        sampler=make_sampler(replay),
        # Each slot counts its overwrites, so late priorities can be told from fresh ones.
        writer=TensorDictRoundRobinWriter(track_generations=True),
        priority_key=PRIORITY_KEY,
        generator=generator,
    )


def sample_batches(
    buffer: TensorDictReplayBuffer,
    replay: ReplayConfig,
    batch_size: int,
    count: int,
    device: torch.device | str = "cpu",
) -> list[TensorDictBase]:
    """``count`` batches of ``batch_size`` for as many updates, drawn in one sampler call
    and moved to ``device`` at once: ``[slices, slice_len]`` steps (time last) from a slice
    sampler, ``[batch_size]`` transitions from the others.

    One call instead of ``count`` spares the sampler's fixed cost per call. Drawn together,
    the batches all see the priorities as they stood before the first of their updates
    (:func:`write_priorities` then writes the new ones together). A slice sampler returns
    its slices one after the other, each in time order, so the flat sample reshapes into
    one slice per row."""
    sample = buffer.sample(count * batch_size).to(device)
    if replay.sampler.endswith("slice"):
        return list(sample.reshape(count, -1, replay.slice_len).unbind(0))
    return list(sample.reshape(count, -1).unbind(0))


def slice_priorities(step_priorities: torch.Tensor) -> torch.Tensor:
    """The priority of each slice (row) from its steps' priorities (columns):
    ``eta * max + (1 - eta) * mean`` with ``eta = SLICE_PRIORITY_ETA``, as in R2D2."""
    largest, mean = step_priorities.amax(dim=1), step_priorities.mean(dim=1)
    return SLICE_PRIORITY_ETA * largest + (1 - SLICE_PRIORITY_ETA) * mean


def write_priorities(buffer: TensorDictReplayBuffer, sample: TensorDictBase) -> int:
    """Write the priorities an update computed for ``sample`` (under ``PRIORITY_KEY``) into
    the buffer, for the slices still there; return how many slices were dropped.

    A flat sample counts as slices of one step. Priorities are stored per step index, and
    a prioritized slice sampler draws a slice *start* with probability proportional to the
    start index's priority (raised to ``alpha``). So every step of a slice takes its own
    TD error, then the slice's start takes :func:`slice_priorities` of them: that decides
    how often this slice is drawn again (a start that is also an inner step of another
    slice in the batch takes the slice priority).

    A slice overwritten, even in part, since it was sampled (the ring buffer wrapped, or a
    worker's data landed in between) keeps its own priorities: a slot's generation no
    longer matches the one the sample captured. Samplers without priorities take none."""
    steps = sample if sample.ndim == 2 else sample.unsqueeze(-1)
    index = steps["index"].reshape(steps.shape)
    generation = steps["index_generation"].reshape(steps.shape)
    current = buffer.writer.generations_of(index.reshape(-1)).reshape(index.shape)
    live = (current == generation).all(dim=1)
    if isinstance(buffer.sampler, PrioritizedSampler) and live.any():
        priority = steps[PRIORITY_KEY].reshape(steps.shape)[live]
        index = index[live]
        # Starts last: where an index appears twice, the last write wins.
        buffer.update_priority(
            torch.cat([index.reshape(-1), index[:, 0]]),
            torch.cat([priority.reshape(-1), slice_priorities(priority)]),
        )
    return int((~live).sum())
