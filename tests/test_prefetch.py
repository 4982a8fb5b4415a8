"""``replay.prefetch``: each batch of an iteration drawn in a background thread while the
update before it runs, with the draws it would have had at once (the same learning up to
float rounding), on a real run."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from rl_app.checks import load_config
from rl_app.config import ConfigError
from rl_app.loop import run_iterations, updates_per_iteration
from rl_app.run import build_run
from rl_app.upstream.torchrl import replay_generator
from tests.helpers import TINY_RUN, train_in_process


def test_each_batch_is_drawn_in_the_background_while_the_update_before_it_runs(
    tiny_config,
) -> None:
    run = build_run(tiny_config("replay.prefetch=true", "collector.total_frames=800"))
    per_iteration = updates_per_iteration(run.config)
    draws: list[str] = []  # the thread of each draw, as it starts
    updates: list[bool] = []  # whether the next draw had started during each update
    changed = threading.Condition()
    sample_batches, update = run.buffer.sample_batches, run.algorithm.update

    def drawing(batch_size: int, count: int):
        with changed:
            draws.append(threading.current_thread().name)
            changed.notify_all()
        return sample_batches(batch_size, count)

    def updating(batch):
        with changed:
            started = len(updates) + 1
            last_of_iteration = started % per_iteration == 0
            # Waits on the condition itself: no draw comes when prefetching is off.
            overlapped = last_of_iteration or changed.wait_for(lambda: len(draws) > started, 60)
            updates.append(overlapped)
        return update(batch)

    run.buffer.sample_batches, run.algorithm.update = drawing, updating
    try:
        run_iterations(run)
    finally:
        run.close()
    assert len(updates) == 3 * per_iteration and all(updates)  # 3 iterations update
    assert len(draws) == len(updates)  # one batch a draw
    assert {name.rsplit("_", 1)[0] for name in draws} == {"rl_app-sampling"}


def test_prefetching_learns_what_drawing_at_once_learns(tiny_config, tmp_path) -> None:
    at_once = train_in_process(tiny_config(run_dir=tmp_path / "at_once"))
    ahead = train_in_process(tiny_config("replay.prefetch=true", run_dir=tmp_path / "ahead"))
    for key, value in at_once[0].items():  # networks, optimizer: float rounding apart
        torch.testing.assert_close(ahead[0][key], value, msg=key)
    torch.testing.assert_close(ahead[1]["observation"], at_once[1]["observation"])
    assert [row["frames"] for row in ahead[2]] == [row["frames"] for row in at_once[2]]


@pytest.mark.parametrize(
    ("sampler", "same"),
    [("prioritized_slice", True), ("prioritized", True), ("uniform", True), ("slice", False)],
)
def test_one_draw_per_batch_draws_what_one_draw_per_iteration_does_but_slices(
    sampler: str, same: bool, tiny_config
) -> None:
    """From the same buffer and generator: three batches drawn one call each are the three
    drawn in one call, but for TorchRL's slice sampler (starts, then offsets, each call).
    Neither touches torch's global generator, which the update draws from."""
    run = build_run(tiny_config(f"replay.sampler={sampler}", "collector.total_frames=400"))
    try:
        run_iterations(run)
        generator = replay_generator(run.buffer)
        drawn_from, global_state = generator.get_state(), torch.get_rng_state()
        at_once = run.buffer.sample_batches(64, 3)
        generator.set_state(drawn_from)
        one_by_one = [run.buffer.sample_batches(64, 1)[0] for _ in range(3)]
        assert torch.equal(torch.get_rng_state(), global_state)
    finally:
        run.close()
    indices = [(a["index"], b["index"]) for a, b in zip(at_once, one_by_one, strict=True)]
    assert all(torch.equal(a, b) for a, b in indices) == same


def test_prefetching_with_hindsight_relabelling_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    with pytest.raises(
        ConfigError, match=r"replay\.prefetch=true is not accepted with replay\.her"
    ):
        load_config("dqn_bitflip", [*TINY_RUN, "replay.prefetch=true", f"run_dir={tmp_path}"])
    assert list(tmp_path.iterdir()) == []
