"""Evaluation in a process of its own (``eval.backend=process``) or a Ray actor
(``eval.backend=ray``): training goes on while it plays, and what is logged and saved is what
a blocking evaluation gives, across stops and kills too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest
import torch

from rl_app.algorithms import make_algorithm
from rl_app.checkpointing import (
    BEST_INDEX,
    POLICY_COMPONENT,
    checkpoint_candidates,
    checkpoint_frames,
    checkpoint_path,
    load_component,
)
from rl_app.checks import load_config
from rl_app.config import Config
from rl_app.envs import make_env
from rl_app.evaluation import evaluate
from rl_app.logger import EVAL_KEY, read_metrics
from rl_app.loop import RunFailed
from rl_app.run import train
from tests.gate_envs import EVAL_FAULT_VARIABLE, EVAL_GATE_VARIABLE, GATE_VARIABLE, GATED
from tests.helpers import PYTHON, TINY_RUN, TRAIN_PY, saved_progress, strip_wall_time, wait_for

# Six iterations of 200 frames, evaluations due at 600 and 1200: the last iteration waits
# for the first evaluation before it starts its own, so both play at the same frames as a
# blocking run's, however long they take.
EVERY_600 = ["eval.interval_frames=600"]


def logged(config: Config) -> tuple[list[dict], str]:
    """The run's metrics rows (wall time aside) and its best checkpoint's index."""
    rows = [strip_wall_time(row) for row in read_metrics(Path(config.run_dir))]
    return rows, (Path(config.run_dir) / "checkpoints" / BEST_INDEX).read_text()


def test_an_evaluation_in_its_own_process_logs_and_saves_what_a_blocking_one_does(
    tiny_config: Callable[..., Config], tmp_path: Path
) -> None:
    runs = {
        backend: tiny_config(*EVERY_600, f"eval.backend={backend}", run_dir=tmp_path / backend)
        for backend in ("blocking", "process")
    }
    for config in runs.values():
        train(config)
    assert logged(runs["process"]) == logged(runs["blocking"])
    assert [row["frames"] for row in logged(runs["process"])[0] if "eval/return" in row] == [
        600,
        1200,
    ]


# Collection and evaluation on Ray actors: one collector actor, half a CPU each.
ON_RAY = [
    "collector.mode=ray", "collector.workers=1", "ray.worker_cpus=0.5", "eval.backend=ray",
]  # fmt: skip


def assert_scores_are_those_of_the_weights_saved(config: Config, evaluated: list[int]) -> None:
    """Each evaluation row of the run (one per 200 frames, evaluations at ``evaluated``)
    holds the blocking evaluation of the weights saved at its frames, and ``best.json``
    names a checkpoint with the best. (A run collecting on Ray is not the same twice to
    the bit: its policy lag varies.)"""
    rows, best = logged(config)
    assert [row["frames"] for row in rows] == list(range(200, 1201, 200))
    scored = {row["frames"]: row[EVAL_KEY] for row in rows if EVAL_KEY in row}
    assert list(scored) == evaluated
    with closing(make_env(config.env, 0)) as env:
        algorithm = make_algorithm(config, env, torch.device("cpu"))
    checkpoints = Path(config.run_dir) / "checkpoints"
    for frames, score in scored.items():
        load_component(checkpoint_path(checkpoints, frames), POLICY_COMPONENT, algorithm.policy)
        assert evaluate(config, algorithm.policy_factory(), algorithm.policy)[EVAL_KEY] == score
    best_checkpoint = checkpoints / json.loads(best)["checkpoint"]
    assert scored[checkpoint_frames(best_checkpoint)] == max(scored.values())


@pytest.mark.ray
def test_an_evaluation_on_a_ray_actor_scores_the_weights_saved_when_it_was_due(
    tiny_config: Callable[..., Config],
) -> None:
    config = tiny_config(*EVERY_600, *ON_RAY)
    train(config)
    assert_scores_are_those_of_the_weights_saved(config, [600, 1200])


# The gated CartPole (tests/gate_envs.py) under DQN, evaluating in a process, or collecting
# and evaluating on Ray with every checkpoint kept (the weights each evaluation played are
# checked).
GATED_PROCESS = [*GATED, *EVERY_600, "eval.backend=process"]
GATED_RAY = [*GATED, *EVERY_600, *ON_RAY, "checkpoint.keep_last=8"]


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], str]:
    """What the ``GATED_PROCESS`` run logs when nothing stops it (trained once)."""
    run_dir = tmp_path_factory.mktemp("alone")
    config = load_config("dqn_cartpole", [*TINY_RUN, *GATED_PROCESS, f"run_dir={run_dir}"])
    train(config)
    return logged(config)


def stop_at_the_gates(
    config: Config, settings: list[str], signum: int, gates: Path, to_group: bool = False
) -> str:
    """Run ``train.py`` with ``settings`` into ``config.run_dir``, its evaluation due at
    600 frames waiting at a gate while training goes on to the middle of its next
    iteration, where ``signum`` comes (``to_group``: to every process of the run, as a
    Ctrl-C in a terminal); its stderr once it has ended."""
    gate, eval_gate = gates / "gate", gates / "eval_gate"
    gate.touch()
    eval_gate.touch()
    environment = {**os.environ, GATE_VARIABLE: str(gate), EVAL_GATE_VARIABLE: str(eval_gate)}
    args = ["--config", "dqn_cartpole", *TINY_RUN, *settings, f"run_dir={config.run_dir}"]
    run = subprocess.Popen(
        [PYTHON, str(TRAIN_PY), *args],
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for("the evaluation at its gate", Path(f"{eval_gate}.reached").exists, 120)
        wait_for("training at its gate", Path(f"{gate}.reached").exists, 120)
        os.killpg(run.pid, signum) if to_group else run.send_signal(signum)
        gate.unlink()
        if signum == signal.SIGKILL:  # the evaluation's process ends: its run is gone
            eval_gate.unlink()
        _, stderr = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    return stderr


# How the run stops, whether the signal reaches every process of the run (the evaluation's
# too, which leaves it to the run), and the backend its resume evaluates with.
ENDINGS = {
    "SIGTERM": (signal.SIGTERM, False, "process"),
    "SIGKILL": (signal.SIGKILL, False, "process"),
    "Ctrl-C": (signal.SIGINT, True, "process"),
    "SIGTERM to every process, resumed blocking": (signal.SIGTERM, True, "blocking"),
}


@pytest.mark.parametrize(("signum", "to_group", "resumed_backend"), ENDINGS.values(), ids=ENDINGS)
def test_an_evaluation_a_stop_or_a_kill_drops_runs_after_the_resume_as_it_would_have(
    tiny_config: Callable[..., Config],
    tmp_path: Path,
    alone: tuple[list[dict], str],
    signum: int,
    to_group: bool,
    resumed_backend: str,
) -> None:
    """Training goes on to its own gate while the evaluation waits at its gate in its
    process: it does not wait for it."""
    stopped = tiny_config(*GATED_PROCESS, preset="dqn_cartpole", run_dir=tmp_path / "stopped")
    stderr = stop_at_the_gates(stopped, GATED_PROCESS, signum, tmp_path, to_group)
    checkpoints = checkpoint_candidates(Path(stopped.run_dir) / "checkpoints")
    progress = saved_progress(checkpoints[0])
    assert progress.owed_eval is not None and progress.owed_eval["iteration"] == 3, stderr
    # A stop saved the iteration it came in, whose row waits for the evaluation; a kill
    # left the checkpoint saved when the evaluation started.
    expected = (600, 0) if signum == signal.SIGKILL else (800, 1)
    assert (progress.frames, len(progress.held_rows)) == expected
    resumed = [*GATED_PROCESS, f"eval.backend={resumed_backend}"]
    train(tiny_config(*resumed, preset="dqn_cartpole", run_dir=stopped.run_dir))
    assert logged(stopped) == alone  # resumed, without gates


@pytest.mark.ray
def test_an_evaluation_on_a_ray_actor_a_stop_drops_runs_after_the_resume(
    tiny_config: Callable[..., Config], tmp_path: Path
) -> None:
    stopped = tiny_config(*GATED_RAY, preset="dqn_cartpole", run_dir=tmp_path / "stopped")
    stderr = stop_at_the_gates(stopped, GATED_RAY, signal.SIGTERM, tmp_path)
    progress = saved_progress(checkpoint_candidates(Path(stopped.run_dir) / "checkpoints")[0])
    assert progress.owed_eval is not None and progress.owed_eval["iteration"] == 3, stderr
    assert (progress.frames, len(progress.held_rows)) == (800, 1)
    train(stopped)
    assert_scores_are_those_of_the_weights_saved(stopped, [600, 1200])


def test_an_evaluation_that_fails_in_its_process_stops_the_run_and_the_resume_owes_it(
    tiny_config: Callable[..., Config],
    tmp_path: Path,
    alone: tuple[list[dict], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    faulty = tiny_config(*GATED_PROCESS, preset="dqn_cartpole", run_dir=tmp_path / "faulty")
    monkeypatch.setenv(EVAL_FAULT_VARIABLE, "1")
    with pytest.raises(RunFailed) as failure:
        train(faulty)
    monkeypatch.delenv(EVAL_FAULT_VARIABLE)
    message = str(failure.value)
    checkpoint = Path(faulty.run_dir) / "checkpoints" / "checkpoint-000000000600"
    assert message.startswith("training stopped while evaluating"), message
    assert "RuntimeError: the evaluation env broke" in message
    assert f"last good checkpoint: {checkpoint} (the evaluation runs first" in message
    assert saved_progress(checkpoint).owed_eval["iteration"] == 3
    train(faulty)
    assert logged(faulty) == alone


@pytest.mark.ray
def test_an_evaluation_that_fails_on_a_ray_actor_stops_the_run_and_the_resume_owes_it(
    tiny_config: Callable[..., Config], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    faulty = tiny_config(*GATED_RAY, preset="dqn_cartpole", run_dir=tmp_path / "faulty")
    monkeypatch.setenv(EVAL_FAULT_VARIABLE, "1")  # (the run's Ray starts with it)
    with pytest.raises(RunFailed) as failure:
        train(faulty)
    monkeypatch.delenv(EVAL_FAULT_VARIABLE)
    message = str(failure.value)
    assert "the evaluation failed in its Ray actor" in message, message
    assert "RuntimeError: the evaluation env broke" in message
    checkpoint = Path(faulty.run_dir) / "checkpoints" / "checkpoint-000000000600"
    assert saved_progress(checkpoint).owed_eval["iteration"] == 3
    train(faulty)
    assert_scores_are_those_of_the_weights_saved(faulty, [600, 1200])
