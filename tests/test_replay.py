"""Replay: prioritized slices are whole, contiguous pieces of one trajectory; priorities
change what is sampled; and learning targets bootstrap through `terminated` only."""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
import torchrl.data.replay_buffers.her
import torchrl.modules.tensordict_module.rnn
from tensordict import TensorDict

from rl_app.algorithms import make_algorithm
from rl_app.config import ReplayConfig
from rl_app.envs import make_env
from rl_app.logger import read_metrics
from rl_app.replay import (
    PRIORITY_KEY,
    TRAJECTORY_KEY,
    RunReplayBuffer,
    frames,
    hindsight,
    make_replay_buffer,
    recurrent,
    sequences,
    write_priorities,
)
from rl_app.run import train
from tests.helpers import random_play, strip_wall_time

SLICE_LEN = 4
NUM_SLICES = 16


@pytest.fixture(scope="module")
def cartpole_play() -> TensorDict:
    # CartPole under random actions ends episodes after 10-40 steps: many short trajectories.
    return random_play("CartPole-v1", 2_000)


def filled_buffer(play: TensorDict, sampler: str, directory: Path):
    replay = ReplayConfig(capacity=4_096, sampler=sampler, slice_len=SLICE_LEN, alpha=1.0)
    buffer = make_replay_buffer(replay, directory, seed=0)
    buffer.extend(play)
    return buffer


def test_one_sampler_call_draws_an_iteration_of_batches_in_time_order(
    cartpole_play: TensorDict, tmp_path: Path
) -> None:
    buffer = filled_buffer(cartpole_play, "prioritized_slice", tmp_path)
    batches = buffer.sample_batches(SLICE_LEN * NUM_SLICES, 5)
    assert [batch.shape for batch in batches] == [torch.Size([NUM_SLICES, SLICE_LEN])] * 5
    for batch in batches:
        traj_ids = batch[TRAJECTORY_KEY]
        assert (traj_ids == traj_ids[:, :1]).all()
        assert (batch["step_count"].squeeze(-1).diff(dim=1) == 1).all()
        assert batch["priority_weight"].shape == batch.shape  # weights per step, per slice
    starts = torch.stack([batch["index"].reshape(batch.shape)[:, 0] for batch in batches])
    assert starts.unique().numel() > NUM_SLICES  # five draws, not one repeated


@pytest.mark.parametrize("sampler", ["prioritized_slice", "slice"])
def test_slices_are_contiguous_and_never_cross_a_trajectory(
    cartpole_play: TensorDict, sampler: str, tmp_path: Path
) -> None:
    buffer = filled_buffer(cartpole_play, sampler, tmp_path)
    for _ in range(50):
        slices = buffer.sample(SLICE_LEN * NUM_SLICES).reshape(NUM_SLICES, SLICE_LEN)
        traj_ids = slices[TRAJECTORY_KEY]
        assert (traj_ids == traj_ids[:, :1]).all(), "a slice mixes trajectories"
        steps = slices["step_count"].squeeze(-1)
        assert (steps.diff(dim=1) == 1).all(), "a slice skips or repeats steps"
        # Each step's next observation is the following step's observation.
        assert torch.equal(slices["next", "observation"][:, :-1], slices["observation"][:, 1:])


def test_raising_a_trajectory_priority_makes_it_sampled_more(
    cartpole_play: TensorDict, tmp_path: Path
) -> None:
    buffer = filled_buffer(cartpole_play, "prioritized_slice", tmp_path)
    traj_ids = buffer[:][TRAJECTORY_KEY]
    long_enough = [int(t) for t in traj_ids.unique() if (traj_ids == t).sum() >= SLICE_LEN]
    favourite = long_enough[len(long_enough) // 2]

    def share_of_favourite(draws: int = 200) -> float:
        hits = sum(
            (buffer.sample(SLICE_LEN * NUM_SLICES)[TRAJECTORY_KEY] == favourite).float().mean()
            for _ in range(draws)
        )
        return float(hits) / draws

    before = share_of_favourite()
    in_favourite = (traj_ids == favourite).nonzero().squeeze(-1)
    buffer.update_priority(in_favourite, torch.full((len(in_favourite),), 100.0))
    after = share_of_favourite()
    # ~100 trajectories share the buffer; one of them now weighs as much as dozens of others.
    assert before < 0.05
    assert after > 0.3 and after > 20 * before, f"share went from {before:.3f} to {after:.3f}"


@pytest.mark.parametrize("sampler", ["prioritized_slice", "slice", "prioritized", "uniform"])
def test_each_sampler_trains_one_step_and_takes_priorities(
    sampler: str, tmp_path: Path, tiny_config
) -> None:
    config = tiny_config(f"replay.sampler={sampler}")
    env = make_env(config.env, config.seed)
    algorithm = make_algorithm(config, env, torch.device("cpu"))
    buffer = make_replay_buffer(config.replay, tmp_path / "replay", 0)
    buffer.extend(random_play(config.env.name, 600))
    sample = buffer.sample_batches(config.optim.batch_size, 1)[0]
    algorithm.update(sample)
    slices = config.optim.batch_size // config.replay.slice_len
    steps = (slices, config.replay.slice_len) if sampler.endswith("slice") else (64,)
    assert sample[PRIORITY_KEY].shape == steps
    assert write_priorities(buffer, sample) == 0  # raises if the sampler rejects priorities


@pytest.mark.parametrize("target", ["td0", "nstep", "td_lambda"])
def test_bootstrapping_uses_terminated_not_the_slice_end_done(
    target: str, tmp_path: Path, tiny_config
) -> None:
    config = tiny_config(f"optim.target={target}")
    env = make_env(config.env, config.seed)
    algorithm = make_algorithm(config, env, torch.device("cpu"))
    buffer = make_replay_buffer(config.replay, tmp_path / "replay", 0)
    buffer.extend(random_play(config.env.name, 600))
    sample = buffer.sample_batches(config.optim.batch_size, 1)[0]
    # The slice sampler marks every slice end done, and time limits end slices too;
    # Pendulum never terminates. A done that is not a termination cuts a multi-step chain
    # and bootstraps, as the last step of a slice always does.
    assert sample["next", "done"][:, -1].all()
    assert not sample["next", "terminated"].any()

    def td_error(batch: TensorDict) -> torch.Tensor:
        torch.manual_seed(0)  # same actor samples for every variant
        with torch.no_grad():
            algorithm.loss(batch)
        return batch[PRIORITY_KEY]

    no_slice_ends = sample.clone()
    no_slice_ends["next", "done"] = no_slice_ends["next", "terminated"].clone()
    assert torch.allclose(td_error(sample.clone()), td_error(no_slice_ends))

    terminal = sample.clone()
    terminal["next", "terminated"] = torch.ones_like(terminal["next", "terminated"])
    assert not torch.allclose(td_error(sample.clone()), td_error(terminal))


# The code of the replay features, and TorchRL's relabelling beneath one of them: a
# default run asks for none of them (SAC, prioritized slices, an MLP, no goals).
FEATURE_FILES = {
    module.__file__
    for module in (frames, hindsight, recurrent, sequences, torchrl.data.replay_buffers.her)
}


def test_a_default_run_passes_through_no_replay_feature(tiny_config) -> None:
    config = tiny_config()
    env = make_env(config.env, config.seed)
    keys = make_algorithm(config, env, torch.device("cpu")).replay_keys()
    buffer = make_replay_buffer(config.replay, Path(config.run_dir) / "made", 0, env, keys=keys)
    assert type(buffer) is RunReplayBuffer
    assert buffer.refresh is None and len(buffer.transform) == 0

    called: set[tuple[str, str]] = set()

    def record(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            called.add((frame.f_code.co_filename, frame.f_code.co_qualname))

    sys.setprofile(record)  # every Python function the run calls in this thread
    try:
        result = train(config)
    finally:
        sys.setprofile(None)
    assert result.updates > 0  # it sampled, updated and wrote back
    files = {file for file, _ in called}
    assert str(Path(make_replay_buffer.__code__.co_filename).parent / "buffer.py") in files
    assert not files & FEATURE_FILES
    # TorchRL's losses enter its recurrent mode on every call: no LSTM runs in it.
    lstm = torchrl.modules.tensordict_module.rnn.__file__
    assert not {name for file, name in called if file == lstm and "LSTM" in name}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_prioritized_slices_in_gpu_memory_train_and_resume_exactly_on_a_gpu(
    tiny_config, tmp_path: Path
) -> None:
    """Storage on the GPU, priority trees on the CPU (only indices and priorities cross):
    a run stopped at 800 frames and resumed logs what the run trained at once logs."""
    gpu = ["device=cuda", "replay.device=cuda", "replay.sampler=prioritized_slice"]
    train(tiny_config(*gpu, run_dir=tmp_path / "alone"))
    train(tiny_config(*gpu, "collector.total_frames=800", run_dir=tmp_path / "resumed"))
    train(tiny_config(*gpu, run_dir=tmp_path / "resumed"))
    alone, resumed = (read_metrics(tmp_path / name) for name in ("alone", "resumed"))
    assert [strip_wall_time(row) for row in resumed] == [strip_wall_time(row) for row in alone]
    assert [row["frames"] for row in alone] == [200, 400, 600, 800, 1000, 1200]
