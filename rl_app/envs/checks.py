"""What the config asks of its env, checked before anything is created: the env is
registered, its spaces fit ``env.observation_indices``, and hindsight relabelling has a goal
env. Building the Gymnasium env is the only way to read its spaces; no TorchRL env, file or
process is created. The Atari rules are in :mod:`rl_app.envs.atari`."""

from __future__ import annotations

import importlib

import gymnasium as gym

from rl_app.config import Config, ConfigError, EnvConfig
from rl_app.envs import is_registered, make_gym

# What hindsight relabelling reads of a goal env, as gymnasium-robotics' GoalEnv offers it:
# its dict observation's entries, and the reward and termination of any goal.
GOAL_KEYS = ("desired_goal", "achieved_goal", "observation")
GOAL_FUNCTIONS = ("compute_reward", "compute_terminated")


def check_env_registered(env_name: str) -> None:
    """Gymnasium ids, or ``module:id`` for an env that ``module`` registers on import."""
    module = env_name.split(":")[0] if ":" in env_name else None
    if module is not None:
        try:
            importlib.import_module(module)
        except Exception as error:  # any failure to import is the user's module's
            raise ConfigError(
                f"env.name={env_name!r}: cannot import {module!r} ({error})"
            ) from None
    if not is_registered(env_name.split(":")[-1]):
        raise ConfigError(
            f"env.name={env_name!r} is not a registered Gymnasium environment "
            "(see gymnasium.envs.registry for the accepted ids, or give module:id)"
        )


def check_spaces(env: EnvConfig) -> str:
    """``env.observation_indices`` must fit the env's observation; returns the actions the
    env takes, ``"discrete"`` or ``"continuous"`` (what an algorithm declares it takes)."""
    env_name = env.name
    try:
        probe = make_gym(env_name)
    except Exception as error:  # a missing optional dependency, a broken env module
        raise ConfigError(f"env.name={env_name!r} cannot be built: {error}") from None
    actions = "discrete" if isinstance(probe.action_space, gym.spaces.Discrete) else "continuous"
    observation_space = probe.observation_space
    probe.close()
    if not isinstance(observation_space, (gym.spaces.Box, gym.spaces.Dict)):
        raise ConfigError(
            f"env.name={env_name!r} observes {observation_space}: the networks read a Box "
            "observation (a vector, or frames) or a goal env's Dict of them"
        )
    if env.observation_indices is not None:
        if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
            raise ConfigError(
                f"env.observation_indices needs a flat Box observation: {env_name} observes "
                f"{observation_space}"
            )
        size = observation_space.shape[0]
        if max(env.observation_indices) >= size:
            raise ConfigError(
                f"env.observation_indices={env.observation_indices!r} is out of range: "
                f"{env_name} observations have {size} entries (indices 0 to {size - 1})"
            )
    return actions


def check_goal_env(config: Config) -> None:
    """Hindsight relabelling (``replay.her_ratio``) needs a goal env."""
    her_ratio = config.replay.her_ratio
    if her_ratio and (problem := goal_env_problem(config.env.name)) is not None:
        raise ConfigError(
            f"replay.her_ratio={her_ratio} relabels goals, but {config.env.name} {problem}"
        )


def goal_env_problem(env_name: str) -> str | None:
    """What ``env_name`` lacks of a goal env (:data:`GOAL_KEYS`, :data:`GOAL_FUNCTIONS`),
    or None."""
    probe = make_gym(env_name)
    space, unwrapped = probe.observation_space, probe.unwrapped
    probe.close()
    observed = space.spaces if isinstance(space, gym.spaces.Dict) else {}
    missing_key = next((key for key in GOAL_KEYS if key not in observed), None)
    if missing_key is not None:
        return (
            f"observes no {missing_key!r} (its observation space is a {type(space).__name__}, "
            f"not a Dict of {', '.join(GOAL_KEYS)})"
        )
    missing = next(
        (name for name in GOAL_FUNCTIONS if not callable(getattr(unwrapped, name, None))), None
    )
    if missing is not None:
        return f"offers no {missing}(achieved_goal, desired_goal, info)"
    return None


def max_episode_steps(env: EnvConfig) -> int | None:
    """The most steps an episode lasts (None: no limit): the env's own limit, from its
    registration, or ``env.max_episode_steps`` where that is shorter."""
    limits = (gym.spec(env.name.split(":")[-1]).max_episode_steps, env.max_episode_steps)
    return min((limit for limit in limits if limit is not None), default=None)
