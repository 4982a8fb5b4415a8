"""Collection in worker processes (``collector.mode=sync|async``).

- ``sync``: TorchRL's ``MultiSyncCollector``, each batch gathered from every worker;
- ``async``: ``MultiAsyncCollector``, workers keep collecting while the learner updates,
  each batch from whichever worker is ready.
Each worker builds its env and policy from picklable factories and holds its own copy of the
weights, replaced only by a push (:class:`rl_app.collection.WeightSync`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase
from torchrl.collectors import BaseCollector, Collector

from rl_app.config import Config
from rl_app.envs import env_factory, worker_seed
from rl_app.replay import TRAJECTORY_KEY
from rl_app.upstream.torchrl_workers import GuardedWeightSyncScheme, make_guarded_policy


def make_worker_collector(
    config: Config, policy_factory: Callable[..., Any], common: dict[str, Any]
) -> BaseCollector:
    """``collector.workers`` processes of one env (or batch of envs) each; ``common`` holds
    the settings every collector shares (batch size, devices)."""
    settings = config.collector
    return Collector(
        [
            env_factory(config.env, worker_seed(config.seed, worker), network=config.network)
            for worker in range(settings.workers)
        ],
        policy_factory=functools.partial(make_guarded_policy, policy_factory),
        num_collectors=settings.workers,
        sync=settings.mode == "sync",
        # Handing workers the policy object instead would share the learner's live tensors.
        weight_sync_schemes={"policy": GuardedWeightSyncScheme()},
        track_policy_version=True,
        # Each worker counts its own frames: split the random warm-up among them.
        init_random_frames=math.ceil(settings.init_random_frames / settings.workers),
        **common,
    )


def remote_collector_kwargs(workers: int, compile_policy: bool) -> list[dict[str, Any]]:
    """The settings of each remote collector (a Ray actor, an RPC worker): every frame
    records the policy version that acted, and trajectory ids interleave across them."""
    return [
        {
            "track_policy_version": True,
            "compile_policy": compile_policy,
            "post_collect_hook": functools.partial(interleave_trajectory_ids, worker, workers),
        }
        for worker in range(workers)
    ]


def interleave_trajectory_ids(worker: int, workers: int, batch: TensorDictBase) -> None:
    """In remote collector ``worker`` (a Ray actor, an RPC worker): its own trajectory ``k``
    becomes ``k * workers + worker``, unique across them; each one's numbering is saved in
    checkpoints and continues on resume."""
    batch.set(TRAJECTORY_KEY, batch.get(TRAJECTORY_KEY) * workers + worker)
