"""Checkpoints: what a run saves (after each evaluation, on a stop, and on a wall-clock
cadence), how it is verified and read back.

One :class:`torchrl.checkpoint.Checkpoint` binds every live object a resume needs; a
:class:`torchrl.checkpoint.CheckpointRotation` keeps the newest ``checkpoint.keep_last``
checkpoints plus the best one by evaluation return (a checkpoint saved without an
evaluation has none, and is never the best). Saves are staged beside the target
and moved in with one rename, so a failed save leaves the previous checkpoint intact.

Loads are verified first. TorchRL reads a truncated tensor file of its default directory
payload back as zeros, so every component is saved with a SHA-256 of each of its files,
inside the staged checkpoint, and :func:`verify_checkpoint` checks them all before anything
is loaded.

The replay buffer's data is not in a checkpoint: its files stay where they are, and an undo
journal brings them back to a checkpoint's state (:mod:`rl_app.replay.journal`); only a
buffer in GPU memory (``replay.device=cuda``) is saved whole with each checkpoint.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from torchrl.checkpoint import (
    Checkpoint,
    CheckpointAdapter,
    CheckpointError,
    CheckpointLoadResult,
    CheckpointRotation,
    JSONCheckpointAdapter,
    StateDictCheckpointAdapter,
)

from rl_app.logger import EVAL_KEY
from rl_app.replay.journal import Journal
from rl_app.upstream.torchrl import add_checkpoint_metadata

CHECKSUM_FILE = "SHA256SUMS.json"
# The free disk a save asks for, as a multiple of the last checkpoint's size.
SAVE_MARGIN = 1.1
# The acting policy's own component, so that playing a run reads nothing else.
POLICY_COMPONENT = "policy"
# Inside the checkpoints directory: which checkpoint is the best (rewritten after every
# save and resume, so it follows rotations and the fallbacks that set damaged ones aside).
BEST_INDEX = "best.json"


def last_good(checkpoint: Path | None) -> str:
    """The last good checkpoint as a failure names it, or what to do where there is none."""
    if checkpoint is None:
        return "none yet (the same command starts the run afresh)"
    return str(checkpoint)


class CorruptCheckpoint(Exception):
    """A checkpoint whose files do not match what was saved."""


class ChecksummedAdapter(CheckpointAdapter):
    """Saves a component with ``inner``, then records the SHA-256 of every file it wrote."""

    def __init__(self, inner: CheckpointAdapter) -> None:
        self.inner = inner
        self.adapter_id = f"{inner.adapter_id}+sha256"
        self.format_version = inner.format_version

    def save(self, component: Any, path: Path, *, args: tuple, kwargs: Mapping) -> Any:
        result = self.inner.save(component, path, args=args, kwargs=kwargs)
        sums = {
            file.relative_to(path).as_posix(): file_sha256(file)
            for file in sorted(path.rglob("*"))
            if file.is_file()
        }
        (path / CHECKSUM_FILE).write_text(json.dumps(sums, indent=1))
        return result

    def load(self, component: Any, path: Path, **options: Any) -> Any:
        return self.inner.load(component, path, **options)


def disk_size(path: Path) -> int:
    """Bytes of all files below ``path`` (their full length, sparse or not)."""
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def file_sha256(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def adapter_for(component: Any) -> CheckpointAdapter:
    """Objects with a ``state_dict`` go through ``torch.save``, whose files fail loudly
    when truncated; plain values are stored as JSON."""
    if callable(getattr(component, "state_dict", None)):
        inner: CheckpointAdapter = StateDictCheckpointAdapter(payload_format="torch")
    else:
        inner = JSONCheckpointAdapter()
    return ChecksummedAdapter(inner)


def verify_checkpoint(path: Path, components: Collection[str] | None = None) -> None:
    """Raise :class:`CorruptCheckpoint` unless every file of the checkpoint at ``path`` (of
    the named ``components`` only, if given) is present and unchanged since it was saved.
    Reads only."""
    try:
        manifest = Checkpoint.manifest(path)
    except (CheckpointError, OSError, ValueError) as error:
        raise CorruptCheckpoint(f"unreadable manifest ({error})") from None
    missing = set(components or ()) - set(manifest["components"])
    if missing:
        raise CorruptCheckpoint(f"it has no component {', '.join(sorted(missing))}")
    for name, record in manifest["components"].items():
        if components is not None and name not in components:
            continue
        component_dir = path / record["path"]
        try:
            expected = json.loads((component_dir / CHECKSUM_FILE).read_text())
        except (OSError, ValueError):
            raise CorruptCheckpoint(f"component {name!r} has no readable checksums") from None
        listed = set(record["files"]) - {CHECKSUM_FILE}
        if listed != set(expected):
            raise CorruptCheckpoint(f"component {name!r} lists other files than it saved")
        for relative, digest in expected.items():
            file = component_dir / relative
            if not file.is_file():
                raise CorruptCheckpoint(f"{name}: file {relative} is missing")
            if file_sha256(file) != digest:
                raise CorruptCheckpoint(f"{name}: file {relative} is damaged (checksum mismatch)")


class RunCheckpoints:
    """The checkpoints of one run: save one; pick and restore one."""

    def __init__(
        self,
        directory: Path,
        keep_last: int,
        components: Mapping[str, Any],
        journal: Journal | None,
    ) -> None:
        self.journal = journal
        self.keep_last = keep_last
        self.checkpoint = Checkpoint()
        for name, component in components.items():
            self.checkpoint.register(name, component, adapter=adapter_for(component))
        self.rotation = CheckpointRotation(
            directory, keep_last=keep_last, keep_best=(EVAL_KEY, "max")
        )
        self.saved_at = time.monotonic()  # of the last save, or of the run's start here

    def save(self, frames: int, eval_return: float | None) -> Path:
        """Save, rotate, and return the new checkpoint's path (``eval_return``: the
        evaluation just made, or None); start its replay journal and delete the journals
        no kept checkpoint needs. Saving at the frames of an existing checkpoint replaces it.

        Raises ``OSError(ENOSPC)`` before writing anything when the disk lacks room for
        the checkpoint (as large as the last one)."""
        self.rotation.directory.mkdir(parents=True, exist_ok=True)
        latest = self.latest()
        needed = disk_size(latest) if latest is not None else 0
        free = shutil.disk_usage(self.rotation.directory).free
        if needed * SAVE_MARGIN > free:
            raise OSError(
                errno.ENOSPC,
                f"No space left on device: a checkpoint needs about {needed / 1e6:.1f} MB, "
                f"{SAVE_MARGIN}x that is asked for, and {free / 1e6:.1f} MB are free in "
                f"{self.rotation.directory}",
            )
        if self.journal is not None:
            self.journal.start(frames)
        # Saved and pruned here rather than by rotation.save, which requires the metric.
        metadata = {} if eval_return is None else {EVAL_KEY: eval_return}
        saved = self.checkpoint.save(
            checkpoint_path(self.rotation.directory, frames), metadata=metadata
        )
        self.rotation.prune()
        self.saved_at = time.monotonic()
        self.record_best()
        if self.journal is not None:
            resumable = checkpoint_candidates(self.rotation.directory)[: self.keep_last]
            self.journal.prune(checkpoint_frames(resumable[-1]))
        return saved

    def record_best(self) -> None:
        """Write which checkpoint is the best to ``BEST_INDEX``, atomically."""
        best = self.best()
        if best is None:
            return
        metric = Checkpoint.manifest(best)["metadata"][EVAL_KEY]
        index = self.rotation.directory / BEST_INDEX
        staged = index.with_name(f".{BEST_INDEX}.staged")
        staged.write_text(json.dumps({"checkpoint": best.name, EVAL_KEY: metric}) + "\n")
        os.replace(staged, index)

    def add_score(self, frames: int, eval_return: float) -> None:
        """Give the checkpoint at ``frames`` the score of the evaluation it was saved for,
        which ended later (``eval.backend=process`` or ``ray``)."""
        add_checkpoint_metadata(
            checkpoint_path(self.rotation.directory, frames), {EVAL_KEY: eval_return}
        )
        self.rotation.prune()
        self.record_best()

    def load_policy(self, frames: int, policy: Any) -> None:
        """Load the acting policy saved at ``frames`` into ``policy`` (on its device)."""
        device = str(next(policy.parameters()).device)
        path = checkpoint_path(self.rotation.directory, frames)
        load_component(path, POLICY_COMPONENT, policy, map_location=device)

    def latest(self) -> Path | None:
        return self.rotation.latest()

    def best(self) -> Path | None:
        return self.rotation.best()

    def load(self, path: Path) -> CheckpointLoadResult:
        """Restore every bound component from ``path`` (:func:`choose_checkpoint` picks a
        verified one), and check the restored replay files: raises
        :class:`~rl_app.replay.journal.StorageDamaged` if they are damaged. A checkpoint saved
        before the acting policy had a component of its own restores the policy with the
        algorithm's networks, which hold it too."""
        saved = Checkpoint.manifest(path)["components"]
        names = [
            name for name in self.checkpoint.components if name in saved or name != POLICY_COMPONENT
        ]
        result = self.checkpoint.load(path, components=names)
        if self.journal is not None:
            self.journal.verify()
        return result


def recorded_best(directory: Path) -> Path | None:
    """The checkpoint ``BEST_INDEX`` names in ``directory``, or None without an index."""
    try:
        name = json.loads((directory / BEST_INDEX).read_text())["checkpoint"]
    except (OSError, ValueError, KeyError):
        return None
    return directory / name


def load_component(path: Path, name: str, component: Any, map_location: str = "cpu") -> None:
    """Restore the component ``name`` of the checkpoint at ``path`` into ``component``,
    after checking that component's files; the other components are not read."""
    verify_checkpoint(path, components=[name])
    checkpoint = Checkpoint()
    checkpoint.register(name, component, adapter=adapter_for(component))
    checkpoint.load(path, components={name}, map_location=map_location, strict="error")


def checkpoint_candidates(directory: Path) -> list[Path]:
    """Saved checkpoints, newest first (by the frame count in their names)."""
    return sorted(directory.glob("checkpoint-*"), key=lambda path: path.name, reverse=True)


def checkpoint_path(directory: Path, frames: int) -> Path:
    """Where the checkpoint at ``frames`` goes (CheckpointRotation's naming)."""
    return directory / f"checkpoint-{frames:012d}"


def checkpoint_frames(path: Path) -> int:
    return int(path.name.split("-")[1])


def choose_checkpoint(
    directory: Path, restorable_from: int = 0
) -> tuple[Path, list[tuple[Path, str]]]:
    """The newest checkpoint that verifies, and each newer one passed over with the reason;
    only one at ``restorable_from`` frames or later when the replay buffer must be restored
    too (:func:`rl_app.replay.journal.restorable_from`).

    Raises :class:`CorruptCheckpoint` when none verifies. Reads only."""
    passed_over = []
    for path in checkpoint_candidates(directory):
        try:
            verify_checkpoint(path)
            if checkpoint_frames(path) < restorable_from:
                raise CorruptCheckpoint(
                    "the replay journal that restores its buffer is gone or damaged "
                    f"(checkpoints from {restorable_from} frames on resume; this one plays)"
                )
        except CorruptCheckpoint as why:
            passed_over.append((path, str(why)))
            continue
        return path, passed_over
    detail = "; ".join(f"{path.name}: {why}" for path, why in passed_over) or "none found"
    raise CorruptCheckpoint(f"no usable checkpoint in {directory} ({detail})")
