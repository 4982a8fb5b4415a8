"""Ray 2.60.0 and TorchRL 0.14.1's Ray collector: their private names and the workarounds
of their behaviours (the index is in :mod:`rl_app.upstream`). Imported only by
``collector.mode=ray``."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from ray.actor import ActorHandle
from torchrl.collectors import Collector

# -- 1. which actor a failure came from ----------------------------------------------------


def actor_id(actor: ActorHandle) -> str:
    """The hex id of ``actor``, as Ray's errors name it: a handle keeps it in the private
    ``_actor_id``. Test: ``test_ray_handles_still_keep_their_hex_id_in_a_private_attribute``."""
    return actor._actor_id.hex()


class TruthfulCollector(Collector):
    """TorchRL's ``Collector`` as a Ray actor whose errors reach the learner.

    Ray tests the truth of an actor when it stores the error one of its methods raised. A
    ``Collector`` takes its truth from ``__len__``, which for the endless collectors
    ``RayCollector`` makes (``total_frames`` becomes ``inf``) returns a float: Ray's
    ``TypeError`` then ends the actor's process, and the learner gets an ``ActorDiedError``
    in place of the error. Test: ``test_an_endless_collector_still_has_a_float_length``."""

    def __bool__(self) -> bool:
        return True


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
# yields nothing, so an endless one is given rl_app.upstream.torchrl.UNBOUNDED_FRAMES; and it
# hands each actor ``init_random_frames // num_collectors``. Test:
# ``test_ray_collector_still_stops_at_minus_one_frames_and_splits_the_warm_up``.
