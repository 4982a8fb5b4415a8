"""Sweeps: the sweep file's checks, pruning at an iteration boundary, and a tiny real sweep
whose worker is killed mid-trial and which a second run finishes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

import rl_app.sweep
from rl_app.checks import load_config
from rl_app.config import Config
from rl_app.logger import read_metrics
from rl_app.run import train
from rl_app.sweep.__main__ import main
from rl_app.sweep.spec import JOURNAL_FILE, checked_values, load_sweep
from rl_app.sweep.study import claim_next, open_study, run_trial
from rl_app.sweep.summary import failed_trials, unfinished_trials
from tests.helpers import PYTHON, ROOT, TINY_RUN, wait_for

# optim.batch_size=48: a multiple of every replay.slice_len in SPACE.
TINY_DQN = [
    *TINY_RUN, "algo=dqn", "env.name=CartPole-v1", "collector.total_frames=800",
    "optim.batch_size=48",
]  # fmt: skip
SPACE = {
    "optim.lr": {"low": 1e-4, "high": 1e-3, "log": True},
    "optim.gamma": {"choices": [0.99, 0.995]},
    "replay.slice_len": {"low": 4, "high": 16, "step": 4},
    "dqn.target_update_interval": {"low": 1, "high": 20},
}


def write_sweep(tmp_path: Path, **changes: Any) -> Path:
    tree = {
        "preset": "dqn_cartpole",
        "overrides": TINY_DQN,
        "space": SPACE,
        "trials": 2,
        "sweep_dir": str(tmp_path / "sweep"),
        **changes,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in tree.items() if v is not None}))
    return path


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"bogus": 1}, "unknown key 'bogus'"),
        ({"preset": "/nonexistent.yaml"}, "error: preset: /nonexistent.yaml: no such file"),
        ({"preset": "/tmp"}, "error: preset: /tmp: is a directory: give a file"),
        ({"trials": 0}, "trials=0 is out of range"),
        ({"pruner": "mean"}, "pruner='mean' is not accepted: choose one of none, median"),
        ({"space": None}, "space is missing"),
        ({"space": ["optim.lr"]}, "space=['optim.lr'] is not accepted: give one or more keys"),
        ({"space": {"optim.foo": {"low": 1, "high": 2}}}, "unknown key 'optim.foo'"),
        ({"space": {"run_dir": {"choices": ["a", "b"]}}}, "unknown key 'run_dir'"),
        ({"space": {"optim.lr": {"low": 1e-3, "high": 1e-4}}}, "must be below high"),
        ({"space": {"optim.lmbda": {"low": 0.0, "high": 1.0, "log": True}}}, "log=true"),
        ({"space": {"optim.gamma": {"low": 0.9, "high": 1.5}}}, "space.optim.gamma=1.5"),
        ({"space": {"optim.lr": {"low": 1e-4, "high": 1e-3, "bins": 3}}}, "space.optim.lr="),
        ({"space": {"replay.slice_len": {"low": 4, "high": 16, "step": 5}}}, "divide"),
        (
            {"space": {"optim.gamma": {"low": 0.9, "high": 0.99, "step": 0.04}}},
            "divide high - low = 0.09",
        ),
        ({"space": {"dqn.loss": {"choices": ["l2", "l3"]}}}, "choose one of l2, smooth_l1"),
        ({"space": {"network.hidden_sizes": {"choices": [1, 2]}}}, "list setting"),
        ({"space": {"sac.tau": {"low": 0.001, "high": 0.01}}}, "space.sac.tau changes no trial"),
        # 10 does not divide optim.batch_size=48: found before the sweep starts.
        ({"space": {"replay.slice_len": {"choices": [8, 10]}}}, "space.replay.slice_len=10"),
        ({"overrides": ["run_dir=x"]}, "the sweep sets run_dir"),
        ({"sweep_dir": "/proc/sweep"}, "sweep_dir '/proc/sweep' cannot be written: No such"),
        # A worker trains its trials in one process, which runs one RPC collector.
        ({"overrides": [*TINY_DQN, "collector.mode=rpc"]}, "collector.mode='rpc' is not accepted"),
        ({"space": {"collector.mode": {"choices": ["sync", "rpc"]}}}, "space.collector.mode='rpc'"),
        ({"launcher": "pbs"}, "launcher='pbs' is not accepted: choose one of local, slurm"),
        ({"slurm": {"bogus": 1}}, "unknown key 'slurm.bogus'"),
        ({"slurm": {"array": "seed=1,2"}}, "jobs sets how many worker jobs run"),
        ({"slurm": {"time_min": "long"}}, "slurm.time_min='long' is not accepted"),
        # Checked before the cluster is asked anything (tests/test_sweep_slurm.py asks it).
        ({"launcher": "slurm", "slurm": {"profile": "nope"}}, "accepted profiles are"),
        ({"launcher": "slurm", "slurm": {"time_min": 1}}, "slurm.signal_delay_s=60 (slurm"),
    ],
)
def test_a_mistake_is_one_line_exit_2_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture, changes: dict[str, Any], named: str
) -> None:
    assert main([str(write_sweep(tmp_path, **changes))]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and named in error, error
    assert not (tmp_path / "sweep").exists()


def test_the_help_lists_the_keys_a_sweep_file_takes(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    keys = re.findall(r"^  ([\w.]+)  \(", capsys.readouterr().out, re.MULTILINE)
    assert {"preset", "trials", "slurm.profile", "overrides", "space"} <= set(keys)
    assert "slurm.array" not in keys  # refused: jobs says how many worker jobs run


def test_a_sweep_dir_continues_only_its_own_sweep(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path))
    sweep.dir.mkdir()
    (sweep.dir / "sweep.yaml").write_text(write_sweep(tmp_path, trials=5).read_text())
    # Budget and workers may change, and where they run.
    load_sweep(write_sweep(tmp_path, trials=7, jobs=2, launcher="slurm", slurm={"time_min": 30}))
    with pytest.raises(ValueError, match=r"holds another sweep .*; space.optim.lr differs\)"):
        load_sweep(write_sweep(tmp_path, space={**SPACE, "optim.lr": {"low": 1e-4, "high": 1e-2}}))
    with pytest.raises(ValueError, match=r"; preset differs\)"):
        load_sweep(write_sweep(tmp_path, preset="rdqn_cartpole_masked"))
    # The same overrides in another order are the same sweep; another value is not.
    load_sweep(write_sweep(tmp_path, overrides=[TINY_DQN[1], TINY_DQN[0], *TINY_DQN[2:]]))
    with pytest.raises(ValueError, match=r"; overrides.optim.batch_size differs\)"):
        load_sweep(write_sweep(tmp_path, overrides=[*TINY_DQN, "optim.batch_size=96"]))
    # Its study without its sweep file (deleted), or a run directory, is no sweep's.
    (sweep.dir / "sweep.yaml").unlink()
    for other in (JOURNAL_FILE, "metrics.jsonl"):
        (sweep.dir / other).write_text("")
        with pytest.raises(ValueError, match=r"holds other files and no sweep.yaml: give a new"):
            load_sweep(write_sweep(tmp_path))
        (sweep.dir / other).unlink()


def test_a_sweep_dir_that_is_a_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert main([str(write_sweep(tmp_path, sweep_dir=str(a_file)))]) == 2
    error = capsys.readouterr().err
    assert error == f"error: sweep_dir={str(a_file)!r} is a file: give a directory\n"


def test_a_stop_asked_after_an_evaluation_stops_at_that_boundary_with_a_checkpoint(
    tmp_path: Path,
) -> None:
    config = load_config("dqn_cartpole", [*TINY_DQN, f"run_dir={tmp_path / 'run'}"])
    seen = []

    def prune_at_first(frames: int, eval_return: float) -> str | None:
        seen.append(frames)
        return "pruned"

    result = train(config, on_eval=prune_at_first)
    assert seen == [400] and result.frames == 400 and result.stopped_by == "pruned"
    assert int(result.last_checkpoint.name.split("-")[1]) == 400


def test_a_trial_whose_values_make_no_valid_run_together_fails_naming_why(tmp_path: Path) -> None:
    space = {"replay.slice_len": {"choices": [8, 16]}, "optim.batch_size": {"choices": [48, 40]}}
    sweep = load_sweep(write_sweep(tmp_path, space=space))  # each value alone is valid
    sweep.dir.mkdir()
    study = open_study(sweep)
    study.enqueue_trial({"replay.slice_len": 16, "optim.batch_size": 40})
    trial, claim = claim_next(study, sweep)
    try:
        assert run_trial(study, trial, sweep) is None
    finally:
        claim.release()
    assert failed_trials(sweep) == [
        "trial 0 failed: optim.batch_size=40 is not accepted: with a slice sampler it must be "
        "a multiple of replay.slice_len=16"
    ]


def test_a_trial_a_signal_stopped_is_counted_unfinished(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path))
    sweep.dir.mkdir()
    study = open_study(sweep)

    def train_stopped_by_ctrl_c(config: Config, on_eval: Any) -> Any:
        return train(config, on_eval=lambda *_: os.kill(os.getpid(), signal.SIGINT))

    trial, claim = claim_next(study, sweep)
    try:
        assert run_trial(study, trial, sweep, train_stopped_by_ctrl_c).stopped_by == "SIGINT"
    finally:
        claim.release()
    assert unfinished_trials(sweep) == [0]


@pytest.mark.parametrize("objective", ["last", "best"])
def test_a_pruned_trial_stops_at_that_evaluation_with_a_checkpoint(
    tmp_path: Path, objective: str
) -> None:
    sweep = load_sweep(write_sweep(tmp_path, objective=objective))
    sweep.dir.mkdir()
    study = open_study(sweep)
    study.pruner = optuna.pruners.ThresholdPruner(lower=1e9)  # prunes every return
    trial, claim = claim_next(study, sweep)
    try:
        assert run_trial(study, trial, sweep) is None
    finally:
        claim.release()
    pruned = study.get_trials()[0]
    assert pruned.state.name == "PRUNED" and list(pruned.intermediate_values) == [400]
    checkpoints = sweep.dir / "trial-0000" / "checkpoints"
    assert [int(p.name.split("-")[1]) for p in checkpoints.glob("checkpoint-*")] == [400]


def trial_states(sweep_dir: Path) -> list[str]:
    sweep = load_sweep(sweep_dir / "sweep.yaml")
    return [trial.state.name for trial in open_study(sweep).get_trials()]


def test_a_killed_worker_s_trial_resumes_and_two_workers_end_the_sweep_with_its_trials(
    tmp_path: Path,
) -> None:
    source = write_sweep(tmp_path, pruner="median", startup_trials=1, jobs=2)
    sweep_dir = tmp_path / "sweep"
    command = [PYTHON, "-m", "rl_app.sweep", str(source)]
    worker = subprocess.Popen([*command, "--worker"], cwd=ROOT, stdout=subprocess.DEVNULL)
    first = sweep_dir / "trial-0000" / "checkpoints"
    wait_for("trial 0's first checkpoint", lambda: any(first.glob("checkpoint-*")), timeout=60)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    assert trial_states(sweep_dir) == ["RUNNING"]  # no heartbeat: the journal cannot tell

    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "2 worker(s)" in done.stdout
    states = trial_states(sweep_dir)
    assert len(states) == 2 and set(states) <= {"COMPLETE", "PRUNED"}, states
    assert sorted(p.name for p in sweep_dir.glob("trial-*")) == ["trial-0000", "trial-0001"]
    # Both workers ran to the end; each trial ended once, trial 0 resumed, not restarted.
    logs = [(sweep_dir / "logs" / f"worker-{n}.log").read_text() for n in range(2)]
    assert all(log.rstrip().endswith("no trial left") for log in logs)
    ended = [re.findall(r"^trial (\d+): (?:COMPLETE|PRUNED)$", log, re.MULTILINE) for log in logs]
    assert sorted(number for numbers in ended for number in numbers) == ["0", "1"]
    assert any("resumed from" in log and "trial 0:" in log for log in logs)
    assert [row["frames"] for row in read_metrics(sweep_dir / "trial-0000")] == [200, 400, 600, 800]

    for name in ("summary.md", "trials.csv", "history.png", "best.yaml", JOURNAL_FILE):
        assert (sweep_dir / name).is_file(), name
    best = load_config(str(sweep_dir / "best.yaml"), [f"run_dir={tmp_path / 'best'}"])
    assert best.algo == "dqn" and best.collector.total_frames == 800
    rows = (sweep_dir / "trials.csv").read_text().splitlines()
    assert rows[0].split(",")[:2] == ["number", "state"] and len(rows) == 3
    again = subprocess.run([*command, "--summary"], cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0 and "summary.md" in again.stdout


def documented_sweeps() -> dict[str, dict[str, Any]]:
    """The sweep files docs/sweeps.md and the package's docstring show, run locally."""
    shown = {
        "docs/sweeps.md": (ROOT / "docs" / "sweeps.md").read_text().split("```yaml\n")[1],
        "rl_app.sweep": rl_app.sweep.__doc__.split("::\n\n")[1].split("\n\n")[0],
    }
    trees = {
        where: yaml.safe_load(textwrap.dedent(text.split("```")[0]))
        for where, text in shown.items()
    }
    return {where: {**tree, "launcher": "local", "slurm": None} for where, tree in trees.items()}


@pytest.mark.parametrize("where", ["docs/sweeps.md", "rl_app.sweep"])
def test_the_sweep_files_the_docs_show_are_valid(tmp_path: Path, where: str) -> None:
    tree = documented_sweeps()[where]
    sweep = load_sweep(write_sweep(tmp_path, **{**tree, "sweep_dir": str(tmp_path / "sweep")}))
    assert sweep.settings.preset == "dqn_cartpole"


def test_a_range_of_billions_of_values_is_checked_at_its_ends_only(tmp_path: Path) -> None:
    # Every value of a range up to 64 long is checked; a longer one's list was built first.
    sweep = load_sweep(write_sweep(tmp_path, space={"seed": {"low": 0, "high": 2**32 - 1}}))
    assert checked_values(sweep.space["seed"]) == [0, 2**32 - 1]


def test_the_worked_example_in_the_readme_is_a_valid_sweep() -> None:
    sweep = load_sweep(ROOT / "sweeps" / "dqn_cartpole.yaml")  # checks every value it names
    assert sweep.settings.preset == "dqn_cartpole" and sweep.settings.trials == 16
    assert set(sweep.space) == {
        "optim.lr",
        "optim.gamma",
        "replay.slice_len",
        "dqn.target_update_interval",
    }
