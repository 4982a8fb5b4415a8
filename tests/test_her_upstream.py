"""What TorchRL 0.14.1's ``HERReplayBuffer`` does, checked on the installed version before
rl_app relabels goals with it.

Each test stores hand-built episodes whose achieved goal is a number that grows by one per
step: the step that starts at achieved goal ``g`` ends at ``g + 1``. A relabelled goal then
names the step it came from, and whether it was taken before or after that step's action.
Stable-Baselines3's ``HerReplayBuffer`` relabels with the achieved goal *after* a later
step's action (``next_observations["achieved_goal"]``), which is what that step's reward
depends on; a failure here after an upgrade means TorchRL changed one of these behaviours.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import (
    HERReplayBuffer,
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSliceSampler,
    SliceSampler,
)
from torchrl.envs import CatTensors

# The desired goal stored with every step: no step achieves it.
UNREACHED = 100.0
TRAJ_KEY = ("collector", "traj_ids")
SLICE_LEN = 4


@pytest.fixture(autouse=True)
def seeded() -> Iterator[None]:
    # The buffer draws future goals from torch's global generator.
    with torch.random.fork_rng():
        torch.manual_seed(0)
        yield


def episode(first: float, steps: int, *, ends: bool = True, traj: int = 0) -> TensorDict:
    """``steps`` transitions whose achieved goal is ``first + t`` before step ``t``'s action
    and ``first + t + 1`` after it, all after the goal UNREACHED; ``("next", "done")`` and
    ``("next", "terminated")`` are set at the last step if the episode ``ends`` there."""
    achieved = first + torch.arange(steps + 1, dtype=torch.float32).unsqueeze(-1)
    goal = torch.full((steps, 1), UNREACHED)
    end = torch.zeros(steps, 1, dtype=torch.bool)
    end[-1] = ends
    return TensorDict(
        {
            "achieved_goal": achieved[:-1],
            "desired_goal": goal,
            TRAJ_KEY: torch.full((steps,), traj),
            "next": {
                "achieved_goal": achieved[1:],
                "desired_goal": goal.clone(),
                "reward": torch.full((steps, 1), -1.0),
                "done": end,
                "terminated": end.clone(),
            },
        },
        [steps],
    )


def reward_after_the_action(td: TensorDictBase) -> torch.Tensor:
    """The sparse reward of the step's outcome, as a goal env's ``compute_reward`` of
    ``("next", "achieved_goal")`` gives it: 0 on reaching the goal, -1 elsewhere."""
    return (td["next", "achieved_goal"] == td["desired_goal"]).float() - 1.0


def docstring_reward(td: TensorDictBase) -> torch.Tensor:
    """The reward function of HERReplayBuffer's docstring example."""
    dist = (td["achieved_goal"] - td["desired_goal"]).norm(dim=-1, keepdim=True)
    return (dist < 0.05).float()


def her_buffer(
    strategy: str,
    *,
    her_ratio: float = 1.0,
    reward_fn: Callable[[TensorDictBase], torch.Tensor] = reward_after_the_action,
    **kwargs: Any,
) -> HERReplayBuffer:
    kwargs.setdefault("storage", LazyTensorStorage(100))
    return HERReplayBuffer(reward_fn, her_ratio=her_ratio, strategy=strategy, **kwargs)


def by_step(sample: TensorDictBase, key: Any) -> dict[float, float]:
    """``sample[key]`` of each sampled step, the step named by its pre-action achieved goal."""
    return dict(
        zip(sample["achieved_goal"].flatten().tolist(), sample[key].flatten().tolist(), strict=True)
    )


def slice_sampler() -> SliceSampler:
    return SliceSampler(slice_len=SLICE_LEN, traj_key=TRAJ_KEY, end_key=("next", "done"))


def prioritized_slice_sampler() -> PrioritizedSliceSampler:
    return PrioritizedSliceSampler(
        100, alpha=0.6, beta=0.4, slice_len=SLICE_LEN, traj_key=TRAJ_KEY, end_key=("next", "done")
    )


def test_relabelled_goals_are_later_steps_pre_action_achieved_goals() -> None:
    buffer = her_buffer("final")
    buffer.extend(episode(0, 4))  # achieved goals 0, 1, 2, 3 before each action; 4 at the end
    sample = buffer.sample(32)
    # SB3's final goal would be 4: the achieved goal after the last action.
    assert sample["desired_goal"].unique().tolist() == [3.0]
    assert sample["next", "desired_goal"].unique().tolist() == [3.0]

    buffer = her_buffer("future")
    buffer.extend(episode(0, 4))
    sample = buffer.sample(400)
    goals, achieved = sample["desired_goal"], sample["achieved_goal"]
    assert ((achieved <= goals) & (goals <= 3.0)).all()
    # The last step's only future goal is where it started (SB3: where it ended, 4).
    assert goals[achieved == 3.0].unique().tolist() == [3.0]
    assert goals.unique().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_the_docstring_reward_reads_the_pre_action_achieved_goal() -> None:
    assert 'td["achieved_goal"] - td["desired_goal"]' in HERReplayBuffer.__doc__
    rewards = {}
    for reward_fn in (docstring_reward, reward_after_the_action):
        buffer = her_buffer("final", reward_fn=reward_fn)
        buffer.extend(episode(0, 4))
        rewards[reward_fn] = by_step(buffer.sample(64), ("next", "reward"))
    # Relabelled with goal 3: the docstring rewards (1 = success) the last step, which
    # starts at 3 and leaves it; the step that reaches 3 is the one before it.
    assert rewards[docstring_reward] == {0.0: 0.0, 1.0: 0.0, 2.0: 0.0, 3.0: 1.0}
    assert rewards[reward_after_the_action] == {0.0: -1.0, 1.0: -1.0, 2.0: 0.0, 3.0: -1.0}


def test_buffer_transforms_run_before_relabelling() -> None:
    goal_input = CatTensors(["achieved_goal", "desired_goal"], "goal_input", del_keys=False)
    buffer = her_buffer("final", transform=goal_input)
    buffer.extend(episode(0, 4))
    sample = buffer.sample(16)
    assert sample["desired_goal"].unique().tolist() == [3.0]
    # The concatenation holds the stored goal: a policy input built by a buffer transform
    # never sees the relabelled one.
    assert sample["goal_input"][:, 1].unique().tolist() == [UNREACHED]


def test_episodes_end_at_done_alone_so_a_flattened_batch_joins_two_envs_pieces() -> None:
    # A collector's batch of two envs, [env, time]: env 0 is mid-episode, env 1 ends.
    batch = torch.stack([episode(0, 4, ends=False, traj=0), episode(10, 4, traj=1)])
    buffer = her_buffer("final")
    buffer.extend(batch.reshape(-1))
    goals = by_step(buffer.sample(64), "desired_goal")
    # Env 0's steps (achieved 0-3) take env 1's final goal, despite their trajectory ids.
    assert goals == dict.fromkeys([0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0], 13.0)


def test_relabelling_recomputes_the_reward_but_keeps_the_stored_terminated_flag() -> None:
    buffer = her_buffer("final")
    buffer.extend(episode(0, 4))
    sample = buffer.sample(64)
    # The step that reaches goal 3 is not terminal; the one that leaves it stays terminal.
    assert by_step(sample, ("next", "reward")) == {0.0: -1.0, 1.0: -1.0, 2.0: 0.0, 3.0: -1.0}
    terminal = {0.0: False, 1.0: False, 2.0: False, 3.0: True}
    assert by_step(sample, ("next", "terminated")) == terminal


def test_a_memmap_storage_works(tmp_path: Path) -> None:
    buffer = her_buffer("final", storage=LazyMemmapStorage(100, scratch_dir=tmp_path))
    buffer.extend(episode(0, 4))
    assert by_step(buffer.sample(64), "desired_goal") == dict.fromkeys([0.0, 1.0, 2.0, 3.0], 3.0)
    assert list(tmp_path.rglob("*.memmap"))


@pytest.mark.parametrize("sampler", [slice_sampler, prioritized_slice_sampler])
def test_slice_samplers_work_and_draw_goals_per_step(sampler: Callable[[], Any]) -> None:
    buffer = her_buffer("future", sampler=sampler())
    buffer.extend(episode(0, 8, traj=0))  # achieved goals 0-7 before each action
    buffer.extend(episode(10, 8, traj=1))  # 10-17
    sample = buffer.sample(16 * SLICE_LEN)
    goals, achieved = sample["desired_goal"], sample["achieved_goal"]
    last = torch.where(achieved < 10, 7.0, 17.0)
    assert ((achieved <= goals) & (goals <= last)).all()
    torch.testing.assert_close(sample["next", "reward"], reward_after_the_action(sample))
    # Each step of a slice has its own goal: the goal a recurrent or n-step learner
    # conditions on changes along the slice.
    slices = goals.reshape(-1, SLICE_LEN)
    assert (slices != slices[:, :1]).any()


def test_her_ratio_splits_the_flat_batch_so_a_slice_can_mix_goals() -> None:
    buffer = her_buffer("future", her_ratio=0.8, sampler=slice_sampler())
    buffer.extend(episode(0, 8))
    goals = buffer.sample(8 * SLICE_LEN)["desired_goal"].flatten()
    # The first int(32 * 0.8) = 25 rows are relabelled: slice 6 (rows 24-27) is split.
    assert (goals[:25] != UNREACHED).all()
    assert goals[25:].tolist() == [UNREACHED] * 7
