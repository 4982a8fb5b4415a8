"""Algorithms the training loop can run, each behind :class:`rl_app.algorithms.base.Algorithm`,
and the run's config schema: the core groups and one group per algorithm.

The loop calls an algorithm only through that interface: ``policy`` acts while collecting,
``update(batch)`` takes one gradient step and writes each step's new priority,
``checkpoint_components()`` is what a resume needs. Each algorithm declares what the config
checks of it: the ``actions`` it takes, whether it has a ``recurrent`` network and reads
``goals``, its own ``settings`` group and its acting policy (``make_policy``).

To add one (``td3.py`` is the worked example): write ``rl_app/algorithms/<name>.py`` with a
subclass of :class:`~rl_app.algorithms.base.Algorithm` built from a TorchRL loss, its
settings as a dataclass of :func:`rl_app.config.setting` fields; add it to
:data:`ALGORITHMS` below (one line and its import); add a preset ``configs/<name>_<env>.yaml``
and its tests. The ``algo`` choices, the config group and the checks follow from the
declarations; nothing in the loop, the config loading, replay or collection changes."""

from __future__ import annotations

import torch
from tensordict.nn import TensorDictModuleBase
from torchrl.envs import EnvBase

from rl_app.algorithms.base import Algorithm, goal_dim, observation_dim
from rl_app.algorithms.dqn import DQN
from rl_app.algorithms.sac import SAC
from rl_app.algorithms.td3 import TD3
from rl_app.config import Config, ConfigError, run_schema, setting

# `algo=` names, each also the key of its algorithm's settings group.
ALGORITHMS: dict[str, type[Algorithm]] = {"sac": SAC, "dqn": DQN, "td3": TD3}

# The schema of a run: the first algorithm is the default.
RunConfig = run_schema(
    setting(
        next(iter(ALGORITHMS)),
        " | ".join(f"{name} ({kind.actions} actions)" for name, kind in ALGORITHMS.items()),
        choices=tuple(ALGORITHMS),
    ),
    {name: kind.settings for name, kind in ALGORITHMS.items() if kind.settings is not None},
    name="RunConfig",
    module=__name__,
)

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "RunConfig",
    "check_actions",
    "check_algorithm",
    "make_algorithm",
    "make_policy",
]


def make_algorithm(config: Config, env: EnvBase, device: torch.device) -> Algorithm:
    """Build the algorithm named by ``config.algo`` for ``env``'s specs on ``device``."""
    return ALGORITHMS[config.algo](config, env, device)


def make_policy(config: Config, env: EnvBase) -> TensorDictModuleBase:
    """The acting policy of ``config.algo`` for ``env``'s specs, on the CPU, with fresh
    weights: no loss, optimizer, buffer or collector is built."""
    action_spec = env.action_spec_unbatched.clone().cpu()
    return ALGORITHMS[config.algo].make_policy(
        config, observation_dim(env), goal_dim(env), action_spec
    )


def check_algorithm(config: Config) -> None:
    """``config.algo`` supports the network and the goals the config asks for."""
    algo, recurrent = config.algo, config.network.recurrent
    if recurrent != "none" and not ALGORITHMS[algo].recurrent:
        having = " or ".join(f"algo={name}" for name, kind in ALGORITHMS.items() if kind.recurrent)
        raise ConfigError(
            f"network.recurrent={recurrent!r} is not accepted with algo={algo!r}: only "
            f"{having} has a recurrent network (set network.recurrent=none)"
        )
    her_ratio = config.replay.her_ratio
    if her_ratio and (not ALGORITHMS[algo].goals or recurrent != "none"):
        reading = sorted(name for name, kind in ALGORITHMS.items() if kind.goals)
        raise ConfigError(
            f"replay.her_ratio={her_ratio} is not accepted with algo={algo!r} and "
            f"network.recurrent={recurrent!r}: only the MLPs of algo="
            f"{' and algo='.join(reading)} read the goal (set replay.her_ratio=0)"
        )


def check_actions(config: Config, env_actions: str) -> None:
    """``config.algo`` takes the actions of the env (``"continuous"`` or ``"discrete"``)."""
    needed = ALGORITHMS[config.algo].actions
    if needed != env_actions:
        fitting = [name for name, kind in ALGORITHMS.items() if kind.actions == env_actions]
        raise ConfigError(
            f"algo={config.algo!r} needs {needed} actions but {config.env.name} has "
            f"{env_actions} actions: use algo={' or algo='.join(fitting)}"
        )
