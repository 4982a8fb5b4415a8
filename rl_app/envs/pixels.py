"""A pixel game small enough to learn on a CPU, which only stacks of frames can play well.

``rl_app/BallTracking-v0``: a ball slides along the top of the screen, one column per step,
bouncing off the side walls; the agent moves a paddle along the bottom (left, stay, right:
one column per step) and scores 1 for each step that ends with the paddle under the ball.
Once under it, the paddle stays there only by moving the way the ball moves, which no single
frame shows, and which a stack of frames shows only in its order: every frame of a stack is
a ball on the same row, so the frames taken as a set do not tell the newest from the
oldest. A paddle that follows where the ball is, not where it goes, stays a column behind.

It observes one ``FRAME_SIZE`` x ``FRAME_SIZE`` uint8 grayscale frame, as an Atari game does
after its preprocessing, and says so (``observes_frames``): it is learned as one is
(:func:`rl_app.envs.observes_frames`), by the Nature CNN from stacks of frames that
the replay buffer stores once.

Importing this module registers the id, so ``env.name`` takes it as
``rl_app.envs.pixels:rl_app/BallTracking-v0``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rl_app.envs import FRAME_SIZE

BALL_TRACKING_ID = "rl_app/BallTracking-v0"
COLUMNS = 7
CELL = FRAME_SIZE // COLUMNS
# The rows of cells the ball and the paddle are drawn in.
BALL_ROW = 1
PADDLE_ROW = COLUMNS - 2
EPISODE_STEPS = 30
# Actions: the paddle's move.
MOVES = (-1, 0, 1)


class BallTrackingEnv(gym.Env):
    """The paddle under a bouncing ball (the module's docstring). Each episode starts with
    the ball, its direction and the paddle drawn at random, and is truncated after
    ``EPISODE_STEPS`` steps."""

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"]}  # noqa: RUF012 (Gymnasium's attribute)
    # Learned from stacks of frames (rl_app.envs.observes_frames).
    observes_frames = True

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(
            0, 255, shape=(FRAME_SIZE, FRAME_SIZE), dtype=np.uint8
        )
        self.action_space = gym.spaces.Discrete(len(MOVES))
        self.ball, self.direction, self.paddle, self.steps = 0, 1, 0, 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.ball, self.paddle = (int(x) for x in self.np_random.integers(0, COLUMNS, 2))
        self.direction = int(self.np_random.choice((-1, 1)))
        self.steps = 0
        return self.frame(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not 0 <= self.ball + self.direction < COLUMNS:  # a wall: it bounces back
            self.direction = -self.direction
        self.ball += self.direction
        self.paddle = min(max(self.paddle + MOVES[int(action)], 0), COLUMNS - 1)
        self.steps += 1
        reward = float(self.paddle == self.ball)
        return self.frame(), reward, False, self.steps >= EPISODE_STEPS, {}

    def frame(self) -> np.ndarray:
        frame = np.zeros((FRAME_SIZE, FRAME_SIZE), dtype=np.uint8)
        for row, column in ((BALL_ROW, self.ball), (PADDLE_ROW, self.paddle)):
            frame[row * CELL : (row + 1) * CELL, column * CELL : (column + 1) * CELL] = 255
        return frame

    def render(self) -> np.ndarray:
        return np.repeat(self.frame()[..., None], 3, axis=-1)

    def get_state(self) -> dict[str, Any]:
        """The episode in progress, which a checkpoint saves (:mod:`rl_app.envs.resumable`)."""
        return {
            "ball": self.ball,
            "direction": self.direction,
            "paddle": self.paddle,
            "steps": self.steps,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.ball, self.direction = state["ball"], state["direction"]
        self.paddle, self.steps = state["paddle"], state["steps"]


gym.register(BALL_TRACKING_ID, entry_point=BallTrackingEnv, max_episode_steps=EPISODE_STEPS)
