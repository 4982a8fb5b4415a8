"""The replay buffer: memmap storage on disk inside the run directory, and a sampler
chosen by ``replay.sampler`` (prioritized slices of whole trajectories by default)."""

from __future__ import annotations

from pathlib import Path

import torch
from tensordict import TensorDictBase
from torchrl.data import (
    LazyMemmapStorage,
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
    if replay.sampler == "prioritized_slice":
        return PrioritizedSliceSampler(
            max_capacity=replay.capacity, alpha=replay.alpha, beta=replay.beta, **slices
        )
    if replay.sampler == "slice":
        return SliceSampler(**slices)
    if replay.sampler == "prioritized":
        return PrioritizedSampler(
            max_capacity=replay.capacity, alpha=replay.alpha, beta=replay.beta
        )
    return RandomSampler()


def make_replay_buffer(
    replay: ReplayConfig, batch_size: int, scratch_dir: Path, seed: int
) -> TensorDictReplayBuffer:
    """A buffer of ``replay.capacity`` transitions memory-mapped under ``scratch_dir``.

    The buffer draws from its own seeded generator, so sampling is reproducible and its
    state travels with the buffer's checkpoint."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    return TensorDictReplayBuffer(
        storage=LazyMemmapStorage(replay.capacity, scratch_dir=scratch_dir, device=replay.device),
        sampler=make_sampler(replay),
        # Each slot counts its overwrites, so late priorities can be told from fresh ones.
        writer=TensorDictRoundRobinWriter(track_generations=True),
        priority_key=PRIORITY_KEY,
        batch_size=batch_size,
        generator=generator,
    )


def write_priorities(buffer: TensorDictReplayBuffer, sample: TensorDictBase) -> int:
    """Write the priorities an update computed for ``sample`` (under ``PRIORITY_KEY``) into
    the buffer, for the records still there; return how many were dropped.

    A record overwritten since it was sampled (the ring buffer wrapped, or a worker's data
    landed in between) keeps its own priority: its slot's generation no longer matches the
    one the sample captured. Samplers without priorities ignore the write."""
    index = sample["index"].reshape(len(sample), -1)[:, 0]
    generation = sample["index_generation"].reshape(len(sample), -1)[:, 0]
    live = buffer.writer.generations_of(index) == generation
    buffer.update_tensordict_priority(sample[live])
    return int((~live).sum())
