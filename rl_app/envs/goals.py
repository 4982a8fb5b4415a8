"""Goal-conditioned Gymnasium envs for hindsight experience replay (Andrychowicz et al., 2017).

Each observes a dict of ``observation``, ``achieved_goal`` and ``desired_goal`` (float32
vectors), rewards 0 when the achieved goal meets the desired one and -1 otherwise, reports
``info["is_success"]``, and offers ``compute_reward(achieved_goal, desired_goal, info)`` and
``compute_terminated(achieved_goal, desired_goal, info)`` over batches of goals, as
gymnasium-robotics' ``GoalEnv`` does: a replay buffer recomputes the reward and the
termination of a stored transition for another goal with them.

Importing this module registers the ids below, so ``env.name`` takes them as
``rl_app.envs.goals:<id>`` (Gymnasium imports the module named before the colon).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

# Bit flipping of a few sizes under ids of their own; another size n is
# gym.make(id, n_bits=n, max_episode_steps=n).
BIT_FLIP_IDS = {n_bits: f"rl_app/BitFlip{n_bits}-v0" for n_bits in (10, 15, 20, 40)}
POINT_REACH_ID = "rl_app/PointReach-v0"
POINT_MAX_STEP = 0.1
POINT_SUCCESS_DISTANCE = 0.05
POINT_EPISODE_STEPS = 50

ObsDict = dict[str, np.ndarray]


def sparse_reward(reached: np.ndarray) -> np.ndarray:
    """0 where the goal is reached, -1 elsewhere."""
    return reached.astype(np.float32) - 1.0


def goal_space(low: float, high: float, size: int) -> gym.spaces.Dict:
    """The dict observation space of a goal env whose three entries share one box."""
    box = gym.spaces.Box(low, high, shape=(size,), dtype=np.float32)
    return gym.spaces.Dict({"observation": box, "achieved_goal": box, "desired_goal": box})


class BitFlippingEnv(gym.Env):
    """The HER paper's bit flipping: ``n_bits`` bits start random, the goal is another
    random string of bits drawn with them, and each action flips one bit.

    The observation is the bits, which are also the achieved goal. An episode terminates
    when the bits equal the goal and is truncated after ``n_bits`` steps, as
    Stable-Baselines3's ``BitFlippingEnv`` does (whose goal is all ones unless randomized).
    Start and goal are drawn independently: a start may equal the goal, and the first flip
    then leaves it."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (Gymnasium's attribute)

    def __init__(self, n_bits: int = 10, render_mode: None = None) -> None:
        self.n_bits = n_bits
        self.observation_space = goal_space(0.0, 1.0, n_bits)
        self.action_space = gym.spaces.Discrete(n_bits)
        self.bits = np.zeros(n_bits, dtype=np.float32)
        self.goal = np.zeros(n_bits, dtype=np.float32)
        self.steps = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, dict[str, Any]]:
        super().reset(seed=seed)
        self.bits = self.random_bits()
        self.goal = self.random_bits()
        self.steps = 0
        return self.observation(), {}

    def step(self, action: int) -> tuple[ObsDict, float, bool, bool, dict[str, Any]]:
        self.bits[action] = 1.0 - self.bits[action]
        self.steps += 1
        success = bool(self.compute_terminated(self.bits, self.goal, {}))
        reward = float(self.compute_reward(self.bits, self.goal, {}))
        truncated = self.steps >= self.n_bits
        return self.observation(), reward, success, truncated, {"is_success": success}

    def compute_reward(
        self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any
    ) -> np.ndarray:
        """0 where ``achieved_goal`` equals ``desired_goal`` in every bit (the last axis),
        -1 elsewhere."""
        return sparse_reward(self.compute_terminated(achieved_goal, desired_goal, info))

    def compute_terminated(
        self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any
    ) -> np.ndarray:
        """Where ``achieved_goal`` equals ``desired_goal`` in every bit: an episode ends there."""
        return np.all(achieved_goal == desired_goal, axis=-1)

    def get_state(self) -> dict[str, Any]:
        """The episode in progress, which a checkpoint saves (:mod:`rl_app.envs.resumable`)."""
        return {"bits": self.bits.copy(), "goal": self.goal.copy(), "steps": self.steps}

    def set_state(self, state: dict[str, Any]) -> None:
        self.bits, self.goal, self.steps = state["bits"], state["goal"], state["steps"]

    def random_bits(self) -> np.ndarray:
        return self.np_random.integers(0, 2, self.n_bits).astype(np.float32)

    def observation(self) -> ObsDict:
        return {
            "observation": self.bits.copy(),
            "achieved_goal": self.bits.copy(),
            "desired_goal": self.goal.copy(),
        }


class PointReachEnv(gym.Env):
    """A point in the square [-1, 1]^2 that must reach a goal, for continuous control: each
    action, clipped to [-1, 1]^2, moves the point by ``POINT_MAX_STEP`` times itself (the
    point stays in the square).

    Start and goal are drawn uniformly in the square each episode. The goal is reached
    within ``POINT_SUCCESS_DISTANCE``; as in gymnasium-robotics' ``FetchReach``, reaching it
    does not end the episode (it is truncated after ``POINT_EPISODE_STEPS`` steps), so a
    stored transition's ``terminated`` (always False) holds for any goal it is relabelled
    with."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (Gymnasium's attribute)

    def __init__(self, render_mode: None = None) -> None:
        self.observation_space = goal_space(-1.0, 1.0, 2)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.position = np.zeros(2, dtype=np.float32)
        self.goal = np.zeros(2, dtype=np.float32)
        self.steps = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, dict[str, Any]]:
        super().reset(seed=seed)
        self.position = self.random_point()
        self.goal = self.random_point()
        self.steps = 0
        return self.observation(), {}

    def step(self, action: np.ndarray) -> tuple[ObsDict, float, bool, bool, dict[str, Any]]:
        move = POINT_MAX_STEP * np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
        self.position = np.clip(self.position + move, -1.0, 1.0).astype(np.float32)
        self.steps += 1
        reward = float(self.compute_reward(self.position, self.goal, {}))
        truncated = self.steps >= POINT_EPISODE_STEPS
        return self.observation(), reward, False, truncated, {"is_success": reward == 0.0}

    def compute_reward(
        self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any
    ) -> np.ndarray:
        """0 where ``achieved_goal`` lies within ``POINT_SUCCESS_DISTANCE`` of
        ``desired_goal`` (vectors along the last axis), -1 elsewhere."""
        distance = np.linalg.norm(achieved_goal - desired_goal, axis=-1)
        return sparse_reward(distance < POINT_SUCCESS_DISTANCE)

    def compute_terminated(
        self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any
    ) -> np.ndarray:
        """False for every goal: reaching one does not end an episode."""
        return np.zeros(np.shape(achieved_goal)[:-1], dtype=bool)

    def get_state(self) -> dict[str, Any]:
        """The episode in progress, which a checkpoint saves (:mod:`rl_app.envs.resumable`)."""
        return {"position": self.position.copy(), "goal": self.goal.copy(), "steps": self.steps}

    def set_state(self, state: dict[str, Any]) -> None:
        self.position, self.goal, self.steps = state["position"], state["goal"], state["steps"]

    def random_point(self) -> np.ndarray:
        return self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)

    def observation(self) -> ObsDict:
        return {
            "observation": self.position.copy(),
            "achieved_goal": self.position.copy(),
            "desired_goal": self.goal.copy(),
        }


def register() -> None:
    """Register the ids. Each also declares its episode length, which the envs enforce
    themselves, so that ``gym.spec(id).max_episode_steps`` tells the trainer's checks how
    long episodes last."""
    for n_bits, env_id in BIT_FLIP_IDS.items():
        gym.register(
            env_id, entry_point=BitFlippingEnv, max_episode_steps=n_bits, kwargs={"n_bits": n_bits}
        )
    gym.register(POINT_REACH_ID, entry_point=PointReachEnv, max_episode_steps=POINT_EPISODE_STEPS)


register()
