"""TorchRL 0.14.1's ``HERReplayBuffer``: its private sampling steps and the workaround of its
cache key (the index is in :mod:`rl_app.upstream`). Imported only by
:mod:`rl_app.replay.hindsight` (``replay.her_ratio``)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.data import HERReplayBuffer

# -- 1. hindsight relabelling --------------------------------------------------------------


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
