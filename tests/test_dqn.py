"""DQN slots into the same pipeline: it resumes with its exploration schedule, and the
training loop knows nothing about it (its learning check is in test_learning.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rl_app.algorithms import make_algorithm
from rl_app.checks import load_config
from rl_app.config import DQNConfig
from rl_app.envs import make_env
from rl_app.logger import read_metrics
from rl_app.run import build_run, train

TINY_DQN = [
    "network.hidden_sizes=[32,32]",
    "collector.frames_per_batch=200",
    "collector.init_random_frames=400",
    "optim.batch_size=64",
    "optim.utd_ratio=0.1",
    "replay.capacity=5000",
    "dqn.eps_annealing_frames=2000",
    "eval.interval_frames=400",
    "eval.episodes=2",
    "logger.backend=none",
]


def scheduled_epsilon(dqn: DQNConfig, frames: int) -> float:
    """Linear annealing from ``eps_start`` to ``eps_end`` over ``eps_annealing_frames``."""
    progress = min(1.0, frames / dqn.eps_annealing_frames)
    return dqn.eps_start + progress * (dqn.eps_end - dqn.eps_start)


def test_resumed_dqn_continues_epsilon_where_it_stopped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = load_config(
        "dqn_cartpole", [*TINY_DQN, "collector.total_frames=800", f"run_dir={run_dir}"]
    )
    train(config)
    resumed_config = load_config(
        "dqn_cartpole", [f"run_dir={run_dir}", "collector.total_frames=1600"]
    )
    run = build_run(resumed_config, resuming=True)
    try:
        run.checkpoints.load(run.checkpoints.latest())
        # Restored from the checkpoint, not the schedule's start.
        assert run.algorithm.exploration.eps.item() == pytest.approx(
            scheduled_epsilon(config.dqn, 800), abs=1e-5
        )
        assert run.algorithm.exploration.eps.item() < config.dqn.eps_start
    finally:
        run.close()

    train(resumed_config)
    rows = read_metrics(run_dir)
    assert [row["frames"] for row in rows] == list(range(200, 1601, 200))
    # Updates (which log epsilon: the value the next batch is collected with) start at
    # 400 frames; the logged values follow the schedule across the resume.
    for row in rows[1:]:
        expected = scheduled_epsilon(config.dqn, row["frames"])
        assert row["train/epsilon"] == pytest.approx(expected, abs=1e-5)


def test_greedy_evaluation_ignores_exploration(tmp_path: Path) -> None:
    config = load_config("dqn_cartpole", [*TINY_DQN, f"run_dir={tmp_path / 'run'}"])
    run = build_run(config)
    try:
        policy = run.algorithm.policy
        run.algorithm.exploration.step(0)  # epsilon 1: every collected action is random
        observation = torch.randn(512, 4)
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            greedy = policy(TensorDict({"observation": observation}, [512]))
        with set_exploration_type(ExplorationType.RANDOM):
            explored = policy(TensorDict({"observation": observation}, [512]))
        best = greedy["action_value"].argmax(-1)
        assert torch.equal(greedy["action"].argmax(-1), best)
        assert (explored["action"].argmax(-1) != best).float().mean() > 0.3
    finally:
        run.close()


@pytest.mark.parametrize("max_grad_norm", [0.0, 0.01])
def test_the_gradient_norm_is_clipped_to_max_grad_norm(max_grad_norm: float) -> None:
    config = load_config(
        "dqn_cartpole",
        [*TINY_DQN, f"dqn.max_grad_norm={max_grad_norm}", "optim.target=td0", "dqn.loss=l2"],
    )
    env = make_env(config.env, seed=0)
    algorithm = make_algorithm(config, env, torch.device("cpu"))
    batch = env.rollout(64, break_when_any_done=False).select(*algorithm.replay_keys())
    batch["next", "reward"] *= 100.0  # targets far from the fresh Q-values: large gradients
    algorithm.update(batch)
    # The step's gradients stay on the parameters until the next update clears them.
    norm = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in algorithm.loss.parameters() if p.grad is not None])
    )
    if max_grad_norm:
        assert norm <= max_grad_norm * (1 + 1e-4)
    else:
        assert norm > 1.0  # unclipped, the same batch's gradient is far larger


def test_annealed_learning_rate_falls_linearly_to_zero_and_resumes_on_schedule(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    settings = [*TINY_DQN, "optim.anneal_lr=true", "optim.lr=1e-3", f"run_dir={run_dir}"]
    train(load_config("dqn_cartpole", [*settings, "collector.total_frames=800"]))
    # Resumed with a longer budget, the schedule is stretched to the new last frame.
    train(load_config("dqn_cartpole", [*settings, "collector.total_frames=1200"]))
    rows = read_metrics(run_dir)
    lr = {row["frames"]: row["train/lr"] for row in rows}
    assert lr[200] == pytest.approx(1e-3 * (1 - 200 / 800))
    assert lr[800] == 0.0
    assert lr[1000] == pytest.approx(1e-3 * (1 - 1000 / 1200))
    assert lr[1200] == 0.0
