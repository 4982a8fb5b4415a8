"""SAC with hindsight experience replay on a continuous goal env (PointReach): the actor and
the critics read the desired goal, the settings relabelling needs are checked as for DQN,
and a run trains and resumes exactly. Its learning check is in tests/test_learning.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rl_app.algorithms import make_algorithm, make_policy
from rl_app.checks import load_config
from rl_app.config import ConfigError
from rl_app.envs import make_env
from rl_app.logger import SUCCESS_RATE_KEY, read_metrics
from rl_app.replay import NEXT_ACHIEVED_GOAL
from rl_app.run import train
from tests.helpers import assert_same_run, resume_in_process, train_in_process

PRESET = "sac_pointreach"
# PointReach with relabelling, small: 50 steps per episode and 100 frames per batch, so
# that a stop at 400 frames falls on an episode boundary; updates run from 200 frames on,
# evaluations (which also checkpoint) at 400 and 800.
SMALL_POINT_REACH = [
    "network.hidden_sizes=[32,32]",
    "collector.frames_per_batch=100",
    "collector.init_random_frames=200",
    "optim.utd_ratio=0.2",
    "optim.batch_size=64",
    "replay.capacity=5000",
    "eval.interval_frames=400",
    "eval.episodes=1",
    "logger.backend=none",
]


def test_the_actor_and_the_critics_read_the_desired_goal(tmp_path: Path) -> None:
    config = load_config(PRESET, ["network.hidden_sizes=[16]", f"run_dir={tmp_path}"])
    env = make_env(config.env, config.seed)
    algorithm = make_algorithm(config, env, torch.device("cpu"))
    keys = algorithm.replay_keys()
    assert {"desired_goal", ("next", "desired_goal"), NEXT_ACHIEVED_GOAL} <= set(keys)
    step = env.rand_action(env.reset())
    elsewhere = step.clone().set("desired_goal", -step["desired_goal"])
    # The policy a run acts with, and the one playing a run builds from the config alone.
    for policy in (algorithm.policy, make_policy(config, env)):
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            actions = [policy(transition.clone())["action"] for transition in (step, elsewhere)]
        assert not torch.equal(*actions)
    loss = algorithm.loss
    for params in loss.qvalue_network_params.unbind(0):
        with params.to_module(loss.qvalue_network):
            values = [
                loss.qvalue_network(transition.clone())["state_action_value"]
                for transition in (step, elsewhere)
            ]
        assert not torch.equal(*values)
    off = load_config(PRESET, ["replay.her_ratio=0", f"run_dir={tmp_path}"])
    assert NEXT_ACHIEVED_GOAL not in make_algorithm(off, env, torch.device("cpu")).replay_keys()


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (["env.name=Pendulum-v1"], "Pendulum-v1 observes no 'desired_goal'"),
        (["replay.sampler=prioritized_sequence"], "takes transitions or slices"),
        (["collector.mode=sync"], "collector.mode=direct with env.num_envs=1"),
    ],
)
def test_sac_relabelling_is_refused_where_dqns_is(overrides: list[str], why: str) -> None:
    with pytest.raises(ConfigError, match=r"replay\.her") as refused:
        load_config(PRESET, [*overrides, "run_dir=runs/unused"])
    assert why in str(refused.value)


def test_sac_with_relabelling_trains_on_memory_mapped_replay_and_resumes_exactly(
    tmp_path: Path,
) -> None:
    def config(run_dir: Path, frames: int):
        overrides = [*SMALL_POINT_REACH, f"collector.total_frames={frames}", f"run_dir={run_dir}"]
        return load_config(PRESET, overrides)

    alone = train_in_process(config(tmp_path / "a", 800))
    interrupted = tmp_path / "b"
    result = train(config(interrupted, 400))
    assert result.frames == 400
    # Memory-mapped files, among them the achieved goals relabelling draws from.
    assert (interrupted / "replay" / "next" / "achieved_goal.memmap").is_file()
    assert read_metrics(interrupted)[-1]["episodes"] == 400 // 50  # whole episodes only
    resumed = resume_in_process(config(interrupted, 800))
    assert_same_run(alone, resumed)
    assert all(SUCCESS_RATE_KEY in row for row in resumed[2] if "eval/return" in row)
