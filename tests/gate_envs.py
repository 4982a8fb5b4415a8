"""A real Gymnasium environment that waits at a gate, for tests that signal a run while it
is known to be training.

Registered as ``rl_app_test/GatedCartPole-v0`` when this module is imported. A training
copy (seeded below ``EVAL_SEED_OFFSET``) that has taken ``GATE_AFTER_STEPS`` steps waits
before each further step while the file named by ``RL_APP_TEST_GATE`` (environment
variable) exists; evaluation copies, and every copy in a process without the variable,
never wait."""

from __future__ import annotations

import os
import time

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from rl_app.envs import EVAL_SEED_OFFSET

GATE_VARIABLE = "RL_APP_TEST_GATE"
# With TINY_RUN (200 frames an iteration, an evaluation and a checkpoint every 400): a run
# waits in the middle of its fourth iteration (frames 601-800), after its first checkpoint.
GATE_AFTER_STEPS = 700


class GatedCartPole(CartPoleEnv):
    """CartPole whose training copies wait at the gate after ``GATE_AFTER_STEPS`` steps."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.training = False
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:  # the seeding reset tells a training copy apart
            self.training = seed < EVAL_SEED_OFFSET
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        gate = os.environ.get(GATE_VARIABLE)
        if gate and self.training and self.steps > GATE_AFTER_STEPS:
            while os.path.exists(gate):
                time.sleep(0.05)
        return super().step(action)


GATED_CARTPOLE = "rl_app_test/GatedCartPole-v0"
if GATED_CARTPOLE not in gym.envs.registry:
    gym.register(GATED_CARTPOLE, entry_point=GatedCartPole, max_episode_steps=500)
GATED = [f"env.name=tests.gate_envs:{GATED_CARTPOLE}"]  # the override
