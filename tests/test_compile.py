"""Faster updates take the same steps: the compiled loss, vmap-free Q-nets and fused Adam
(float rounding apart), CUDA graphs on a GPU; a compiled run checkpoints and resumes like any
other."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl_app.algorithms import make_algorithm
from rl_app.algorithms.base import CUDA_GRAPH_WARMUP
from rl_app.config import ConfigError, load_config
from rl_app.envs import make_env
from rl_app.logger import read_metrics
from rl_app.loop import train
from rl_app.replay import PRIORITY_KEY
from tests.helpers import TINY_RUN

# TorchRL's own settings: Q-nets under vmap (SAC), Adam's per-parameter loop.
TORCHRL_DEFAULTS = ["sac.vmap_qnets=true", "optim.fused_adam=false"]
SPEED_SETTINGS = {
    "compiled loss": ["optim.compile=true"],
    "rl_app defaults (vmap-free Q-nets, fused Adam)": [],
}


@pytest.mark.parametrize("settings", SPEED_SETTINGS.values(), ids=SPEED_SETTINGS.keys())
@pytest.mark.parametrize("preset", ["default", "dqn_cartpole"])
def test_faster_update_settings_take_the_same_steps(preset: str, settings: list[str]) -> None:
    tiny = ["network.hidden_sizes=[32,32]", "optim.batch_size=64"]
    reference_config = load_config(preset, [*tiny, *TORCHRL_DEFAULTS])
    faster_config = load_config(preset, [*tiny, *settings])
    env = make_env(reference_config.env, seed=0)
    torch.manual_seed(0)
    reference = make_algorithm(reference_config, env, torch.device("cpu"))
    torch.manual_seed(0)
    faster = make_algorithm(faster_config, env, torch.device("cpu"))
    if faster_config.optim.compile:
        assert faster.compute_losses is not faster.loss
    rollout = env.rollout(64, break_when_any_done=False).select(*reference.replay_keys())

    for step in range(3):
        reference_batch, faster_batch = rollout.clone(), rollout.clone()
        torch.manual_seed(step)
        reference_losses = reference.update(reference_batch)
        torch.manual_seed(step)
        faster_losses = faster.update(faster_batch)
        for key in reference_losses.keys():
            torch.testing.assert_close(faster_losses[key], reference_losses[key])
        torch.testing.assert_close(faster_batch[PRIORITY_KEY], reference_batch[PRIORITY_KEY])
    # Same parameters after the steps (float rounding apart): actor, critics, targets,
    # temperature.
    for (name, after_faster), after_reference in zip(
        faster.loss.named_parameters(), reference.loss.parameters(), strict=True
    ):
        torch.testing.assert_close(after_faster, after_reference, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("preset", ["default", "dqn_cartpole"])
def test_cuda_graph_updates_take_the_same_steps_as_eager_ones_on_a_gpu(preset: str) -> None:
    tiny = ["network.hidden_sizes=[32,32]", "optim.batch_size=64", "device=cuda"]
    eager_config = load_config(preset, tiny)
    graph_config = load_config(preset, [*tiny, "optim.cudagraphs=true"])
    env = make_env(eager_config.env, seed=0)
    torch.manual_seed(0)
    eager = make_algorithm(eager_config, env, torch.device("cuda"))
    torch.manual_seed(0)
    graphed = make_algorithm(graph_config, env, torch.device("cuda"))
    rollout = env.rollout(64, break_when_any_done=False).select(*eager.replay_keys()).to("cuda")
    # Past the warm-up, later steps replay the captured graph with each new batch.
    for step in range(CUDA_GRAPH_WARMUP + 3):
        batch = rollout.clone()
        batch["next", "reward"] += step  # a new batch each step, same shapes
        eager_batch, graph_batch = batch.clone(), batch.clone()
        torch.manual_seed(step)
        eager_losses = eager.update(eager_batch)
        torch.manual_seed(step)
        graph_losses = graphed.update(graph_batch)
        for key in eager_losses.keys():
            torch.testing.assert_close(graph_losses[key], eager_losses[key])
        torch.testing.assert_close(graph_batch[PRIORITY_KEY], eager_batch[PRIORITY_KEY])
    for (name, after_graph), after_eager in zip(
        graphed.loss.named_parameters(), eager.loss.parameters(), strict=True
    ):
        torch.testing.assert_close(after_graph, after_eager, msg=name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_cuda_graphs_without_a_gpu_are_refused_before_anything_starts(
    device: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"optim\.cudagraphs=true needs a CUDA learner"):
        load_config("default", [f"device={device}", "optim.cudagraphs=true", f"run_dir={tmp_path}"])
    assert list(tmp_path.iterdir()) == []


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
