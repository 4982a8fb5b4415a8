"""Checkpoints: what a run saves after each evaluation, and how it is read back.

One :class:`torchrl.checkpoint.Checkpoint` binds every live object a resume needs; a
:class:`torchrl.checkpoint.CheckpointRotation` keeps the newest ``checkpoint.keep_last``
checkpoints plus the best one by evaluation return. Saves are staged beside the target
and moved in with one rename, so a failed save leaves the previous checkpoint intact.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchrl.checkpoint import (
    Checkpoint,
    CheckpointLoadResult,
    CheckpointRotation,
    StateDictCheckpointAdapter,
)

# The metadata key that ranks checkpoints.
EVAL_METRIC = "eval_reward"

# State dicts are written with torch.save: a truncated file then fails to load, where the
# default per-tensor directory payload reads a truncated tensor back as zeros.
STATE_DICT_ADAPTER = StateDictCheckpointAdapter(payload_format="torch")


def make_checkpoint(components: Mapping[str, Any]) -> Checkpoint:
    """Bind named components: objects with ``dump``/``load`` (the replay buffer) save
    themselves; objects with ``state_dict`` go through ``torch.save``; plain values as JSON."""
    checkpoint = Checkpoint()
    for name, component in components.items():
        saves_itself = callable(getattr(component, "dump", None))
        has_state = callable(getattr(component, "state_dict", None))
        adapter = STATE_DICT_ADAPTER if has_state and not saves_itself else None
        checkpoint.register(name, component, adapter=adapter)
    return checkpoint


class RunCheckpoints:
    """The checkpoints of one run: save after an evaluation, find the latest and the best."""

    def __init__(self, directory: Path, keep_last: int, components: Mapping[str, Any]) -> None:
        self.checkpoint = make_checkpoint(components)
        self.rotation = CheckpointRotation(
            directory, keep_last=keep_last, keep_best=(EVAL_METRIC, "max")
        )

    def save(self, frames: int, eval_reward: float) -> Path:
        return self.rotation.save(self.checkpoint, step=frames, metadata={EVAL_METRIC: eval_reward})

    def latest(self) -> Path | None:
        return self.rotation.latest()

    def best(self) -> Path | None:
        return self.rotation.best()

    def load(self, path: Path) -> CheckpointLoadResult:
        """Restore every bound component from ``path``."""
        return self.checkpoint.load(path)
