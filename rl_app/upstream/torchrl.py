"""TorchRL 0.14.1: its private names and the workarounds of its behaviours that every run
needs (the index is in :mod:`rl_app.upstream`). An optional feature's are in a
``torchrl_<feature>`` module beside this one, which only that feature imports, so that a run
without it never loads them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl._utils import _replace_last
from torchrl.checkpoint import Checkpoint
from torchrl.collectors import Collector
from torchrl.data import PrioritizedSampler, PrioritizedSliceSampler, ReplayBuffer, TensorStorage
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage
from torchrl.envs import EnvBase
from torchrl.envs.batched_envs import BatchedEnvBase
from torchrl.objectives import SACLoss

# -- 1. the Gymnasium env inside a TorchRL env, and a collector's next step -----------------


def gymnasium_env(env: EnvBase) -> gym.Env:
    """TorchRL's ``GymWrapper`` keeps the env it wraps in ``_env`` and offers no public
    handle; the collector's checkpoint state needs it to replay an episode's reset.
    Test: ``test_gym_wrapper_keeps_the_gymnasium_env_in_a_private_attribute``."""
    return env.base_env._env


def next_step_input(collector: Collector) -> TensorDictBase:
    """What a direct collector hands its next step: the observation with the transforms'
    per-episode entries (step count, episode return, ``is_init``, stacked frames) and the
    trajectory id. TorchRL keeps it in the private ``_carrier``, which its checkpoint state
    leaves out; updated in place, it resumes an episode. Test:
    ``test_a_collector_still_carries_the_next_step_in_a_private_attribute``."""
    return collector._carrier


# -- 5. a batch of envs that changes the thread count when it closes ----------------------


@contextmanager
def keeping_threads() -> Iterator[None]:
    """Leave torch's thread count as it was after closing a ``SerialEnv`` or
    ``ParallelEnv`` (directly, or through the collector or evaluator that holds it).
    TorchRL's ``close`` sets it to ``min(the count at import, now + workers)``, even for a
    ``SerialEnv``, which never lowered it: after one evaluation a run with ``threads=1``
    would compute its updates on more threads, and float rounding would change what it
    learns. Test: ``test_closing_a_serial_env_still_raises_the_thread_count``."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def close_keeping_threads(env: BatchedEnvBase) -> None:
    """Close ``env`` (:func:`keeping_threads`). A batch whose envs failed to start (a stop
    dropping the evaluation as they were built) counts as closed already, and TorchRL's
    ``close`` raises for it: not here, so that the exception that stopped it is the one
    that propagates. Test: ``test_a_batch_whose_envs_failed_to_start_still_refuses_to_close``."""
    with keeping_threads():
        env.close(raise_if_closed=False)


# -- 6. a buffer SACLoss creates on first use ---------------------------------------------


def create_target_entropy_buffer(loss: SACLoss) -> None:
    """Create SACLoss's target-entropy buffer now. SACLoss creates it on first use: inside a
    compiled loss, whose second call then finds the module changed and recompiles. Test:
    ``test_sac_loss_still_creates_its_target_entropy_buffer_on_first_use``."""
    loss.target_entropy  # noqa: B018 (the property creates the buffer)


# -- 7. a storage laid out before its first extend -----------------------------------------


def lay_out_storage(storage: TensorStorage, transition: TensorDictBase) -> None:
    """Lay ``storage`` out at its full size for records shaped as ``transition`` (its
    memory-mapped files created, or its GPU tensors allocated), as TorchRL's lazy storages
    do at their first extend, through their private ``_init``. Test:
    ``test_a_lazy_storage_still_lays_itself_out_at_the_first_extend``."""
    storage._init(transition)


# -- 9. a replay buffer's state without its data -------------------------------------------


def replay_generator(buffer: ReplayBuffer) -> torch.Generator:
    """The generator a replay buffer samples with: ``set_rng`` sets it, and only
    ``state_dict`` (which also holds the whole storage) reads it back, from the private
    ``_rng``. Test: ``test_a_replay_buffer_keeps_its_generator_in_a_private_attribute``."""
    return buffer._rng


def set_storage_length(storage: TensorStorage, length: int) -> None:
    """Set how many records ``storage`` holds, as ``load_state_dict`` does with the data
    it loads, through the private ``_len``. Test:
    ``test_a_storage_length_is_set_through_a_private_attribute``."""
    storage._len = length


def keep_priority_trees_on_cpu(sampler: PrioritizedSampler) -> None:
    """Keep a prioritized sampler's sum and min trees on the CPU, whatever device its
    storage is on: only sampled indices and new priorities then cross to and from a GPU.

    TorchRL 0.14.1 moves the trees to a storage's GPU when it first sees the storage, which
    needs CUDA segment trees (PyPI's wheel has none: "CUDA prioritized replay buffers
    require a TorchRL CUDA wheel") and draws their samples from the sampler's generator
    there, where rl_app's seeded generator, saved with every checkpoint, is a CPU one. A
    device set beforehand wins; ``PrioritizedSliceSampler`` takes no ``device=``, so it is
    set through the private ``_device``. Test:
    ``test_priority_trees_stay_on_the_cpu_beside_a_storage_on_a_gpu_stand_in``."""
    sampler._device = torch.device("cpu")


# A prioritized sampler's state_dict holds its segment trees as C++ extension objects.
SEGMENT_TREES = ("_sum_tree", "_min_tree")


def sampler_state(sampler: Sampler) -> dict[str, Any]:
    """``sampler.state_dict()`` with a prioritized sampler's segment trees as tensors of
    their leaves: loadable with ``torch.load(weights_only=True)``, as every checkpoint
    component is. Test: ``test_a_prioritized_sampler_state_holds_extension_objects``."""
    state = sampler.state_dict()
    for key in SEGMENT_TREES:
        if key in state:
            state[key] = state[key][torch.arange(state[key].size)]
    if "_max_priority" in state:  # views into a larger tensor, which torch.save writes whole
        state["_max_priority"] = tuple(
            value.clone() if isinstance(value, torch.Tensor) else value
            for value in state["_max_priority"]
        )
    return state


def load_sampler_state(sampler: Sampler, state: dict[str, Any]) -> None:
    """Load a :func:`sampler_state`: each tree's leaves are written into a copy of the
    sampler's own tree, whose inner nodes they determine exactly."""
    trees = sampler.state_dict()
    for key in SEGMENT_TREES:
        if key in state:
            trees[key].update(torch.arange(trees[key].size), state[key])
            state = {**state, key: trees[key]}
    sampler.load_state_dict(state)


# -- 10. the slots that may start a slice, recomputed over the buffer after every extend ----


class SliceStartIndex:
    """The slots of a one-dimensional storage that may not start a slice of ``steps``
    steps, as TorchRL's :class:`PrioritizedSliceSampler` finds them (its private
    ``_preceding_stop_idx``): a slot is one when a trajectory ends within the ``steps - 1``
    slots from it, itself included; circularly, a full storage being a ring.

    Ends are those of ``torchrl.data.find_start_stop_traj``: where the ``key`` entry (a
    trajectory id) differs from the next slot's, or where it is set (``by_trajectory``
    False: a done flag); the last slot of a storage not yet full ends its trajectory, and
    so does the last slot written into a full one (the write cursor). An end depends on a
    slot and the next, a slot's start on the ends of the ``steps - 1`` slots from it: a
    write changes only the written slots, the slot before them and the ones the length or
    the cursor moved from and to, and the starts up to ``steps - 2`` slots before those.
    :meth:`written` updates the index from those; anything else the storage went through
    (told by its private mutation count, which each write bumps by one) leaves the index
    stale, and the sampler builds a new one from the whole storage, as TorchRL does."""

    def __init__(self, storage: TensorStorage, key: Any, by_trajectory: bool, steps: int) -> None:
        self.storage, self.key, self.by_trajectory, self.steps = storage, key, by_trajectory, steps
        self.revision, self.length = storage._mutation_revision, len(storage)
        self.full, self.cursor = storage._is_full, _ring_cursor(storage)
        ends = self.ends_at(self.column(storage), torch.arange(self.length))
        if self.full and not ends.any():  # TorchRL's rule for a ring without an end
            ends[-1] = True
        self.ends = torch.zeros(storage.max_size, dtype=torch.bool)
        self.ends[: self.length] = ends
        blocked = ends.clone()
        for step in range(1, steps - 1):
            blocked |= ends.roll(-step)
        self.blocked = np.flatnonzero(blocked.numpy())  # sorted

    @staticmethod
    def supports(storage: Storage, key: Any) -> bool:
        """Whether an index can be kept for ``storage``: a tensor storage of one dimension,
        not empty, holding one ``key`` value per slot."""
        if not isinstance(storage, TensorStorage) or storage.ndim != 1 or not len(storage):
            return False
        column = storage[:].get(key, None)
        return column is not None and column.numel() == len(storage)

    def current(self, storage: TensorStorage, key: Any) -> bool:
        """Whether the index still describes ``storage`` read by ``key``."""
        return (self.storage is storage and self.key == key
                and self.revision == storage._mutation_revision and self.length == len(storage)
                and self.cursor == _ring_cursor(storage))  # fmt: skip

    def column(self, storage: TensorStorage) -> torch.Tensor:
        return storage[:][self.key].reshape(-1)

    def ends_at(self, column: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Whether each of ``slots`` (of ``column``, the storage's ``key`` entries) ends its
        trajectory."""
        here = slots.to(column.device)
        if self.by_trajectory:
            ends = (column[here] != column[(here + 1) % self.length]).cpu()
        else:
            ends = column[here].cpu().bool()
        if not self.full:
            return ends | (slots == self.length - 1)
        return ends if self.cursor is None else ends | (slots == self.cursor)

    def written(self, storage: TensorStorage, slots: torch.Tensor) -> bool:
        """Update the index for a write of ``slots`` into ``storage``, the only change since
        the index was current; False (the index stale) where it cannot tell."""
        length, full, cursor = len(storage), storage._is_full, _ring_cursor(storage)
        if (storage is not self.storage or storage._mutation_revision != self.revision + 1
                or length < self.length or len(slots) >= length
                or (full and cursor is None)):  # fmt: skip
            return False
        moved = [self.length - 1, length - 1, *(c for c in (self.cursor, cursor) if c is not None)]
        dirty = torch.cat(
            [slots, slots - 1, torch.tensor(moved), torch.arange(self.length, length)]
        )
        self.revision, self.length = storage._mutation_revision, length
        self.full, self.cursor = full, cursor
        dirty = (dirty % length).unique()
        self.ends[dirty] = self.ends_at(self.column(storage), dirty)
        behind = torch.arange(self.steps - 1)
        starts = ((dirty.unsqueeze(1) - behind) % length).unique()
        blocked = self.ends[(starts.unsqueeze(1) + behind) % length].any(1).numpy()
        starts = starts.numpy()
        at = np.searchsorted(self.blocked, starts)
        listed = at < len(self.blocked)
        listed[listed] = self.blocked[at[listed]] == starts[listed]
        self.blocked = np.delete(self.blocked, at[listed & ~blocked])
        added = starts[~listed & blocked]
        self.blocked = np.insert(self.blocked, np.searchsorted(self.blocked, added), added)
        return True


def _ring_cursor(storage: TensorStorage) -> int | None:
    """The slot last written into a full ``storage``, which ends its trajectory; None for
    a storage not yet full (its last slot ends it) or not written since it was loaded."""
    return storage._last_cursor_index if storage._is_full else None


class VectorizedSliceSampler(PrioritizedSliceSampler):
    """TorchRL's :class:`PrioritizedSliceSampler`, which after every extend recomputes over
    the whole storage which slots may start a slice (its trajectories, then their slots
    laid out in a matrix of trajectories by the longest one's length, filled row by row in
    a Python loop: ``_padded_indices``), and reads every sampled record whole to take its
    done flags: most of each iteration's sampling with a 1M-frame Atari buffer
    (docs/speed.md). Here a :class:`SliceStartIndex` follows the writes (TorchRL tells the
    sampler of each through ``mark_update``), and sampling reads only the done flags: the
    same slices, weights and flags from the same generator. Where a draw fails, the masked
    priorities are given back (TorchRL leaves them at 0). Configurations the index does not
    cover (several end keys, a multi-dimensional storage, ``span``, slices not of
    ``slice_len``, ``strict_length=False``) sample as TorchRL does, with the matrix filled
    in a few tensor operations. Tests: ``test_the_vectorized_slice_sampler_samples_as_
    torchrl_does``; TorchRL's behaviours: ``test_the_prioritized_slice_sampler_still_
    recomputes_its_starts_after_every_extend``, ``..._still_pads_in_a_loop``,
    ``..._still_reads_whole_records_for_done_flags``, ``test_a_write_bumps_the_storage_
    mutation_count_once_and_tells_the_sampler``."""

    _starts: SliceStartIndex | None = None

    def _padded_indices(self, shapes: torch.Tensor, arange: torch.Tensor) -> torch.Tensor:
        lengths = shapes.reshape(-1)
        padding = lengths.max() - lengths
        # Column c of row g holds step c - padding[g] of trajectory g, or -1 before it.
        step = torch.arange(int(lengths.max()), device=arange.device) - padding.unsqueeze(1)
        first = (lengths.cumsum(0) - lengths).unsqueeze(1)
        slots = arange[(first + step).clamp(0, len(arange) - 1)]
        return torch.where(step >= 0, slots, torch.full_like(slots, -1))

    def _start_key(self) -> tuple[Any, bool] | None:
        """The entry ends are read from and whether it is a trajectory id, where a
        :class:`SliceStartIndex` covers this sampler's configuration."""
        plain = (self.slice_len is not None and self.slice_len > 1 and self.strict_length
                 and not self.span[1] and self.end_keys is None
                 and "static-stop-and-length" not in self._cache
                 and not getattr(self, "_traj_key_auto", False))  # fmt: skip
        if not plain:
            return None
        return (self._used_traj_key, True) if self._fetch_traj else (self.end_key, False)

    def blocked_starts(self, storage: Storage) -> np.ndarray | None:
        """The slots that may not start a slice, sorted (None: not covered)."""
        found = self._start_key()
        if found is None:
            return None
        key, by_trajectory = found
        if self._starts is None or not self._starts.current(storage, key):
            if not SliceStartIndex.supports(storage, key):
                return None
            self._starts = SliceStartIndex(storage, key, by_trajectory, self.slice_len)
        return self._starts.blocked

    def mark_update(self, index: int | torch.Tensor, *, storage: Storage | None = None) -> None:
        super().mark_update(index, storage=storage)
        if self._starts is not None and storage is not None:
            slots = torch.as_tensor(index).reshape(-1).cpu()
            if not self._starts.written(storage, slots):
                self._starts = None

    def sample(self, storage: Storage, batch_size: int) -> tuple[Any, dict]:
        blocked = self.blocked_starts(storage)
        if blocked is None:
            return super().sample(storage, batch_size)
        # From here on TorchRL's sample, for slices of slice_len steps, with the starts kept.
        seq_length, num_slices = self._adjusted_batch_size(batch_size)
        masked = torch.tensor(self._sum_tree[blocked])
        self._sum_tree[blocked] = 0.0
        try:
            starts, info = PrioritizedSampler.sample(self, storage, batch_size // seq_length)
        finally:
            self._sum_tree[blocked] = masked
        records = storage[:]
        device = records.get(self._starts.key).device
        weight = torch.as_tensor(info["priority_weight"], device=device)
        info["priority_weight"] = torch.repeat_interleave(weight, seq_length)
        index = self._tensor_slices_from_startend(seq_length, starts, storage.shape[0])
        index = index.to(torch.long).unbind(-1)
        if self.truncated_key is None:
            return index, info
        done_key = _replace_last(self.truncated_key, "done")
        terminated_key = _replace_last(self.truncated_key, "terminated")
        truncated = torch.zeros((index[0].shape[0], 1), dtype=torch.bool, device=index[0].device)
        truncated.view(num_slices, -1)[:, -1] = 1
        done = records.get(done_key, None)
        terminated = records.get(terminated_key, None)
        info[self.truncated_key] = truncated
        # The flags of a storage on a GPU come to the index's device, the trees' (the CPU).
        on_index = truncated.device
        info[done_key] = truncated.clone() if done is None else done[index].to(on_index) | truncated
        info[terminated_key] = (
            torch.zeros_like(truncated) if terminated is None else terminated[index].to(on_index)
        )
        return index, info

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._starts = None  # built again from the storage loaded with it

    def _empty(self) -> None:
        super()._empty()
        self._starts = None

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_starts": None}


# -- 12. what a buffer keeps per slot ------------------------------------------------------

# What TorchRL 0.14.1 keeps per slot of the buffer (rl_app.fit counts it; measured:
# docs/capacity.md). The prioritized sampler's two segment trees (sum and min) each hold
# 2 x the power of two above the capacity of float32 values. Test:
# ``test_a_buffer_still_keeps_these_bytes_per_slot``.
TREE_VALUE_BYTES = 4
# The writer stamps every slot with a generation (int64), kept where the storage is and
# saved in each checkpoint; the buffer holding them doubles as the storage fills.
GENERATION_BYTES = 8
# A checkpoint saves the trees' leaves, a float32 each per slot; saving them copies the
# trees first (TorchRL's state_dict), then reads the leaves out, next to a copy of the
# generations.
TREE_LEAF_BYTES = 8


# -- 13. a saved checkpoint's metadata -----------------------------------------------------


def add_checkpoint_metadata(path: Path, metadata: dict[str, Any]) -> None:
    """Add ``metadata`` to the manifest of the checkpoint saved at ``path``, atomically
    (a score known only after the save). TorchRL writes metadata only when it saves, into
    the directory's ``manifest.json``, which ``CheckpointRotation`` reads back to pick the
    best. Test: ``test_a_checkpoint_manifest_is_still_read_from_manifest_json``."""
    manifest = Checkpoint.manifest(path)
    manifest["metadata"] = {**manifest["metadata"], **metadata}
    staged = path / ".manifest.json.staged"
    staged.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(staged, path / "manifest.json")
