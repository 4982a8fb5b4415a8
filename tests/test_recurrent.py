"""Recurrent DQN on replayed sequences: every stored frame carries the state it acted with,
burn-in and padding never reach the loss, refreshed states go only into records still in
the buffer, and sequence priorities follow the documented rule."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.modules import set_recurrent_mode

from rl_app.algorithms import make_algorithm
from rl_app.config import ConfigError, EnvConfig
from rl_app.envs import RECURRENT_STATE_KEYS, make_env, observation_statistics
from rl_app.logger import read_metrics
from rl_app.replay import (
    LOSS_MASK_KEY,
    PRIORITY_KEY,
    SLICE_PRIORITY_ETA,
    TRAJECTORY_KEY,
    make_replay_buffer,
    write_priorities,
)
from rl_app.replay.recurrent import recurrent_state_drift, write_recurrent_states
from rl_app.run import train
from tests.test_targets import stored_priorities

PRESET = "rdqn_cartpole_masked"
# Small and quick, with windows long enough to reach past CartPole's short random episodes.
TINY_RECURRENT = [
    "network.hidden_sizes=[16]",
    "network.lstm_size=8",
    "replay.slice_len=6",
    "replay.burn_in=4",
    "optim.batch_size=48",
    "replay.alpha=1.0",
]


@pytest.fixture
def recurrent(tiny_config):
    """``recurrent(*overrides)``: the masked-CartPole preset made tiny, its algorithm, and a
    buffer (capacity 4096, or ``replay.capacity=``) holding 1,000 frames it collected."""

    def make(*overrides: str):
        config = tiny_config(*TINY_RECURRENT, "replay.capacity=4096", *overrides, preset=PRESET)
        env = make_env(config.env, config.seed, network=config.network)
        algorithm = make_algorithm(config, env, torch.device("cpu"))
        collector = Collector(env, algorithm.policy, frames_per_batch=1_000, total_frames=1_000)
        play = next(iter(collector))
        collector.shutdown()
        buffer = make_replay_buffer(config.replay, Path(config.run_dir) / "replay", 0)
        buffer.extend(play.select(*algorithm.replay_keys(), TRAJECTORY_KEY))
        return config, algorithm, play, buffer

    return make


def test_the_masked_env_observes_positions_normalized_alike_in_every_env(tiny_config) -> None:
    config = tiny_config(preset=PRESET)
    assert config.env.observation_indices == [0, 2] and config.env.normalize_observations
    observation_statistics.cache_clear()
    envs = [
        make_env(config.env, 1),
        make_env(config.env, 2, network=config.network),
        make_env(dataclasses.replace(config.env, num_envs=3), 3),
    ]
    norms = [env.transform[-1] for env in envs]
    # Random play ran once, for the first env: the others reused its statistics.
    assert observation_statistics.cache_info().misses == 1
    for norm in norms[1:]:
        assert torch.equal(norm.loc, norms[0].loc) and torch.equal(norm.scale, norms[0].scale)
    # Undone, the normalization gives back CartPole's cart position and pole angle.
    observation = envs[0].reset()["observation"]
    whole = make_env(EnvConfig(name="CartPole-v1"), 1).reset()["observation"]
    assert torch.allclose(observation * norms[0].scale + norms[0].loc, whole[[0, 2]])
    played = envs[0].rollout(300)["observation"]
    assert 0.2 < played.std(0).min() and played.std(0).max() < 5  # near unit scale


def test_each_stored_frame_holds_the_state_its_action_was_taken_with(recurrent) -> None:
    config, algorithm, play, _ = recurrent()
    assert (play["observation"].shape[-1], play["is_init"].sum() > 5) == (2, True)
    actor = algorithm.policy[0]
    state = TensorDict(
        {key: torch.zeros(1, config.network.lstm_size) for key in RECURRENT_STATE_KEYS}
    )
    with torch.no_grad():
        for frame in play.unbind(0):
            if frame["is_init"]:
                state = state.apply(torch.zeros_like)
            for key in RECURRENT_STATE_KEYS:
                assert torch.equal(frame[key], state[key])
            replayed = actor(frame.select("observation", "is_init").update(state))
            # The Q-values the action was chosen from, from the replayed state.
            assert torch.allclose(replayed["action_value"], frame["action_value"])
            state = replayed["next"].select(*RECURRENT_STATE_KEYS)


def test_the_loss_unrolls_states_and_next_states_as_they_were_acted_with(recurrent) -> None:
    config, algorithm, play, _ = recurrent("optim.target=td0")
    buffer = make_replay_buffer(config.replay, Path(config.run_dir) / "replay-q", 0)
    buffer.extend(play.select(*algorithm.replay_keys(), TRAJECTORY_KEY, "action_value"))
    batch = buffer.sample_batches(240, 1)[0]
    acted = batch.pop("action_value")  # the Q-values each frame's action was chosen from
    valid = batch["validity_mask"]
    with set_recurrent_mode(True), torch.no_grad():
        unrolled = algorithm.loss.value_network(batch.clone())["action_value"]
    assert torch.allclose(unrolled[valid], acted[valid], atol=1e-5)

    # The TD target of step t bootstraps from the Q-values acted with at step t + 1 (the
    # target network is still a copy): the next states unroll from the stored next state.
    algorithm.update(batch)  # writes the squared TD errors, computed before the step
    action = batch["action"].argmax(-1, keepdim=True)
    predicted = acted.gather(-1, action).squeeze(-1)
    reward = batch["next", "reward"].squeeze(-1)
    target = reward[:, :-1] + config.optim.gamma * acted[:, 1:].amax(-1)
    following = valid[:, :-1] & valid[:, 1:] & ~batch["next", "done"].squeeze(-1)[:, :-1]
    assert following.sum() > 50
    td_error = batch[PRIORITY_KEY].reshape(batch.shape)[:, :-1]
    expected = (predicted[:, :-1] - target) ** 2
    assert torch.allclose(td_error[following], expected[following], rtol=1e-4, atol=1e-5)


def loss_and_grads(algorithm, batch: TensorDict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    algorithm.optimizer.zero_grad()
    with set_recurrent_mode(True):
        loss = algorithm.loss(batch.clone())["loss"]
    loss.backward()
    return loss.detach(), [
        p.grad.clone() for p in algorithm.loss.parameters() if p.grad is not None
    ]


def test_burn_in_and_padded_steps_do_not_reach_the_loss(recurrent) -> None:
    config, algorithm, _, buffer = recurrent()
    batch = buffer.sample_batches(config.optim.batch_size, 1)[0]
    window = config.replay.burn_in + config.replay.slice_len
    assert batch.shape == (config.optim.batch_size // config.replay.slice_len, window)
    learning, valid = batch["learning_mask"], batch["validity_mask"]
    assert (learning == (torch.arange(window) >= config.replay.burn_in)).all()
    assert (~valid).any(), "no window reached past an episode end or start"
    assert (batch[LOSS_MASK_KEY] == (learning & valid)).all()

    loss, grads = loss_and_grads(algorithm, batch)
    perturbed = batch.clone()
    perturbed["next", "reward"][~batch[LOSS_MASK_KEY]] += 100.0  # burn-in and padding
    perturbed_loss, perturbed_grads = loss_and_grads(algorithm, perturbed)
    assert torch.allclose(loss, perturbed_loss)
    for grad, perturbed_grad in zip(grads, perturbed_grads, strict=True):
        assert torch.allclose(grad, perturbed_grad)
    # A learning step's reward does reach it.
    perturbed["next", "reward"][batch[LOSS_MASK_KEY]] += 1.0
    assert not torch.allclose(loss, loss_and_grads(algorithm, perturbed)[0])


def test_a_window_restarts_its_recurrence_at_its_first_valid_record(recurrent) -> None:
    _, _, _, buffer = recurrent()
    batch = buffer.sample_batches(240, 1)[0]
    valid = batch["validity_mask"]
    before_start = ~valid[:, 0]  # burn-in reached back past the episode start
    assert before_start.any()
    first = valid.int().argmax(dim=1)
    rows = torch.arange(batch.shape[0])
    assert batch["is_init"][rows, first].all() and batch["next", "is_init"][rows, first].all()
    # The last valid record ends the multi-step chain.
    last = batch.shape[1] - 1 - valid.flip(1).int().argmax(dim=1)
    assert batch["next", "done"][rows, last].all()


def test_refreshed_states_go_only_into_records_still_in_the_buffer(recurrent) -> None:
    _, algorithm, play, buffer = recurrent("replay.capacity=1200")
    sequences = buffer.sample_batches(480, 1)[0]
    # Make the learner's weights differ from those the states were collected with.
    with torch.no_grad():
        for parameter in algorithm.policy.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    states = algorithm.recurrent_states(sequences)
    assert recurrent_state_drift(sequences, states) > 1e-3

    # Slots 1000-1199, then the ring wraps: slots 0-199 now hold other records.
    buffer.extend(play[:400].select(*algorithm.replay_keys(), TRAJECTORY_KEY))
    valid = sequences["validity_mask"]
    index = sequences["index"].reshape(sequences.shape)[valid]
    overwritten = index < 200
    assert overwritten.any() and (~overwritten).any()
    stored_before = buffer[index]["recurrent_state_h"].clone()

    written = write_recurrent_states(buffer, sequences, states)
    stored_after = buffer[index]["recurrent_state_h"]
    recomputed = states["recurrent_state_h"][valid]
    assert written == int((~overwritten).sum())
    assert torch.equal(stored_after[overwritten], stored_before[overwritten])
    # A record in two windows takes the state of the last one: compare the others.
    once = ~overwritten & ((index.unsqueeze(0) == index.unsqueeze(1)).sum(0) == 1)
    assert once.any()
    assert torch.allclose(stored_after[once], recomputed[once])
    assert not torch.allclose(stored_before[once], recomputed[once])


def test_sequence_priorities_follow_the_documented_rule_and_steer_sampling(recurrent) -> None:
    config, algorithm, _, buffer = recurrent()
    batch = buffer.sample_batches(config.optim.batch_size, 1)[0]
    algorithm.update(batch)
    assert write_priorities(buffer, batch) == 0
    counted = batch[LOSS_MASK_KEY]
    td_error = batch[PRIORITY_KEY].reshape(batch.shape)
    largest = td_error.masked_fill(~counted, float("-inf")).amax(dim=1)
    mean = (td_error * counted).sum(dim=1) / counted.sum(dim=1)
    expected = SLICE_PRIORITY_ETA * largest + (1 - SLICE_PRIORITY_ETA) * mean
    anchors = batch["anchor_index"][:, 0]
    once = (anchors.unsqueeze(0) == anchors.unsqueeze(1)).sum(0) == 1  # drawn once
    assert once.sum() > 4
    assert torch.allclose(stored_priorities(buffer, anchors[once]), expected[once], rtol=1e-4)

    def share_anchored_at(anchor: torch.Tensor, draws: int = 200) -> float:
        drawn = [
            buffer.sample_batches(config.optim.batch_size, 1)[0]["anchor_index"]
            for _ in range(draws)
        ]
        return (torch.cat(drawn)[:, 0] == anchor).float().mean().item()

    favourite = anchors[0]
    before = share_anchored_at(favourite)
    batch["next", "reward"][0] += 100.0  # sequence 0's returns are now far off its values
    algorithm.update(batch)
    write_priorities(buffer, batch)
    after = share_anchored_at(favourite)
    assert after > 0.3 and after > 10 * before, f"share went from {before:.3f} to {after:.3f}"


@pytest.mark.parametrize(
    "how",
    [
        ["collector.mode=sync"],  # worker processes carry their own states
        ["replay.sampler=prioritized_slice", "replay.burn_in=0"],  # slices, unrolled whole
    ],
    ids=["sequences-sync-workers", "slices"],
)
def test_a_recurrent_run_trains_and_refreshes_its_stored_states(
    how: list[str], tiny_config, tmp_path: Path
) -> None:
    config = tiny_config(*TINY_RECURRENT, *how, "collector.total_frames=800", preset=PRESET)
    result = train(config)
    assert result.frames == 800 and result.last_checkpoint is not None
    rows = [row for row in read_metrics(Path(config.run_dir)) if "train/state_drift" in row]
    assert rows and all(row["train/states_refreshed"] > 0 for row in rows)


BAD_SETTINGS = {
    "sac": (
        ["algo=sac", "env.name=Pendulum-v1"],
        r"recurrent='lstm' is not accepted with algo='sac'",
    ),
    "one-step sampler": (
        ["replay.sampler=uniform", "replay.burn_in=0", "optim.target=td0"],
        r"replay\.sampler='uniform' samples single steps",
    ),
    "burn-in of slices": (
        ["replay.sampler=prioritized_slice"],
        r"burn_in=4 needs replay\.sampler=",
    ),
    "window too long": (
        ["env.name=Acrobot-v1", "replay.burn_in=400", "replay.slice_len=101"],
        r"replay\.burn_in \+ replay\.slice_len=501 is out of range",
    ),
    "indices": (["env.observation_indices=[0,4]"], r"observation_indices=\[0, 4\] is out of range"),
}


@pytest.mark.parametrize(("overrides", "message"), BAD_SETTINGS.values(), ids=BAD_SETTINGS)
def test_bad_recurrent_settings_stop_before_anything_starts(
    overrides: list[str], message: str, tiny_config, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny_config(*TINY_RECURRENT, *overrides, preset=PRESET)
    assert not (tmp_path / "run").exists()
