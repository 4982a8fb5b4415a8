"""An env's episode in progress as plain values, so that a checkpoint taken mid-episode
resumes it exactly.

:class:`ResumableEnv` wraps one Gymnasium env (its wrappers included) and gives its whole
episode state: the env's random generator, the env's own state for the kinds this project
ships, and what its wrappers count. What the TorchRL transforms hold for the episode (step
count, episode return, ``is_init``, stacked frames) travels with the collector's next
step (:class:`rl_app.collection.CollectorState`).

Kinds of env whose state is saved:
- an Atari game (ale-py): its emulator, cloned with the emulator's random state;
- Gymnasium's own MuJoCo envs: the integration state, everything ``mj_step``
  reads (time, positions, velocities, actuator activations, the solver's warm start, ...),
  and the body positions the last step computed;
- classic control (CartPole, Pendulum, MountainCar, Acrobot): their ``state`` vector;
- an env that offers ``get_state()`` and ``set_state(state)`` itself, as the project's goal
  envs do (:mod:`rl_app.envs.goals`): a dict of NumPy arrays and Python values.

Another env, or a wrapper not known to hold nothing per episode, cannot give its state: at
an episode start its reset is replayed from the random state it drew from; mid-episode
:meth:`ResumableEnv.get_state` returns None and a resumed run starts a new episode.
"""

from __future__ import annotations

import sys
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.classic_control import (
    AcrobotEnv,
    CartPoleEnv,
    Continuous_MountainCarEnv,
    MountainCarEnv,
    PendulumEnv,
)
from gymnasium.wrappers import AtariPreprocessing, PassiveEnvChecker, TimeLimit
from gymnasium.wrappers.common import OrderEnforcing

from rl_app.upstream.gymnasium import set_elapsed_steps

# Their whole state is ``state``: CartPole's ``steps_beyond_terminated`` counts only past a
# termination, and Pendulum's ``last_u`` is drawn only.
CLASSIC_CONTROL = (AcrobotEnv, CartPoleEnv, Continuous_MountainCarEnv, MountainCarEnv, PendulumEnv)
GYMNASIUM_MUJOCO = "gymnasium.envs.mujoco."
# Body positions MuJoCo computed in the last step, from the state before its last substep
# (not from the state it ended in): Ant and Humanoid read them before their next step.
POSITIONS = ("xpos", "xipos")
# Gymnasium's wrappers that hold nothing an episode changes; one of this project's says so
# with ``holds_episode_state = False``.
STATELESS_WRAPPERS = (OrderEnforcing, PassiveEnvChecker)


class ResumableEnv(gym.Wrapper):
    """The outermost wrapper of a single env: :meth:`get_state` and :meth:`set_state` of
    its episode in progress, Gymnasium's side of it. It counts the steps since the reset,
    which every ``TimeLimit`` inside counts too."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.steps_since_reset = 0
        self.random_state_before_reset: dict[str, Any] = {}

    def reset(self, **kwargs: Any) -> Any:
        self.random_state_before_reset = self.unwrapped.np_random.bit_generator.state
        self.steps_since_reset = 0
        return super().reset(**kwargs)

    def step(self, action: Any) -> Any:
        self.steps_since_reset += 1
        return super().step(action)

    def unsaved_part(self) -> str | None:
        """The env or wrapper whose state cannot be saved, by its class name; None if the
        whole episode can be."""
        if (wrapper := self.unsaved_wrapper()) is not None:
            return wrapper
        return type(self.unwrapped).__name__ if env_state(self.unwrapped) is None else None

    def unsaved_wrapper(self) -> str | None:
        for wrapper in self.wrappers():
            known = isinstance(wrapper, (TimeLimit, AtariPreprocessing, *STATELESS_WRAPPERS))
            if not known and getattr(wrapper, "holds_episode_state", True):
                return type(wrapper).__name__
        return None

    def get_state(self) -> dict[str, Any] | None:
        """The episode in progress as tensors and Python values (loadable with
        ``torch.load(weights_only=True)``); at an episode start of an env that cannot give
        its state, the random state its reset drew from; otherwise None."""
        own = env_state(self.unwrapped) if self.unsaved_wrapper() is None else None
        if own is None:
            if self.steps_since_reset > 0:
                return None
            return {"replay_reset_from": self.random_state_before_reset}
        wrappers = {
            depth: preprocessing_state(wrapper)
            for depth, wrapper in enumerate(self.wrappers())
            if isinstance(wrapper, AtariPreprocessing)
        }
        return {
            "steps_since_reset": self.steps_since_reset,
            "random_state": self.unwrapped.np_random.bit_generator.state,
            "env": as_tensors(own),
            "wrappers": as_tensors(wrappers),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue the episode :meth:`get_state` gave, in an env built the same way."""
        if "replay_reset_from" in state:
            self.unwrapped.np_random.bit_generator.state = state["replay_reset_from"]
            self.reset()
            return
        self.unwrapped.np_random.bit_generator.state = state["random_state"]
        set_env_state(self.unwrapped, as_arrays(state["env"]))
        wrappers = as_arrays(state["wrappers"])
        for depth, wrapper in enumerate(self.wrappers()):
            if isinstance(wrapper, TimeLimit):
                set_elapsed_steps(wrapper, state["steps_since_reset"])
            elif isinstance(wrapper, AtariPreprocessing):
                set_preprocessing_state(wrapper, wrappers[depth])
        self.steps_since_reset = state["steps_since_reset"]

    def wrappers(self) -> list[gym.Wrapper]:
        """The wrappers inside this one, outermost first."""
        found, env = [], self.env
        while isinstance(env, gym.Wrapper):
            found.append(env)
            env = env.env
        return found


def loaded_class(module: str, name: str) -> type | None:
    """The class ``name`` of ``module`` if that module is imported: an env of that class
    exists only then, and a run without it does not pay for the import."""
    return getattr(sys.modules.get(module), name, None)


def env_state(env: gym.Env) -> dict[str, Any] | None:
    """The state of the unwrapped ``env`` as NumPy arrays and Python values, for the kinds
    in the module's doc; None for another. A subclass of one of them may hold more than its
    parent (an env of this kind of Gymnasium's own module, for MuJoCo): it is another kind,
    unless it offers ``get_state`` itself."""
    atari = loaded_class("ale_py.env", "AtariEnv")
    mujoco_env = loaded_class("gymnasium.envs.mujoco.mujoco_env", "MujocoEnv")
    if type(env) is atari:
        emulator = env.ale.cloneState(include_rng=True).serialize()
        return {"emulator": np.frombuffer(emulator, dtype=np.uint8)}
    if isinstance(env, mujoco_env or ()) and type(env).__module__.startswith(GYMNASIUM_MUJOCO):
        import mujoco

        spec = mujoco.mjtState.mjSTATE_INTEGRATION  # all that mj_step reads
        physics = np.empty(mujoco.mj_stateSize(env.model, spec))
        mujoco.mj_getState(env.model, env.data, physics, spec)
        return {"physics": physics, **{name: getattr(env.data, name).copy() for name in POSITIONS}}
    if type(env) in CLASSIC_CONTROL:
        return {"state": np.array(env.state)}
    if callable(getattr(env, "get_state", None)) and callable(getattr(env, "set_state", None)):
        return env.get_state()
    return None


def set_env_state(env: gym.Env, state: dict[str, Any]) -> None:
    """Restore what :func:`env_state` gave."""
    if "emulator" in state:
        from ale_py import ALEState

        env.ale.restoreState(ALEState(state["emulator"].tobytes()))
    elif "physics" in state:
        import mujoco

        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        mujoco.mj_setState(env.model, env.data, state["physics"], spec)
        mujoco.mj_forward(env.model, env.data)  # what follows from the state, as set_state does
        for name in POSITIONS:
            getattr(env.data, name)[...] = state[name]
    elif type(env) in CLASSIC_CONTROL:
        env.state = state["state"]
    else:
        env.set_state(state)


def preprocessing_state(wrapper: AtariPreprocessing) -> dict[str, Any]:
    """The last two emulator screens Atari preprocessing pools, and the lives it counts."""
    return {
        "screens": np.stack(wrapper.obs_buffer),
        "lives": wrapper.lives,
        "game_over": wrapper.game_over,
    }


def set_preprocessing_state(wrapper: AtariPreprocessing, state: dict[str, Any]) -> None:
    for screen, saved in zip(wrapper.obs_buffer, state["screens"], strict=True):
        screen[...] = saved
    wrapper.lives = state["lives"]
    wrapper.game_over = state["game_over"]


def as_tensors(value: Any) -> Any:
    """``value`` with every NumPy array inside it (dicts, lists) as a tensor of its own."""
    if isinstance(value, np.ndarray):
        return torch.tensor(value)
    if isinstance(value, dict):
        return {key: as_tensors(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_tensors(item) for item in value]
    return value


def as_arrays(value: Any) -> Any:
    """:func:`as_tensors` undone: every tensor a NumPy array of its own."""
    if isinstance(value, torch.Tensor):
        return value.numpy().copy()
    if isinstance(value, dict):
        return {key: as_arrays(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_arrays(item) for item in value]
    return value
