"""Collection on Ray actors (``collector.mode=ray``).

TorchRL's ``RayCollector``: ``collector.workers`` actors, each a TorchRL collector of
``env.num_envs`` envs built from picklable factories; weights reach them through TorchRL's
``RayWeightSyncScheme`` (Ray to signal, gloo to carry the tensors), pushed by
:class:`rl_app.collection.WeightSync` as in every other mode. With ``ray.sync`` each batch is
gathered from every actor; without, each batch is one actor's, whichever is ready first,
while the others keep collecting.

:class:`RayCollection` adds what a run needs:

- the Ray runtime: unset ``ray.address`` starts a local Ray with this machine's CPUs and
  shuts it down with the collector; a set one is joined and left running;
- trajectory ids unique across actors and resumes (each actor numbers its own);
- an actor whose process died is replaced by a new one (``ray.max_actor_replacements``
  times per actor): its env seeded anew from the run's seed, the current weights and
  policy version, trajectory ids past any the dead one can have used; the batch it was
  collecting is lost. An actor that raised, one that died once too often, and the replay
  service's actor are named (:class:`ActorStopped`,
  :class:`~rl_app.replay.service.ServiceStopped`), so that the run stops at that iteration
  boundary with its last checkpoint intact;
- with ``replay.service=ray``, the replay buffer as a Ray service
  (:mod:`rl_app.replay.service`), built once Ray is joined, shut down with the actors that
  write into it; each actor extends it and hands the learner only what the loop counts and
  logs of its batch; :meth:`RayCollection.drain` waits for the batches in flight to land.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
import torch
from ray.exceptions import RayActorError
from tensordict import TensorDict, TensorDictBase
from torch import nn

from rl_app.checks import machine_cpus
from rl_app.collection import CollectorStopped
from rl_app.collection.workers import remote_collector_kwargs
from rl_app.config import Config
from rl_app.envs import SUCCESS_KEY, env_factory, worker_seed
from rl_app.replay import TRAJECTORY_KEY
from rl_app.replay.service import ServiceReplayBuffer, ServiceStopped, service_parts
from rl_app.rundir import REPLAY_DIR
from rl_app.upstream.ray import (
    ReplaceableActors,
    TruthfulCollector,
    actor_id,
    how_it_died,
    quiet_construction_warnings,
    service_buffer,
    warm_up_frames,
)
from rl_app.upstream.torchrl_collectors import UNBOUNDED_FRAMES

log = logging.getLogger("rl_app")


def connect_ray(address: str | None) -> bool:
    """Join the Ray cluster at ``address``, or start a local one (no dashboard, no usage
    reports) when unset; True when this call connected, so that the caller disconnects
    (which stops a local Ray, and leaves a joined cluster running). A process already
    connected stays on its cluster."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return False
    # Actors print their whole collector when they start: their errors reach the learner
    # with their tracebacks anyway.
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        # "local": a new Ray even where ray.init() would join one found on this machine.
        ray.init(
            address="local", num_cpus=machine_cpus(), include_dashboard=False, log_to_driver=False
        )
    return True


# How long the actors are given to answer when a failure may have come from a dead one.
DEAD_ACTOR_ANSWER_S = 10.0


class ActorStopped(CollectorStopped):
    """A collector actor died, or raised while collecting."""

    def __init__(self, index: int, env_name: str, why: str, where: str | None = None) -> None:
        actor = "Ray actor" if where is None else f"Ray actor, {where}"
        super().__init__(f"collector worker {index} ({actor}) of env {env_name} stopped: {why}")
        self.index, self.why, self.where = index, why, where


class ActorDied(ActorStopped):
    """A collector actor's process ended: a new actor can take its place."""


class CollectionFailed(RuntimeError):
    """Raised in collector actor ``worker``: Ray hands the learner an error without the actor
    it came from. ``service_lost``: the actor it could not reach was the replay service's."""

    def __init__(self, worker: int, what: str, service_lost: bool = False) -> None:
        super().__init__(worker, what, service_lost)
        self.worker = worker
        self.what = what
        self.service_lost = service_lost


# What the learner gets of a batch an actor wrote into the replay service: what the loop
# counts and logs (frames, ended episodes and their returns, the policy version acted with).
SUMMARY_KEYS = (
    TRAJECTORY_KEY, ("next", "done"), ("next", "episode_reward"), ("next", "policy_version"),
    ("next", SUCCESS_KEY),
)  # fmt: skip


class ActorCollector(TruthfulCollector):
    """The collector each actor runs: TorchRL's, its failures naming the actor. Writing
    into a replay service, it returns the summary of the batch it stored (TorchRL's
    returns None): what the learner counts is what landed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stored = 0  # frames this actor wrote into the replay service
        self.summary: TensorDictBase | None = None
        if self.replay_buffer is not None:
            # TorchRL calls the hook on each batch just before storing it.
            self.post_collect_hook = functools.partial(self.summarize, self.post_collect_hook)

    def summarize(
        self, hook: Callable[[TensorDictBase], None] | None, batch: TensorDictBase
    ) -> None:
        if hook is not None:
            hook(batch)
        self.summary = batch.select(*SUMMARY_KEYS, strict=False).clone()

    def next(self) -> TensorDictBase | None:
        try:
            batch = super().next()
        except Exception as error:
            # The only actor a collector calls while collecting is the replay service.
            lost = isinstance(error, RayActorError)
            what = f"{type(error).__name__}: {error}"
            raise CollectionFailed(self.worker_idx, what, service_lost=lost) from error
        if batch is None and self.summary is not None:
            batch, self.summary = self.summary, None
            self.stored += batch.numel()
        return batch

    def stored_frames(self) -> int:
        """The frames this actor wrote into the replay service: answered once the batch it
        is collecting, if any, has landed (an actor runs its calls one at a time)."""
        return self.stored


# How long a new actor may take to start in a dead one's place (Ray may wait for a node
# with the CPUs it reserves).
ACTOR_START_S = 300.0
# Batches of an actor the learner may not have seen when it dies: the one it was collecting,
# and one a restarted iterator left it collecting. Each starts at most one trajectory a frame.
UNSEEN_BATCHES = 2


class RayCollection(ReplaceableActors):
    """TorchRL's ``RayCollector`` on the runtime :func:`connect_ray` joined; see the module
    docstring. ``env_maker(n)`` makes the env of the ``n``-th actor started: actor ``i``'s
    ``k``-th replacement is number ``i + k * workers``."""

    def __init__(
        self,
        env_name: str,
        address: str | None,
        env_maker: Callable[[int], Any],
        max_replacements: int,
        replay_service: Callable[[], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.env_name = env_name
        self.env_maker = env_maker
        self.max_replacements = max_replacements
        self.connected = connect_ray(address)
        self.pushes = 0  # weight pushes relayed: the policy version of every actor
        self.pushed_weights: TensorDictBase | None = None  # what the actors act with
        self.next_trajectory = 0  # past every trajectory id seen, over workers
        # The replay service's owner, built on this Ray: the actors write into it.
        self.service = None
        try:
            if replay_service is not None:
                self.service = replay_service()
            with quiet_construction_warnings():
                super().__init__(replay_buffer=self.service, **kwargs)
        except BaseException as error:
            died = self.died_starting(error)
            try:
                self.release_actors()
                self.close_service()
            finally:
                self.disconnect()
            if died is not None:
                raise died from error
            raise
        self.actor_ids = [actor_id(actor) for actor in self.remote_collectors]
        self.replaced = [0] * len(self.remote_collectors)  # replacements of each actor
        self.replaced_ids: set[str] = set()

    def iterator(self) -> Iterator[TensorDictBase]:
        while True:
            try:
                with self.naming_stopped_actors():
                    for batch in super().iterator():
                        trajectories = batch.get(TRAJECTORY_KEY)
                        last = int(trajectories.max()) // len(self.remote_collectors)
                        self.next_trajectory = max(self.next_trajectory, last + 1)
                        # Sync batches stack the actors' [envs, steps] batches: a row per env.
                        yield batch.flatten(0, -2) if batch.ndim > 2 else batch
                return
            except ActorDied as died:
                self.replace(died)
            except RayActorError as error:  # the batch of an actor replaced in a push
                if error.actor_id not in self.replaced_ids:
                    raise

    def update_policy_weights_(self, policy: nn.Module, **kwargs: Any) -> None:
        push = functools.partial(super().update_policy_weights_, policy, **kwargs)
        self.replacing_dead_actors(push)
        self.pushes += 1
        self.pushed_weights = TensorDict.from_module(policy).data.clone()  # for a new actor

    def state_dict(self) -> list[dict[str, Any]]:
        return self.replacing_dead_actors(super().state_dict)

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        """Each actor's state, but its policy version: a run's actors count the pushes this
        process relayed, as the learner does (:class:`rl_app.collection.WeightSync`)."""
        states = [{**actor, "policy_version": self.pushes} for actor in state]
        self.replacing_dead_actors(functools.partial(super().load_state_dict, states))

    def drain(self) -> int:
        """Wait until every batch in flight (asynchronous actors keep collecting between
        the learner's batches) has landed in the replay service; the frames the actors have
        written into it. TorchRL's ``pause()`` leaves them in flight."""

        def stored() -> int:
            return sum(ray.get([actor.stored_frames.remote() for actor in self.remote_collectors]))

        return self.replacing_dead_actors(stored)

    def metrics(self) -> dict[str, float]:
        return {"collector/replaced_actors": sum(self.replaced)}

    def replacing_dead_actors(self, call: Callable[[], Any]) -> Any:
        """``call()``, again after replacing each actor found dead on the way."""
        while True:
            try:
                with self.naming_stopped_actors():
                    return call()
            except ActorDied as died:
                self.replace(died)

    def replace(self, died: ActorDied) -> None:
        """A new actor in the place of the one that ``died``, or ``died`` raised when that
        actor has been replaced ``max_replacements`` times already."""
        index = died.index
        if self.replaced[index] >= self.max_replacements:
            if self.max_replacements == 0:
                raise died
            raise ActorStopped(
                index, self.env_name,
                f"{died.why}; a new actor took its place {self.replaced[index]} times "
                f"already, as many as ray.max_actor_replacements={self.max_replacements} allows",
                died.where,
            ) from died  # fmt: skip
        self.replaced[index] += 1
        log.warning("%s; a new actor takes its place (replacement %d of at most %d)",
                    died, self.replaced[index], self.max_replacements)  # fmt: skip
        workers = len(self.remote_collectors)
        env_maker = self.env_maker(index + self.replaced[index] * workers)
        actor = self.replace_actor(index, env_maker, self.pushed_weights, ACTOR_START_S)
        self.replaced_ids.add(self.actor_ids[index])
        self.actor_ids[index] = actor_id(actor)
        # Trajectory k of an actor is id k * workers + index: k past any the dead one used.
        batch_frames = self.collector_kwargs[index]["frames_per_batch"]
        state = ray.get(actor.state_dict.remote())
        state["traj_pool"] = {
            "traj_id": torch.tensor(self.next_trajectory + UNSEEN_BATCHES * batch_frames)
        }
        state["policy_version"] = self.pushes
        ray.get(actor.load_state_dict.remote(state))

    @contextmanager
    def naming_stopped_actors(self) -> Iterator[None]:
        try:
            yield
        except CollectionFailed as error:  # Ray's error, an instance of the actor's too
            if error.service_lost:
                first_line = error.what.splitlines()[0]
                why = f"collector worker {error.worker} could not reach it ({first_line})"
                raise ServiceStopped(why) from error
            raise ActorStopped(error.worker, self.env_name, error.what) from error
        except RayActorError as error:
            if error.actor_id not in self.actor_ids:
                raise
            raise self.actor_died(self.actor_ids.index(error.actor_id), error) from error
        except RuntimeError as error:  # gloo's "Connection closed by peer", in a weight push
            dead = self.dead_actor()
            if dead is None:
                raise
            raise self.actor_died(*dead) from error

    def died_starting(self, error: BaseException) -> ActorStopped | None:
        """The error naming the actor whose death ``error`` is, if it is one of the actors
        this collection was starting: no new actor takes the place of one dying then."""
        ids = [actor_id(actor) for actor in getattr(self, "remote_collectors", ())]
        if not isinstance(error, RayActorError) or error.actor_id not in ids:
            return None
        where, why = how_it_died(error)
        index = ids.index(error.actor_id)
        return ActorStopped(index, self.env_name, f"as the collectors started, {why}", where)

    def actor_died(self, index: int, death: RayActorError) -> ActorDied:
        where, why = how_it_died(death)
        return ActorDied(index, self.env_name, why, where)

    def dead_actor(self) -> tuple[int, RayActorError] | None:
        """The index of an actor that has died, and Ray's error, or None if none answers
        as dead within ``DEAD_ACTOR_ANSWER_S``. Each actor is asked for its stored frames:
        a dead one answers at once, a live one after its batch in progress."""
        answers = [actor.stored_frames.remote() for actor in self.remote_collectors]
        done, _ = ray.wait(answers, num_returns=len(answers), timeout=DEAD_ACTOR_ANSWER_S)
        for index, answer in enumerate(answers):
            if answer in done:
                try:
                    ray.get(answer)
                except RayActorError as death:
                    return index, death
        return None

    def shutdown(self, timeout: float | None = None, shutdown_ray: bool = False) -> None:
        try:
            super().shutdown(timeout, shutdown_ray=False)
        finally:
            self.close_service()  # after the actors that write into it
            self.disconnect()

    def close_service(self) -> None:
        if self.service is not None:
            self.service.shutdown()
            self.service = None

    def disconnect(self) -> None:
        if self.connected:
            self.connected = False
            ray.shutdown()


def make_replay_service(config: Config) -> Any:
    """The replay service's owner (a TorchRL ``RayReplayBuffer``): one actor holding the
    buffer :func:`rl_app.replay.service.service_parts` describes, reserving no CPU."""
    scratch_dir = Path(config.run_dir) / REPLAY_DIR
    return service_buffer(
        ServiceReplayBuffer, **service_parts(config.replay, scratch_dir, config.seed)
    )


def make_ray_collector(
    config: Config, policy_factory: Callable[..., Any], devices: Any
) -> RayCollection:
    """``collector.workers`` actors of ``env.num_envs`` envs each, each reserving
    ``ray.worker_cpus`` CPUs (``rl_app.checks`` refused a cluster without them); with
    ``replay.service=ray``, writing into the replay service this builds."""
    settings, workers = config.collector, config.collector.workers
    service = config.replay.service == "ray"

    def env_maker(actor: int) -> Any:
        return env_factory(config.env, worker_seed(config.seed, actor), network=config.network)

    return RayCollection(
        config.env.name,
        config.ray.address,
        env_maker,
        config.ray.max_actor_replacements,
        functools.partial(make_replay_service, config) if service else None,
        create_env_fn=[env_maker(worker) for worker in range(workers)],
        policy_factory=policy_factory,
        num_collectors=workers,
        sync=config.ray.sync,
        frames_per_batch=settings.frames_per_batch,
        total_frames=UNBOUNDED_FRAMES,
        init_random_frames=warm_up_frames(settings.init_random_frames, workers, service),
        collector_class=ActorCollector,
        collector_kwargs=remote_collector_kwargs(workers, settings.compile_policy),
        # Replaces TorchRL's default request (1 CPU, 2 GiB, a GPU share on a CUDA host).
        remote_configs={"num_cpus": config.ray.worker_cpus},
        env_device=devices.env,
        policy_device=devices.policy,
        storing_device=devices.storage,
    )
