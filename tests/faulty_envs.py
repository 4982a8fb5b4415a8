"""Real Gymnasium environments that fail on purpose, for the fault-handling tests.

Registered under ``rl_app_test/...`` when this module is imported. Each env instance counts
its own steps; evaluation envs step 1,000 frames per evaluation here, so faults set past
that hit the training env only."""

from __future__ import annotations

import gymnasium as gym
from gymnasium.envs.classic_control.pendulum import PendulumEnv


class FaultyPendulum(PendulumEnv):
    """Pendulum that, from its ``fail_after``-th step on, either raises or rewards NaN."""

    def __init__(self, fail_after: int, fault: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_after = fail_after
        self.fault = fault
        self.steps = 0

    def step(self, action):
        self.steps += 1
        observation, reward, terminated, truncated, info = super().step(action)
        if self.steps >= self.fail_after:
            if self.fault == "raise":
                raise RuntimeError(f"simulated physics failure at step {self.steps}")
            reward = float("nan")
        return observation, reward, terminated, truncated, info


def register(name: str, fail_after: int, fault: str) -> str:
    env_id = f"rl_app_test/{name}-v0"
    if env_id not in gym.envs.registry:
        gym.register(
            env_id,
            entry_point=FaultyPendulum,
            max_episode_steps=200,
            kwargs={"fail_after": fail_after, "fault": fault},
        )
    return env_id


RAISES_AT_1100 = register("RaisingPendulum", 1100, "raise")
NAN_AT_1100 = register("NaNPendulum", 1100, "nan")
