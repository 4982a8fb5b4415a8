"""``make results``' summary: final returns over seeds, the table and the figure, made by
``rl_app.compare``'s functions; a stop or a run directory in use ends the tool with one
line, summarizing nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from rl_app.checks import load_config
from rl_app.compare import groups_table, plot_comparison, read_run, summarize_group
from rl_app.config import to_yaml
from rl_app.logger import read_metrics
from tests.helpers import (
    PYTHON,
    ROOT,
    SLOW_MACHINE_MARGIN,
    TINY_RUN,
    hold_lock_in_another_process,
    wait_for,
)
from tests.slow_eval_envs import SLOW_EVAL, SLOW_STEP_S, STEP_SECONDS_VARIABLE
from tools.results import ENTRIES, entry_settings, main, parse_args, store_summaries

# An entry of a few seconds a seed, whose evaluations are slow when asked to be.
TINY_ENTRY = ("default", [*TINY_RUN, *SLOW_EVAL])


def fake_run(run_dir: Path, evals: list[float], wall_seconds: float) -> Path:
    run_dir.mkdir(parents=True)
    config = load_config("default", [f"run_dir={run_dir}", "logger.backend=none"])
    (run_dir / "config.yaml").write_text(to_yaml(config))
    rows = [
        {"frames": 1000 * (index + 1), "wall_seconds": wall_seconds * (index + 1) / len(evals),
         "eval/return": value}
        for index, value in enumerate(evals)
    ]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run_dir


def test_the_summary_takes_each_runs_last_evaluation(tmp_path: Path) -> None:
    runs = [
        fake_run(tmp_path / "a", [-900.0, -300.0, -150.0], wall_seconds=60.0),
        fake_run(tmp_path / "b", [-800.0, -100.0, -250.0], wall_seconds=120.0),
    ]
    summary = summarize_group("default", [read_run(run) for run in runs])
    assert summary.final_eval_returns == [-150.0, -250.0]
    assert summary.best_eval_returns == [-150.0, -100.0]
    assert summary.frames == 3000 and summary.wall_seconds == [60.0, 120.0]

    table = groups_table([summary])
    assert "| `default` | 2 | 3,000 | -200.0 ± 70.7 | -125.0 ± 35.4 | 1.5 min |" in table
    assert pytest.approx(summary.curve_mean) == [-850.0, -200.0, -200.0]
    plot_comparison([summary], tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_of_one_entry_keep_the_stored_summaries_of_the_others(tmp_path: Path) -> None:
    def summary(name: str, final: float):
        run = fake_run(tmp_path / f"{name}-{final}", [-900.0, final], wall_seconds=60.0)
        return summarize_group(name, [read_run(run)])

    store = tmp_path / "docs" / "results.json"
    store_summaries(store, {"dqn_cartpole": summary("dqn_cartpole", -300.0)})
    store_summaries(store, {"default": summary("default", -200.0)})
    every_entry = store_summaries(store, {"dqn_cartpole": summary("dqn_cartpole", -100.0)})

    # In the order of the tool's entries; the re-measured entry replaced, the other kept.
    assert list(every_entry) == ["default", "dqn_cartpole"]
    assert every_entry["default"].final_eval_returns == [-200.0]
    assert every_entry["dqn_cartpole"].final_eval_returns == [-100.0]
    assert every_entry["dqn_cartpole"].curve_mean == [-900.0, -100.0]
    assert list(json.loads(store.read_text())) == ["default", "dqn_cartpole"]


def test_any_preset_is_an_entry_with_no_overrides(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    preset = "dqn_atari"
    assert preset not in ENTRIES
    assert parse_args(["--entries", preset, "default"]).entries == [preset, "default"]
    assert entry_settings(preset) == (preset, [])
    with pytest.raises(SystemExit):
        parse_args(["--entries", "no_such_preset"])
    assert "invalid choice: 'no_such_preset'" in capsys.readouterr().err

    # Its summary is stored beside the others, after the entries of ENTRIES.
    def summary(name: str):
        run = fake_run(tmp_path / name, [-900.0, -100.0], wall_seconds=60.0)
        return summarize_group(name, [read_run(run)])

    store = tmp_path / "results.json"
    store_summaries(store, {preset: summary(preset)})
    assert list(store_summaries(store, {"default": summary("default")})) == ["default", preset]


def test_a_random_policy_is_scored_on_each_seeds_evaluation_episodes(tmp_path: Path) -> None:
    store = tmp_path / "random_policy.json"
    store.write_text(json.dumps({"default": {"seeds": [1], "eval_returns": [-1200.0]}}))
    args = ["--random-policy", "--entries", "dqn_cartpole", "--random-store", str(store)]
    assert main([*args, "--seeds", "1", "2"]) == 0
    both = json.loads(store.read_text())
    assert main([*args, "--seeds", "1"]) == 0
    again = json.loads(store.read_text())

    assert again["default"]["eval_returns"] == [-1200.0]  # another entry's is kept
    assert both["dqn_cartpole"]["seeds"] == [1, 2] and again["dqn_cartpole"]["seeds"] == [1]
    # Seed 1's episodes and draws, the same again; seed 2's starts are others.
    seed_1, seed_2 = both["dqn_cartpole"]["eval_returns"]
    assert again["dqn_cartpole"]["eval_returns"] == [seed_1] and seed_2 != seed_1
    # CartPole's random episodes last about 20 steps: nowhere near its 500.
    assert 9 < seed_1 < 50


def tiny_entry_args(tmp_path: Path) -> list[str]:
    return [
        "--entries", "tiny", "--seeds", "1", "2", "--root", str(tmp_path / "runs"),
        "--store", str(tmp_path / "results.json"), "--figure", str(tmp_path / "results.png"),
    ]  # fmt: skip


def test_a_stop_ends_the_tool_unsummarized_and_the_same_command_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = tiny_entry_args(tmp_path)
    program = (
        "import sys; from tools.results import ENTRIES, main\n"
        f"ENTRIES['tiny'] = {TINY_ENTRY!r}\n"
        "sys.exit(main(sys.argv[1:]))"
    )
    process = subprocess.Popen(
        [PYTHON, "-c", program, *args],
        cwd=ROOT,
        env={**os.environ, STEP_SECONDS_VARIABLE: SLOW_STEP_S},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seed_1 = tmp_path / "runs" / "tiny-seed1"
    # Seed 1's first iteration is logged: the signal comes in its second, whose 20 s
    # evaluation is due.
    wait_for("seed 1's first iteration", lambda: read_metrics(seed_1), 60)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120 * SLOW_MACHINE_MARGIN)
    assert process.returncode == 1, stderr
    assert f"stopped by SIGTERM in {seed_1}; nothing summarized" in stderr
    assert "Traceback" not in stderr
    assert not (tmp_path / "runs" / "tiny-seed2").exists()
    assert not (tmp_path / "results.json").exists()

    monkeypatch.setitem(ENTRIES, "tiny", TINY_ENTRY)  # evaluations at full speed now
    assert main(args) == 0
    summary = json.loads((tmp_path / "results.json").read_text())["tiny"]
    assert summary["frames"] == 1200 and len(summary["final_eval_returns"]) == 2


def test_a_run_directory_in_use_ends_the_tool_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(ENTRIES, "tiny", TINY_ENTRY)
    holder = hold_lock_in_another_process(tmp_path / "runs" / "tiny-seed1", 3600)
    try:
        assert main(tiny_entry_args(tmp_path)) == 2
    finally:
        holder.kill()
        holder.wait()
    error = capsys.readouterr().err
    assert error.startswith(f"error: run_dir='{tmp_path / 'runs' / 'tiny-seed1'}' is in use")
    assert len(error.splitlines()) == 1
    assert not (tmp_path / "runs" / "tiny-seed2").exists()
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize(
    ("option", "error"),
    [
        (["--store", "{tmp}/a-file/results.json"], "--store '{tmp}/a-file' cannot be made"),
        (["--store", "{tmp}"], "--store '{tmp}' is a directory: give a file"),
        (["--store", "{tmp}/a-file"], "--store '{tmp}/a-file' cannot be read: Expecting value"),
        (["--seeds", "1", "1"], "--seeds 1 1: give each seed once"),
        (
            ["--random-policy", "--random-store", "{tmp}/a-file"],
            "--random-store '{tmp}/a-file' cannot be read",
        ),
    ],
)
def test_outputs_it_could_not_write_end_the_tool_in_one_line_before_any_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    option: list[str],
    error: str,
) -> None:
    monkeypatch.setitem(ENTRIES, "tiny", TINY_ENTRY)
    (tmp_path / "a-file").write_text("not a results store\n")
    given = [part.format(tmp=tmp_path) for part in option]
    assert main([*tiny_entry_args(tmp_path), *given]) == 2
    printed = capsys.readouterr().err
    assert printed.startswith(f"error: {error.format(tmp=tmp_path)}") and printed.count("\n") == 1
    assert not (tmp_path / "runs").exists()  # nothing trained
