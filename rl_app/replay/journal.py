"""The replay buffer in checkpoints, without copying it.

The buffer's memory-mapped files (``replay/``) are its storage, and they stay in the run
directory. A checkpoint holds only what they do not: the storage's length, the sampler's
priorities, the writer's cursor and slot generations, the sampling generator's state, and
checksums of the files. What brings the files back to their state at a checkpoint is an
undo journal:

- From each checkpoint on, every write into the storage first appends to that checkpoint's
  journal (``replay-journal/undo-<frames>.bin``) the values it is about to overwrite (once
  per slot and set of keys: the first write to a slot since the checkpoint is the one that
  matters). A slot that held nothing at the checkpoint (past the storage's length) is
  recorded as empty, without data: filling the buffer costs no journal.
- Restoring the checkpoint at F frames applies the journals of F and of every later
  checkpoint, newest record first: each slot gets back the value it held at F, and empty
  ones are zeroed, as they were. Reapplying after a crash during a restore gives the same.
- A checkpoint thus costs the sampler's state (16 B per slot: the trees' leaves and the
  slot generations) and a journal of at most one evaluation interval's data, never a copy
  of the buffer. The journals of the
  ``checkpoint.keep_last`` newest checkpoints are kept: those are the ones a run resumes
  from (an older best checkpoint still plays).

Damage is detected. Each journal record carries a CRC-32; a torn last record (a kill during
its append) came before its storage write and is dropped, a damaged earlier one makes its
checkpoint and older ones unrestorable. The storage files are checksummed (CRC-32) per key
and chunk of ``CHUNK_SLOTS`` slots: at each save only the chunks written since the last
one are read again, and a resume checks them all.
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
import zlib
from pathlib import Path
from typing import Any, Protocol

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer, TensorStorage

from rl_app.upstream.torchrl import (
    load_sampler_state,
    replay_generator,
    sampler_state,
    set_storage_length,
)

# Slots per checksummed chunk of each storage file (7 MB of 84x84 frames, 4 KB of floats).
CHUNK_SLOTS = 1024
# A journal record: magic, payload length, CRC-32 of the payload; then the payload.
RECORD_HEADER = struct.Struct("<4sQI")
RECORD_MAGIC = b"UNDO"
# Checkpoints older than the frame count this file names have no journal left.
RESTORABLE_FILE = "restorable-from.json"


class Journal(Protocol):
    """What a run's checkpoints drive: :class:`UndoJournal`, or a replay service's
    (:class:`rl_app.replay.service.ServiceReplayState`), which calls its actor's."""

    def start(self, frames: int) -> None: ...
    def prune(self, keep_from: int) -> None: ...
    def verify(self) -> None: ...
    def close(self) -> None: ...


class StorageDamaged(Exception):
    """The replay buffer's files, or a journal, do not match their checksums."""


def journal_path(directory: Path, frames: int) -> Path:
    return directory / f"undo-{frames:012d}.bin"


def journal_frames(path: Path) -> int:
    return int(path.stem.split("-")[1])


def journals(directory: Path, since: int = 0) -> list[Path]:
    """The journals of checkpoints at ``since`` frames or later, newest first."""
    found = [path for path in directory.glob("undo-*.bin") if journal_frames(path) >= since]
    return sorted(found, key=journal_frames, reverse=True)


def leaf_keys(data: TensorDictBase) -> frozenset:
    return frozenset(data.keys(include_nested=True, leaves_only=True))


class JournaledStorage(LazyMemmapStorage):
    """TorchRL's memory-mapped storage whose writes first record, in ``journal`` when one
    is attached, what they overwrite. ``set`` is the write path of ``extend``;
    ``update_if_present`` writes past it, so its callers record their patches first
    (:func:`record_patch`)."""

    journal: UndoJournal | None = None

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        if self.journal is not None:
            slots = torch.arange(self.max_size)[cursor] if isinstance(cursor, slice) else cursor
            self.journal.before_write(torch.as_tensor(slots).reshape(-1), leaf_keys(data))
        super().set(cursor, data, set_cursor=set_cursor)


def record_patch(storage: TensorStorage, slots: torch.Tensor, keys: list) -> None:
    """Journal what a patch of ``keys`` at ``slots`` (``update_if_present``) overwrites."""
    if isinstance(storage, JournaledStorage) and storage.journal is not None:
        storage.journal.before_write(slots.reshape(-1), frozenset(keys))


class UndoJournal:
    """The journals of a :class:`JournaledStorage` in ``directory``, and the checksums of
    its files. Nothing is journaled before the first checkpoint: there is nothing to
    restore to."""

    def __init__(self, storage: JournaledStorage, directory: Path) -> None:
        self.storage = storage
        self.directory = directory
        self.file: io.RawIOBase | None = None
        self.frames: int | None = None  # the checkpoint the open journal restores
        self.held = 0  # the storage's length at that checkpoint
        self.keys = sorted(leaf_keys(storage.get(slice(0, 1))), key=str)
        chunks = math.ceil(storage.max_size / CHUNK_SLOTS)
        self.checksums = torch.zeros(len(self.keys), chunks, dtype=torch.int64)
        self.dirty = torch.zeros(chunks, dtype=torch.bool)  # written since the last save
        self.rows_kept = torch.zeros(storage.max_size, dtype=torch.bool)
        self.keys_kept: dict[frozenset, torch.Tensor] = {}
        storage.journal = self

    # -- writing -------------------------------------------------------------------------

    def before_write(self, slots: torch.Tensor, keys: frozenset) -> None:
        """Append the values ``keys`` hold at ``slots`` that no write since the checkpoint
        has recorded yet, before they are overwritten."""
        self.dirty[slots // CHUNK_SLOTS] = True
        if self.file is None:
            return
        slots = slots.unique()
        whole = keys >= set(self.keys)
        kept = self.rows_kept[slots]
        if not whole:
            kept_keys = self.keys_kept.setdefault(keys, torch.zeros_like(self.rows_kept))
            kept = kept | kept_keys[slots]
        fresh = slots[~kept]
        if fresh.numel() == 0:
            return
        (self.rows_kept if whole else kept_keys)[fresh] = True
        held = fresh[fresh < self.held] if whole else fresh
        values = {}
        if held.numel():
            values = dict(self.storage.get(held).select(*keys).items(True, True))
        record = {
            "slots": held,
            "values": values,
            "emptied": fresh[fresh >= self.held] if whole else fresh[:0],
        }
        payload = io.BytesIO()
        torch.save(record, payload)
        data = payload.getvalue()
        # Whole before the storage write: a kill or a full disk tears at most this record,
        # the last, whose write then never happened. A write can stop short without raising
        # (a full disk): the next one raises.
        unwritten = memoryview(RECORD_HEADER.pack(RECORD_MAGIC, len(data), zlib.crc32(data)) + data)
        while unwritten:
            unwritten = unwritten[self.file.write(unwritten) :]

    def start(self, frames: int) -> None:
        """Begin the journal of the checkpoint being saved at ``frames``: writes from now on
        can be undone back to the storage as it is now. Brings the checksums of the chunks
        written since the last save up to date first."""
        self.update_checksums()
        if self.file is not None:
            self.file.close()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.file = open(journal_path(self.directory, frames), "wb", buffering=0)
        self.frames = frames
        self.held = len(self.storage)
        self.rows_kept.zero_()
        self.keys_kept.clear()

    def prune(self, keep_from: int) -> None:
        """Delete the journals of checkpoints older than ``keep_from`` frames (recorded
        first, so that those checkpoints are never taken for restorable)."""
        marker = self.directory / RESTORABLE_FILE
        staged = marker.with_suffix(".staged")
        staged.write_text(json.dumps({"frames": keep_from}) + "\n")
        os.replace(staged, marker)
        for path in self.directory.glob("undo-*.bin"):
            if journal_frames(path) < keep_from:
                path.unlink()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    # -- checksums -----------------------------------------------------------------------

    def chunk_checksums(self, chunks: torch.Tensor) -> torch.Tensor:
        """CRC-32 of each key's bytes in each of ``chunks``, ``[keys, chunks]``."""
        sums = torch.zeros(len(self.keys), len(chunks), dtype=torch.int64)
        for column, chunk in enumerate(chunks.tolist()):
            rows = self.storage.get(slice(chunk * CHUNK_SLOTS, (chunk + 1) * CHUNK_SLOTS))
            for row, key in enumerate(self.keys):
                sums[row, column] = zlib.crc32(rows.get(key).numpy())
        return sums

    def update_checksums(self) -> None:
        chunks = self.dirty.nonzero().reshape(-1)
        self.checksums[:, chunks] = self.chunk_checksums(chunks)
        self.dirty.zero_()

    def verify(self) -> None:
        """Raise :class:`StorageDamaged` unless every chunk holding data matches its
        checksum."""
        chunks = torch.arange(math.ceil(len(self.storage) / CHUNK_SLOTS))
        bad = (self.chunk_checksums(chunks) != self.checksums[:, chunks]).nonzero().tolist()
        if bad:
            where = ", ".join(
                f"{self.keys[row]} slots {chunk * CHUNK_SLOTS}-{(chunk + 1) * CHUNK_SLOTS - 1}"
                for row, chunk in bad[:3]
            )
            raise StorageDamaged(
                f"the replay buffer's files in {self.storage.scratch_dir} are damaged "
                f"(checksum mismatch: {where}{', ...' if len(bad) > 3 else ''})"
            )

    # -- restoring -----------------------------------------------------------------------

    def restore(self, frames: int) -> None:
        """Bring the storage back to its state when the checkpoint at ``frames`` was
        saved, then journal on from there. The storage's length must be that
        checkpoint's already."""
        self.close()
        newer = journals(self.directory, since=frames)
        for path in newer:
            for offset, size in reversed(read_records(path)):
                self.undo(path, offset, size)
        for path in newer:  # newest first: an interrupted clean-up reapplies the same
            path.unlink()
        self.dirty.zero_()  # the restored chunks are checked against the checkpoint's sums
        self.start(frames)

    def undo(self, path: Path, offset: int, size: int) -> None:
        with open(path, "rb") as file:
            file.seek(offset)
            record = torch.load(io.BytesIO(file.read(size)), weights_only=True)
        if record["slots"].numel():
            values = TensorDict(record["values"], batch_size=[record["slots"].numel()])
            self.storage.set(record["slots"], values, set_cursor=False)
        emptied = record["emptied"]
        if emptied.numel():  # past the restored length: built, not read
            zeros = self.storage.get(slice(0, 0)).apply(
                lambda leaf: leaf.new_zeros((len(emptied), *leaf.shape[1:])),
                batch_size=[len(emptied)],
            )
            self.storage.set(emptied, zeros, set_cursor=False)


def read_records(path: Path) -> list[tuple[int, int]]:
    """Offset and size of the payload of each whole record of the journal at ``path``, a
    torn last one left out. Raises :class:`StorageDamaged` for a damaged earlier one."""
    records: list[tuple[int, int]] = []
    with open(path, "rb") as file:
        end = os.fstat(file.fileno()).st_size
        while file.tell() < end:
            header = file.read(RECORD_HEADER.size)
            if len(header) < RECORD_HEADER.size:
                break
            magic, size, crc = RECORD_HEADER.unpack(header)
            offset = file.tell()
            payload = file.read(size) if magic == RECORD_MAGIC else b""
            if magic != RECORD_MAGIC or len(payload) < size or zlib.crc32(payload) != crc:
                if offset + size >= end:
                    break  # torn by a kill during the append
                raise StorageDamaged(f"{path.name}: record at byte {offset} is damaged")
            records.append((offset, size))
    return records


def restorable_from(directory: Path) -> int:
    """The oldest checkpoint (in frames) whose journals are all present and undamaged:
    restoring the checkpoint at F reads the journals of F and every later one."""
    oldest = 0
    try:
        oldest = json.loads((directory / RESTORABLE_FILE).read_text())["frames"]
    except (OSError, ValueError, KeyError):
        pass
    for path in journals(directory):
        try:
            read_records(path)
        except StorageDamaged:
            return max(oldest, journal_frames(path) + 1)
    return oldest


class ReplayState:
    """The replay buffer as a checkpoint component: everything but the stored data, which
    :class:`UndoJournal` brings back (then :meth:`UndoJournal.verify` checks it). A buffer
    in GPU memory (``replay.device=cuda``) has no files to keep: its data is saved whole."""

    def __init__(self, buffer: TensorDictReplayBuffer, journal: UndoJournal | None) -> None:
        self.buffer = buffer
        self.journal = journal

    def state_dict(self) -> dict[str, Any]:
        storage = self.buffer.storage
        state = {
            "length": len(storage),
            "sampler": sampler_state(self.buffer.sampler),
            "writer": self.buffer.writer.state_dict(),
            "generator": replay_generator(self.buffer).get_state(),
        }
        if self.journal is None:
            return {**state, "storage": storage.state_dict()}
        return {**state, "journal": self.journal.frames, "checksums": self.journal.checksums}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        storage = self.buffer.storage
        if self.journal is None:
            storage.load_state_dict(state["storage"])
        else:
            set_storage_length(storage, state["length"])
            self.journal.restore(state["journal"])
            self.journal.checksums = state["checksums"].clone()
        load_sampler_state(self.buffer.sampler, state["sampler"])
        self.buffer.writer.load_state_dict(state["writer"])
        replay_generator(self.buffer).set_state(state["generator"])
