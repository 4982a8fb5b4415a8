"""Recurrent-state refresh: after the updates, the learner recomputes the recurrent state
each sampled record would act with under the current weights; the buffer logs how far the
stored states were from them (``train/state_drift``) and, with ``replay.refresh_states``,
writes them back into the records still there (``train/states_refreshed``), so that later
samples start from fresher states (R2D2's stored state, refreshed). ``network.recurrent``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDictBase
from torchrl.data import TensorDictReplayBuffer

from rl_app.envs import RECURRENT_STATE_KEYS
from rl_app.replay.journal import record_patch


class StateRefresh:
    """The write-back of recurrent states: ``recompute`` gives the states of sampled
    ``[sequences, steps]`` records (an algorithm's ``recurrent_states``); ``write``: whether
    they are written into the buffer, or only measured."""

    def __init__(self, recompute: Callable[[TensorDictBase], TensorDictBase], write: bool) -> None:
        self.recompute = recompute
        self.write = write

    def __call__(
        self, buffer: TensorDictReplayBuffer, sequences: TensorDictBase
    ) -> dict[str, float]:
        states = self.recompute(sequences)
        metrics = {"train/state_drift": recurrent_state_drift(sequences, states)}
        if self.write:
            metrics["train/states_refreshed"] = write_recurrent_states(buffer, sequences, states)
        return metrics


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
