"""Real Gymnasium environments that fail on purpose, for the fault-handling tests.

Registered under ``rl_app_test/...`` when this module is imported. Each env instance counts
its own steps; evaluation envs step 1,000 frames per evaluation here, so faults set past
that hit the training env only."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time

import gymnasium as gym
from gymnasium.envs.classic_control.pendulum import PendulumEnv


class FaultyPendulum(PendulumEnv):
    """Pendulum that, from its ``fail_after``-th step on, either raises or rewards NaN.

    With ``only_seed``, only the env seeded so fails (worker 0 of a run seeded 0). With
    ``stop_s``, a worker process holding the env takes that long to exit when terminated,
    as one shutting a simulator down would."""

    def __init__(
        self, fail_after: int, fault: str, only_seed: int | None = None, stop_s: float = 0.0,
        **kwargs,
    ) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self.fail_after = fail_after
        self.fault = fault
        self.only_seed = only_seed
        self.seeded_with = None
        self.steps = 0
        if stop_s and multiprocessing.parent_process() is not None:
            signal.signal(signal.SIGTERM, lambda signum, frame: stop_slowly(stop_s, signum))

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.seeded_with = seed
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        observation, reward, terminated, truncated, info = super().step(action)
        if self.steps >= self.fail_after and self.only_seed in (None, self.seeded_with):
            if self.fault == "raise":
                raise RuntimeError(f"simulated physics failure at step {self.steps}")
            reward = float("nan")
        return observation, reward, terminated, truncated, info


class DyingInRayActorPendulum(PendulumEnv):
    """Pendulum whose construction in a Ray actor kills the actor's process (``kill -9``),
    or with ``raises`` raises: an actor lost while the collectors start. Built anywhere
    else, it is Pendulum."""

    def __init__(self, raises: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            if sys.modules["ray"].get_runtime_context().get_actor_id() is not None:
                if raises:
                    raise ValueError("no simulator licence on this node")
                os.kill(os.getpid(), signal.SIGKILL)


def stop_slowly(seconds: float, signum: int) -> None:
    time.sleep(seconds)
    os._exit(128 + signum)


def register(name: str, fail_after: int, fault: str, **kwargs) -> str:
    env_id = f"rl_app_test/{name}-v0"
    if env_id not in gym.envs.registry:
        gym.register(
            env_id,
            entry_point=FaultyPendulum,
            max_episode_steps=200,
            kwargs={"fail_after": fail_after, "fault": fault, **kwargs},
        )
    return env_id


RAISES_AT_1100 = register("RaisingPendulum", 1100, "raise")
NAN_AT_1100 = register("NaNPendulum", 1100, "nan")
# Worker 0 (seed 0) raises; worker 1, terminated then, takes 2 s to exit.
RAISES_AT_1100_BESIDE_A_SLOW_STOP = register(
    "RaisingBesideSlowStopPendulum", 1100, "raise", only_seed=0, stop_s=2.0
)
DIES_IN_RAY_ACTORS = "rl_app_test/DyingInRayActorPendulum-v0"
RAISES_IN_RAY_ACTORS = "rl_app_test/RaisingInRayActorPendulum-v0"
for env_id, raises in ((DIES_IN_RAY_ACTORS, False), (RAISES_IN_RAY_ACTORS, True)):
    if env_id not in gym.envs.registry:
        gym.register(
            env_id,
            entry_point=DyingInRayActorPendulum,
            max_episode_steps=200,
            kwargs={"raises": raises},
        )
