"""``optim.compile``: the compiled loss takes the same update steps as the eager one, and a
compiled run checkpoints and resumes like any other."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl_app.algorithms import make_algorithm
from rl_app.config import load_config
from rl_app.envs import make_env
from rl_app.logger import read_metrics
from rl_app.loop import train
from rl_app.replay import PRIORITY_KEY
from tests.helpers import TINY_RUN


@pytest.mark.parametrize("preset", ["default", "dqn_cartpole"])
def test_compiled_updates_take_the_same_steps_as_eager_ones(preset: str) -> None:
    eager_config = load_config(preset, ["network.hidden_sizes=[32,32]", "optim.batch_size=64"])
    compiled_config = load_config(
        preset, ["network.hidden_sizes=[32,32]", "optim.batch_size=64", "optim.compile=true"]
    )
    env = make_env(eager_config.env, seed=0)
    torch.manual_seed(0)
    eager = make_algorithm(eager_config, env, torch.device("cpu"))
    torch.manual_seed(0)
    compiled = make_algorithm(compiled_config, env, torch.device("cpu"))
    assert compiled.compute_losses is not compiled.loss
    rollout = env.rollout(64, break_when_any_done=False).select(*eager.replay_keys())

    for step in range(3):
        eager_batch, compiled_batch = rollout.clone(), rollout.clone()
        torch.manual_seed(step)
        eager_losses = eager.update(eager_batch)
        torch.manual_seed(step)
        compiled_losses = compiled.update(compiled_batch)
        for key in eager_losses.keys():
            torch.testing.assert_close(compiled_losses[key], eager_losses[key])
        torch.testing.assert_close(compiled_batch[PRIORITY_KEY], eager_batch[PRIORITY_KEY])
    # Same parameters after the steps: actor, critics, targets, temperature.
    for (name, after_compiled), after_eager in zip(
        compiled.loss.named_parameters(), eager.loss.parameters(), strict=True
    ):
        torch.testing.assert_close(after_compiled, after_eager, msg=name)


def test_a_compiled_run_resumes_without_compiling(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(load_config("default", [*TINY_RUN, f"run_dir={run_dir}", "optim.compile=true"]))
    # optim.compile may change on resume: checkpoints hold the loss module, never its
    # compiled wrapper.
    train(
        load_config(
            "default", [f"run_dir={run_dir}", "collector.total_frames=1600", "optim.compile=false"]
        )
    )
    rows = read_metrics(run_dir)
    assert [row["frames"] for row in rows] == list(range(200, 1601, 200))
    assert all(torch.isfinite(torch.tensor(row["train/loss_qvalue"])) for row in rows[2:])
