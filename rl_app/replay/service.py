"""The replay buffer as a Ray service (``replay.service=ray``).

One Ray actor owns the buffer: TorchRL's ``TensorDictReplayBuffer(..., service_backend="ray")``
around rl_app's own :class:`~rl_app.replay.buffer.RunReplayBuffer`, built inside the actor
from the same parts as in-process (memory-mapped storage under the run directory, the
sampler of ``replay.sampler``, the writer counting each slot's overwrites, the seeded
generator), handed over as constructors. The ``collector.mode=ray`` actors extend it
directly; the learner samples it and writes priorities back, each a call on the actor
(:class:`ServiceReplay`, the loop's buffer); a checkpoint holds its whole state
(:class:`ServiceReplayState`).

Only what runs inside the actor is supported: hindsight relabelling, Sequence windows,
recurrent states and stored frames need the learner's env or networks, and are refused
before anything is created (``rl_app/checks.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
from tensordict import NestedKey, TensorDictBase
from torchrl.data import LazyMemmapStorage, TensorDictRoundRobinWriter

from rl_app.config import ReplayConfig
from rl_app.replay import allocate_storage, make_sampler, shared_buffer_parts
from rl_app.replay.buffer import RunReplayBuffer
from rl_app.replay.keys import LOSS_MASK_KEY, PRIORITY_KEY, TRAJECTORY_KEY
from rl_app.upstream.torchrl import load_sampler_state, replay_generator, sampler_state

# What a write-back needs of a sampled batch: the rest stays with the learner.
WRITE_BACK_KEYS = ("index", "index_generation", "anchor_index", PRIORITY_KEY, LOSS_MASK_KEY)
# The metric of how many frames the service has stored (the collectors' writes).
STORED_METRIC = "replay/stored_frames"


class ServiceReplayBuffer(RunReplayBuffer):
    """The buffer inside the service's actor: :class:`RunReplayBuffer` with what the
    learner asks of it in one call each (its storage laid out, its state saved and
    restored, the frames stored after a write-back)."""

    def allocate(self, keys: list[NestedKey], transition: TensorDictBase) -> None:
        """Keep the ``keys`` of each collected frame (an algorithm's ``replay_keys()``), and
        lay the storage out now for them (:func:`rl_app.replay.allocate_storage`), before
        the first batch lands."""
        self.collected_keys = [*keys, TRAJECTORY_KEY]
        allocate_storage(self, transition)

    def write_back(self, samples: list[TensorDictBase]) -> dict[str, float]:
        return {**super().write_back(samples), STORED_METRIC: float(self.write_count)}

    def saved_state(self) -> dict[str, Any]:
        """Everything the buffer holds: stored data, sampler, writer, generator."""
        return {
            "storage": self.storage.state_dict(),
            "sampler": sampler_state(self.sampler),
            "writer": self.writer.state_dict(),
            "generator": replay_generator(self).get_state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.storage.load_state_dict(state["storage"])
        load_sampler_state(self.sampler, state["sampler"])
        self.writer.load_state_dict(state["writer"])
        replay_generator(self).set_state(state["generator"])


class ReplayClient(Protocol):
    """What the learner calls on the service (each call runs in its actor)."""

    def sample_batches(self, batch_size: int, count: int) -> list[TensorDictBase]: ...
    def write_back(self, samples: list[TensorDictBase]) -> dict[str, float]: ...
    def allocate(self, keys: list[NestedKey], transition: TensorDictBase) -> None: ...
    def saved_state(self) -> dict[str, Any]: ...
    def restore(self, state: dict[str, Any]) -> None: ...
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
            LazyMemmapStorage, replay.capacity, scratch_dir=scratch_dir, existsok=True
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
        return [batch.to(self.device) for batch in self.client.sample_batches(batch_size, count)]

    def write_back(self, samples: list[TensorDictBase]) -> dict[str, float]:
        """Send the service the priorities the updates computed for ``samples`` (with what
        tells their slots and slices apart: only that travels); returns the service's
        metrics, the frames it holds among them."""
        keys = samples[0].keys()
        sent = [
            batch.select(*(key for key in WRITE_BACK_KEYS if key in keys)).cpu()
            for batch in samples
        ]
        return self.client.write_back(sent)

    def __getitem__(self, index: Any) -> TensorDictBase:
        return self.client[index]

    def __len__(self) -> int:
        return len(self.client)


class ServiceReplayState:
    """The service as a checkpoint component: its whole state, data included (the storage
    is read once through the actor), saved after ``drain`` has waited for every batch in
    flight to land, so that a resume restores exactly what was stored."""

    def __init__(self, replay: ServiceReplay, drain: Callable[[], None]) -> None:
        self.replay = replay
        self.drain = drain

    def state_dict(self) -> dict[str, Any]:
        self.drain()
        return self.replay.client.saved_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.replay.client.restore(state)
