"""TorchRL 0.14.1's multi-process collectors: the workaround of how they push weights to
their workers (the index is in :mod:`rl_app.upstream`). Imported only by
``collector.mode=sync|async``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tensordict.nn import TensorDictModuleBase
from torchrl.weight_update import MultiProcessWeightSyncScheme

# -- 1. weight pushes to worker processes --------------------------------------------------

# Workers receive weights on a background thread, which TorchRL 0.14.1 copies into the
# policy parameter by parameter while the worker's main thread may be running that policy:
# one action could mix old and new layers, and act with new weights under the old version.
# In each worker process this lock is held by the policy's forward pass and by a weight
# update (from the "receive" instruction to its acknowledgement, which spans applying the
# weights and bumping the policy version), so that each action sees one whole version.
_WEIGHTS_LOCK = threading.Lock()
# TorchRL waits for a worker's acknowledgement without a time limit (`timeout=None`): a
# worker that died would never answer.
ACK_TIMEOUT_S = 60.0


class GuardedWeightSyncScheme(MultiProcessWeightSyncScheme):
    """TorchRL's multi-process weight sync, applying each update under ``_WEIGHTS_LOCK`` to
    weights each worker holds alone, and waiting at most ``ACK_TIMEOUT_S`` for workers to
    acknowledge it.

    It hooks the two steps TorchRL's background receiver loop takes around an update (the
    loop has no public hook) and a worker's connection; an update that fails midway
    releases the lock at the loop's next wait. Tests:
    ``test_weight_sync_receiver_steps_are_still_private_hooks``,
    ``test_weight_sync_still_gives_workers_on_one_device_one_copy_of_the_weights`` and
    ``test_weight_sync_still_waits_for_acks_without_a_limit``."""

    _holding_lock = False

    def _setup_connection_and_weights_on_receiver_impl(
        self, *, worker_idx: int | None = None
    ) -> None:
        # TorchRL hands the workers on one device the same shared-memory copy of the first
        # weights and points each worker's policy at it: one worker applying a push would
        # rewrite the weights another is acting with. Each worker takes its own copy before
        # its receiver thread can apply a push.
        with _WEIGHTS_LOCK:
            super()._setup_connection_and_weights_on_receiver_impl(worker_idx=worker_idx)
            for tensor in (*self.model.parameters(), *self.model.buffers()):
                tensor.data = tensor.data.clone()

    def _wait_for_instruction(self, timeout: float | None = None) -> str | None:
        self._release_lock()
        instruction = super()._wait_for_instruction(timeout)
        if instruction == "receive":
            _WEIGHTS_LOCK.acquire()
            self._holding_lock = True
        return instruction

    def _send_ack(self, message: str = "updated") -> None:
        self._release_lock()
        super()._send_ack(message)

    def _wait_for_ack(self, worker_ids: Any = None, timeout: float | None = None) -> None:
        super()._wait_for_ack(worker_ids, timeout=ACK_TIMEOUT_S if timeout is None else timeout)

    def _release_lock(self) -> None:
        if self._holding_lock:
            self._holding_lock = False
            _WEIGHTS_LOCK.release()


def make_guarded_policy(
    policy_factory: Callable[..., TensorDictModuleBase],
) -> TensorDictModuleBase:
    """A worker's policy, whose forward pass holds ``_WEIGHTS_LOCK``."""
    policy = policy_factory()
    policy.register_forward_pre_hook(acquire_weights_lock)
    policy.register_forward_hook(release_weights_lock)
    return policy


def acquire_weights_lock(module: Any, args: Any) -> None:
    _WEIGHTS_LOCK.acquire()  # a pre-hook returns None: the call's arguments stay as they are


def release_weights_lock(module: Any, args: Any, output: Any) -> None:
    _WEIGHTS_LOCK.release()
