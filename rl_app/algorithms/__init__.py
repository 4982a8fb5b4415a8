"""Algorithms the training loop can run, each behind :class:`rl_app.algorithms.base.Algorithm`
and registered by where its class is (:data:`ALGORITHMS`): a run imports the module of the
algorithm it names, and no other.

The loop calls an algorithm only through that interface: ``policy`` acts while collecting,
``update(batch)`` takes its gradient steps and returns their metrics and each step's TD
error (the loop writes it back as priorities), ``checkpoint_components()`` is what a
resume needs. Each algorithm declares what the config
checks of it: the ``actions`` it takes, whether it has a ``recurrent`` network and reads
``goals``, its own ``settings`` group and its acting policy (``make_policy``).

To add one (``td3.py`` is the worked example): write ``rl_app/algorithms/<name>.py`` with a
subclass of :class:`~rl_app.algorithms.base.Algorithm` built from a TorchRL loss; its
settings as a dataclass of :func:`rl_app.config.setting` fields in
``rl_app/config/algorithms.py``, the field ``<name>`` of :class:`rl_app.config.RunConfig`;
add it to :data:`ALGORITHMS` below (one line); add a preset ``configs/<name>_<env>.yaml``
and its tests. The ``algo`` choices and the checks follow from the declarations; nothing in
the loop, the config loading, replay or collection changes. An algorithm whose module is
missing is not offered: its name leaves the ``algo`` choices."""

from __future__ import annotations

import importlib
import importlib.util

import torch
from tensordict.nn import TensorDictModuleBase
from torchrl.envs import EnvBase

from rl_app.algorithms.base import Algorithm, goal_dim, observation_dim
from rl_app.config import Config, ConfigError

# `algo=` names, each also the key of its algorithm's settings group, and its class as
# module:class.
ALGORITHMS: dict[str, str] = {
    "sac": "rl_app.algorithms.sac:SAC",
    "dqn": "rl_app.algorithms.dqn:DQN",
    "td3": "rl_app.algorithms.td3:TD3",
}

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "algorithm_class",
    "available_algorithms",
    "check_actions",
    "check_algorithm",
    "check_settings",
    "describe_algorithms",
    "make_algorithm",
    "make_policy",
]


def available_algorithms() -> list[str]:
    """The names in :data:`ALGORITHMS` whose module is present (found, not imported): the
    values ``algo`` accepts."""
    return [
        name
        for name, where in ALGORITHMS.items()
        if importlib.util.find_spec(where.partition(":")[0]) is not None
    ]


def algorithm_class(name: str) -> type[Algorithm]:
    """The algorithm registered as ``name``, its module imported now."""
    module, _, class_name = ALGORITHMS[name].partition(":")
    return getattr(importlib.import_module(module), class_name)


def every_algorithm() -> dict[str, type[Algorithm]]:
    """Every available algorithm by name, each module imported: for the messages and the
    help that name them all, never on the way of a run that fits."""
    return {name: algorithm_class(name) for name in available_algorithms()}


def describe_algorithms() -> str:
    """The ``algo`` values with the actions each takes (``train.py --help``)."""
    return " | ".join(
        f"{name} ({kind.actions} actions)" for name, kind in every_algorithm().items()
    )


def make_algorithm(config: Config, env: EnvBase, device: torch.device) -> Algorithm:
    """Build the algorithm named by ``config.algo`` for ``env``'s specs on ``device``."""
    return algorithm_class(config.algo)(config, env, device)


def make_policy(config: Config, env: EnvBase) -> TensorDictModuleBase:
    """The acting policy of ``config.algo`` for ``env``'s specs, on the CPU, with fresh
    weights: no loss, optimizer, buffer or collector is built."""
    action_spec = env.action_spec_unbatched.clone().cpu()
    return algorithm_class(config.algo).make_policy(
        config, observation_dim(env), goal_dim(env), action_spec
    )


def listed(names: list[str], conjunction: str = "or") -> str:
    """``algo=a or algo=b``, for a message."""
    return f" {conjunction} ".join(f"algo={name}" for name in names)


def check_algorithm(config: Config) -> None:
    """``config.algo`` supports the network and the goals the config asks for."""
    algo, recurrent = config.algo, config.network.recurrent
    chosen = algorithm_class(algo)
    if recurrent != "none" and not chosen.recurrent:
        having = [name for name, kind in every_algorithm().items() if kind.recurrent]
        which = f"only {listed(having)} has" if having else "no available algorithm has"
        raise ConfigError(
            f"network.recurrent={recurrent!r} is not accepted with algo={algo!r}: {which} a "
            "recurrent network (set network.recurrent=none)"
        )
    her_ratio = config.replay.her_ratio
    if her_ratio and (not chosen.goals or recurrent != "none"):
        reading = sorted(name for name, kind in every_algorithm().items() if kind.goals)
        which = f"only the MLPs of {listed(reading, 'and')} read" if reading else "none reads"
        raise ConfigError(
            f"replay.her_ratio={her_ratio} is not accepted with algo={algo!r} and "
            f"network.recurrent={recurrent!r}: {which} the goal (set replay.her_ratio=0)"
        )


def check_actions(config: Config, env_actions: str) -> None:
    """``config.algo`` takes the actions of the env (``"continuous"`` or ``"discrete"``)."""
    needed = algorithm_class(config.algo).actions
    if needed != env_actions:
        fitting = [name for name, kind in every_algorithm().items() if kind.actions == env_actions]
        which = f"use {listed(fitting)}" if fitting else "no available algorithm takes them"
        raise ConfigError(
            f"algo={config.algo!r} needs {needed} actions but {config.env.name} has "
            f"{env_actions} actions: {which}"
        )


def check_settings(config: Config) -> None:
    """Each algorithm's own group fits the rest of the config, whichever ``algo`` runs: the
    chosen algorithm checks its group, and so does each other one whose group is set away
    from its defaults (defaults fit every config), its module imported only then."""
    for name in available_algorithms():
        group = getattr(config, name)
        if name == config.algo or group != type(group)():
            algorithm_class(name).check(config)
