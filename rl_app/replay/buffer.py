"""The run's replay buffer: TorchRL's ``TensorDictReplayBuffer`` that the loop extends with
each collected batch, samples an iteration's batches from, and gives back what the updates
computed (:class:`RunReplayBuffer`). Without a feature switched on, this module is the
whole of it."""

from __future__ import annotations

from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase
from torchrl.data import PrioritizedSampler, TensorDictReplayBuffer

from rl_app.replay.keys import LOSS_MASK_KEY, PRIORITY_KEY

# R2D2's mix of a slice's largest and mean step priority (Kapturowski et al., 2019).
SLICE_PRIORITY_ETA = 0.9

# What a write-back does besides priorities, given the buffer and the sampled records
# with what the updates wrote into them; it returns metrics (rl_app.replay.recurrent).
WriteBack = Callable[[TensorDictReplayBuffer, TensorDictBase], dict[str, float]]


class RunReplayBuffer(TensorDictReplayBuffer):
    """TorchRL's buffer (``parts``: storage, sampler, writer, ...) as the loop uses it:
    :meth:`extend`, :meth:`sample_batches`, :meth:`write_back`.

    ``collected_keys``: what it keeps of a collected frame (None: everything it is given);
    ``slice_len``: the steps of a sampled slice (None: transitions); ``device``: where sampled
    batches go; ``refresh``: what a write-back does besides priorities; ``nstep``: what turns
    each sampled slice into one n-step transition (:mod:`rl_app.replay.nstep`; None: batches
    are the slices)."""

    def __init__(
        self,
        *,
        collected_keys: list[NestedKey] | None = None,
        slice_len: int | None = None,
        device: torch.device | str = "cpu",
        refresh: WriteBack | None = None,
        nstep: Callable[[TensorDictBase], TensorDictBase] | None = None,
        **parts: Any,
    ) -> None:
        super().__init__(**parts)
        self.collected_keys = collected_keys
        self.slice_len = slice_len
        self.device = device
        self.refresh = refresh
        self.nstep = nstep

    def extend(self, batch: TensorDictBase, **options: Any) -> torch.Tensor:
        """Store the frames of a collected ``batch`` (of any shape), in one write."""
        if self.collected_keys is not None:
            batch = batch.reshape(-1).select(*self.collected_keys)
        return super().extend(batch, **options)

    def sample_batches(self, batch_size: int, count: int) -> list[TensorDictBase]:
        """``count`` batches of ``batch_size`` for as many updates, drawn in one sampler
        call and moved to ``device`` at once: ``[slices, slice_len]`` steps (time last)
        from a slice sampler, ``[batch_size]`` transitions from the others, and
        ``[batch_size]`` n-step transitions, one per slice, with ``nstep``.

        One call instead of ``count`` spares the sampler's fixed cost per call. Drawn
        together, the batches all see the priorities as they stood before the first of
        their updates (:meth:`write_back` then writes the new ones together). A slice
        sampler returns its slices one after the other, each in time order, so the flat
        sample reshapes into one slice per row."""
        if self.nstep is not None:  # batch_size transitions, a slice each
            slices = self.dealt_out(self.sample(count * batch_size * self.slice_len), count)
            return list(to_learner(self.nstep(slices), self.device).reshape(count, -1).unbind(0))
        sample = to_learner(self.dealt_out(self.sample(count * batch_size), count), self.device)
        if self.slice_len is not None:
            return list(sample.reshape(count, -1, self.slice_len).unbind(0))
        return list(sample.reshape(count, -1).unbind(0))

    def dealt_out(self, sample: TensorDictBase, count: int) -> TensorDictBase:
        """``sample`` arranged to be cut into ``count`` batches: as it was drawn."""
        return sample

    def write_back(self, samples: list[TensorDictBase]) -> dict[str, float]:
        """Give the buffer what the updates computed for ``samples`` (the batches of
        :meth:`sample_batches`): their new priorities (:func:`write_priorities`) and, with
        ``refresh``, what it writes; returns its metrics."""
        sampled = torch.cat(samples)
        write_priorities(self, sampled)
        return {} if self.refresh is None else self.refresh(self, sampled)


def to_learner(sample: TensorDictBase, device: torch.device | str) -> TensorDictBase:
    """``sample`` on the learner's ``device``; from the host to a GPU through pinned memory,
    without waiting for the copy (the update's kernels come after it on the stream)."""
    on_host = sample.device is not None and sample.device.type == "cpu"
    if torch.device(device).type == "cuda" and on_host:
        return sample.pin_memory().to(device, non_blocking=True)
    return sample.to(device)


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

    A flat sample counts as slices of one step. Priorities are stored per step index, and a
    prioritized slice sampler draws a slice *start* with probability proportional to the
    start index's priority (raised to ``alpha``). So every counted step of a slice (not
    padding, ``LOSS_MASK_KEY``) takes its own TD error, then the slice's start takes
    :func:`slice_priorities` of them: that decides how often this slice is drawn again (a
    start that is also an inner step of another slice in the batch takes the slice
    priority). A Sequence window is a slice whose start is its anchor and whose counted
    steps are its learning ones (``LOSS_MASK_KEY``).

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


def sampled_batches(
    buffer: RunReplayBuffer, batch_size: int, count: int, prefetch: bool
) -> Generator[TensorDictBase, None, None]:
    """An iteration's ``count`` batches, drawn at the first ``next`` in one sampler call or,
    with ``prefetch`` (``replay.prefetch``), one call per batch in a background thread, each
    batch drawn while the update before it runs. Either way every draw sees the priorities as
    they stood before the iteration's first update (they are written back after the last).
    Closing it waits for a draw in flight."""
    if not prefetch:
        yield from buffer.sample_batches(batch_size, count)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="rl_app-sampling") as sampling:
        drawn = sampling.submit(buffer.sample_batches, batch_size, 1)
        for left in reversed(range(count)):
            (batch,) = drawn.result()
            if left:
                drawn = sampling.submit(buffer.sample_batches, batch_size, 1)
            yield batch
