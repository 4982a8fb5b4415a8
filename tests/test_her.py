"""Hindsight experience replay in rl_app: which goal a transition is relabelled with, its
reward and termination for that goal, the goal-conditioned Q-network, the success rate of
evaluations, and the settings that are refused."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict

from rl_app.algorithms import make_algorithm
from rl_app.checks import load_config
from rl_app.config import ConfigError, EnvConfig, ReplayConfig
from rl_app.envs import make_env
from rl_app.envs.goals import BIT_FLIP_IDS, BitFlippingEnv
from rl_app.evaluation import evaluate
from rl_app.logger import EVAL_KEY, SUCCESS_RATE_KEY
from rl_app.replay import (
    NEXT_ACHIEVED_GOAL,
    PRIORITY_KEY,
    TRAJECTORY_KEY,
    make_replay_buffer,
    slice_priorities,
    write_priorities,
)

BIT_FLIP = f"rl_app.envs.goals:{BIT_FLIP_IDS[10]}"
# The desired goal stored with every hand-built step: no step achieves it.
UNREACHED = -1.0
STEPS = 4


class BitFlipWithoutTermination(BitFlippingEnv):
    """A goal env that cannot say whether a goal ends an episode."""

    compute_terminated = None


NO_TERMINATION_ID = "rl_app_test/BitFlipWithoutTermination-v0"
gym.register(NO_TERMINATION_ID, entry_point=BitFlipWithoutTermination, max_episode_steps=10)


@pytest.fixture(autouse=True)
def seeded() -> Iterator[None]:
    # Relabelling draws its goals from torch's global generator.
    with torch.random.fork_rng():
        torch.manual_seed(0)
        yield


def episode(first: float, traj: int) -> TensorDict:
    """STEPS transitions whose achieved goal is ``first + t`` before step ``t``'s action and
    ``first + t + 1`` after it, under the goal UNREACHED; the last step is truncated."""
    achieved = first + torch.arange(STEPS + 1, dtype=torch.float32).unsqueeze(-1)
    goal = torch.full((STEPS, 1), UNREACHED)
    end = torch.zeros(STEPS, 1, dtype=torch.bool)
    end[-1] = True
    return TensorDict(
        {
            "achieved_goal": achieved[:-1],
            "desired_goal": goal,
            TRAJECTORY_KEY: torch.full((STEPS,), traj),
            "next": {
                "achieved_goal": achieved[1:],
                "desired_goal": goal.clone(),
                "reward": torch.full((STEPS, 1), -1.0),
                "done": end,
                "terminated": torch.zeros_like(end),
            },
        },
        [STEPS],
    )


def relabelling_buffer(tmp_path: Path, strategy: str, her_ratio: float = 1.0, **sampling):
    """rl_app's buffer with two hand-built episodes (achieved goals 0-4 and 10-14), relabelled
    by bit flipping's reward and termination (a goal is reached where it equals the one
    achieved after the action); uniform transitions unless ``sampling`` says otherwise."""
    sampling = {"sampler": "uniform", **sampling}
    replay = ReplayConfig(capacity=64, her_ratio=her_ratio, her_strategy=strategy, **sampling)
    buffer = make_replay_buffer(replay, tmp_path, seed=0, env=make_env(EnvConfig(name=BIT_FLIP), 0))
    buffer.extend(torch.cat([episode(0, traj=0), episode(10, traj=1)]))
    return replay, buffer


# Stable-Baselines3's HerReplayBuffer relabels the transition at step t of an episode of T
# steps with next_observations["achieved_goal"] of step: a uniform one of t..T-1 (future,
# t included), T-1 (final), a uniform one of 0..T-1 (episode). Here step t achieves t + 1.
SB3_GOALS = {
    "future": lambda t: set(range(t + 1, STEPS + 1)),
    "final": lambda t: {STEPS},
    "episode": lambda t: set(range(1, STEPS + 1)),
}


@pytest.mark.parametrize("strategy", SB3_GOALS)
def test_goals_are_those_later_steps_achieved_after_their_actions_as_in_sb3(
    strategy: str, tmp_path: Path
) -> None:
    _, buffer = relabelling_buffer(tmp_path, strategy)
    sample = buffer.sample(1024)
    goals = defaultdict(set)
    pairs = zip(sample["achieved_goal"].flatten(), sample["desired_goal"].flatten(), strict=True)
    for before, goal in pairs:
        first = 10 * (before // 10)  # the episode's first achieved goal
        goals[(first.item(), (before - first).item())].add((goal - first).item())
    expected = {(first, t): SB3_GOALS[strategy](t) for first in (0, 10) for t in range(STEPS)}
    assert goals == expected
    assert torch.equal(sample["next", "desired_goal"], sample["desired_goal"])


# A slice sampler's stored flags travel apart from the sampled data: recomputed all the same.
@pytest.mark.parametrize("sampler", ["uniform", "slice"])
def test_reward_and_termination_are_the_envs_for_the_new_goal(sampler: str, tmp_path: Path) -> None:
    _, buffer = relabelling_buffer(tmp_path, "future", sampler=sampler, slice_len=1)
    sample = buffer.sample(512)
    reached = sample[NEXT_ACHIEVED_GOAL] == sample["desired_goal"]
    assert reached.any() and not reached.all()
    assert torch.equal(sample["next", "reward"], reached.float() - 1)
    # Bit flipping ends an episode where its goal is reached: so does the relabelled one.
    assert torch.equal(sample["next", "terminated"], reached)


def test_each_update_gets_its_share_of_relabelled_transitions(tmp_path: Path) -> None:
    _, buffer = relabelling_buffer(tmp_path, "future", her_ratio=0.5)
    batches = buffer.sample_batches(32, 4)
    for batch in batches:
        assert int((batch["desired_goal"] != UNREACHED).sum()) == 16


def test_the_q_network_reads_the_desired_goal_and_the_buffer_keeps_what_relabels() -> None:
    config = load_config("dqn_bitflip", ["network.hidden_sizes=[16]", "run_dir=runs/unused"])
    env = make_env(config.env, config.seed)
    algorithm = make_algorithm(config, env, torch.device("cpu"))
    keys = algorithm.replay_keys()
    assert {"desired_goal", ("next", "desired_goal"), NEXT_ACHIEVED_GOAL} <= set(keys)
    step = env.reset()
    values = algorithm.policy(step.clone())["action_value"]
    step["desired_goal"] = 1 - step["desired_goal"]
    assert not torch.equal(algorithm.policy(step)["action_value"], values)
    off = load_config("dqn_bitflip", ["replay.her_ratio=0", "run_dir=runs/unused"])
    assert NEXT_ACHIEVED_GOAL not in make_algorithm(off, env, torch.device("cpu")).replay_keys()


def test_evaluation_reports_the_success_rate_of_a_goal_env_only(tiny_config) -> None:
    for preset, has_goals in (("dqn_bitflip", True), ("dqn_cartpole", False)):
        config = tiny_config("eval.episodes=3", preset=preset)
        env = make_env(config.env, config.seed)
        algorithm = make_algorithm(config, env, torch.device("cpu"))
        scores = evaluate(config, algorithm.policy_factory(), algorithm.policy)
        assert set(scores) == ({EVAL_KEY, SUCCESS_RATE_KEY} if has_goals else {EVAL_KEY})
        assert 0 <= scores.get(SUCCESS_RATE_KEY, 0) <= 1


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (["env.name=CartPole-v1"], "CartPole-v1 observes no 'desired_goal'"),
        ([f"env.name=tests.test_her:{NO_TERMINATION_ID}"], "offers no compute_terminated"),
        (["replay.sampler=prioritized_sequence"], "takes transitions or slices"),
        (["env.num_envs=2"], "collector.mode=direct with env.num_envs=1"),
        (["collector.mode=sync"], "collector.mode=direct with env.num_envs=1"),
        (
            ["network.recurrent=lstm", "replay.sampler=prioritized_slice", "replay.slice_len=1"],
            "only the MLPs of algo=dqn and algo=sac",
        ),
        (["replay.her_strategy=random"], "choose one of future, final, episode"),
        (["replay.her_ratio=1.5"], "replay.her_ratio=1.5 is out of range"),
    ],
)
def test_settings_hindsight_relabelling_cannot_serve_are_refused(
    overrides: list[str], why: str
) -> None:
    with pytest.raises(ConfigError, match=r"replay\.her") as refused:
        load_config("dqn_bitflip", [*overrides, "run_dir=runs/unused"])
    assert why in str(refused.value)


def test_a_relabelled_slice_has_one_goal_and_its_priority_is_its_own_td_error(
    tmp_path: Path,
) -> None:
    _, buffer = relabelling_buffer(
        tmp_path, "future", her_ratio=0.5, sampler="prioritized_slice", slice_len=2, alpha=1.0
    )
    batches = buffer.sample_batches(16, 4)
    for batch in batches:
        goals = batch["desired_goal"]
        assert batch.shape == (8, 2) and (goals == goals[:, :1]).all()
        assert int((goals[:, 0] != UNREACHED).sum()) == 4  # each update gets its share
        # A goal its first step could take (future): achieved after it, in its episode.
        relabelled = (goals != UNREACHED).squeeze(-1)[:, 0]
        first = batch["achieved_goal"][relabelled, :1]
        assert ((first < goals[relabelled]) & (goals[relabelled] <= 10 * (first // 10) + 4)).all()
        reached = batch[NEXT_ACHIEVED_GOAL] == goals
        assert torch.equal(batch["next", "reward"], reached.float() - 1)
    # A slice is learned from with the goal it was drawn with, relabelled or not, and its
    # priority is what that update found: R2D2's mix of its steps' TD errors.
    batch = batches[0]
    # One TD error per slot: a slice drawn twice gets the same priority both times.
    td_errors = (batch["index"].reshape(8, 2) % 7 + 1).float() / 10
    batch[PRIORITY_KEY] = td_errors.unsqueeze(-1)
    write_priorities(buffer, batch)
    starts = batch["index"].reshape(8, 2)[:, 0]
    tree = buffer.sampler.state_dict()["_sum_tree"]
    stored = torch.tensor([tree[int(start)] for start in starts])
    expected = slice_priorities(td_errors)
    torch.testing.assert_close(stored, expected, atol=1e-6, rtol=1e-4)
