"""Stops that save in seconds, whatever the evaluation costs: a signal during a slow
evaluation saves at the iteration it came in, with the evaluation owed to the resume; a
signal that lands inside library code stops the run as anywhere else; an evaluation's
fault saves the training first; a second Ctrl-C during a save waits for it; checkpoints
come on their own cadence too."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from gymnasium.envs.classic_control.pendulum import PendulumEnv

from rl_app import interrupts
from rl_app.checkpointing import checkpoint_candidates, recorded_best
from rl_app.checks import load_config
from rl_app.config import Config
from rl_app.interrupts import Abandoned, StopRequest
from rl_app.logger import EVAL_KEY, read_metrics
from rl_app.loop import RunFailed
from rl_app.run import ERROR_LOG, train
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

VIDEO = ("eval.video=true", "logger.backend=csv")
# Points inside library code where a signal comes, each reached by the run's first
# evaluation (at 400 frames) or the save after it: the library's function it is sent from
# (its owner and name), the project's function that calls it (directly or not), and the
# settings that make the run reach it. "policy construction" is where a stop once failed
# the run: TorchRL's MLP -> create_on_device -> inspect.getfullargspec, whose
# ``except Exception`` turned what the signal raised into TypeError('unsupported callable').
SIGNAL_POINTS: dict[str, tuple[Any, str, str, tuple[str, ...]]] = {
    "policy construction": (inspect, "_signature_from_callable", "evaluate", ()),
    "env construction": (PendulumEnv, "__init__", "episode_env", ()),
    "env step": (PendulumEnv, "step", "play_episodes", ()),
    "video frame": (PendulumEnv, "render", "record_evaluation_video", VIDEO),
    "checkpoint save": (torch, "save", "save_checkpoint", ()),
}


def called_from(function: str) -> bool:
    """Whether the caller runs below a call of ``rl_app``'s function ``function``."""
    frame = inspect.currentframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == function and f"{os.sep}rl_app{os.sep}" in code.co_filename:
            return True
        frame = frame.f_back
    return False


def once_inside(
    monkeypatch: pytest.MonkeyPatch,
    owner: Any,
    name: str,
    within: str,
    action: Callable[[], None],
) -> None:
    """Run ``action`` inside ``owner.name`` (before its own work), the first time it is
    called below ``rl_app``'s function ``within``."""
    original = getattr(owner, name)
    done = False

    def hooked(*args: Any, **kwargs: Any) -> Any:
        nonlocal done
        if not done and called_from(within):
            done = True
            action()
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, hooked)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple]:
    """``uninterrupted(*overrides)``: the tiny run trained without a stop (once per module
    and overrides)."""
    runs: dict[tuple[str, ...], tuple] = {}

    def run(*overrides: str) -> tuple:
        if overrides not in runs:
            run_dir = tmp_path_factory.mktemp("uninterrupted")
            runs[overrides] = train_in_process(
                load_config("default", [*TINY_RUN, f"run_dir={run_dir}", *overrides])
            )
        return runs[overrides]

    return run


def resume_and_compare(config: Config, alone: tuple) -> None:
    """Resuming ``config``'s run gives the run trained without a stop, every evaluation
    logged once (a resume that owes nothing)."""
    resumed = resume_in_process(config)
    assert_same_run(alone, resumed)
    assert [row["frames"] for row in resumed[2] if EVAL_KEY in row] == [400, 800, 1200]


@pytest.mark.parametrize("point", SIGNAL_POINTS)
def test_a_stop_landing_inside_library_code_saves_and_the_resume_owes_nothing(
    point: str,
    tiny_config,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    uninterrupted,
    request: pytest.FixtureRequest,
) -> None:
    owner, name, within, overrides = SIGNAL_POINTS[point]
    if overrides == VIDEO:
        request.getfixturevalue("mp4")  # skipped where no MP4 can be written
    once_inside(monkeypatch, owner, name, within, lambda: signal.raise_signal(signal.SIGTERM))
    config = tiny_config(*overrides, run_dir=tmp_path / "stopped")
    result = train(config)
    monkeypatch.undo()
    assert result.stopped_by == "SIGTERM" and result.frames == 400
    (checkpoint,) = checkpoint_candidates(tmp_path / "stopped" / "checkpoints")
    assert checkpoint.name == "checkpoint-000000000400"
    # Inside the evaluation, it is owed; inside the save after it, it was made.
    owed = saved_progress(checkpoint).owed_eval
    assert (owed is None) == (point == "checkpoint save")
    resume_and_compare(config, uninterrupted(*overrides))


def test_an_evaluation_fault_saves_the_training_and_the_resume_owes_nothing(
    tiny_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uninterrupted
) -> None:
    def fault() -> None:
        raise RuntimeError("the evaluation env broke")

    once_inside(monkeypatch, PendulumEnv, "step", "play_episodes", fault)
    config = tiny_config(run_dir=tmp_path / "faulty")
    with pytest.raises(RunFailed) as failure:
        train(config)
    monkeypatch.undo()
    message = str(failure.value)
    checkpoint = tmp_path / "faulty" / "checkpoints" / "checkpoint-000000000400"
    assert message.startswith(
        "training stopped while evaluating at iteration 2 (400 frames): "
        "RuntimeError: the evaluation env broke\n"
        f"last good checkpoint: {checkpoint} (the evaluation runs first when it resumes)"
    )
    assert "the evaluation env broke" in (tmp_path / "faulty" / ERROR_LOG).read_text()
    assert saved_progress(checkpoint).owed_eval["iteration"] == 2
    assert [row["frames"] for row in read_metrics(tmp_path / "faulty")] == [200]
    resume_and_compare(config, uninterrupted())


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


def test_a_second_ctrl_c_turned_into_another_error_by_library_code_stops_as_one() -> None:
    # The run's own test: tests/test_resume.py::test_a_second_ctrl_c_stops_at_once_...
    stop = StopRequest()
    with pytest.raises(KeyboardInterrupt) as raised:
        with stop.installed():
            signal.raise_signal(signal.SIGINT)
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:  # as tensordict did, inside an update
                raise RuntimeError("Converting a tensordict to boolean value") from None
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_a_second_ctrl_c_while_the_first_is_being_said_stops_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said: list[str] = []

    def say_and_get_another(message: str) -> None:
        said.append(message)
        if len(said) == 1:  # the second lands inside the first one's handler
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(interrupts, "say", say_and_get_another)
    with pytest.raises(KeyboardInterrupt):
        with StopRequest().installed():
            signal.raise_signal(signal.SIGINT)
    assert said[0].startswith("SIGINT: saving a checkpoint, then stopping")
    assert said[1].startswith("second Ctrl-C: stopping now")


def test_a_signal_drops_abandonable_work_at_its_next_abandon_point() -> None:
    stop = StopRequest()
    with stop.installed():
        with pytest.raises(Abandoned):
            with stop.abandonable():
                stop.abandon_point()  # no stop yet: goes on
                signal.raise_signal(signal.SIGTERM)  # the handler raises nothing
                steps_after_the_signal = 1
                stop.abandon_point()
                raise AssertionError("not reached: the abandon point raises")
        assert steps_after_the_signal == 1
        with pytest.raises(Abandoned):  # a stop asked for before it begins
            with stop.abandonable():
                raise AssertionError("not reached")
        with stop.allowing(), stop.abandonable():  # allowed despite the stop: only a new
            stop.abandon_point()  # signal drops it
            signal.raise_signal(signal.SIGUSR2)
            with pytest.raises(Abandoned):
                stop.abandon_point()
    assert stop.reason == "SIGUSR2"


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
