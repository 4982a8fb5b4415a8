"""Comparing runs: groups of seeds, their labels and statistics, the figure and the table."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
import yaml

from rl_app.checks import load_config
from rl_app.compare import FIGURE_FILE, TABLE_FILE, compare
from rl_app.compare import main as compare_main
from rl_app.config import to_yaml
from rl_app.logger import SUCCESS_RATE_KEY, read_metrics
from rl_app.run import train
from tests.helpers import PYTHON, ROOT

PNG = b"\x89PNG\r\n\x1a\n"


def synthetic_run(
    run_dir: Path, overrides: list[str], evals: list[float], preset: str = "default"
) -> Path:
    """A run directory as training leaves it: its config and one metrics row per evaluation."""
    run_dir.mkdir(parents=True)
    config = load_config(preset, [*overrides, f"run_dir={run_dir}", "logger.backend=none"])
    (run_dir / "config.yaml").write_text(to_yaml(config))
    rows = [
        {"frames": 1000 * (index + 1), "wall_seconds": 30.0 * (index + 1), "eval/return": value}
        for index, value in enumerate(evals)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run_dir


EVALS = {
    "3e-4": [[-900.0, -300.0, -150.0], [-800.0, -100.0, -250.0], [-700.0, -400.0, -200.0]],
    "1e-3": [[-600.0, -200.0, -120.0], [-500.0, -300.0, -140.0], [-400.0, -250.0, -160.0]],
}


@pytest.fixture
def two_settings(tmp_path: Path) -> list[Path]:
    """Three seeds of each of two learning rates (and bookkeeping keys that differ)."""
    return [
        synthetic_run(
            tmp_path / f"lr{lr}-seed{seed}",
            [f"optim.lr={lr}", f"seed={seed}", f"threads={seed}", f"logger.project=p{seed}"],
            evals,
        )
        for lr, runs in EVALS.items()
        for seed, evals in enumerate(runs, start=1)
    ]


def test_seeds_of_two_settings_make_two_groups_labelled_by_the_setting(
    two_settings: list[Path], tmp_path: Path
) -> None:
    summaries, skipped = compare(two_settings, tmp_path / "out")
    assert skipped == []
    by_label = {group.label: group for group in summaries}
    assert set(by_label) == {"optim.lr=0.0003", "optim.lr=0.001"}
    for lr, label in (("3e-4", "optim.lr=0.0003"), ("1e-3", "optim.lr=0.001")):
        group, evals = by_label[label], EVALS[lr]
        assert len(group.runs) == 3 and group.frames == 3000
        assert group.final_eval_returns == [run[-1] for run in evals]
        assert group.best_eval_returns == [max(run) for run in evals]
        assert group.curve_frames == [1000, 2000, 3000]
        by_hand = [statistics.mean(values) for values in zip(*evals, strict=True)]
        assert group.curve_mean == pytest.approx(by_hand)
        for low, mean, high in zip(
            group.curve_low, group.curve_mean, group.curve_high, strict=True
        ):
            assert low <= mean <= high
    table = (tmp_path / "out" / TABLE_FILE).read_text()
    final = [run[-1] for run in EVALS["1e-3"]]
    best = [max(run) for run in EVALS["1e-3"]]
    assert (
        f"| `optim.lr=0.001` | 3 | 3,000 | {statistics.mean(final):.1f} ± "
        f"{statistics.stdev(final):.1f} | {statistics.mean(best):.1f} ± "
        f"{statistics.stdev(best):.1f} | 1.5 min |"
    ) in table
    assert (tmp_path / "out" / FIGURE_FILE).read_bytes()[:8] == PNG


def test_a_copy_of_a_run_counts_once(two_settings: list[Path], tmp_path: Path) -> None:
    copy = shutil.copytree(two_settings[0], tmp_path / "backup")
    summaries, skipped = compare([*two_settings, copy], tmp_path / "out")
    assert sorted(len(group.runs) for group in summaries) == [3, 3]
    assert skipped == [f"{copy}: a copy of {two_settings[0]} (the same settings and metrics)"]


def test_runs_of_two_algorithms_are_labelled_by_their_own_settings_only(tmp_path: Path) -> None:
    sac = synthetic_run(tmp_path / "sac", [], [-300.0])
    dqn = synthetic_run(tmp_path / "dqn", [], [200.0], preset="dqn_cartpole")
    labels = [group.label for group in compare([sac, dqn], tmp_path / "out")[0]]
    assert labels[0].startswith("algo=sac, ") and labels[1].startswith("algo=dqn, ")
    # Each run holds every algorithm's group; the other algorithm's is none of its business.
    assert "dqn." not in labels[0] and "sac." not in labels[1], labels


def test_a_goal_env_group_shows_its_final_and_best_success_rates(
    two_settings: list[Path], tiny_config, tmp_path: Path
) -> None:
    run_dir = tmp_path / "bitflip"
    train(tiny_config(preset="dqn_bitflip", run_dir=run_dir))
    rows = read_metrics(run_dir)
    rates = [row[SUCCESS_RATE_KEY] for row in rows if SUCCESS_RATE_KEY in row]
    # Training episodes report theirs too, in every iteration where some ended.
    ended = [row for row in rows if "train/episode_return" in row]
    assert ended and all(0 <= row["train/success_rate"] <= 1 for row in ended)

    summaries, _ = compare([two_settings[0], run_dir], tmp_path / "out")
    by_env = {group.env_name: group for group in summaries}
    goals = by_env["rl_app.envs.goals:rl_app/BitFlip15-v0"]
    assert goals.final_success_rates == [rates[-1]]
    assert goals.best_success_rates == [max(rates)]
    assert by_env["Pendulum-v1"].final_success_rates == []
    table = (tmp_path / "out" / TABLE_FILE).read_text()
    assert "| final success (mean ± std) | best success (mean ± std) |" in table
    assert f"| {100 * rates[-1]:.1f}% ± 0.0% | {100 * max(rates):.1f}% ± 0.0% |" in table
    assert "| - | - |" in table  # Pendulum's row: no success rate


def test_a_run_made_before_a_setting_existed_groups_with_its_default(
    two_settings: list[Path], tmp_path: Path
) -> None:
    older = two_settings[0] / "config.yaml"
    config = yaml.safe_load(older.read_text())
    del config["optim"]["anneal_lr"]  # as a run saved before the setting was added
    older.write_text(yaml.safe_dump(config))
    summaries, _ = compare(two_settings, tmp_path / "out")
    assert sorted(len(group.runs) for group in summaries) == [3, 3]


def test_compare_cli_skips_a_run_without_metrics_by_name(tiny_config, tmp_path: Path) -> None:
    config = tiny_config()
    train(config)
    empty = tmp_path / "not-trained"
    empty.mkdir()
    (empty / "config.yaml").write_text(to_yaml(config))
    done = subprocess.run(
        [PYTHON, "-m", "rl_app.compare", config.run_dir, str(empty), f"{config.run_dir}/."],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and f"skipped {empty}: no evaluation" in done.stderr
    outputs = [Path(line.split(": ", 1)[1]) for line in done.stdout.splitlines()[-2:]]
    assert [path.name for path in outputs] == [FIGURE_FILE, TABLE_FILE]
    assert (tmp_path / outputs[0]).parent.parent == tmp_path / "runs"  # the default OUT
    rows = [json.loads(line) for line in Path(config.run_dir, "metrics.jsonl").open()]
    final = [row["eval/return"] for row in rows if "eval/return" in row][-1]
    # One seed: the run given twice counts once.
    assert f"| `sac on Pendulum-v1` | 1 | 1,200 | {final:.1f} ± 0.0 |" in done.stdout


def test_nothing_to_compare_exits_2_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [PYTHON, "-m", "rl_app.compare", str(tmp_path / "missing")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "missing" in done.stderr


def test_a_run_directory_that_does_not_exist_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # (A typo among RUNS: comparing the others would hide it.)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    assert compare_main(["a", "runs/typo", "b"]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err == "error: no such run directory: runs/typo, b\n"
    assert [path.name for path in tmp_path.iterdir()] == ["a"]  # no runs/compare-*


def test_damaged_runs_are_named_and_skipped_and_an_out_that_cannot_be_made_is_refused(
    two_settings: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    garbled, not_yaml, empty = two_settings[:3]
    metrics = (garbled / "metrics.jsonl").read_text()
    (garbled / "metrics.jsonl").write_text("{not json\n" + metrics)
    (not_yaml / "config.yaml").write_text("optim: [lr\n")
    (empty / "config.yaml").write_text("")
    assert compare_main([*map(str, two_settings), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr()
    assert "Traceback" not in printed.err
    skipped = printed.err.splitlines()
    assert skipped[0].startswith(f"skipped {garbled}: metrics.jsonl cannot be read: Expecting")
    assert skipped[1:] == [
        f"skipped {not_yaml}: config.yaml cannot be read: while parsing a flow sequence",
        f"skipped {empty}: config.yaml holds no settings",
    ]
    assert "| 3 |" in printed.out  # the other three seeds, one group
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for out in (a_file, a_file / "out"):
        assert compare_main([str(two_settings[3]), "--out", str(out)]) == 2
        printed = capsys.readouterr()
        assert printed.out == ""
        assert (
            printed.err == f"error: --out {str(out)!r} cannot be made: {str(a_file)!r} is a file\n"
        )
