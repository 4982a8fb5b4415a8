"""Atari on real ALE frames: the replay buffer stores each frame once, and the stacks it
rebuilds at sample time are the env's own CatFrames stacks, bit for bit."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rl_app.algorithms import make_algorithm
from rl_app.config import ConfigError, ReplayConfig
from rl_app.envs import LIFE_LOST, PIXELS_KEY, make_env
from rl_app.logger import read_metrics
from rl_app.replay import (
    LOSS_MASK_KEY,
    TRAJECTORY_KEY,
    allocate_storage,
    make_replay_buffer,
    stored_transition,
)
from rl_app.replay.frames import (
    RESET_STEP,
    STEP_KEY,
    random_shift,
    reset_trajectory,
    stack_frames,
)
from rl_app.replay.nstep import NStepTransitions
from tests.helpers import TINY_RUN, random_play_batches, run_train
from tools import dead_units
from tools.bench.update import as_before, gather_shift

GAME = "BreakoutNoFrameskip-v4"
# Random Breakout games last about 150-250 steps: capped at 160, some end (terminated) and
# some are cut (truncated), a few per thousand frames.
EPISODE_CAP = 160
FRAMES = 1_600
FRAMES_PER_BATCH = 200
SLICE_LEN = 4
# What a stored transition may take on disk: a frame is 7,056 bytes.
MAX_BYTES_PER_TRANSITION = 7_680


@pytest.fixture(scope="module")
def play() -> list[TensorDict]:
    return random_play_batches(GAME, FRAMES, FRAMES_PER_BATCH, max_episode_steps=EPISODE_CAP)


@pytest.fixture
def atari_config(tiny_config):
    return tiny_config(
        f"env.max_episode_steps={EPISODE_CAP}",
        f"replay.slice_len={SLICE_LEN}",
        "optim.batch_size=32",
        preset="dqn_atari",
    )


def stored_buffer(
    config, play: list[TensorDict], capacity: int, directory: Path, nstep_gamma: float | None = None
):
    """A buffer of ``capacity`` filled with ``play`` as the loop fills it, batch by batch
    (sampling n-step transitions discounted by ``nstep_gamma`` if given)."""
    replay = ReplayConfig(capacity=capacity, sampler="prioritized_slice", slice_len=SLICE_LEN)
    env = make_env(config.env, config.seed)
    keys = make_algorithm(config, env, torch.device("cpu")).replay_keys()
    buffer = make_replay_buffer(replay, directory, seed=0, keys=keys, nstep_gamma=nstep_gamma)
    allocate_storage(buffer, stored_transition(env, keys))
    for batch in play:
        buffer.extend(batch)
    return buffer


def step_keys(steps: TensorDict) -> list[tuple[int, int]]:
    """(trajectory, step in the episode) of each of ``steps``, in order."""
    steps = steps.reshape(-1)
    trajectories, numbers = steps[TRAJECTORY_KEY].tolist(), steps[STEP_KEY].reshape(-1).tolist()
    return list(zip(trajectories, numbers, strict=True))


def env_stacks(play: list[TensorDict]) -> dict[tuple[int, int], tuple[torch.Tensor, ...]]:
    """The env's CatFrames stacks (observation, next observation) of each (trajectory, step)."""
    steps = torch.cat(play)
    pairs = zip(steps[PIXELS_KEY], steps["next", PIXELS_KEY], strict=True)
    return dict(zip(step_keys(steps), pairs, strict=True))


def assert_env_stacks(sample: TensorDict, stacks: dict) -> None:
    steps = sample.reshape(-1)
    for row, key in enumerate(step_keys(steps)):
        observation, next_observation = stacks[key]
        assert torch.equal(steps[PIXELS_KEY][row], observation), f"observation of {key}"
        assert torch.equal(steps["next", PIXELS_KEY][row], next_observation), f"next of {key}"


def every_step(buffer) -> TensorDict:
    """Every stored step (reset slots aside), as a sample."""
    stored = buffer.storage.get(torch.arange(len(buffer)))
    return stored[stored[STEP_KEY].squeeze(-1) != RESET_STEP]


def test_rebuilt_stacks_are_the_env_stacks_bit_for_bit(
    play: list[TensorDict], atari_config, tmp_path: Path
) -> None:
    steps = torch.cat(play)
    assert steps["next", "terminated"].any() and steps["next", "truncated"].any()
    assert (steps[STEP_KEY] == 0).sum() >= 8  # episodes start in several batches
    stacks = env_stacks(play)
    buffer = stored_buffer(atari_config, play, capacity=4_096, directory=tmp_path)
    assert len(buffer) == FRAMES + int((steps[STEP_KEY] == 0).sum())  # one reset slot each

    # Every stored step, episode starts and ends included.
    everything = stack_frames(buffer.storage, every_step(buffer))
    assert len(everything) == FRAMES and everything[LOSS_MASK_KEY].all()
    assert_env_stacks(everything, stacks)

    # As the loop samples: prioritized slices of four steps, their stacks rebuilt.
    sampled = torch.cat(buffer.sample_batches(32, 200))
    assert sampled.shape == (200 * 32 // SLICE_LEN, SLICE_LEN)
    assert sampled[LOSS_MASK_KEY].all()
    assert not (sampled[STEP_KEY] == RESET_STEP).any()  # reset slots are never drawn
    assert (sampled[STEP_KEY] == 0).any() and sampled["next", "done"].any()
    assert_env_stacks(sampled, stacks)


def test_an_n_step_transition_has_its_first_steps_stack_and_the_one_after_its_slice(
    play: list[TensorDict], atari_config, tmp_path: Path
) -> None:
    steps = torch.cat(play)
    stacks = env_stacks(play)
    by_step = dict(zip(step_keys(steps), steps["next"].unbind(0), strict=True))
    buffer = stored_buffer(atari_config, play, 4_096, tmp_path, nstep_gamma=0.9)
    transitions = torch.cat(buffer.sample_batches(32, 20))
    assert transitions.shape == (32 * 20,) and transitions[LOSS_MASK_KEY].all()
    assert (transitions["steps_to_next_obs"] == SLICE_LEN).all()
    assert transitions["next", "terminated"].any()  # slices ending an episode were drawn
    for row, (trajectory, first) in enumerate(step_keys(transitions)):
        slice_steps = [by_step[trajectory, first + k] for k in range(SLICE_LEN)]
        expected = sum(0.9**k * step["reward"] for k, step in enumerate(slice_steps))
        transition = transitions[row]
        assert torch.equal(transition[PIXELS_KEY], stacks[trajectory, first][0])
        assert torch.equal(
            transition["next", PIXELS_KEY], stacks[trajectory, first + SLICE_LEN - 1][1]
        )
        assert torch.allclose(transition["next", "reward"], expected)
        assert transition["next", "terminated"] == slice_steps[-1]["terminated"]


@pytest.fixture(scope="module")
def play_losing_lives() -> list[TensorDict]:
    return random_play_batches(
        GAME, FRAMES, FRAMES_PER_BATCH, max_episode_steps=EPISODE_CAP, life_loss_terminal=True
    )


def test_a_game_says_which_steps_lost_a_life_and_plays_on_after_them(
    play_losing_lives: list[TensorDict],
) -> None:
    steps = torch.cat(play_losing_lives)
    lost = steps["next", LIFE_LOST].reshape(-1)
    over = steps["next", "terminated"].reshape(-1)
    assert over.any()
    for trajectory in steps[TRAJECTORY_KEY][over].tolist():
        game = steps[TRAJECTORY_KEY] == trajectory
        assert lost[game].sum() == 5 and lost[game][-1]  # Breakout's 5 lives; the last ends it
    # A life lost before the last neither terminates nor ends the episode: the game goes on.
    assert (lost & ~over).any()
    assert not steps["next", "done"].reshape(-1)[lost & ~over].any()


def test_an_n_step_transition_ends_at_the_first_life_its_slice_lost(
    play_losing_lives: list[TensorDict], tiny_config, tmp_path: Path
) -> None:
    config = tiny_config(
        f"env.max_episode_steps={EPISODE_CAP}",
        f"replay.slice_len={SLICE_LEN}",
        "optim.target=nstep_transition",
        "env.life_loss_terminal=true",
        preset="dqn_atari",
    )
    steps = torch.cat(play_losing_lives)
    stacks = env_stacks(play_losing_lives)
    by_step = dict(zip(step_keys(steps), steps["next"].unbind(0), strict=True))
    buffer = stored_buffer(config, play_losing_lives, 4_096, tmp_path, nstep_gamma=0.9)
    transitions = torch.cat(buffer.sample_batches(32, 20))
    assert transitions[LOSS_MASK_KEY].all()
    cut = 0
    for row, (trajectory, first) in enumerate(step_keys(transitions)):
        slice_steps = [by_step[trajectory, first + k] for k in range(SLICE_LEN)]
        last = next((k for k, step in enumerate(slice_steps) if step[LIFE_LOST]), SLICE_LEN - 1)
        cut += last < SLICE_LEN - 1
        kept = slice_steps[: last + 1]
        transition = transitions[row]
        assert torch.equal(transition[PIXELS_KEY], stacks[trajectory, first][0])
        assert torch.equal(transition["next", PIXELS_KEY], stacks[trajectory, first + last][1])
        expected = sum(0.9**k * step["reward"] for k, step in enumerate(kept))
        assert torch.allclose(transition["next", "reward"], expected)
        # No bootstrap past a lost life; where none was lost, as without the setting.
        ended = slice_steps[last]["terminated"] | slice_steps[last][LIFE_LOST]
        assert transition["next", "terminated"] == ended
        assert transition["steps_to_next_obs"] == last + 1
    assert cut > 0  # slices with a lost life inside were drawn


def test_stacks_reaching_overwritten_slots_are_masked_and_the_rest_exact(
    play: list[TensorDict], atari_config, tmp_path: Path
) -> None:
    buffer = stored_buffer(atari_config, play, capacity=700, directory=tmp_path)
    stored = buffer.storage.get(torch.arange(len(buffer)))
    frames_held = set(step_keys(stored))  # whose next frame each slot holds
    everything = stack_frames(buffer.storage, every_step(buffer))

    def whole(trajectory: int, step: int) -> bool:
        # Frame p of an episode is held by step p - 1's slot, p = 0 by its reset slot.
        needed = range(max(0, step - 3), step + 2)
        reset = reset_trajectory(torch.tensor(trajectory)).item()
        return all(
            (trajectory, p - 1) in frames_held if p > 0 else (reset, RESET_STEP) in frames_held
            for p in needed
        )

    expected = torch.tensor([whole(*key) for key in step_keys(everything)])
    assert torch.equal(everything[LOSS_MASK_KEY], expected)
    assert 0 < (~expected).sum() <= 4  # the oldest trajectory's first surviving steps
    assert_env_stacks(everything[expected], env_stacks(play))


def test_masked_steps_do_not_reach_the_loss(
    play: list[TensorDict], atari_config, tmp_path: Path
) -> None:
    env = make_env(atari_config.env, atari_config.seed)
    algorithm = make_algorithm(atari_config, env, torch.device("cpu"))
    buffer = stored_buffer(atari_config, play, capacity=4_096, directory=tmp_path)
    batch = buffer.sample_batches(32, 1)[0]
    batch[LOSS_MASK_KEY][:, 0] = False  # as if each slice's first stacks were lost

    def loss(sample: TensorDict) -> torch.Tensor:
        with torch.no_grad():
            return algorithm.loss(sample.clone())["loss"]

    scrambled = batch.clone()
    for key in (PIXELS_KEY, ("next", PIXELS_KEY)):
        scrambled[key][:, 0] = torch.randint(0, 256, scrambled[key][:, 0].shape).to(torch.uint8)
    assert loss(scrambled) == loss(batch)
    batch[LOSS_MASK_KEY][:, 0] = True
    assert loss(scrambled) != loss(batch)


def test_a_stored_transition_takes_at_most_7_5_kb_on_disk(
    play: list[TensorDict], atari_config, tmp_path: Path
) -> None:
    capacity = 1_000  # filled, and wrapped around
    buffer = stored_buffer(atari_config, play, capacity=capacity, directory=tmp_path)
    files = list(tmp_path.rglob("*.memmap"))
    on_disk = sum(file.stat().st_blocks * 512 for file in files)
    apparent = sum(file.stat().st_size for file in files)
    assert len(buffer) == capacity
    assert apparent / capacity <= MAX_BYTES_PER_TRANSITION, apparent / capacity
    assert on_disk / capacity <= MAX_BYTES_PER_TRANSITION, on_disk / capacity


def test_the_learner_sees_the_sign_of_rewards_and_episodes_return_the_score() -> None:
    # Space Invaders scores 5 to 30 points per invader: random play hits a few in 300 steps.
    (steps,) = random_play_batches("SpaceInvadersNoFrameskip-v4", 300, 300)
    rewards = steps["next", "reward"]
    assert set(rewards.unique().tolist()) == {0.0, 1.0}
    score = steps["next", "episode_reward"][-1].item()
    assert score > rewards.sum().item() > 0


def test_random_shift_moves_each_image_within_the_pad_and_both_stacks_independently(
    play: list[TensorDict], tiny_config
) -> None:
    config = tiny_config(f"replay.slice_len={SLICE_LEN}", "dqn.random_shift=4", preset="dqn_atari")
    algorithm = make_algorithm(config, make_env(config.env, config.seed), torch.device("cpu"))
    batch = torch.cat(play)[:32].select(*algorithm.loss.in_keys).reshape(8, SLICE_LEN)
    original = batch.clone()
    algorithm.update(batch)  # shifts the batch's stacks in place, then learns from them

    def shifts(before: torch.Tensor, after: torch.Tensor) -> set[tuple[int, int]]:
        """The shifts within +-4 that take ``before`` (all its channels) to ``after``."""
        rows, columns = torch.arange(84), torch.arange(84)
        return {
            (dy, dx)
            for dy, dx in itertools.product(range(-4, 5), repeat=2)
            if torch.equal(
                before[:, (rows + dy).clamp(0, 83)][:, :, (columns + dx).clamp(0, 83)], after
            )
        }

    different = 0
    for before, after in zip(original.reshape(-1), batch.reshape(-1), strict=True):
        observation = shifts(before[PIXELS_KEY], after[PIXELS_KEY])
        next_observation = shifts(before["next", PIXELS_KEY], after["next", PIXELS_KEY])
        assert observation and next_observation, "a shift beyond 4 pixels, or a changed image"
        different += not observation & next_observation
    assert different > 16  # drawn independently: 1 chance in 81 of the same shift


def test_random_shift_replicates_the_edges() -> None:
    image = torch.arange(16, dtype=torch.uint8).reshape(1, 1, 4, 4)
    shifted = {tuple(random_shift(image, 1).flatten().tolist()) for _ in range(200)}
    assert len(shifted) == 9  # every shift of -1, 0, 1 in each direction
    assert (0, 0, 1, 2, 0, 0, 1, 2, 4, 4, 5, 6, 8, 8, 9, 10) in shifted  # down-right by one


@pytest.mark.parametrize(
    ("shape", "pad"),
    [((8, 4, 4, 84, 84), 4), ((1, 1, 4, 4), 1), ((5, 2, 7, 9), 3), ((2, 3, 1, 6, 6), 6)],
)
def test_random_shift_gives_the_pixels_of_the_per_pixel_gather(
    shape: tuple[int, ...], pad: int
) -> None:
    # gather_shift is the shift as it was (a gather per pixel): the same shifts drawn must
    # give the same pixels, for every batch shape and pad.
    pixels = torch.randint(0, 256, shape, dtype=torch.uint8)
    with torch.random.fork_rng():
        torch.manual_seed(7)
        expected = gather_shift(pixels, pad)
        torch.manual_seed(7)
        assert torch.equal(random_shift(pixels, pad), expected)


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_nature_cnn_update_takes_the_steps_it_took_before(
    play: list[TensorDict], tiny_config, channels_last: bool
) -> None:
    # The Atari-100k update (random shifts, n-step transitions, a dueling head, a target
    # copy after every update) against the update as it was: the gather shift and double
    # DQN's pick of the next action by the online network, contiguous convolutions. The pick
    # is the target's own (target and online network are equal at each update): the same
    # steps to the bit; channels-last convolutions sum in another order: the same up to
    # float rounding.
    settings = ["env.name=BreakoutNoFrameskip-v4", f"replay.slice_len={SLICE_LEN}"]
    config = tiny_config(*settings, f"dqn.channels_last={channels_last}", preset="dqn_atari100k")
    before_config = tiny_config(*settings, "dqn.channels_last=false", preset="dqn_atari100k")
    env = make_env(config.env, config.seed)
    torch.manual_seed(0)
    algorithm = make_algorithm(config, env, torch.device("cpu"))
    torch.manual_seed(0)
    before = make_algorithm(before_config, env, torch.device("cpu"))
    before_update = as_before(before, config.dqn.random_shift)
    # The preset's batches: n-step transitions, one per slice of SLICE_LEN played steps.
    transitions = NStepTransitions(config.optim.gamma, SLICE_LEN)
    steps = transitions(torch.cat(play)[: 3 * 8 * SLICE_LEN])
    exact = {"rtol": 0, "atol": 0} if not channels_last else {"rtol": 1e-4, "atol": 1e-6}
    for batch in steps.select(*algorithm.loss.in_keys, "steps_to_next_obs").reshape(3, 8):
        with torch.random.fork_rng():
            metrics = algorithm.update(batch.clone())
        expected = before_update(batch.clone())
        torch.testing.assert_close(metrics["loss"], expected["loss"], **exact)
        for (name, parameter), reference in zip(
            algorithm.loss.named_parameters(), before.loss.parameters(), strict=True
        ):
            torch.testing.assert_close(parameter.grad, reference.grad, **exact, msg=name)
            torch.testing.assert_close(parameter, reference, **exact, msg=name)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["replay.sampler=uniform", "optim.target=td0"], "replay.sampler"),
        (["replay.slice_len=1"], "replay.slice_len"),
        (["env.name=CartPole-v1"], "dqn.random_shift"),
        (["env.name=CartPole-v1", "dqn.random_shift=0", "dqn.dueling=true"], "dqn.dueling"),
        (["env.life_loss_terminal=true"], "env.life_loss_terminal=true needs optim.target="),
        (
            ["env.name=CartPole-v1", "dqn.random_shift=0", "env.life_loss_terminal=true"],
            "env.life_loss_terminal=true needs an Atari game: CartPole-v1 has no lives",
        ),
    ],
)
def test_atari_settings_are_checked(tiny_config, overrides: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        tiny_config("dqn.random_shift=4", *overrides, preset="dqn_atari")


@pytest.mark.parametrize(
    "overrides",
    [[], ["optim.target=nstep_transition", "env.life_loss_terminal=true"]],
    ids=["preset", "life_loss_terminal"],
)
def test_the_atari_preset_trains_end_to_end_on_the_cpu(
    overrides: list[str], tmp_path: Path, capsys
) -> None:
    run_dir = tmp_path / "run"
    result = run_train(
        tmp_path,
        "--config",
        "dqn_atari",
        *TINY_RUN,
        *overrides,
        f"run_dir={run_dir}",
        "device=cpu",
        "collector.total_frames=2000",
        "collector.init_random_frames=1000",
        "optim.utd_ratio=0.01",  # 2 updates per batch of 200 frames from 1,000 frames: 12
        "optim.batch_size=8",
        "replay.capacity=3000",
        "eval.interval_frames=2000",
        "eval.episodes=1",
        f"env.max_episode_steps={EPISODE_CAP}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert rows[-1]["frames"] == 2000 and rows[-1]["updates"] == 12
    assert any("train/loss" in row for row in rows)
    assert "eval/return" in rows[-1]
    assert list((run_dir / "checkpoints").glob("checkpoint-*"))
    # With the setting, each stored step says whether it lost a life.
    assert (run_dir / "replay" / "next" / "life_lost.memmap").exists() == bool(overrides)
    # Its network read by the dead-unit tool: 3 convolutions and the hidden layer.
    assert dead_units.main([str(run_dir), "--steps", "20"]) == 0
    report = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[1].split(" units")[0] for line in report[:4]] == [
        "32",
        "64",
        "64",
        "512",
    ]
    assert report[4].startswith("Q-values: standard deviation across observations")
