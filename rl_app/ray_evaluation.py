"""Evaluations beside training on the run's Ray cluster (``eval.backend=ray``, with
``collector.mode=ray``): one actor, reserving ``ray.worker_cpus`` CPUs as a collector actor
does, plays them one at a time, the episodes a blocking evaluation plays.

TorchRL's ``RayEvalWorker`` (behind the ``Evaluator``'s ``ray`` backend) would not do: it
builds its env once and scores one rollout by its mean reward per step, not the seeded
episodes of :func:`rl_app.evaluation.play_episodes`."""

from __future__ import annotations

from collections.abc import Callable

import ray
import torch
from ray.exceptions import RayActorError, RayTaskError
from tensordict.nn import TensorDictModuleBase

from rl_app.config import Config
from rl_app.evaluation import BackgroundEvaluator, evaluate_weights
from rl_app.upstream.ray import how_it_died


class EvaluationActor:
    """The actor: each evaluation's scores, on the learner's thread count (the same float
    rounding as a blocking evaluation)."""

    def __init__(
        self, config: Config, policy_factory: Callable[..., TensorDictModuleBase], threads: int
    ) -> None:
        torch.set_num_threads(threads)
        self.config, self.policy_factory = config, policy_factory

    def evaluate(self, weights: dict[str, torch.Tensor]) -> dict[str, float]:
        return evaluate_weights(self.config, self.policy_factory, weights)


class RayEvaluator(BackgroundEvaluator):
    """A :class:`~rl_app.evaluation.BackgroundEvaluator` whose worker is an
    :class:`EvaluationActor` on the Ray cluster the collector joined; killed (not left
    running) when an evaluation is dropped or the run ends."""

    result: ray.ObjectRef  # the scores of the evaluation playing, once it has ended

    def start_worker(self) -> None:
        actor = ray.remote(num_cpus=self.config.ray.worker_cpus)(EvaluationActor)
        self.worker = actor.remote(self.config, self.policy_factory, torch.get_num_threads())

    def send(self, weights: dict[str, torch.Tensor]) -> None:
        self.result = self.worker.evaluate.remote(weights)

    def scores(self, timeout: float | None = 0) -> dict[str, float] | None:
        ready, _ = ray.wait([self.result], timeout=timeout)
        if not ready:
            return None
        self.playing = False
        try:
            return ray.get(self.result)
        except RayActorError as error:
            where, why = how_it_died(error)
            raise RuntimeError(
                f"the evaluation's Ray actor ({where or 'where unknown'}) ended: {why}"
            ) from None
        except RayTaskError as error:
            raise RuntimeError(f"the evaluation failed in its Ray actor:\n{error}") from None

    def close(self) -> None:
        if self.worker is not None:
            ray.kill(self.worker)
