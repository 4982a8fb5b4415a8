"""TD3 on real parts: the actor and the target networks follow every ``td3.policy_delay``-th
critic update, the critics learn from a smoothed target action whose noise is clipped,
collected actions carry Gaussian noise that evaluation leaves out, and a run trains, resumes
exactly and plays. Its learning check is at the end (``slow``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rl_app.algorithms import make_algorithm, make_policy
from rl_app.algorithms.base import CUDA_GRAPH_WARMUP
from rl_app.algorithms.td3 import TD3
from rl_app.checks import load_config
from rl_app.envs import make_env
from rl_app.logger import SUCCESS_RATE_KEY, read_metrics
from rl_app.play import load_policy, play
from rl_app.replay import PRIORITY_KEY
from rl_app.run import train
from tests.helpers import TINY_RUN, assert_same_run, resume_in_process, train_in_process
from tests.test_compile import assert_same_steps

PRESET = "td3_pendulum"
# Pendulum's torques span [-2, 2]: settings in half-widths are twice that in torque.
HALF_WIDTH = 2.0


def tiny_td3(*overrides: str) -> tuple[TD3, TensorDictBase]:
    """A TD3 of small networks for Pendulum, and a 64-step batch of real random play."""
    config = load_config(PRESET, [*TINY_RUN, "run_dir=runs/unused", *overrides])
    env = make_env(config.env, seed=0)
    torch.manual_seed(0)
    algorithm = make_algorithm(config, env, torch.device("cpu"))
    batch = env.rollout(64, break_when_any_done=False).select(*algorithm.replay_keys())
    env.close()
    return algorithm, batch


def batch_of(observations: torch.Tensor) -> TensorDictBase:
    return TensorDict({"observation": observations}, observations.shape[:1])


def snapshot(params: TensorDictBase) -> TensorDictBase:
    return params.detach().clone()


def test_the_actor_and_the_targets_follow_every_policy_delay_th_critic_update() -> None:
    algorithm, batch = tiny_td3("td3.policy_delay=3")
    loss = algorithm.loss
    watched = {
        "critics": loss.qvalue_network_params,
        "actor": loss.actor_network_params,
        "target critics": loss.target_qvalue_network_params,
        "target actor": loss.target_actor_network_params,
    }
    changed: dict[str, list[bool]] = {name: [] for name in watched}
    reported = []
    for step in range(7):
        before = {name: snapshot(params) for name, params in watched.items()}
        sample = batch.clone()
        sample["next", "reward"] += step  # a new batch each step
        metrics = algorithm.update(sample)
        for name, params in watched.items():
            changed[name].append(not (params.detach() == before[name]).all())
        reported.append(metrics["loss_actor"].item())
        assert metrics[PRIORITY_KEY].shape == (64,)  # the TD errors the loop writes back
        assert (metrics[PRIORITY_KEY] >= 0).all()
    assert changed["critics"] == [True] * 7
    delayed = [True, False, False, True, False, False, True]  # updates 1, 4 and 7
    assert changed["actor"] == changed["target critics"] == changed["target actor"] == delayed
    # Each update reports the latest actor step's loss.
    assert reported[0] == reported[1] == reported[2] != reported[3]
    assert algorithm.delayed.critic_updates == 7


def test_the_target_action_is_the_target_actors_with_clipped_noise() -> None:
    # Noise of std 2 torques clipped to +-0.2: almost every draw is clipped.
    algorithm, batch = tiny_td3("td3.policy_noise=1.0", "td3.noise_clip=0.1", "optim.gamma=0.9")
    loss = algorithm.loss
    with torch.no_grad():  # the targets differ from the networks, as after training
        for params in (loss.target_actor_network_params, loss.target_qvalue_network_params):
            params.apply_(lambda p: p.add_(0.1 * torch.randn_like(p)))

    torch.manual_seed(7)
    _, metadata = loss.value_loss(batch.clone())

    # By hand: TD3Loss draws the noise first, from torch's generator.
    torch.manual_seed(7)
    noise = torch.randn_like(batch["action"]) * 1.0 * HALF_WIDTH
    clipped = noise.clamp(-0.1 * HALF_WIDTH, 0.1 * HALF_WIDTH)
    assert (clipped != noise).float().mean() > 0.9
    with torch.no_grad():
        following = batch["next"].select("observation").clone()
        with loss.target_actor_network_params.to_module(loss.actor_network):
            target_action = loss.actor_network(following)["action"]
        following["action"] = (target_action + clipped).clamp(-HALF_WIDTH, HALF_WIDTH)
        values = []
        for params in loss.target_qvalue_network_params.unbind(0):
            with params.to_module(loss.qvalue_network):
                values.append(loss.qvalue_network(following.clone())["state_action_value"])
    smallest = torch.minimum(*values).squeeze(-1)
    alive = (~batch["next", "terminated"]).float().squeeze(-1)
    expected = batch["next", "reward"].squeeze(-1) + 0.9 * alive * smallest
    torch.testing.assert_close(metadata["target_value"], expected)
    torch.testing.assert_close(metadata["next_state_value"], smallest)


def test_collected_actions_carry_gaussian_noise_and_evaluation_none() -> None:
    algorithm, _ = tiny_td3("td3.exploration_noise=0.1")
    observations = torch.randn(20_000, 3)
    # A fresh actor acts near 0, far from the bounds: the noise is not clipped there.
    with torch.no_grad():
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            acted = algorithm.policy(batch_of(observations))["action"]
            again = algorithm.policy(batch_of(observations))["action"]
        with set_exploration_type(ExplorationType.RANDOM):
            explored = algorithm.policy(batch_of(observations))["action"]
    assert torch.equal(acted, again)
    assert acted.abs().max() < 1.0
    noise = explored - acted
    assert noise.mean().abs() < 0.01
    assert noise.std().item() == pytest.approx(0.1 * HALF_WIDTH, rel=0.03)


def test_compiled_updates_take_the_same_steps_as_eager_ones() -> None:
    # Four updates: the critic's step alone and with the actor's, each compiled.
    assert_same_steps(PRESET, ["optim.compile=false"], ["optim.compile=true"], "cpu", steps=4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_updates_take_the_same_steps_as_eager_ones_on_a_gpu() -> None:
    # The actor's step comes every second update: it is captured after twice the warm-up.
    steps = 2 * CUDA_GRAPH_WARMUP + 4
    assert_same_steps(PRESET, ["optim.compile=false"], ["optim.cudagraphs=true"], "cuda", steps)


def test_a_tiny_run_resumes_exactly_between_two_actor_steps(tiny_config, tmp_path: Path) -> None:
    # 20 updates an iteration from 400 frames on, and an actor step at every 7th: the stop
    # at 800 frames (60 updates) falls between two actor steps, where the resumed run must
    # go on.
    def config(run_dir: Path, frames: int):
        overrides = ["td3.policy_delay=7", f"collector.total_frames={frames}"]
        return tiny_config(*overrides, run_dir=run_dir, preset=PRESET)

    alone = train_in_process(config(tmp_path / "a", 1600))
    interrupted = tmp_path / "b"
    assert train(config(interrupted, 800)).updates % 7 != 0
    resumed = load_config(PRESET, [f"run_dir={interrupted}", "collector.total_frames=1600"])
    assert resumed.algo == "td3" and resumed.td3.policy_delay == 7  # the saved config
    assert_same_run(alone, resume_in_process(resumed))
    learning = alone[2][1:]  # updates start at 400 frames
    assert all({"train/loss_qvalue", "train/loss_actor"} <= row.keys() for row in learning)


def test_play_builds_the_deterministic_actor_and_replays_the_evaluation(tiny_config) -> None:
    config = tiny_config(preset=PRESET)
    train(config)
    played = play(config.run_dir, "last")
    rows = read_metrics(Path(config.run_dir))
    assert played.mean_return == [row["eval/return"] for row in rows if "eval/return" in row][-1]
    policy = load_policy(config.run_dir, "last")
    observation = batch_of(torch.randn(8, 3))
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        actions = [policy(observation.clone())["action"] for _ in range(2)]
    assert torch.equal(*actions)
    assert actions[0].abs().max() <= HALF_WIDTH
    assert type(make_policy(config, make_env(config.env, 0))) is type(policy)


def test_td3_relabels_goals_in_a_goal_env(tmp_path: Path) -> None:
    # PointReach, small, with relabelling: the actor and the critics read the goal.
    overrides = [
        "algo=td3",
        "network.hidden_sizes=[32,32]",
        "collector.total_frames=400",
        "collector.frames_per_batch=100",
        "collector.init_random_frames=200",
        "optim.utd_ratio=0.2",
        "optim.batch_size=64",
        "eval.interval_frames=400",
        "eval.episodes=1",
        "logger.backend=none",
        f"run_dir={tmp_path}",
    ]
    config = load_config("sac_pointreach", overrides)
    assert config.replay.her_ratio > 0
    env = make_env(config.env, config.seed)
    algorithm = make_algorithm(config, env, torch.device("cpu"))
    assert "desired_goal" in algorithm.policy[0].in_keys
    assert algorithm.relabels_goals
    env.close()
    result = train(config)
    assert result.updates > 0
    assert SUCCESS_RATE_KEY in read_metrics(tmp_path)[-1]


@pytest.mark.slow
def test_td3_preset_learns_pendulum_within_8k_frames(tmp_path: Path) -> None:
    # The preset with 1,000 random frames instead of 10,000, as SAC's check: a random
    # policy scores about -1,250; seed 0's final evaluation -206 here.
    overrides = [
        f"run_dir={tmp_path / 'run'}",
        "logger.backend=none",
        "collector.init_random_frames=1000",
        "collector.total_frames=8000",
        "eval.interval_frames=8000",  # one evaluation, of the final policy
    ]
    config = load_config(PRESET, overrides)
    assert config.seed == 0 and config.eval.episodes == 10
    result = train(config)
    assert result.frames == 8_000
    assert result.last_eval_return >= -400, result
