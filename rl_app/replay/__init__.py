"""The replay buffer: memmap storage on disk inside the run directory, and a sampler
chosen by ``replay.sampler`` (prioritized slices of whole trajectories by default); with
``replay.her_ratio``, goals relabelled in hindsight as transitions are sampled."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    SliceSampler,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
)
from torchrl.data.replay_buffers import Sequence
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.envs import EnvBase

from rl_app.config import ReplayConfig
from rl_app.envs import RECURRENT_STATE_KEYS
from rl_app.replay.checks import samples_sequences
from rl_app.replay.journal import JournaledStorage, record_patch
from rl_app.upstream.torchrl import (
    HindsightReplayBuffer,
    VectorizedSliceSampler,
    gymnasium_env,
    lay_out_storage,
)

# The collector numbers every trajectory; slices are cut within one id.
TRAJECTORY_KEY = ("collector", "traj_ids")
# The writer stamps every stored transition with its slot.
SLOT_KEY = "index"
# Where an algorithm's update writes one new priority per sampled transition.
PRIORITY_KEY = "td_error"
# Steps of a sampled Sequence window the loss counts: learning steps (not burn-in) that are
# part of the sampled episode (not padding past its end).
LOSS_MASK_KEY = "loss_mask"
# R2D2's mix of a slice's largest and mean step priority (Kapturowski et al., 2019).
SLICE_PRIORITY_ETA = 0.9
# A transition is relabelled with the goal a later step achieved after its action (as
# Stable-Baselines3's HerReplayBuffer does): the goal that step's reward was for. Stored
# with every transition when relabelling is on.
NEXT_ACHIEVED_GOAL = ("next", "achieved_goal")


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
    if replay.sampler in ("prioritized", "prioritized_sequence") or (
        replay.sampler == "prioritized_slice" and one_step
    ):
        return PrioritizedSampler(**prioritized)
    if replay.sampler == "prioritized_slice":
        return VectorizedSliceSampler(**prioritized, **slices)
    if replay.sampler == "slice":
        return SliceSampler(**slices)
    return RandomSampler()


def make_replay_buffer(
    replay: ReplayConfig, scratch_dir: Path, seed: int, env: EnvBase | None = None
) -> TensorDictReplayBuffer:
    """A buffer of ``replay.capacity`` transitions memory-mapped under ``scratch_dir``, or
    held in GPU memory when ``replay.device`` is a GPU (a memory map lives on the host).

    The buffer draws from its own seeded generator, so sampling is reproducible and its
    state travels with the buffer's checkpoint. With ``replay.her_ratio`` it relabels
    goals (:func:`hindsight_buffer`) with the reward and termination of goal env ``env``;
    its goals are drawn from torch's global generator, which checkpoints save too."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    if replay.device.startswith("cuda"):
        storage = LazyTensorStorage(replay.capacity, device=replay.device)
    else:
        # Files kept across a resume: checkpoints restore them (rl_app.replay.journal).
        storage = JournaledStorage(replay.capacity, scratch_dir=scratch_dir, existsok=True)
    sequence = None
    if replay.sampler == "prioritized_sequence":
        # Each sampled anchor expands into burn_in steps before it and slice_len from it,
        # cut at its episode's ends (padded there, and masked).
        sequence = Sequence(replay.slice_len, burn_in=replay.burn_in, episode_boundary="pad")
    parts = {
        "storage": storage,
        "sampler": make_sampler(replay),
        "sample_unit": sequence,
        # Each slot counts its overwrites, so late priorities can be told from fresh ones.
        "writer": TensorDictRoundRobinWriter(track_generations=True),
        "priority_key": PRIORITY_KEY,
        "generator": generator,
    }
    if replay.her_ratio:
        return hindsight_buffer(replay, gymnasium_env(env).unwrapped, parts)
    return TensorDictReplayBuffer(**parts)


def hindsight_buffer(replay: ReplayConfig, goal_env: gym.Env, parts: dict) -> HindsightReplayBuffer:
    """TorchRL's hindsight experience replay over a buffer made of ``parts``: the first
    ``replay.her_ratio`` of each sampled batch takes as desired goal (and next desired goal)
    what its episode achieved after one of its steps, picked by ``replay.her_strategy``,
    with the reward ``goal_env`` gives for it; every sampled transition's ``terminated``
    is recomputed for its goal (:class:`~rl_app.upstream.HindsightReplayBuffer`). From a
    slice sampler, the share is one of slices, each relabelled with one goal: the one its
    first step would get, so that a multi-step target along it is for one goal.

    TorchRL finds episodes in storage order: the steps of the one episode that wraps past
    the end of a full ring take goals from their own slot (future) or from the episode
    before them (final, episode). Those transitions stay right, reward and termination
    being recomputed for whatever goal they get; only their goals are not hindsight ones."""
    return HindsightReplayBuffer(
        reward_fn=functools.partial(goal_reward, goal_env),
        terminated_fn=functools.partial(goal_terminated, goal_env),
        her_ratio=replay.her_ratio,
        strategy=replay.her_strategy,
        achieved_goal_key=NEXT_ACHIEVED_GOAL,
        slice_len=replay.slice_len if samples_sequences(replay.sampler) else 1,
        **parts,
    )


def goal_reward(goal_env: gym.Env, transitions: TensorDictBase) -> torch.Tensor:
    """The reward of each transition for its desired goal: ``goal_env.compute_reward`` of
    the goal achieved after its action."""
    reward = goal_env.compute_reward(*goals_of(transitions), [{}] * transitions.numel())
    return as_step_values(reward, transitions, torch.float32)


def goal_terminated(goal_env: gym.Env, transitions: TensorDictBase) -> torch.Tensor:
    """Whether each transition ends its episode under its desired goal:
    ``goal_env.compute_terminated`` of the goal achieved after its action."""
    ended = goal_env.compute_terminated(*goals_of(transitions), [{}] * transitions.numel())
    return as_step_values(ended, transitions, torch.bool)


def goals_of(transitions: TensorDictBase) -> tuple[np.ndarray, np.ndarray]:
    """The goals achieved after each transition's action and the desired ones, as a goal
    env's functions take them."""
    achieved = transitions[NEXT_ACHIEVED_GOAL].reshape(transitions.numel(), -1)
    desired = transitions["desired_goal"].reshape(transitions.numel(), -1)
    return achieved.cpu().numpy(), desired.cpu().numpy()


def as_step_values(
    values: np.ndarray, transitions: TensorDictBase, dtype: torch.dtype
) -> torch.Tensor:
    """One value per transition, shaped as its reward: ``[*batch, 1]``. A goal env may
    answer a constant for every goal (gymnasium-robotics' ``compute_terminated``)."""
    values = np.broadcast_to(np.asarray(values), (transitions.numel(),))
    tensor = torch.as_tensor(values.copy(), dtype=dtype, device=transitions.device)
    return tensor.reshape(*transitions.shape, 1)


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


def sample_batches(
    buffer: TensorDictReplayBuffer,
    replay: ReplayConfig,
    batch_size: int,
    count: int,
    device: torch.device | str = "cpu",
    complete: Callable[[TensorDictBase], TensorDictBase] | None = None,
) -> list[TensorDictBase]:
    """``count`` batches of ``batch_size`` for as many updates, drawn in one sampler call,
    given what is not stored by ``complete`` (if given: :func:`rl_app.replay.frames.stack_frames`
    rebuilds frame stacks) and moved to ``device`` at once: ``[slices, slice_len]`` steps
    (time last) from a slice
    sampler, ``[batch_size / slice_len, burn_in + slice_len]`` from the sequence sampler
    (see :func:`sequence_windows`), ``[batch_size]`` transitions from the others.

    One call instead of ``count`` spares the sampler's fixed cost per call (with hindsight
    relabelling, each batch gets its share of relabelled transitions: :func:`dealt_out`).
    Drawn together,
    the batches all see the priorities as they stood before the first of their updates
    (:func:`write_priorities` then writes the new ones together). A slice sampler returns
    its slices one after the other, each in time order, so the flat sample reshapes into
    one slice per row."""
    if replay.sampler == "prioritized_sequence":
        anchors = count * batch_size // replay.slice_len
        windows = sequence_windows(buffer.sample(anchors).reshape(anchors, -1))
        return list(windows.to(device).reshape(count, -1, windows.shape[1]).unbind(0))
    sample = buffer.sample(count * batch_size)
    if replay.her_ratio:
        slice_len = replay.slice_len if samples_sequences(replay.sampler) else 1
        sample = dealt_out(sample, count, slice_len)
    sample = (sample if complete is None else complete(sample)).to(device)
    if samples_sequences(replay.sampler):
        return list(sample.reshape(count, -1, replay.slice_len).unbind(0))
    return list(sample.reshape(count, -1).unbind(0))


def dealt_out(sample: TensorDictBase, count: int, slice_len: int) -> TensorDictBase:
    """Flat ``sample``'s slices of ``slice_len`` steps (1: transitions) reordered so that,
    cut into ``count`` batches, each holds every ``count``-th slice of it. Hindsight
    relabelling relabels the first ``replay.her_ratio`` of a sample's slices: each batch
    then gets that share of them."""
    slices = sample.reshape(-1, slice_len)
    order = torch.arange(slices.shape[0]).reshape(-1, count).T.reshape(-1)
    return slices[order].reshape(-1)


def sequence_windows(windows: TensorDictBase) -> TensorDictBase:
    """Sequence windows, one per row, made ready for a loss over time.

    TorchRL's Sequence unit marks each record with ``learning_mask`` (not burn-in) and
    ``validity_mask`` (inside the anchor's episode: where a window reaches past the episode
    start or end, it repeats the first or last record). The loss counts the steps where
    both hold (``LOSS_MASK_KEY``). Two marks make the copies harmless for a recurrent
    network and a multi-step target: a recurrence restarts at the first valid record from
    the state stored with it (``is_init`` there, also for the next states), and the last
    valid record ends the multi-step chain (a ``done`` that bootstraps from its next
    state, as at any slice end)."""
    valid = windows["validity_mask"]
    windows[LOSS_MASK_KEY] = windows["learning_mask"] & valid
    first_valid = valid & ~torch.cat([torch.zeros_like(valid[:, :1]), valid[:, :-1]], dim=1)
    last_valid = valid & ~torch.cat([valid[:, 1:], torch.zeros_like(valid[:, :1])], dim=1)
    for key in ("is_init", ("next", "is_init")):
        if key in windows.keys(include_nested=True):
            windows[key] = windows[key] | first_valid.unsqueeze(-1)
    windows["next", "done"] = windows["next", "done"] | last_valid.unsqueeze(-1)
    return windows


def slice_priorities(
    step_priorities: torch.Tensor, counted: torch.Tensor | None = None
) -> torch.Tensor:
    """The priority of each slice (row) from its steps' priorities (columns):
    ``eta * max + (1 - eta) * mean`` with ``eta = SLICE_PRIORITY_ETA``, as in R2D2; only
    over the ``counted`` steps if given (a sequence's learning steps)."""
    if counted is None:
        counted = torch.ones_like(step_priorities, dtype=torch.bool)
    # A slice without a counted step (its frame stacks lost to overwriting) takes 0.
    largest = step_priorities.masked_fill(~counted, float("-inf")).amax(dim=1).clamp_min(0)
    mean = (step_priorities * counted).sum(dim=1) / counted.sum(dim=1).clamp_min(1)
    return SLICE_PRIORITY_ETA * largest + (1 - SLICE_PRIORITY_ETA) * mean


def write_priorities(buffer: TensorDictReplayBuffer, sample: TensorDictBase) -> int:
    """Write the priorities an update computed for ``sample`` (under ``PRIORITY_KEY``) into
    the buffer, for the slices still there; return how many slices were dropped.

    A flat sample counts as slices of one step. Priorities are stored per step index, and
    a prioritized slice sampler draws a slice *start* with probability proportional to the
    start index's priority (raised to ``alpha``). So every step of a slice takes its own
    TD error, then the slice's start takes :func:`slice_priorities` of them: that decides
    how often this slice is drawn again (a start that is also an inner step of another
    slice in the batch takes the slice priority). A Sequence window is a slice whose start
    is its anchor and whose counted steps are its learning ones (``LOSS_MASK_KEY``).

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
        keys = steps.keys()
        counted = steps[LOSS_MASK_KEY][live] if LOSS_MASK_KEY in keys else None
        starts = (steps["anchor_index"] if "anchor_index" in keys else index)[live][:, 0]
        index = index[live]
        steps_counted = torch.ones_like(index, dtype=torch.bool) if counted is None else counted
        # Starts last: where an index appears twice, the last write wins.
        buffer.update_priority(
            torch.cat([index[steps_counted], starts]),
            torch.cat([priority[steps_counted], slice_priorities(priority, counted)]),
        )
    return int((~live).sum())


def valid_records(sequences: TensorDictBase) -> torch.Tensor:
    """Which sampled records belong to their sequence's episode: Sequence windows mark
    padding in ``validity_mask``; slices hold none."""
    valid = sequences.get("validity_mask", None)
    if valid is None:
        valid = torch.ones(sequences.shape, dtype=torch.bool, device=sequences.device)
    return valid


def recurrent_state_drift(sequences: TensorDictBase, states: TensorDictBase) -> float:
    """How far the stored recurrent states of the sampled records are from ``states``,
    the ones the learner recomputed: the mean absolute difference over valid records."""
    valid = valid_records(sequences)
    gaps = [(sequences[key] - states[key]).abs().mean(dim=(-2, -1)) for key in RECURRENT_STATE_KEYS]
    return torch.stack(gaps).mean(dim=0)[valid].mean().item()


def write_recurrent_states(
    buffer: TensorDictReplayBuffer, sequences: TensorDictBase, states: TensorDictBase
) -> int:
    """Write the recomputed recurrent ``states`` (and the next ones) of the sampled valid
    records into the buffer, with ``update_if_present``: a record whose slot was
    overwritten since it was sampled (its generation changed) is left alone. Returns how
    many records were written."""
    valid = valid_records(sequences)
    keys = [*RECURRENT_STATE_KEYS, *(("next", key) for key in RECURRENT_STATE_KEYS)]
    record_patch(buffer.storage, sequences["index"][valid].cpu(), keys)
    result = buffer.update_if_present(
        index=sequences["index"][valid].cpu(),
        generation=sequences["index_generation"][valid].cpu(),
        patch={key: states[key][valid].cpu() for key in keys},
    )
    return int(result.updated.sum())
