"""Slices as the unit of learning: updates see [slices, slice_len] batches in time order,
multi-step targets are the returns TorchRL's estimators define over each slice, and
priorities are written per step and per slice."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rl_app.algorithms import make_algorithm
from rl_app.config import ConfigError, ReplayConfig
from rl_app.envs import make_env
from rl_app.logger import read_metrics
from rl_app.replay import (
    PRIORITY_KEY,
    SLICE_PRIORITY_ETA,
    TRAJECTORY_KEY,
    make_replay_buffer,
    write_priorities,
)
from rl_app.replay.nstep import NStepTransitions
from tests.helpers import TINY_RUN, random_play, run_train

TARGETS = ["td0", "nstep", "td_lambda"]


def stored_priorities(buffer, index: torch.Tensor) -> torch.Tensor:
    """The sampler's stored priorities (``(priority + eps) ** alpha``) at ``index``."""
    tree = buffer.sampler.state_dict()["_sum_tree"]
    return torch.as_tensor(tree[index.reshape(-1)]).reshape(index.shape)


def dqn_with_buffer(tiny_config, tmp_path: Path, *overrides: str):
    """A DQN on CartPole and a prioritized slice buffer (alpha 1) of random play."""
    config = tiny_config("replay.alpha=1.0", *overrides, preset="dqn_cartpole")
    algorithm = make_algorithm(config, make_env(config.env, 0), torch.device("cpu"))
    buffer = make_replay_buffer(config.replay, tmp_path / "replay", 0)
    play = random_play(config.env.name, 2_000)
    buffer.extend(play.select(*algorithm.replay_keys(), TRAJECTORY_KEY))
    return config, algorithm, buffer


def sampled_slices(tiny_config, preset: str, tmp_path: Path):
    """A preset's algorithm with TD(lambda) targets, and slices sampled from random play."""
    config = tiny_config("optim.target=td_lambda", preset=preset)
    algorithm = make_algorithm(config, make_env(config.env, 0), torch.device("cpu"))
    buffer = make_replay_buffer(config.replay, tmp_path / "replay", 0)
    buffer.extend(random_play(config.env.name, 1_000))
    return config, algorithm, buffer.sample_batches(config.optim.batch_size, 1)[0]


@pytest.mark.parametrize("preset", ["default", "dqn_cartpole"])
def test_a_slice_batch_reaches_the_loss_one_trajectory_per_row_in_time_order(
    preset: str, tiny_config, tmp_path: Path
) -> None:
    config, algorithm, batch = sampled_slices(tiny_config, preset, tmp_path)
    slices = config.optim.batch_size // config.replay.slice_len
    assert batch.shape == (slices, config.replay.slice_len)
    assert (batch[TRAJECTORY_KEY] == batch[TRAJECTORY_KEY][:, :1]).all()
    assert (batch["step_count"].squeeze(-1).diff(dim=1) == 1).all()
    assert torch.equal(batch["next", "observation"][:, :-1], batch["observation"][:, 1:])
    # The sampler marks every slice end done: the last column, where each row's chain stops.
    assert batch["next", "done"][:, -1].all()
    algorithm.update(batch)
    # The loss wrote one TD error per step of the [slices, slice_len] batch it was given.
    assert batch[PRIORITY_KEY].shape[:2] == (slices, config.replay.slice_len)


def hand_built_slices() -> TensorDict:
    """Three slices of four CartPole steps with known rewards: row 0 ends at a plain slice
    end, row 1 ends with a termination, row 2 holds a termination at step 1 (a new episode
    follows) and ends with a time-limit truncation."""
    generator = torch.Generator().manual_seed(0)
    done = torch.tensor([[0, 0, 0, 1], [0, 0, 0, 1], [0, 1, 0, 1]], dtype=torch.bool)
    terminated = torch.tensor([[0, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 0]], dtype=torch.bool)
    actions = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 1, 1]])
    return TensorDict(
        {
            "observation": torch.randn(3, 4, 4, generator=generator),
            "action": torch.nn.functional.one_hot(actions, 2),
            "next": {
                "observation": torch.randn(3, 4, 4, generator=generator),
                "reward": torch.tensor([[1.0, 2, 3, 4], [-1, 0, 5, 2], [3, 1, -2, 6]]).unsqueeze(
                    -1
                ),
                "done": done.unsqueeze(-1),
                "terminated": terminated.unsqueeze(-1),
                "truncated": (done & ~terminated).unsqueeze(-1),
            },
        },
        [3, 4],
    )


def returns_by_hand(
    reward: torch.Tensor, next_value: torch.Tensor, batch: TensorDict, gamma: float, lmbda: float
) -> torch.Tensor:
    """G_t = r_t at a termination; r_t + gamma V(s_t+1) at any other done (slice end, time
    limit); otherwise r_t + gamma ((1 - lmbda) V(s_t+1) + lmbda G_t+1)."""
    done, terminated = batch["next", "done"].squeeze(-1), batch["next", "terminated"].squeeze(-1)
    returns = torch.zeros_like(reward)
    for row in range(reward.shape[0]):
        for t in reversed(range(reward.shape[1])):
            if terminated[row, t]:
                returns[row, t] = reward[row, t]
            elif done[row, t]:
                returns[row, t] = reward[row, t] + gamma * next_value[row, t]
            else:
                blend = (1 - lmbda) * next_value[row, t] + lmbda * returns[row, t + 1]
                returns[row, t] = reward[row, t] + gamma * blend
    return returns


@pytest.mark.parametrize(("target", "lmbda"), [("td0", 0.0), ("nstep", 1.0), ("td_lambda", 0.7)])
def test_the_multi_step_target_the_loss_uses_is_the_return_computed_by_hand(
    target: str, lmbda: float, tiny_config
) -> None:
    config = tiny_config(f"optim.target={target}", "optim.lmbda=0.7", preset="dqn_cartpole")
    algorithm = make_algorithm(config, make_env(config.env, 0), torch.device("cpu"))
    batch = hand_built_slices()
    qvalues = algorithm.policy[0]  # the target network starts as a copy of it
    with torch.no_grad():
        next_value = qvalues(batch["next"].clone())["action_value"].amax(-1)
        predicted = (qvalues(batch.clone())["action_value"] * batch["action"]).sum(-1)
        algorithm.loss(batch)
    expected = returns_by_hand(
        batch["next", "reward"].squeeze(-1), next_value, batch, config.optim.gamma, lmbda
    )
    # DQNLoss writes the squared TD error of each step.
    td_error = batch[PRIORITY_KEY].squeeze(-1)
    assert torch.allclose(td_error, (predicted - expected) ** 2, rtol=1e-5, atol=1e-5)


def test_an_n_step_transition_target_is_the_slice_return_computed_by_hand(tiny_config) -> None:
    config = tiny_config("optim.target=nstep_transition", preset="dqn_cartpole")
    algorithm = make_algorithm(config, make_env(config.env, 0), torch.device("cpu"))
    gamma = config.optim.gamma
    slices = hand_built_slices()[:2]  # a plain slice end, and a termination at the end
    transitions = NStepTransitions(gamma, 4)(slices.reshape(-1))
    assert transitions.shape == (2,)
    assert torch.equal(transitions["observation"], slices["observation"][:, 0])
    assert torch.equal(transitions["next", "observation"], slices["next", "observation"][:, -1])
    qvalues = algorithm.policy[0]  # the target network starts as a copy of it
    with torch.no_grad():
        next_value = qvalues(transitions["next"].clone())["action_value"].amax(-1)
        predicted = (qvalues(transitions.clone())["action_value"] * transitions["action"]).sum(-1)
        algorithm.loss(transitions)
    rewards = slices["next", "reward"].squeeze(-1)
    discounted = [sum(gamma**k * rewards[row, k] for k in range(4)) for row in range(2)]
    expected = torch.stack([discounted[0] + gamma**4 * next_value[0], discounted[1]])
    td_error = transitions[PRIORITY_KEY].squeeze(-1)  # squared, as DQNLoss writes it
    assert torch.allclose(td_error, (predicted - expected) ** 2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["replay.sampler=prioritized_sequence"], "replay.sampler='prioritized_sequence'"),
        (["network.recurrent=lstm"], "network.recurrent='lstm'"),
        (["replay.her_ratio=0.5"], "replay.her_ratio=0.5"),
    ],
)
def test_n_step_transitions_refuse_what_is_not_a_slice_of_single_transitions(
    overrides: list[str], named: str, tiny_config
) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        tiny_config("optim.target=nstep_transition", *overrides, preset="dqn_cartpole")
    # A batch counts transitions: no multiple of the slice length needed.
    tiny_config("optim.target=nstep_transition", "optim.batch_size=30", preset="dqn_cartpole")


def test_a_run_learns_from_n_step_transitions_end_to_end(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_train(
        tmp_path,
        "--config",
        "dqn_cartpole",
        *TINY_RUN,
        f"run_dir={run_dir}",
        "optim.target=nstep_transition",
        "optim.batch_size=30",  # transitions, not a multiple of replay.slice_len
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert rows[-1]["frames"] == 1200 and "eval/return" in rows[-1]
    assert all(math.isfinite(row["train/loss"]) for row in rows if "train/loss" in row)


def test_slice_priorities_follow_the_documented_formula_and_steer_sampling(
    tiny_config, tmp_path: Path
) -> None:
    config, algorithm, buffer = dqn_with_buffer(tiny_config, tmp_path, "optim.target=td_lambda")
    batch = buffer.sample_batches(config.optim.batch_size, 1)[0]
    algorithm.update(batch)
    assert write_priorities(buffer, batch) == 0
    index = batch["index"].reshape(batch.shape)
    td_error = batch[PRIORITY_KEY].reshape(batch.shape)
    eta = SLICE_PRIORITY_ETA
    assert eta == 0.9
    expected_start = eta * td_error.amax(dim=1) + (1 - eta) * td_error.mean(dim=1)
    assert torch.allclose(stored_priorities(buffer, index[:, 0]), expected_start, rtol=1e-4)
    # Inner steps sampled once, in one slice, keep their own TD error.
    flat = index.reshape(-1)
    once = (flat.unsqueeze(0) == flat.unsqueeze(1)).sum(0) == 1
    inner = once & ~torch.isin(flat, index[:, 0]) & (torch.arange(flat.numel()) % 8 != 0)
    assert inner.any()
    assert torch.allclose(
        stored_priorities(buffer, flat[inner]), td_error.reshape(-1)[inner], rtol=1e-4
    )

    def share_starting_in(steps: torch.Tensor, draws: int = 200) -> float:
        starts = [
            buffer.sample_batches(config.optim.batch_size, 1)[0]["index"][:, 0].reshape(-1)
            for _ in range(draws)
        ]
        return torch.isin(torch.cat(starts), steps).float().mean().item()

    # Each step of the slice is the start of a slice too: they all take a large priority.
    before = share_starting_in(index[0])
    batch["next", "reward"][0] += 100.0  # slice 0's returns are now far off its values
    algorithm.update(batch)
    write_priorities(buffer, batch)
    after = share_starting_in(index[0])
    assert after > 0.5 and after > 10 * before, f"share went from {before:.3f} to {after:.3f}"


def test_a_slice_overwritten_in_part_keeps_all_its_priorities(tmp_path: Path) -> None:
    replay = ReplayConfig(capacity=400, slice_len=8, alpha=1.0)
    buffer = make_replay_buffer(replay, tmp_path, seed=0)
    play = TensorDict(
        {
            "observation": torch.arange(550.0).unsqueeze(-1),
            TRAJECTORY_KEY: torch.arange(550) // 100,
            ("next", "done"): (torch.arange(550) % 100 == 99).unsqueeze(-1),
        },
        [550],
    )
    buffer.extend(play[:400])
    for _ in range(50):  # until a slice straddles slot 150, where the overwrite will end
        batch = buffer.sample_batches(256, 1)[0]
        index = batch["index"].reshape(batch.shape)
        straddling = (index < 150).any(dim=1) & (index >= 150).any(dim=1)
        if straddling.any():
            break
    assert straddling.any()
    buffer.extend(play[400:550])  # wraps: slots 0-149 now hold new records
    before = stored_priorities(buffer, index)
    batch[PRIORITY_KEY] = torch.full(batch.shape, 1_000.0)
    dropped = write_priorities(buffer, batch)

    overwritten = (index < 150).any(dim=1)
    assert dropped == int(overwritten.sum())
    after = stored_priorities(buffer, index)
    # Rows of overwritten slices that share no slot with a live slice: all unchanged.
    untouched = overwritten & ~torch.isin(index, index[~overwritten]).any(dim=1)
    assert untouched.any()
    assert torch.equal(after[untouched], before[untouched])
    assert torch.allclose(after[~overwritten], torch.tensor(1_000.0))


def test_a_slice_of_one_step_is_plain_td0_with_prioritized_replay(
    tiny_config, tmp_path: Path
) -> None:
    config, algorithm, buffer = dqn_with_buffer(
        tiny_config, tmp_path, "replay.slice_len=1", "optim.target=td_lambda"
    )
    batch = buffer.sample_batches(config.optim.batch_size, 1)[0]
    assert batch.shape == (64, 1) and "priority_weight" in batch.keys()
    with torch.no_grad():
        algorithm.loss(batch)
        lambda_error = batch[PRIORITY_KEY].clone()
        algorithm.loss.make_value_estimator(gamma=config.optim.gamma)  # TD(0)
        algorithm.loss(batch)
    assert torch.allclose(lambda_error, batch[PRIORITY_KEY])
    write_priorities(buffer, batch)
    index = batch["index"].reshape(-1)
    assert torch.allclose(
        stored_priorities(buffer, index), batch[PRIORITY_KEY].reshape(-1), rtol=1e-4
    )


@pytest.mark.parametrize("sampler", ["prioritized", "uniform"])
@pytest.mark.parametrize("target", ["nstep", "td_lambda"])
def test_a_multi_step_target_without_slices_is_a_config_error(
    sampler: str, target: str, tiny_config
) -> None:
    with pytest.raises(ConfigError, match=rf"optim\.target='{target}' needs a sequence sampler"):
        tiny_config(f"optim.target={target}", f"replay.sampler={sampler}")


@pytest.mark.parametrize("preset", ["default", "dqn_cartpole"])
def test_importance_weights_scale_the_loss_per_slice(
    preset: str, tiny_config, tmp_path: Path
) -> None:
    _, algorithm, batch = sampled_slices(tiny_config, preset, tmp_path)
    # The sampler gives every step of a slice its slice's weight.
    weights = batch["priority_weight"]
    assert weights.shape == batch.shape and (weights == weights[:, :1]).all()

    def losses(sample: TensorDict) -> TensorDict:
        torch.manual_seed(0)  # same actor samples for every variant
        with torch.no_grad():
            return algorithm.loss(sample.clone())

    only_first = batch.clone()
    only_first["priority_weight"] = torch.zeros(batch.shape)
    only_first["priority_weight"][0] = 3.0
    first_slice_alone = batch[:1].clone()
    first_slice_alone["priority_weight"] = torch.ones(1, batch.shape[1])
    key = "loss" if preset == "dqn_cartpole" else "loss_qvalue"
    assert not torch.allclose(losses(only_first)[key], losses(batch)[key], rtol=1e-4)
    if preset == "dqn_cartpole":  # deterministic: the weighted loss is the slice's own loss
        assert torch.allclose(losses(only_first)[key], losses(first_slice_alone)[key], rtol=1e-4)
