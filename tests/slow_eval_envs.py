"""A real Gymnasium environment whose evaluation copies are slow, for the tests of stops
during a long evaluation.

Registered as ``rl_app_test/SlowEvalPendulum-v0`` when this module is imported. A copy
seeded as evaluation envs are (``seed + EVAL_SEED_OFFSET``) sleeps
``RL_APP_TEST_EVAL_STEP_S`` seconds (environment variable; 0 if unset) in each step;
training envs never do. With ``RL_APP_TEST_USR2_AT_EVAL_STEP=N``, the N-th step of an
evaluation copy in this process sends the process SIGUSR2 (a stop at a known point of an
evaluation). With ``RL_APP_TEST_SLOW_IN_FIRST_ATTEMPT_ONLY`` set, a requeued SLURM job's
attempts (``SLURM_RESTART_COUNT`` 1 or more) are not slowed: they only pay what a stop owed."""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
from gymnasium.envs.classic_control.pendulum import PendulumEnv

from rl_app.envs import EVAL_SEED_OFFSET

STEP_SECONDS_VARIABLE = "RL_APP_TEST_EVAL_STEP_S"
USR2_AT_STEP_VARIABLE = "RL_APP_TEST_USR2_AT_EVAL_STEP"
FIRST_ATTEMPT_ONLY_VARIABLE = "RL_APP_TEST_SLOW_IN_FIRST_ATTEMPT_ONLY"
# With TINY_RUN's evaluations of 2 episodes of 200 steps: 20 s each, where one training
# iteration takes well under a second.
SLOW_STEP_S = "0.05"


class SlowEvalPendulum(PendulumEnv):
    """Pendulum, slow in every step of a copy seeded for evaluation."""

    evaluation_steps = 0  # by every evaluation copy in this process

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.step_seconds = 0.0
        self.evaluating = False

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:  # the seeding reset tells an evaluation copy apart
            self.evaluating = seed >= EVAL_SEED_OFFSET
            self.step_seconds = float(os.environ.get(STEP_SECONDS_VARIABLE, 0)) * self.evaluating
            if os.environ.get(FIRST_ATTEMPT_ONLY_VARIABLE) and requeued():
                self.step_seconds = 0.0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        time.sleep(self.step_seconds)
        if self.evaluating:
            SlowEvalPendulum.evaluation_steps += 1
            if str(SlowEvalPendulum.evaluation_steps) == os.environ.get(USR2_AT_STEP_VARIABLE):
                os.kill(os.getpid(), signal.SIGUSR2)
        return super().step(action)


def requeued() -> bool:
    return int(os.environ.get("SLURM_RESTART_COUNT", 0)) > 0


SLOW_EVAL_PENDULUM = "rl_app_test/SlowEvalPendulum-v0"
if SLOW_EVAL_PENDULUM not in gym.envs.registry:
    gym.register(SLOW_EVAL_PENDULUM, entry_point=SlowEvalPendulum, max_episode_steps=200)
SLOW_EVAL = [f"env.name=tests.slow_eval_envs:{SLOW_EVAL_PENDULUM}"]  # the override
