"""The replay buffer: one part, which the loop extends with each collected batch, samples an
iteration's batches from, and gives back what the updates computed
(:class:`~rl_app.replay.buffer.RunReplayBuffer`). It is TorchRL's
``TensorDictReplayBuffer``: memmap storage on disk inside the run directory
(:mod:`rl_app.replay.journal` brings it back to a checkpoint's state; with
``replay.device=cuda``, storage in GPU memory), a sampler chosen by ``replay.sampler``
(prioritized slices of whole trajectories by default), a writer counting each slot's
overwrites so that late priorities and patches can be told from fresh ones.

A feature is a module here, built from TorchRL's buffer parts (a storage, writer, sampler,
sample unit, transform or buffer subclass), and switched on by :func:`make_replay_buffer`
from the settings that ask for it; a run that does not ask for it never runs its code:

- :mod:`~rl_app.replay.frames`: Atari frames stored once, stacks rebuilt at sample time (a
  buffer transform), when the algorithm stores frames (its ``replay_keys()``);
- :mod:`~rl_app.replay.hindsight`: goals relabelled as transitions are sampled (a buffer
  subclass), ``replay.her_ratio``;
- :mod:`~rl_app.replay.sequences`: TorchRL's Sequence windows with burn-in (a sample unit
  and a buffer subclass), ``replay.sampler=prioritized_sequence``;
- :mod:`~rl_app.replay.recurrent`: recurrent states recomputed and written back after the
  updates (a write-back part), with a recurrent network;
- :mod:`~rl_app.replay.nstep`: each sampled slice turned into one n-step transition (a
  part of the buffer's sampling), ``optim.target=nstep_transition``;
- :mod:`~rl_app.replay.journal`: the undo journal that checkpoints restore the storage with.

The same buffer may instead live in a Ray actor that the ``collector.mode=ray`` actors
write into (``replay.service=ray``): :mod:`~rl_app.replay.service`.

Adding one: write its module here; switch it on in :func:`make_replay_buffer` from its
settings; put the checks of those settings in ``rl_app/replay/checks.py``; test it in
``tests/`` beside the tests of the part it extends (``tests/test_replay.py`` shows that a
default buffer runs none of the features).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase
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
from torchrl.envs import EnvBase

from rl_app.config import OptimConfig, ReplayConfig
from rl_app.envs import FRAME_KEY
from rl_app.replay.buffer import (
    SLICE_PRIORITY_ETA,
    RunReplayBuffer,
    slice_priorities,
    write_priorities,
)
from rl_app.replay.checks import NSTEP_TRANSITION, samples_sequences
from rl_app.replay.journal import JournaledStorage
from rl_app.replay.keys import (
    LOSS_MASK_KEY,
    NEXT_ACHIEVED_GOAL,
    NEXT_FRAME_KEY,
    PRIORITY_KEY,
    SLOT_KEY,
    TRAJECTORY_KEY,
)
from rl_app.upstream.torchrl import (
    VectorizedSliceSampler,
    gymnasium_env,
    keep_priority_trees_on_cpu,
    lay_out_storage,
)

__all__ = [
    "LOSS_MASK_KEY",
    "NEXT_ACHIEVED_GOAL",
    "PRIORITY_KEY",
    "SLICE_PRIORITY_ETA",
    "SLOT_KEY",
    "TRAJECTORY_KEY",
    "RunReplayBuffer",
    "allocate_storage",
    "make_replay_buffer",
    "make_sampler",
    "nstep_gamma",
    "shared_buffer_parts",
    "slice_priorities",
    "stored_transition",
    "write_priorities",
]


def make_sampler(replay: ReplayConfig, *, torchrl_own: bool = False) -> Sampler:
    """The sampler named by ``replay.sampler``; with ``torchrl_own``, TorchRL's own class
    where rl_app replaces it (``prioritized_slice``), with the same settings (to compare)."""
    slices = {
        "slice_len": replay.slice_len,
        "traj_key": TRAJECTORY_KEY,
        "strict_length": True,
        # TorchRL's own class scans the whole storage for trajectory boundaries; cached,
        # that scan runs once per extend (which clears the cache) instead of once per
        # sample. Exact here: the learner is the buffer's only writer, and it writes through
        # extend. rl_app's keeps the slots that may start a slice per write instead.
        "cache_values": True,
    }
    prioritized = {"max_capacity": replay.capacity, "alpha": replay.alpha, "beta": replay.beta}
    # A one-step slice is a transition; TorchRL 0.14.1's PrioritizedSliceSampler masks every
    # start when slice_len is 1 (it then raises "non-positive p_sum").
    one_step = replay.slice_len == 1
    if replay.sampler == "slice":
        return SliceSampler(**slices)
    if replay.sampler == "uniform":
        return RandomSampler()
    if replay.sampler == "prioritized_slice" and not one_step:
        kind = PrioritizedSliceSampler if torchrl_own else VectorizedSliceSampler
        sampler = kind(**prioritized, **slices)
    else:  # prioritized, prioritized_sequence, or one-step prioritized slices
        sampler = PrioritizedSampler(**prioritized)
    # With replay.device=cuda too: the trees stay on the CPU (rl_app.upstream).
    keep_priority_trees_on_cpu(sampler)
    return sampler


def nstep_gamma(optim: OptimConfig) -> float | None:
    """The discount of the n-step transitions ``optim.target`` asks for (None: none)."""
    return optim.gamma if optim.target == NSTEP_TRANSITION else None


def shared_buffer_parts(replay: ReplayConfig, seed: int) -> dict[str, Any]:
    """The parts of every run's buffer, in this process or in a replay service's actor:
    priorities under :data:`PRIORITY_KEY`, a generator seeded with ``seed`` (sampling is
    reproducible, and its state travels with the buffer's checkpoint), slices of
    ``replay.slice_len`` steps when ``replay.sampler`` yields sequences."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    return {
        "priority_key": PRIORITY_KEY,
        "generator": generator,
        "slice_len": replay.slice_len if samples_sequences(replay.sampler) else None,
    }


def make_replay_buffer(
    replay: ReplayConfig,
    scratch_dir: Path,
    seed: int,
    env: EnvBase | None = None,
    *,
    keys: list[NestedKey] | None = None,
    device: torch.device | str = "cpu",
    recurrent_states: Callable[[TensorDictBase], TensorDictBase] | None = None,
    nstep_gamma: float | None = None,
) -> RunReplayBuffer:
    """A buffer of ``replay.capacity`` transitions memory-mapped under ``scratch_dir``, or
    held in GPU memory when ``replay.device`` is a GPU (a memory map lives on the host),
    keeping the ``keys`` of each collected frame (an algorithm's ``replay_keys()``; None:
    all it is given) and handing sampled batches to ``device``.

    Its features, each switched on here:
    frames stored once (``keys`` store frames), hindsight relabelling (``replay.her_ratio``,
    with the reward and termination of goal env ``env``), Sequence windows
    (``replay.sampler=prioritized_sequence``), recurrent states recomputed by
    ``recurrent_states`` after the updates (given with a recurrent network), a slice
    sampler's slices turned into n-step transitions discounted by ``nstep_gamma``
    (``optim.target=nstep_transition``)."""
    if replay.device.startswith("cuda"):
        storage = LazyTensorStorage(replay.capacity, device=replay.device)
    else:
        # Files kept across a resume: checkpoints restore them (rl_app.replay.journal).
        storage = JournaledStorage(replay.capacity, scratch_dir=scratch_dir, existsok=True)
    parts = {
        "storage": storage,
        "sampler": make_sampler(replay),
        # Each slot counts its overwrites, so late priorities can be told from fresh ones.
        "writer": TensorDictRoundRobinWriter(track_generations=True),
        **shared_buffer_parts(replay, seed),
        "collected_keys": None if keys is None else [*keys, TRAJECTORY_KEY],
        "device": device,
    }
    stack = None
    if keys is not None and NEXT_FRAME_KEY in keys:  # frames stored once (frame_replay_keys)
        from rl_app.replay.frames import StoredFrames, stack_frames

        # The reset slots are made of the observation's newest frame.
        parts["collected_keys"].append(FRAME_KEY)
        parts["transform"] = StoredFrames(storage, stack_samples=nstep_gamma is None)
        stack = functools.partial(stack_frames, storage)
    if nstep_gamma is not None:
        from rl_app.replay.nstep import NStepTransitions

        parts["nstep"] = NStepTransitions(nstep_gamma, replay.slice_len, stack)
    if recurrent_states is not None:
        from rl_app.replay.recurrent import StateRefresh

        parts["refresh"] = StateRefresh(recurrent_states, write=replay.refresh_states)
    if replay.her_ratio:
        from rl_app.replay.hindsight import hindsight_buffer

        return hindsight_buffer(replay, gymnasium_env(env).unwrapped, **parts)
    if replay.sampler == "prioritized_sequence":
        from rl_app.replay.sequences import SequenceReplayBuffer, sequence_unit

        return SequenceReplayBuffer(sample_unit=sequence_unit(replay), **parts)
    return RunReplayBuffer(**parts)


def stored_transition(env: EnvBase, keys: Iterable) -> TensorDictBase:
    """One transition as the buffer stores it: the ``keys`` an algorithm learns from (its
    ``replay_keys()``), shaped as ``env``'s specs say, with the collector's trajectory id
    and the writer's slot. Its values mean nothing: it gives the storage its layout."""
    transition = env.fake_tensordict().reshape(-1)[0].select(*keys)
    transition[TRAJECTORY_KEY] = torch.zeros((), dtype=torch.int64)
    transition[SLOT_KEY] = torch.zeros((), dtype=torch.int64)
    return transition


def allocate_storage(buffer: TensorDictReplayBuffer, transition: TensorDictBase) -> None:
    """Lay the storage out at its full size now, from a :func:`stored_transition`, rather
    than at the first extend, and take the disk space of its memory-mapped files.

    Those files are sparse: their disk blocks would be taken as frames arrive, and a write
    through a memory map to a full disk kills the process (SIGBUS) instead of raising.
    Taken here, a full disk raises ``OSError`` at the start, and the files are removed."""
    storage = buffer.storage
    lay_out_storage(storage, transition)  # what TorchRL runs at the first extend, run ahead
    if not isinstance(storage, LazyMemmapStorage):
        return  # GPU memory: taken by the layout
    files = sorted(Path(storage.scratch_dir).rglob("*.memmap"))
    size = sum(file.stat().st_size for file in files)
    try:
        for file in files:
            with open(file, "r+b") as handle:
                os.posix_fallocate(handle.fileno(), 0, os.fstat(handle.fileno()).st_size)
    except OSError as error:
        for file in files:  # their blocks are freed when the process ends
            file.unlink()
        raise OSError(
            error.errno, f"{error.strerror} ({size / 1e6:.1f} MB in {storage.scratch_dir})"
        ) from None
