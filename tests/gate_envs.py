"""A real Gymnasium environment that waits at a gate, for tests that signal a run while it
is known to be training.

Registered as ``rl_app_test/GatedCartPole-v0`` when this module is imported. A training
copy (seeded below ``EVAL_SEED_OFFSET``) that has taken ``GATE_AFTER_STEPS`` steps waits
before each further step while the file named by ``RL_APP_TEST_GATE`` (environment
variable) exists, and creates that name with ``.reached`` appended when it first waits.
Evaluation copies wait before their first step while the file named by
``RL_APP_TEST_EVAL_GATE`` exists, and raise there if ``RL_APP_TEST_EVAL_FAULT`` is set. A
copy in a process without the variables never waits."""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from rl_app.envs import EVAL_SEED_OFFSET

GATE_VARIABLE = "RL_APP_TEST_GATE"
EVAL_GATE_VARIABLE = "RL_APP_TEST_EVAL_GATE"
EVAL_FAULT_VARIABLE = "RL_APP_TEST_EVAL_FAULT"  # set: evaluation copies raise at their first step
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
        if self.training and self.steps > GATE_AFTER_STEPS:
            wait_at(os.environ.get(GATE_VARIABLE))
        elif not self.training:
            if os.environ.get(EVAL_FAULT_VARIABLE):
                raise RuntimeError("the evaluation env broke")
            wait_at(os.environ.get(EVAL_GATE_VARIABLE))
        return super().step(action)

    # Its episode in progress, as CartPole's, so that a run stopped mid-episode resumes exactly.
    def get_state(self) -> dict:
        return {"state": np.array(self.state)}

    def set_state(self, state: dict) -> None:
        self.state = state["state"]


def wait_at(gate: str | None) -> None:
    if gate and os.path.exists(gate):
        open(f"{gate}.reached", "a").close()
        while os.path.exists(gate):
            time.sleep(0.05)


GATED_CARTPOLE = "rl_app_test/GatedCartPole-v0"
if GATED_CARTPOLE not in gym.envs.registry:
    gym.register(GATED_CARTPOLE, entry_point=GatedCartPole, max_episode_steps=500)
GATED = [f"env.name=tests.gate_envs:{GATED_CARTPOLE}"]  # the override
