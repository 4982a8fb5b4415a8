"""The replay buffer's undo journal on real memory-mapped files: a checkpoint restores the
buffer exactly, across ring-buffer wraps and patches, and damage is detected."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer, TensorDictRoundRobinWriter

from rl_app.replay.journal import (
    CHUNK_SLOTS,
    JournaledStorage,
    StorageDamaged,
    UndoJournal,
    journal_path,
    record_patch,
    restorable_from,
)
from rl_app.upstream.torchrl import set_storage_length

CAPACITY = 3 * CHUNK_SLOTS // 2  # two chunks, the second one half full when wrapped


def transitions(start: int, count: int) -> TensorDict:
    steps = torch.arange(start, start + count)
    return TensorDict(
        {
            "observation": steps.float().unsqueeze(-1).expand(count, 3).clone(),
            "frame": (steps % 251).to(torch.uint8).reshape(count, 1, 1).expand(count, 4, 4),
            ("next", "reward"): -steps.float().unsqueeze(-1),
            "state": torch.zeros(count, 2),
        },
        [count],
    )


def journaled_buffer(directory: Path) -> tuple[TensorDictReplayBuffer, UndoJournal]:
    storage = JournaledStorage(CAPACITY, scratch_dir=directory / "replay", existsok=True)
    buffer = TensorDictReplayBuffer(
        storage=storage, writer=TensorDictRoundRobinWriter(track_generations=True)
    )
    buffer.extend(transitions(0, 10))
    return buffer, UndoJournal(storage, directory / "journal")


def contents(buffer: TensorDictReplayBuffer) -> TensorDict:
    return buffer.storage.get(slice(0, CAPACITY)).clone()


def patch_states(buffer: TensorDictReplayBuffer, slots: torch.Tensor, value: float) -> None:
    record_patch(buffer.storage, slots, ["state"])
    buffer.update_if_present(
        index=slots,
        generation=buffer.writer.generations_of(slots),
        patch={"state": torch.full((len(slots), 2), float(value))},
    )
    assert (buffer.storage.get(slots)["state"] == value).all()


def test_a_restore_brings_back_each_checkpoints_buffer_across_wraps_and_patches(
    tmp_path: Path,
) -> None:
    buffer, journal = journaled_buffer(tmp_path)
    saved = {}
    written = 10
    for frames, count in ((10, 700), (710, 900), (1610, 1200)):  # the last two wrap
        journal.start(frames)
        saved[frames] = (contents(buffer), len(buffer.storage))
        patch_states(buffer, torch.arange(0, len(buffer.storage), 7), frames)
        buffer.extend(transitions(written, count))
        patch_states(buffer, torch.arange(3, len(buffer.storage), 5), -frames)
        written += count
    for frames in (1610, 710, 10):  # each restore undoes the later journals too
        set_storage_length(buffer.storage, saved[frames][1])  # as ReplayState does
        journal.restore(frames)
        assert (contents(buffer) == saved[frames][0]).all(), frames
        assert not any(path.name > journal_path(journal.directory, frames).name
                       for path in journal.directory.glob("undo-*"))  # fmt: skip


def test_filling_the_buffer_journals_no_data(tmp_path: Path) -> None:
    buffer, journal = journaled_buffer(tmp_path)
    journal.start(10)
    buffer.extend(transitions(10, 500))
    # 500 slot numbers, none of the 500 transitions' bytes (about 32 B each here).
    assert journal_path(journal.directory, 10).stat().st_size < 500 * 8 + 2048


def test_a_torn_last_record_is_dropped_and_a_damaged_one_detected(tmp_path: Path) -> None:
    buffer, journal = journaled_buffer(tmp_path)
    buffer.extend(transitions(10, CAPACITY))  # full: later writes journal data
    journal.start(100)
    before = contents(buffer)
    buffer.extend(transitions(0, 50))
    buffer.extend(transitions(50, 50))
    journal.close()
    path = journal_path(journal.directory, 100)
    size = path.stat().st_size
    os.truncate(path, size - 10)  # a kill during the last append: its write never happened
    assert restorable_from(journal.directory) == 0
    buffer.storage.set(torch.arange(50, 100), transitions(0, 50), set_cursor=False)
    journal.restore(100)
    assert (contents(buffer)[:50] == before[:50]).all()

    buffer.extend(transitions(0, 50))
    buffer.extend(transitions(50, 50))
    journal.close()
    with open(path, "r+b") as file:  # an earlier record damaged: this checkpoint is lost
        file.write(b"\0" * 4)
    assert restorable_from(journal.directory) == 101


def test_damaged_replay_files_are_detected_at_a_restore(tmp_path: Path) -> None:
    buffer, journal = journaled_buffer(tmp_path)
    buffer.extend(transitions(10, 1100))
    journal.start(1110)
    checksums = journal.checksums.clone()
    journal.verify()
    (frame_file,) = (tmp_path / "replay").rglob("frame.memmap")
    with open(frame_file, "r+b") as file:
        file.seek(CHUNK_SLOTS * 16 + 5)  # a byte of the second chunk
        file.write(b"\xff")
    journal.checksums = checksums
    with pytest.raises(StorageDamaged, match=rf"frame slots {CHUNK_SLOTS}-"):
        journal.verify()
