"""Ray 2.60.0 and TorchRL 0.14.1's Ray collector: their private names and the workarounds
of their behaviours (the index is in :mod:`rl_app.upstream`). Imported only by
``collector.mode=ray``."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayActorError
from tensordict import TensorDictBase
from torchrl.collectors import Collector
from torchrl.collectors.distributed import RayCollector
from torchrl.data import ReplayBuffer

from rl_app.upstream.torchrl_collectors import split_warm_up

# -- 1. which actor a failure came from ----------------------------------------------------


def actor_id(actor: ActorHandle) -> str:
    """The hex id of ``actor``, as Ray's errors name it: a handle keeps it in the private
    ``_actor_id``. Test: ``test_ray_handles_still_keep_their_hex_id_in_a_private_attribute``."""
    return actor._actor_id.hex()


def how_it_died(error: RayActorError) -> tuple[str | None, str]:
    """Where a dead actor ran and why it ended, from the text of Ray's error (Ray 2.60
    exposes neither as attributes): e.g. ``("pid 508 on 192.0.2.2", "its process ended
    (worker exit type SYSTEM_ERROR); its log: <Ray's logs>/worker-*-508.err on
    192.0.2.2")``; where is None when the error does not say. A process killed by a signal
    reads as SYSTEM_ERROR: Ray does not record the signal. An actor whose constructor
    raised is told by the error that ends its traceback. Tests:
    ``test_an_actor_killed_between_batches_is_named_by_the_next_weight_push``,
    ``test_an_actor_whose_constructor_raises_is_named_and_train_py_exits``."""
    text = str(error)
    if error.actor_init_failed:  # the text is the constructor's traceback
        started = re.search(r"\(pid=(\d+), ip=([^,)]+)", text)
        raised = text.rstrip().splitlines()[-1]
        where = None if started is None else f"pid {started[1]} on {started[2]}"
        return where, f"its constructor raised {raised}"
    pid = re.search(r"^\s*pid: (\d+)$", text, re.MULTILINE)
    node = re.search(r"^\s*ip: (\S+)$", text, re.MULTILINE)
    exit_type = re.search(r"Worker exit type: (\w+)", text)
    if pid is None or node is None:
        return None, f"its process ended ({text.splitlines()[0]})"
    why = "its process ended"
    if exit_type is not None:
        why += f" (worker exit type {exit_type[1]})"
    log = f"{ray_logs_dir()}/worker-*-{pid[1]}.err on {node[1]}"
    return f"pid {pid[1]} on {node[1]}", f"{why}; its log: {log}"


def ray_logs_dir() -> str:
    """The log directory of this Ray session (each node keeps its workers' logs under the
    same path): private to Ray's node object."""
    return ray._private.worker.global_worker.node.get_logs_dir_path()


class TruthfulCollector(Collector):
    """TorchRL's ``Collector`` as a Ray actor whose errors reach the learner, and which
    stops asking a shared buffer for its count once its random warm-up is over.

    Ray tests the truth of an actor when it stores the error one of its methods raised. A
    ``Collector`` takes its truth from ``__len__``, which for the endless collectors
    ``RayCollector`` makes (``total_frames`` becomes ``inf``) returns a float: Ray's
    ``TypeError`` then ends the actor's process, and the learner gets an ``ActorDiedError``
    in place of the error. Test: ``test_an_endless_collector_still_has_a_float_length``."""

    def __bool__(self) -> bool:
        return True

    # Once a shared buffer holds the warm-up's frames it always will: stop asking.
    _warmed_up = False

    def _should_use_random_frames(self) -> bool:
        """TorchRL's test, asked once per env step; with a buffer owned by a Ray service
        (TorchRL reads its ``write_count``) that is a blocking call on the service's actor
        per step, for the whole run: here only until the warm-up is over. Test:
        ``test_a_collector_writing_into_a_buffer_still_counts_the_buffer_s_frames``."""
        if self._warmed_up:
            return False
        random = super()._should_use_random_frames()
        self._warmed_up = not random and self.replay_buffer is not None
        return random


# -- 2. warnings that do not apply to rl_app's Ray collector -------------------------------


@contextmanager
def quiet_construction_warnings() -> Iterator[None]:
    """Around building a ``RayCollector``, TorchRL 0.14.1's warnings that do not apply:

    - from a policy factory, that weight updates will be no-ops, while
      ``update_policy_weights_(policy)`` (what :class:`rl_app.collection.WeightSync` calls)
      does reach every actor;
    - asynchronous with random warm-up frames, that it does not control when actors stop
      acting at random: each actor plays its own share first, as async worker processes do.

    Test: ``test_ray_collector_still_warns_about_policy_factories_and_async_warm_up``."""
    with warnings.catch_warnings():
        for message in NOT_APPLYING:
            warnings.filterwarnings("ignore", message=message)
        yield


NOT_APPLYING = ("The policy is not an nn.Module", "async distributed data collection with init")

# -- 3. an endless collector and its random warm-up ----------------------------------------

# RayCollector's iterators run while ``collected_frames < total_frames``: the default -1
# yields nothing, so an endless one is given rl_app.upstream.torchrl_collectors.UNBOUNDED_FRAMES;
# and it hands each actor ``init_random_frames // num_collectors``. Test:
# ``test_ray_collector_still_stops_at_minus_one_frames_and_splits_the_warm_up``.


def warm_up_frames(init_random_frames: int, workers: int, shared_buffer: bool) -> int:
    """What to hand ``RayCollector(init_random_frames=...)`` for ``init_random_frames``
    random frames in all: it gives each of its ``workers`` actors a ``// workers`` share.
    An actor counts its own frames against it, so the shares add up to the request (each
    rounded up to whole frames); but an actor writing into a shared buffer counts the
    buffer's frames, everyone's (``Collector._should_use_random_frames`` reads its
    ``write_count``): each actor's share is then the whole request. Test:
    ``test_a_collector_writing_into_a_buffer_still_counts_the_buffer_s_frames``."""
    if shared_buffer:
        return workers * init_random_frames
    return split_warm_up(init_random_frames, workers)


# -- 4. a replay buffer owned by a Ray actor -------------------------------------------------


def service_buffer(buffer_class: type[ReplayBuffer], **parts: Any) -> ReplayBuffer:
    """``buffer_class(**parts)`` built inside one Ray actor, TorchRL's
    ``service_backend="ray"``; its owner (a ``RayReplayBuffer``) is returned.

    - TorchRL 0.14.1 hands the class ``delayed_init``, which its
      ``TensorDictPrioritizedReplayBuffer`` does not take (``TypeError``): priorities come
      from a ``TensorDictReplayBuffer`` subclass with a ``PrioritizedSampler`` (what
      ``replay.sampler`` builds anyway). Test: ``test_a_prioritized_tensordict_buffer_
      still_cannot_be_a_ray_service``.
    - The actor would reserve TorchRL's default 1 CPU (and 2 GiB, and a GPU share on a CUDA
      host): next to collector actors that reserve the machine's CPUs, Ray would leave it
      waiting for ever. It reserves none: it works only when asked. Test:
      ``test_a_ray_service_still_reserves_a_cpu_by_default``.

    Data travel through Ray's object store (``transport="ray"``): TorchRL's
    ``"distributed"`` transport cannot write priorities per index."""
    return buffer_class(
        **parts,
        service_backend="ray",
        service_backend_options={"remote_config": {"num_cpus": 0}},
        transport="ray",
    )


# -- 5. replacing a collector actor ----------------------------------------------------------


class ReplaceableActors(RayCollector):
    """TorchRL's ``RayCollector`` with one more operation: :meth:`replace_actor` puts a new
    actor in the place of one whose process died. TorchRL 0.14.1 has none, and two of its
    parts assume the actors it started stay:

    - ``add_collectors`` numbers actors by their place in its lists (``worker_idx``): the
      new actor is built as it builds each, under the dead one's number;
    - the weights travel in one gloo group of the learner and every actor, which a dead
      member breaks for good: the survivors and the new actor join a new group (TorchRL's
      ``_copy_uninitialized`` scheme, registered on each actor, which shuts down its old
      one) and are sent the given weights when they connect, as TorchRL's first push
      connects them (``_lazy_initialize_weight_sync``, which sends none).

    Test: ``test_a_replaced_actor_joins_the_weight_sync_of_the_survivors``."""

    def add_collectors(
        self,
        create_env_fn: list[Any],
        num_envs: int,
        policy: Any,
        collector_kwargs: list[dict[str, Any]],
        remote_configs: list[dict[str, Any]],
    ) -> None:
        self.actor_parts = (num_envs, policy, collector_kwargs, remote_configs)
        super().add_collectors(create_env_fn, num_envs, policy, collector_kwargs, remote_configs)

    def release_actors(self) -> None:
        """Kill the actors started so far, and forget them, when construction failed: left
        to TorchRL's ``__del__``, the kill comes after Ray is shut down, and starts a new
        local Ray to do it (which then never lets the process exit). Test:
        ``test_an_actor_lost_as_the_collectors_start_is_named_and_the_run_stops``."""
        if ray.is_initialized():  # else ray.kill would start a Ray of its own
            for actor in getattr(self, "_remote_collectors", ()):
                with suppress(Exception):  # the error that stopped it is the one to tell
                    ray.kill(actor, no_restart=True)
        self._remote_collectors = []  # forgotten either way: nothing left for __del__

    def replace_actor(
        self, index: int, env_maker: Any, weights: TensorDictBase, start_timeout_s: float
    ) -> ActorHandle:
        """Actor ``index`` (dead) replaced by a new one acting in ``env_maker``'s env,
        given ``start_timeout_s`` to start; every actor then acts with ``weights``. Returns
        the new actor."""
        num_envs, worker_policy, collector_kwargs, remote_configs = self.actor_parts
        ray.kill(self.remote_collectors[index], no_restart=True)
        actor_class = self.collector_class.as_remote(remote_configs[index]).remote
        self.remote_collectors[index] = self._make_collector(
            actor_class,
            env_maker=[env_maker] * num_envs if num_envs > 1 else env_maker,
            policy=worker_policy,
            other_params={**collector_kwargs[index], "worker_idx": index},
        )
        old_scheme = self._weight_sync_schemes["policy"]
        scheme = old_scheme._copy_uninitialized()
        old_scheme.shutdown()
        scheme.init_on_sender(
            model_id="policy", remote_collectors=self.remote_collectors, context=self
        )
        ray.get([
            actor.register_scheme_receiver.remote({"policy": scheme}, synchronize_weights=False)
            for actor in self.remote_collectors
        ], timeout=start_timeout_s)  # fmt: skip
        self._weight_sync_schemes = {"policy": scheme}
        connected = [
            actor.cascade_execute.remote("_receiver_schemes['policy'].connect")
            for actor in self.remote_collectors
        ]
        scheme.connect(weights=weights)
        ray.get(connected)
        return self.remote_collectors[index]
