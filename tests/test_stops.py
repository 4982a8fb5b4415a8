"""Stops that save in seconds, whatever the evaluation costs: a signal during a slow
evaluation saves at the iteration it came in, with the evaluation owed to the resume; a
second Ctrl-C during a save waits for it; checkpoints come on their own cadence too."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from rl_app.checkpointing import checkpoint_candidates, recorded_best
from rl_app.interrupts import Abandoned, StopRequest
from rl_app.logger import EVAL_KEY, read_metrics
from rl_app.run import train
from tests.helpers import (
    PYTHON,
    TINY_RUN,
    TRAIN_PY,
    assert_same_run,
    resume_in_process,
    saved_progress,
    strip_wall_time,
    train_in_process,
    wait_for,
)
from tests.slow_eval_envs import (
    SLOW_EVAL,
    SLOW_STEP_S,
    STEP_SECONDS_VARIABLE,
    USR2_AT_STEP_VARIABLE,
    SlowEvalPendulum,
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2], ids=["SIGTERM", "SIGUSR2"])
def test_a_stop_during_a_slow_evaluation_saves_at_once_and_the_resume_owes_nothing(
    signum: signal.Signals, tiny_config, tmp_path: Path
) -> None:
    run_dir = tmp_path / "stopped"
    process = subprocess.Popen(
        [PYTHON, str(TRAIN_PY), *TINY_RUN, *SLOW_EVAL, f"run_dir={run_dir}"],
        env={**os.environ, STEP_SECONDS_VARIABLE: SLOW_STEP_S},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Iteration 1 is logged: the signal comes in iteration 2 (400 frames), whose
    # evaluation is due; in its 20 s evaluation, or just before it.
    wait_for("the first iteration", lambda: read_metrics(run_dir), 60)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert f"stopped by {signum.name} at 400 frames" in stdout
    assert "no evaluation yet" in stdout  # not a best return of -inf

    (checkpoint,) = checkpoint_candidates(run_dir / "checkpoints")
    assert checkpoint.name == "checkpoint-000000000400"  # the iteration the signal came in
    progress = saved_progress(checkpoint)
    assert progress.frames == 400 and progress.evaluations == 0
    # The evaluation is owed, with the row of its iteration, which waits for it.
    assert progress.owed_eval is not None and progress.owed_eval["iteration"] == 2
    assert [row["frames"] for row in read_metrics(run_dir)] == [200]
    assert recorded_best(run_dir / "checkpoints") is None  # no evaluation yet

    alone = train_in_process(tiny_config(*SLOW_EVAL, run_dir=tmp_path / "alone"))
    resumed = resume_in_process(tiny_config(*SLOW_EVAL, run_dir=run_dir))
    assert_same_run(alone, resumed)  # the owed evaluation's row included
    assert [row["frames"] for row in resumed[2] if EVAL_KEY in row] == [400, 800, 1200]


@pytest.mark.parametrize("grace_s", [60.0, 0.0], ids=["fits", "does_not_fit"])
def test_a_usr2_stop_runs_the_evaluation_it_owes_if_it_fits_the_grace_time(
    grace_s: float, tiny_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # USR2 comes in the second evaluation (2 episodes of 200 steps each), at 400 frames.
    monkeypatch.setenv(USR2_AT_STEP_VARIABLE, "410")
    monkeypatch.setattr(SlowEvalPendulum, "evaluation_steps", 0)
    run_dir = tmp_path / "run"
    result = train(
        tiny_config(*SLOW_EVAL, "eval.interval_frames=200", run_dir=run_dir), 0.0, None, grace_s
    )
    assert result.stopped_by == "SIGUSR2" and result.frames == 400

    (checkpoint, *_) = checkpoint_candidates(run_dir / "checkpoints")
    progress = saved_progress(checkpoint)
    assert checkpoint.name == "checkpoint-000000000400"
    rows = read_metrics(run_dir)
    if grace_s:  # the first evaluation's time, and a save, fit 60 s: it ran after the save
        assert progress.owed_eval is None and progress.evaluations == 2
        assert [row["frames"] for row in rows if EVAL_KEY in row] == [200, 400]
    else:  # owed to the resume, with its iteration's row
        assert progress.owed_eval is not None and progress.evaluations == 1
        assert [row["frames"] for row in rows] == [200]


def test_a_second_ctrl_c_during_a_save_waits_for_it_and_stops_at_once_otherwise(
    capfd: pytest.CaptureFixture,
) -> None:
    stop = StopRequest(unsaved=lambda: "the 600 frames since checkpoint-000000000400")
    with stop.installed():
        signal.raise_signal(signal.SIGINT)
        assert stop.reason == "SIGINT"
        saved = False
        with pytest.raises(KeyboardInterrupt):
            with stop.saving():
                signal.raise_signal(signal.SIGINT)
                saved = True  # the save goes on to its end
        assert saved
        assert "stopping once the checkpoint is saved" in capfd.readouterr().err

        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert "lost: the 600 frames since checkpoint-000000000400" in capfd.readouterr().err


def test_a_signal_drops_abandonable_work_at_once() -> None:
    stop = StopRequest()
    with stop.installed():
        with pytest.raises(Abandoned):
            with stop.abandonable():
                signal.raise_signal(signal.SIGTERM)
                raise AssertionError("not reached: the signal raises")
        with pytest.raises(Abandoned):  # a stop asked for before it begins
            with stop.abandonable():
                raise AssertionError("not reached")
    assert stop.reason == "SIGTERM"


def test_a_run_that_evaluates_only_at_its_end_has_checkpoints_along_the_way(
    tiny_config, tmp_path: Path
) -> None:
    at_the_end = ["eval.interval_frames=1200", "checkpoint.keep_last=3"]
    every_iteration = tiny_config(
        *at_the_end, "checkpoint.interval_minutes=0", run_dir=tmp_path / "a"
    )
    rarely = tiny_config(*at_the_end, "checkpoint.interval_minutes=600", run_dir=tmp_path / "b")
    saved = train_in_process(every_iteration)
    unsaved = train_in_process(rarely)

    checkpoints = tmp_path / "a" / "checkpoints"
    names = [path.name for path in checkpoint_candidates(checkpoints)]
    assert names == [f"checkpoint-{frames:012d}" for frames in (1200, 1000, 800)]
    assert saved_progress(checkpoints / names[1]).evaluations == 0
    assert recorded_best(checkpoints).name == names[0]  # the one evaluated
    assert [p.name for p in checkpoint_candidates(tmp_path / "b" / "checkpoints")] == names[:1]
    # Saving more often changes nothing a run learns or logs.
    for key in saved[0]:
        assert torch.equal(saved[0][key], unsaved[0][key]), key
    assert (saved[1] == unsaved[1]).all()
    assert [strip_wall_time(row) for row in saved[2]] == [
        strip_wall_time(row) for row in unsaved[2]
    ]
