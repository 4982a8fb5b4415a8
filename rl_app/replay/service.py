"""The replay buffer as a Ray service (``replay.service=ray``).

One Ray actor owns the buffer: TorchRL's ``TensorDictReplayBuffer(..., service_backend="ray")``
around rl_app's own :class:`~rl_app.replay.buffer.RunReplayBuffer`, built inside the actor
from the same parts as in-process (memory-mapped storage under the run directory, the
sampler of ``replay.sampler``, the writer counting each slot's overwrites, the seeded
generator), handed over as constructors. The ``collector.mode=ray`` actors extend it
directly; the learner samples it and writes priorities back, each a call on the actor
(:class:`ServiceReplay`, the loop's buffer). Its checkpoints journal as the in-process
buffer's do (:mod:`rl_app.replay.journal`): the files stay in place, the journal is kept by
the actor, and a checkpoint holds the rest of its state (:class:`ServiceReplayState`).

Only what runs inside the actor is supported: hindsight relabelling, Sequence windows,
recurrent states and stored frames need the learner's env or networks, n-step transitions
(``optim.target=nstep_transition``) a sample other than the slices as stored, and all are
refused before anything is created (``rl_app/checks.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch
from tensordict import NestedKey, TensorDictBase
from torchrl.data import TensorDictRoundRobinWriter

from rl_app.config import ReplayConfig
from rl_app.replay import allocate_storage, make_sampler, shared_buffer_parts
from rl_app.replay.buffer import RunReplayBuffer, to_learner
from rl_app.replay.journal import JournaledStorage, ReplayState, StorageDamaged, UndoJournal
from rl_app.replay.keys import LOSS_MASK_KEY, PRIORITY_KEY, TRAJECTORY_KEY

# What a write-back needs of a sampled batch: the rest stays with the learner.
WRITE_BACK_KEYS = ("index", "index_generation", "anchor_index", PRIORITY_KEY, LOSS_MASK_KEY)
# The metric of how many frames the service has stored (the collectors' writes).
STORED_METRIC = "replay/stored_frames"


class ServiceStopped(RuntimeError):
    """The replay service's actor died."""

    def __init__(self, why: str) -> None:
        super().__init__(f"the replay service (Ray actor) stopped: {why}")


@contextmanager
def naming_the_service() -> Iterator[None]:
    """Around the learner's calls on the service: its actor dead is named
    (:class:`ServiceStopped`), and damaged replay files or a full disk in it are raised as
    in-process, not as Ray's error with the actor's traceback."""
    from ray.exceptions import RayActorError, RayTaskError  # (a run without Ray has none)

    try:
        yield
    except RayActorError as error:
        first_line = str(error).splitlines()[0]
        why = f"the learner could not reach it ({type(error).__name__}: {first_line})"
        raise ServiceStopped(why) from error
    except RayTaskError as error:
        if isinstance(error.cause, (StorageDamaged, OSError)):
            raise error.cause from None
        raise


class ServiceReplayBuffer(RunReplayBuffer):
    """The buffer inside the service's actor: :class:`RunReplayBuffer` with what the
    learner asks of it in one call each (its storage laid out, its journal started, pruned
    and checked, its state saved and restored, the frames stored after a write-back)."""

    journal: UndoJournal

    def allocate(
        self, keys: list[NestedKey], transition: TensorDictBase, journal_dir: Path
    ) -> None:
        """Keep the ``keys`` of each collected frame (an algorithm's ``replay_keys()``), lay
        the storage out now for them (:func:`rl_app.replay.allocate_storage`), before the
        first batch lands, and journal its writes in ``journal_dir``."""
        self.collected_keys = [*keys, TRAJECTORY_KEY]
        allocate_storage(self, transition)
        self.journal = UndoJournal(self.storage, journal_dir)

    def write_back(self, samples: list[TensorDictBase]) -> dict[str, float]:
        return {**super().write_back(samples), STORED_METRIC: float(self.write_count)}

    def checkpoint(self, frames: int) -> dict[str, Any]:
        """Start the journal of the checkpoint at ``frames`` and return the buffer's state
        (:class:`~rl_app.replay.journal.ReplayState`), in one call: no collector's write
        lands between the two."""
        self.journal.start(frames)
        return ReplayState(self, self.journal).state_dict()

    def restore(self, state: dict[str, Any]) -> None:
        if "storage" not in state:
            ReplayState(self, self.journal).load_state_dict(state)
            return
        # Saved whole (a service checkpoint that copied its storage): checksummed as it
        # is now, journaled from the next checkpoint on.
        ReplayState(self, None).load_state_dict(state)
        self.journal.dirty[:] = True
        self.journal.update_checksums()

    def prune_journals(self, keep_from: int) -> None:
        self.journal.prune(keep_from)

    def verify_storage(self) -> None:
        self.journal.verify()


class ReplayClient(Protocol):
    """What the learner calls on the service (each call runs in its actor). TorchRL's client
    refuses the names ``start``, ``close`` and ``shutdown``, hence ``checkpoint``,
    ``prune_journals`` and ``verify_storage``."""

    def sample_batches(self, batch_size: int, count: int) -> list[TensorDictBase]: ...
    def write_back(self, samples: list[TensorDictBase]) -> dict[str, float]: ...
    def allocate(
        self, keys: list[NestedKey], transition: TensorDictBase, journal_dir: Path
    ) -> None: ...
    def checkpoint(self, frames: int) -> dict[str, Any]: ...
    def restore(self, state: dict[str, Any]) -> None: ...
    def prune_journals(self, keep_from: int) -> None: ...
    def verify_storage(self) -> None: ...
    def __getitem__(self, index: Any) -> TensorDictBase: ...
    def __len__(self) -> int: ...


def service_parts(replay: ReplayConfig, scratch_dir: Path, seed: int) -> dict[str, Any]:
    """What :class:`ServiceReplayBuffer` is built from inside its actor: the parts of
    :func:`rl_app.replay.make_replay_buffer` (``replay.capacity`` transitions memory-mapped
    under ``scratch_dir``, the sampler of ``replay.sampler``,
    :func:`~rl_app.replay.shared_buffer_parts`), the storage, sampler and writer as
    constructors, which do not travel."""
    return {
        "storage": functools.partial(
            JournaledStorage, replay.capacity, scratch_dir=scratch_dir, existsok=True
        ),
        "sampler": functools.partial(make_sampler, replay),
        "writer": functools.partial(TensorDictRoundRobinWriter, track_generations=True),
        **shared_buffer_parts(replay, seed),
    }


class ServiceReplay:
    """The loop's buffer when a service owns it: the collectors' actors have stored each
    batch already, the learner samples and writes back through the service."""

    def __init__(self, owner: Any, device: torch.device | str) -> None:
        self.owner = owner  # shut down with the collector that writes into it
        self.client: ReplayClient = owner.client()
        self.device = device

    def extend(self, batch: TensorDictBase) -> None:
        """Nothing to store: the actors that collected ``batch`` wrote it into the service
        (the loop is handed what it counts and logs of it)."""

    def sample_batches(self, batch_size: int, count: int) -> list[TensorDictBase]:
        """:meth:`RunReplayBuffer.sample_batches`, drawn in the service and moved here."""
        with naming_the_service():
            batches = self.client.sample_batches(batch_size, count)
        return [to_learner(batch, self.device) for batch in batches]

    def write_back(self, samples: list[TensorDictBase]) -> dict[str, float]:
        """Send the service the priorities the updates computed for ``samples`` (with what
        tells their slots and slices apart: only that travels); returns the service's
        metrics, the frames it holds among them."""
        keys = samples[0].keys()
        sent = [
            batch.select(*(key for key in WRITE_BACK_KEYS if key in keys)).cpu()
            for batch in samples
        ]
        with naming_the_service():
            return self.client.write_back(sent)

    def __getitem__(self, index: Any) -> TensorDictBase:
        with naming_the_service():
            return self.client[index]

    def __len__(self) -> int:
        with naming_the_service():
            return len(self.client)


class ServiceReplayState:
    """The service as a checkpoint component, and as the journal the run's checkpoints
    drive (``start``, ``prune``, ``verify``, ``close`` of
    :class:`~rl_app.replay.journal.UndoJournal`), the first three each a call on its actor
    (the journal's file closes with the actor). ``start`` waits
    for every batch in flight to land (``drain``), then starts the actor's journal and takes
    the state the checkpoint holds, in one call: a resume restores exactly what was
    stored."""

    def __init__(self, replay: ServiceReplay, drain: Callable[[], None]) -> None:
        self.client = replay.client
        self.drain = drain
        self.saved: dict[str, Any] | None = None  # taken by start, for state_dict

    def start(self, frames: int) -> None:
        self.drain()
        with naming_the_service():
            self.saved = self.client.checkpoint(frames)

    def state_dict(self) -> dict[str, Any]:
        if self.saved is None:
            raise RuntimeError("the replay service's state is taken by start(), called first")
        saved, self.saved = self.saved, None
        return saved

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with naming_the_service():
            self.client.restore(state)

    def prune(self, keep_from: int) -> None:
        with naming_the_service():
            self.client.prune_journals(keep_from)

    def verify(self) -> None:
        with naming_the_service():
            self.client.verify_storage()

    def close(self) -> None:
        """Nothing to do here: the journal's file closes with the actor."""
