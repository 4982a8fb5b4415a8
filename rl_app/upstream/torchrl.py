"""TorchRL 0.14.1: its private names and the workarounds of its behaviours (the index is in
:mod:`rl_app.upstream`)."""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase, TensorDictSequential
from torch.distributed import rpc as rpc_api
from torchrl._utils import _replace_last
from torchrl.collectors import Collector
from torchrl.collectors.distributed import DistributedCollector, RPCCollector
from torchrl.collectors.distributed import generic as torchrl_distributed
from torchrl.collectors.distributed import rpc as torchrl_rpc
from torchrl.collectors.distributed.default_configs import _find_free_port
from torchrl.data import (
    HERReplayBuffer,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    ReplayBuffer,
    TensorStorage,
)
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage
from torchrl.envs import EnvBase
from torchrl.envs.batched_envs import BatchedEnvBase
from torchrl.modules import LSTMModule
from torchrl.objectives import SACLoss
from torchrl.weight_update import MultiProcessWeightSyncScheme

log = logging.getLogger("rl_app")


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


# -- 2. weight pushes to worker processes ---------------------------------------------------

# Workers receive weights on a background thread, which TorchRL 0.14.1 copies into the
# policy parameter by parameter while the worker's main thread may be running that policy:
# one action could mix old and new layers, and act with new weights under the old version.
# In each worker process this lock is held by the policy's forward pass and by a weight
# update (from the "receive" instruction to its acknowledgement, which spans applying the
# weights and bumping the policy version), so that each action sees one whole version.
_WEIGHTS_LOCK = threading.Lock()
# TorchRL waits for a worker's acknowledgement without a time limit (`timeout=None`): a
# worker that died would never answer.
ACK_TIMEOUT_S = 60.0


class GuardedWeightSyncScheme(MultiProcessWeightSyncScheme):
    """TorchRL's multi-process weight sync, applying each update under ``_WEIGHTS_LOCK`` and
    waiting at most ``ACK_TIMEOUT_S`` for workers to acknowledge it.

    It hooks the two steps TorchRL's background receiver loop takes around an update (the
    loop has no public hook); an update that fails midway releases the lock at the loop's
    next wait. Tests: ``test_weight_sync_receiver_steps_are_still_private_hooks`` and
    ``test_weight_sync_still_waits_for_acks_without_a_limit``."""

    _holding_lock = False

    def _wait_for_instruction(self, timeout: float | None = None) -> str | None:
        self._release_lock()
        instruction = super()._wait_for_instruction(timeout)
        if instruction == "receive":
            _WEIGHTS_LOCK.acquire()
            self._holding_lock = True
        return instruction

    def _send_ack(self, message: str = "updated") -> None:
        self._release_lock()
        super()._send_ack(message)

    def _wait_for_ack(self, worker_ids: Any = None, timeout: float | None = None) -> None:
        super()._wait_for_ack(worker_ids, timeout=ACK_TIMEOUT_S if timeout is None else timeout)

    def _release_lock(self) -> None:
        if self._holding_lock:
            self._holding_lock = False
            _WEIGHTS_LOCK.release()


def make_guarded_policy(
    policy_factory: Callable[..., TensorDictModuleBase],
) -> TensorDictModuleBase:
    """A worker's policy, whose forward pass holds ``_WEIGHTS_LOCK``."""
    policy = policy_factory()
    policy.register_forward_pre_hook(acquire_weights_lock)
    policy.register_forward_hook(release_weights_lock)
    return policy


def acquire_weights_lock(module: Any, args: Any) -> None:
    _WEIGHTS_LOCK.acquire()  # a pre-hook returns None: the call's arguments stay as they are


def release_weights_lock(module: Any, args: Any, output: Any) -> None:
    _WEIGHTS_LOCK.release()


# -- 3. the distributed collector on submitit -----------------------------------------------

# TorchRL's distributed iterator treats total_frames=-1 as zero frames: "never stop" is a
# count no run reaches. Test: ``test_distributed_collector_still_takes_its_join_wait_in_days``
# guards this module's reading of that file.
UNBOUNDED_FRAMES = 2**62


def split_warm_up(init_random_frames: int, workers: int) -> int:
    """What to hand a distributed collector (submitit, RPC, Ray) for ``init_random_frames``
    random frames in all: it gives each of its ``workers`` a ``// workers`` share, which
    drops the remainder; here each share is rounded up to whole frames instead. Tests:
    ``test_distributed_collectors_still_split_the_warm_up``,
    ``test_ray_collector_still_stops_at_minus_one_frames_and_splits_the_warm_up``."""
    return workers * math.ceil(init_random_frames / workers)


class ExecutorDistributedCollector(DistributedCollector):
    """TorchRL's ``DistributedCollector`` with the submitit launcher, submitting its jobs
    with a given ``executor`` and rendezvousing at ``address:port`` within
    ``connect_timeout_s``; it runs until stopped.

    TorchRL 0.14.1 takes the host name's address, its own executor (a ``./log_test``
    folder, no SLURM resources) and waits for the jobs to join ``MAX_TIME_TO_CONNECT``
    *days* (1,000: it is passed to ``timedelta`` as days). ``jobs`` holds the submitted
    jobs as soon as they are submitted, also when joining then fails."""

    def __init__(
        self,
        env_makers: list[Any],
        *,
        executor: Any,
        address: str,
        port: int,
        connect_timeout_s: float,
        **kwargs: Any,
    ) -> None:
        # Read by _init_workers, which TorchRL's __init__ calls.
        self.executor = executor
        self.address = address
        self.connect_timeout_s = connect_timeout_s
        self.jobs: list[Any] = []
        super().__init__(
            env_makers,
            launcher="submitit",
            sync=True,
            total_frames=UNBOUNDED_FRAMES,
            tcp_port=port,
            **kwargs,
        )

    def _init_workers(self) -> None:
        self.IPAddr = self.address
        for node in range(self.num_workers):
            self.jobs.append(self._init_worker_dist_submitit(self.executor, node))
        log.info(
            "submitted collection jobs %s; logs in %s; waiting for them at %s:%s",
            ", ".join(job.job_id for job in self.jobs),
            self.executor.folder, self.address, self.tcp_port,
        )  # fmt: skip
        default_wait_days = torchrl_distributed.MAX_TIME_TO_CONNECT
        torchrl_distributed.MAX_TIME_TO_CONNECT = self.connect_timeout_s / 86_400
        try:
            self._init_master_dist(self.num_workers + 1, self.backend)
        finally:
            torchrl_distributed.MAX_TIME_TO_CONNECT = default_wait_days


@contextmanager
def weight_sync_kept_open(collector: DistributedCollector) -> Iterator[None]:
    """Shut ``collector`` down inside this block, and its weight-sync store only after.

    TorchRL closes the store as soon as each job has handed back its result, while the
    job's receiver thread still waits on that store: the job then aborts on its way out and
    ends FAILED. Test: ``test_distributed_shutdown_still_closes_the_weight_store_itself``."""
    schemes, collector._weight_sync_schemes = collector._weight_sync_schemes, None
    try:
        yield
    finally:
        for scheme in (schemes or {}).values():
            scheme.shutdown()


def undo_trajectory_id_shifts(ids: torch.Tensor) -> torch.Tensor:
    """Each job's own trajectory ids, from a gathered ``(jobs, frames)`` batch.

    TorchRL shifts job ``i``'s ids by job ``i-1``'s largest (already shifted) id, so the
    first trajectory of one job takes the id of the last of the other, and the shift
    changes from batch to batch. Test: ``test_distributed_collector_still_shifts_ids``."""
    ids = ids.clone()
    for node in range(ids.shape[0] - 1, 0, -1):  # last first: each shift used the one before
        ids[node] -= ids[node - 1].max()
    return ids


# -- 4. an LSTM unrolled over sequences -----------------------------------------------------


def unrolling_view(network: TensorDictSequential) -> TensorDictSequential:
    """``network`` as a loss unrolls it over ``[sequences, steps]``: the same modules and
    weights, but its LSTM writes the states it reaches under keys of its own.

    In recurrent mode TorchRL's ``LSTMModule`` writes the state it reached only at the
    last step, zeros before it, under its out_keys ``("next", state key)``: inside a loss
    those would replace the stored next states that the next states' values unroll from
    (``DQNLoss`` takes its next states from the same tensordict). Acting one step at a time,
    the policy still writes ``("next", state key)``, which the env carries to the next step.
    Test: ``test_an_unrolled_lstm_still_writes_zeros_before_the_last_step``."""
    modules = []
    for module in network:
        if isinstance(module, LSTMModule):
            states = [key if isinstance(key, str) else key[-1] for key in module.in_keys[1:3]]
            module = LSTMModule(
                lstm=module.lstm,
                in_keys=module.in_keys[:3],
                out_keys=[module.out_keys[0], *(f"unrolled_{key}" for key in states)],
            )
        modules.append(module)
    return TensorDictSequential(*modules)


# -- 5. a batch of envs that changes the thread count when it closes ----------------------


def close_keeping_threads(env: BatchedEnvBase) -> None:
    """Close ``env`` (a ``SerialEnv`` or ``ParallelEnv``) and leave torch's thread count as
    it was. TorchRL's ``close`` sets it to ``min(the count at import, now + workers)``, even
    for a ``SerialEnv``, which never lowered it: after one evaluation a run with
    ``threads=1`` would compute its updates on more threads, and float rounding would
    change what it learns. Test: ``test_closing_a_serial_env_still_raises_the_thread_count``.

    A batch whose envs failed to start (a stop dropping the evaluation as they were built)
    counts as closed already, and TorchRL's ``close`` raises for it: not here, so that the
    exception that stopped it is the one that propagates. Test:
    ``test_a_batch_whose_envs_failed_to_start_still_refuses_to_close``."""
    threads = torch.get_num_threads()
    try:
        env.close(raise_if_closed=False)
    finally:
        torch.set_num_threads(threads)


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


# -- 11. hindsight relabelling -------------------------------------------------------------


class HERSampling(HERReplayBuffer):
    """TorchRL's ``HERReplayBuffer``, its sampling steps under public names for the
    relabelling of :mod:`rl_app.replay.hindsight` (which overrides :meth:`sample_relabelled`),
    and one of its behaviours changed:

    It rebuilds its table of episode ends when the storage changed, which it tells by a key
    holding the storage's private ``_last_cursor``: a tensor of slots after any ``extend``.
    Once the storage is full the lengths in two keys are equal and Python compares the
    tensors, which raises ("Boolean value of Tensor with more than one value is
    ambiguous"); and a cursor that comes round to the same slots would keep a stale table.
    Here the key is the storage's length and the writer's count of writes, which grows with
    every one (private ``_storage_cache_key``). Test:
    ``test_a_full_her_buffer_still_fails_to_compare_its_cache_key``."""

    def _storage_cache_key(self, storage: Any) -> tuple:
        return (len(storage), self.write_count)

    def _sample(self, batch_size: int) -> tuple[Any, dict]:
        return self.sample_relabelled(batch_size)

    def sample_relabelled(self, batch_size: int) -> tuple[TensorDictBase, dict]:
        """Data and info of a sample of ``batch_size``, relabelled: TorchRL's way by
        default (:meth:`relabelled_per_step`)."""
        return self.relabelled_per_step(batch_size)

    def relabelled_per_step(self, batch_size: int) -> tuple[TensorDictBase, dict]:
        """TorchRL's relabelled sample: the first ``her_ratio`` of its records each take a
        goal of its own, drawn by the strategy."""
        return super()._sample(batch_size)

    def not_relabelled(self, batch_size: int) -> tuple[TensorDictBase, dict]:
        """A sample as a plain buffer draws it, with the info TorchRL writes over it."""
        return super(HERReplayBuffer, self)._sample(batch_size)

    def episode_ends(self) -> torch.Tensor:
        """The slots where stored episodes end, in storage order."""
        return self._get_episode_ends(self.storage)

    def goal_sources(self, index: torch.Tensor, episode_ends: torch.Tensor) -> torch.Tensor:
        """For each stored step at ``index``, the slot whose achieved goal becomes its goal,
        drawn by the strategy within its episode (``episode_ends``: :meth:`episode_ends`)."""
        starts, last = self._get_episode_range(index, episode_ends)
        return self._sample_goal_indices(index, starts, last, len(self.storage))


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


# -- 13. the RPC collector on local processes and SLURM jobs -----------------------------

# TorchRL's RPC collector names worker i's RPC node "COLLECTOR_NODE_{i + 1}" (the learner is
# rank 0), and RPC re-raises a worker's error with the worker named in its message, the
# worker's own error on the next line. Test: ``test_an_rpc_worker_error_still_names_its_node``.
RPC_WORKER_NODE = re.compile(r"COLLECTOR_NODE_(\d+)\):\n(.*)")


def rpc_worker_of(error: BaseException) -> tuple[int, str] | None:
    """The index of the RPC collector worker ``error`` came from and its own error, if it
    names one."""
    found = RPC_WORKER_NODE.search(str(error))
    return (int(found.group(1)) - 1, found.group(2)) if found else None


def undo_rpc_trajectory_id_shift(ids: torch.Tensor, workers: int) -> torch.Tensor:
    """A sync RPC batch's trajectory ids as its workers wrote them.

    TorchRL concatenates the workers' batches (in the order they finish) and then shifts
    what it takes for worker ``i``'s ids, ``ids[i]``, by ``ids[i - 1].max()``: on the
    concatenated frames that adds frame ``i - 1``'s id to frame ``i``, for the first
    ``workers`` frames. Test: ``test_rpc_collector_still_shifts_the_first_frames_ids``."""
    ids = ids.clone()
    ids[:workers] = undo_trajectory_id_shifts(ids[:workers])
    return ids


def free_local_port() -> int:
    """A TCP port free on this machine now, for the RPC collector's rendezvous (TorchRL's
    own default, 10003, is one port for every run on the machine)."""
    return _find_free_port()


class LaunchedRPCCollector(RPCCollector):
    """TorchRL's ``RPCCollector`` on local processes (``executor=None``: its ``mp``
    launcher), or on SLURM jobs submitted with a given ``executor``, which join the learner
    at ``address``; it runs until stopped. ``jobs`` holds the processes or jobs.

    TorchRL 0.14.1's submitit launcher takes its own executor (a ``./log_test`` folder, no
    SLURM resources) and the host name's address: here the jobs are submitted as its
    ``submitit_delayed`` launcher expects them, already running, with TorchRL's own worker
    entry point. Test: ``test_rpc_collector_still_starts_its_nodes_with_this_entry_point``."""

    def __init__(self, *, executor: Any = None, address: str = "localhost", **kwargs: Any) -> None:
        self.executor = executor
        self.address = address
        launcher = "mp" if executor is None else "submitit_delayed"
        super().__init__(launcher=launcher, total_frames=UNBOUNDED_FRAMES, **kwargs)

    def _init_worker_rpc(self, executor: Any, i: int) -> Any:
        if self.executor is None:
            return super()._init_worker_rpc(executor, i)
        return self.executor.submit(
            torchrl_rpc._rpc_init_collection_node,
            i + 1,
            self.address,
            self.tcp_port,
            self.num_workers + 1,
            None,
            self.tensorpipe_options,
            self.backend,
            self._VERBOSE,
        )


def rpc_started_in_this_process() -> bool:
    """Whether this process has joined an RPC group before.

    torch 2.14.1 prefixes a group's rendezvous keys with a count of the process's
    ``init_rpc`` calls, and numbers its all-gathers per process: a process that already ran
    an RPC collector starts a second with keys and numbers its fresh workers never use, and
    waits for them for ever (resetting both counts gets it started, then its shutdown waits
    for ever). Test: ``test_a_second_rpc_group_in_a_process_still_uses_other_keys``."""
    return rpc_api._init_counter > 0
