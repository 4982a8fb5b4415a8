"""``replay.prefetch``: each batch of an iteration drawn in a background thread while the
update before it runs, with the draws it would have had at once (the same learning up to
float rounding), on a real run."""

from __future__ import annotations

import threading

import torch

from rl_app.loop import run_iterations, updates_per_iteration
from rl_app.run import build_run
from tests.helpers import train_in_process


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
