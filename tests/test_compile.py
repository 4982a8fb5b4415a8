"""Faster updates take the same steps: the compiled loss, vmap-free Q-nets and fused Adam
(float rounding apart), CUDA graphs on a GPU; a tensor off the learner's device is named
before a capture; a compiled run checkpoints and resumes like any other."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from rl_app.algorithms import make_algorithm
from rl_app.algorithms.base import CUDA_GRAPH_WARMUP, LearnerDeviceError, accelerate
from rl_app.checks import load_config
from rl_app.config import ConfigError
from rl_app.envs import make_env
from rl_app.logger import read_metrics
from rl_app.run import train
from tests.helpers import TINY_RUN

# TorchRL's own settings: Q-nets under vmap (SAC), Adam's per-parameter loop, eager loss.
TORCHRL_DEFAULTS = ["sac.vmap_qnets=true", "optim.fused_adam=false", "optim.compile=false"]
SPEED_SETTINGS = {
    "compiled loss": ["optim.compile=true"],
    "vmap-free Q-nets, fused Adam": ["optim.compile=false"],
}


def assert_same_steps(
    preset: str, reference: list[str], other: list[str], device: str, steps: int
) -> None:
    """Two algorithms of ``preset``, built alike but for their settings, take ``steps``
    updates on the same batches (a new one each step) with the same random numbers: same
    losses and priorities at every step, same parameters after (float rounding apart):
    actor, critics, targets, temperature."""
    tiny = ["network.hidden_sizes=[32,32]", "optim.batch_size=64", f"device={device}"]
    configs = [load_config(preset, [*tiny, *settings]) for settings in (reference, other)]
    # Dynamo stops compiling a function after 8 compiles in a process, then runs it eagerly.
    torch.compiler.reset()
    env = make_env(configs[0].env, seed=0)
    algorithms = []
    for config in configs:
        torch.manual_seed(0)
        algorithms.append(make_algorithm(config, env, torch.device(device)))
    rollout = env.rollout(64, break_when_any_done=False).select(*algorithms[0].replay_keys())
    for step in range(steps):
        batch = rollout.to(device)
        batch["next", "reward"] += step  # a new batch each step, same shapes
        batches = [batch.clone(), batch.clone()]
        losses = []
        for algorithm, copy in zip(algorithms, batches, strict=True):
            torch.manual_seed(step)
            losses.append(algorithm.update(copy))
        for key in losses[0].keys():  # the TD errors (priorities) too
            torch.testing.assert_close(losses[1][key], losses[0][key])
    for (name, after_other), after_reference in zip(
        algorithms[1].loss.named_parameters(), algorithms[0].loss.parameters(), strict=True
    ):
        torch.testing.assert_close(after_other, after_reference, msg=name)


@pytest.mark.parametrize("settings", SPEED_SETTINGS.values(), ids=SPEED_SETTINGS.keys())
@pytest.mark.parametrize("preset", ["default", "dqn_cartpole"])
def test_faster_update_settings_take_the_same_steps(preset: str, settings: list[str]) -> None:
    assert_same_steps(preset, TORCHRL_DEFAULTS, settings, "cpu", steps=3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("preset", ["default", "dqn_cartpole"])
def test_cuda_graph_updates_take_the_same_steps_as_eager_ones_on_a_gpu(preset: str) -> None:
    # Past the warm-up, later steps replay the captured graph with each new batch.
    assert_same_steps(preset, [], ["optim.cudagraphs=true"], "cuda", CUDA_GRAPH_WARMUP + 3)


@pytest.mark.parametrize("preset", ["default", "dqn_cartpole", "td3_pendulum"])
def test_a_tensor_off_the_learners_device_is_named_before_a_capture(
    preset: str, tmp_path: Path
) -> None:
    """A batch key, a buffer of the loss and an optimizer state on another device (``meta``
    here, the CPU where the learner is a GPU) are each named, before the step runs."""
    config = load_config(
        preset, ["network.hidden_sizes=[32,32]", "optim.compile=false", f"run_dir={tmp_path}"]
    )
    env = make_env(config.env, seed=0)
    algorithm = make_algorithm(config, env, torch.device("cpu"))
    batch = env.rollout(16, break_when_any_done=False).select(*algorithm.replay_keys())
    algorithm.update(batch.clone())  # the optimizer makes its state
    algorithm.check_device(batch)  # everything on the learner's device: no error
    batch.clear_device_()["stray"] = torch.zeros(16, device="meta")
    algorithm.loss.register_buffer("stray_buffer", torch.zeros(1, device="meta"))
    stepped = next(iter(algorithm.optimizer.state))  # a parameter the update stepped
    algorithm.optimizer.state[stepped]["exp_avg"] = torch.zeros(1, device="meta")
    parameters = [p for group in algorithm.optimizer.param_groups for p in group["params"]]
    index = next(i for i, parameter in enumerate(parameters) if parameter is stepped)
    steps = []
    # CUDA graphs on: without CUDA, CudaGraphModule calls the step as it is.
    cudagraphs = dataclasses.replace(config.optim, cudagraphs=True)
    step = accelerate(steps.append, cudagraphs, algorithm.check_device)
    with pytest.raises(LearnerDeviceError) as error:
        step(batch)
    assert str(error.value) == (
        "the update reads tensors that are not on the learner's device cpu: "
        "batch['stray'] (meta), loss.stray_buffer (meta), "
        f"optimizer state 'exp_avg' of parameter {index} (meta)"
    )
    assert steps == []


# A short run through train(): updates from the first batch on, one evaluation at the end.
GPU_PIPELINE = [
    "device=cuda", "optim.compile=true", "optim.cudagraphs=true",
    "collector.frames_per_batch=200", "collector.init_random_frames=200",
    "collector.total_frames=600", "optim.utd_ratio=0.25", "eval.interval_frames=600",
    "eval.episodes=1", "replay.capacity=5000", "logger.backend=none",
]  # fmt: skip


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize(
    "preset", ["default", "dqn_cartpole", "td3_pendulum", "sac_halfcheetah", "dqn_atari100k"]
)
def test_compile_and_cuda_graphs_train_each_preset_through_train_on_a_gpu(
    preset: str, tmp_path: Path
) -> None:
    """Past the warm-up and the capture, every tensor the step reads was on the GPU, and
    the run ends with finite metrics."""
    result = train(load_config(preset, [*GPU_PIPELINE, f"run_dir={tmp_path / 'run'}"]))
    assert result.frames == 600 and result.updates > CUDA_GRAPH_WARMUP + 1
    rows = read_metrics(tmp_path / "run")
    assert all(torch.isfinite(torch.tensor(value)) for row in rows for value in row.values())


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
