"""The small interface between the training loop and an RL algorithm.

The loop never imports an algorithm module: it calls :func:`rl_app.algorithms.make_algorithm`
and then only the methods below. Adding an algorithm means one module implementing
:class:`Algorithm`, its name in ``ALGORITHMS`` (``rl_app/algorithms/__init__.py``) and in
``ALGORITHM_ACTIONS`` (``rl_app/config.py``, with a settings group if it has its own
settings), and one preset in ``configs/``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.objectives import LossModule

# Key under which `update` writes one priority per sampled transition.
PRIORITY_KEY = "td_error"


class Algorithm(abc.ABC):
    """What the training loop needs from an algorithm."""

    #: The policy that acts in the environment while collecting (it explores).
    policy: TensorDictModuleBase
    #: The TorchRL loss the update minimises.
    loss: LossModule

    def replay_keys(self) -> list[Any]:
        """What an update reads from a transition (the loss's ``in_keys``): with the
        trajectory ids, all the replay buffer stores of a collected frame."""
        return list(self.loss.in_keys)

    @abc.abstractmethod
    def policy_factory(self) -> Callable[..., TensorDictModuleBase]:
        """A picklable factory for a fresh copy of ``policy``, for the Evaluator and for
        collector worker processes. Weights are loaded into the copy separately."""

    @abc.abstractmethod
    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """One gradient step on a sampled batch.

        Writes ``batch[PRIORITY_KEY]`` (one new priority per transition) and returns the
        detached scalar metrics of the step (losses, temperature, ...)."""

    @abc.abstractmethod
    def after_collect(self, frames: int) -> None:
        """Advance exploration schedules once ``frames`` environment frames are collected."""

    @abc.abstractmethod
    def checkpoint_components(self) -> dict[str, Any]:
        """Everything of the algorithm a resume needs (networks, target networks,
        optimizer, exploration state), each object offering ``state_dict``."""
