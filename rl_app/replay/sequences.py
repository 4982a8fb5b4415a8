"""Sequences with burn-in: TorchRL's ``Sequence`` sample unit expands each sampled anchor
into a window of ``replay.burn_in`` steps before it and ``replay.slice_len`` from it, cut
at its episode's ends (padded there, and masked); the loss counts its learning steps
inside the episode (``LOSS_MASK_KEY``), and its priority goes to its anchor
(:func:`rl_app.replay.buffer.write_priorities`). ``replay.sampler=prioritized_sequence``."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.data.replay_buffers import Sequence

from rl_app.config import ReplayConfig
from rl_app.replay.buffer import RunReplayBuffer, to_learner
from rl_app.replay.keys import LOSS_MASK_KEY


def sequence_unit(replay: ReplayConfig) -> Sequence:
    """The sample unit expanding each sampled anchor into its window."""
    return Sequence(replay.slice_len, burn_in=replay.burn_in, episode_boundary="pad")


class SequenceReplayBuffer(RunReplayBuffer):
    """A buffer whose samples are Sequence windows: ``[batch_size / slice_len,
    burn_in + slice_len]`` records per batch, one window per row."""

    def sample_batches(self, batch_size: int, count: int) -> list[TensorDictBase]:
        anchors = count * batch_size // self.slice_len
        windows = sequence_windows(self.sample(anchors).reshape(anchors, -1))
        on_learner = to_learner(windows, self.device)
        return list(on_learner.reshape(count, -1, windows.shape[1]).unbind(0))


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
