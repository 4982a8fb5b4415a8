"""Compare runs: ``python -m rl_app.compare RUN_DIR... [--out DIR]``.

Reads each run's ``config.yaml`` and ``metrics.jsonl``, groups the runs whose configs
differ only by ``seed`` (and by bookkeeping: ``run_dir``, ``launcher``, ``threads``,
``logger.*``, ``slurm.*``), and writes ``compare.png`` (evaluation return against frames:
each group's mean over seeds with a 95% bootstrap interval, one panel per environment) and
``compare.md`` (final and best evaluation return per group, mean ± std over seeds, seeds,
frames, wall time; in a goal env, also the final and best evaluation success rate).
Groups are labelled by the settings that differ between them. A run directory that cannot
be read is named and skipped; one that does not exist is refused before any work."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import yaml
from omegaconf import OmegaConf

from rl_app.config import ConfigError, RunConfig, flatten
from rl_app.logger import (
    EVAL_KEY,
    METRICS_FILE,
    SUCCESS_RATE_KEY,
    label_eval_axes,
    read_metrics,
)
from rl_app.rundir import CONFIG_FILE
from rl_app.runlock import make_writable_directory

# Keys that do not make two runs different experiments.
BOOKKEEPING_KEYS = ("seed", "run_dir", "launcher", "threads")
BOOKKEEPING_GROUPS = ("logger.", "slurm.")
BOOTSTRAP_SAMPLES = 2_000
FIGURE_FILE = "compare.png"
TABLE_FILE = "compare.md"


class UnreadableRun(Exception):
    """A run directory without what a comparison needs."""


@dataclass
class RunRecord:
    path: Path
    settings: dict[str, Any]  # the config, flattened, without bookkeeping keys
    rows: list[dict[str, Any]]

    @property
    def evals(self) -> dict[int, float]:
        return {row["frames"]: row[EVAL_KEY] for row in self.rows if EVAL_KEY in row}

    @property
    def success_rates(self) -> dict[int, float]:
        """Evaluation success rate by frames: empty outside goal envs."""
        rows = (row for row in self.rows if SUCCESS_RATE_KEY in row)
        return {row["frames"]: row[SUCCESS_RATE_KEY] for row in rows}


@dataclass
class GroupSummary:
    label: str
    env_name: str
    runs: list[str]
    frames: int
    final_eval_returns: list[float]
    best_eval_returns: list[float]
    wall_seconds: list[float]
    curve_frames: list[int] = field(default_factory=list)
    curve_mean: list[float] = field(default_factory=list)
    curve_low: list[float] = field(default_factory=list)
    curve_high: list[float] = field(default_factory=list)
    # Goal envs only (empty elsewhere): each run's last and best evaluation success rate.
    final_success_rates: list[float] = field(default_factory=list)
    best_success_rates: list[float] = field(default_factory=list)


def experiment_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings that make an experiment, from a run's saved config. A key the run's
    config lacks (a setting added since the run was made) counts as its default."""
    flat = {**flatten(dataclasses.asdict(RunConfig())), **flatten(config)}
    return {
        key: value
        for key, value in flat.items()
        if key not in BOOKKEEPING_KEYS and not key.startswith(BOOKKEEPING_GROUPS)
    }


def read_run(path: Path) -> RunRecord:
    """A run's settings and metrics; :class:`UnreadableRun` says what is missing."""
    if not (path / CONFIG_FILE).is_file():
        raise UnreadableRun(f"{path}: no {CONFIG_FILE}")
    try:
        rows = read_metrics(path)
    except ValueError as error:  # a line cut short, or not JSON
        raise UnreadableRun(f"{path}: {METRICS_FILE} cannot be read: {error}") from None
    if not any(EVAL_KEY in row for row in rows):
        raise UnreadableRun(f"{path}: no evaluation in {METRICS_FILE}")
    try:
        config = OmegaConf.to_container(OmegaConf.load(path / CONFIG_FILE))
    except (OSError, ValueError, yaml.YAMLError) as error:
        first_line = str(error).splitlines()[0]
        raise UnreadableRun(f"{path}: {CONFIG_FILE} cannot be read: {first_line}") from None
    if not isinstance(config, dict) or not config:
        raise UnreadableRun(f"{path}: {CONFIG_FILE} holds no settings")
    return RunRecord(path, experiment_settings(config), rows)


def read_runs(paths: Sequence[Path]) -> tuple[list[RunRecord], list[str]]:
    """The readable runs, and one line for each run skipped."""
    runs, skipped = [], []
    for path in paths:
        try:
            runs.append(read_run(path))
        except UnreadableRun as why:
            skipped.append(str(why))
    return runs, skipped


def group_runs(runs: Sequence[RunRecord]) -> dict[str, list[RunRecord]]:
    """Runs with the same settings, labelled by the settings that differ between groups."""
    groups: dict[tuple, list[RunRecord]] = {}
    for run in runs:
        key = tuple(sorted((name, repr(value)) for name, value in run.settings.items()))
        groups.setdefault(key, []).append(run)
    algos = {run.settings.get("algo") for run in runs}
    # A group's settings less the groups of the other algorithms compared (sac.* of a DQN run).
    members = [
        (group, {key: value for key, value in group[0].settings.items()
                 if key.partition(".")[0] not in algos - {group[0].settings.get("algo")}})
        for group in groups.values()
    ]  # fmt: skip
    keys = sorted({key for _, settings in members for key in settings})
    differing = [
        key
        for key in keys
        if len({repr(settings[key]) for _, settings in members if key in settings}) > 1
    ]
    return {group_label(settings, differing): group for group, settings in members}


def group_label(settings: dict[str, Any], differing: list[str]) -> str:
    if not differing:
        return f"{settings.get('algo')} on {settings.get('env.name')}"
    return ", ".join(f"{key}={settings[key]}" for key in differing if key in settings)


def bootstrap_interval(
    values: np.ndarray, rng: np.random.Generator, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of the mean over seeds (axis 0), at each point."""
    picks = rng.integers(0, values.shape[0], size=(BOOTSTRAP_SAMPLES, values.shape[0]))
    means = values[picks].mean(axis=1)
    tail = (1 - level) / 2 * 100
    return np.percentile(means, tail, axis=0), np.percentile(means, 100 - tail, axis=0)


def summarize_group(label: str, runs: Sequence[RunRecord]) -> GroupSummary:
    """Final and best evaluation returns (and success rates in a goal env), frames, wall
    time and the mean curve of a group (over the evaluation points all its runs share)."""
    evals = [run.evals for run in runs]
    successes = [run.success_rates for run in runs if run.success_rates]
    shared = sorted(set.intersection(*(set(points) for points in evals)))
    curves = np.array([[points[frame] for frame in shared] for points in evals])
    low, high = bootstrap_interval(curves, np.random.default_rng(0))
    return GroupSummary(
        label=label,
        env_name=str(runs[0].settings.get("env.name")),
        runs=[str(run.path) for run in runs],
        frames=max(run.rows[-1]["frames"] for run in runs),
        final_eval_returns=[points[max(points)] for points in evals],
        best_eval_returns=[max(points.values()) for points in evals],
        wall_seconds=[run.rows[-1].get("wall_seconds", 0.0) for run in runs],
        curve_frames=shared,
        curve_mean=curves.mean(axis=0).tolist(),
        curve_low=low.tolist(),
        curve_high=high.tolist(),
        final_success_rates=[points[max(points)] for points in successes],
        best_success_rates=[max(points.values()) for points in successes],
    )


def mean_std(values: Sequence[float], percent: bool = False) -> str:
    """Mean ± std over seeds; ``percent`` shows rates (0 to 1) as percentages."""
    scale, unit = (100, "%") if percent else (1, "")
    values = [scale * value for value in values]
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.1f}{unit} ± {std:.1f}{unit}"


def success_cell(rates: Sequence[float]) -> str:
    return mean_std(rates, percent=True) if rates else "-"  # "-": not a goal env


def groups_table(summaries: Sequence[GroupSummary]) -> str:
    """The groups as a Markdown table, one row each: returns (and success rates, when a
    group is in a goal env) over its seeds, frames and wall time."""
    goals = any(group.final_success_rates for group in summaries)
    success_header = "final success (mean ± std) | best success (mean ± std) | " if goals else ""
    lines = [
        "| group | seeds | frames | final eval return (mean ± std) "
        f"| best eval return (mean ± std) | {success_header}wall time per run |",
        "| --- " * (8 if goals else 6) + "|",
    ]
    for group in summaries:
        wall = statistics.mean(group.wall_seconds) / 60
        success = (
            f"{success_cell(group.final_success_rates)} | "
            f"{success_cell(group.best_success_rates)} | "
            if goals
            else ""
        )
        lines.append(
            f"| `{group.label}` | {len(group.runs)} | {group.frames:,} | "
            f"{mean_std(group.final_eval_returns)} | {mean_std(group.best_eval_returns)} | "
            f"{success}{wall:.1f} min |"
        )
    return "\n".join(lines) + "\n"


# Characters per line of a legend label: a panel's width at its font size.
LEGEND_WIDTH = 64


def plot_comparison(summaries: Sequence[GroupSummary], path: Path) -> None:
    """Mean evaluation return with its 95% bootstrap interval per group; groups of the same
    environment share a panel (returns of different environments do not compare)."""
    envs = list(dict.fromkeys(group.env_name for group in summaries))
    figure, panels = plt.subplots(1, len(envs), figsize=(5 * len(envs), 3.6), squeeze=False)
    for axes, env_name in zip(panels[0], envs, strict=True):
        for group in (group for group in summaries if group.env_name == env_name):
            line = axes.plot(
                group.curve_frames, group.curve_mean, marker="o", markersize=3,
                label=textwrap.fill(f"{group.label} ({len(group.runs)} seeds)", LEGEND_WIDTH),
            )[0]  # fmt: skip
            axes.fill_between(
                group.curve_frames, group.curve_low, group.curve_high,
                color=line.get_color(), alpha=0.2,
            )  # fmt: skip
        axes.set_title(env_name)
        label_eval_axes(axes)
        # Below the panel, however long the labels: the saved figure grows to hold them.
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.18))
    figure.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(figure)


def compare(paths: Sequence[Path], out: Path) -> tuple[list[GroupSummary], list[str]]:
    """Write ``compare.png`` and ``compare.md`` to ``out``; return the groups and the runs
    skipped (one line each). A run given twice, or a copy of one, counts once."""
    once: dict[Path, Path] = {}
    for path in paths:
        once.setdefault(path.resolve(), path)
    readable, skipped = read_runs(list(once.values()))
    runs: list[RunRecord] = []
    for run in readable:
        # Its metrics to the wall-clock second: not another seed, nor the same seed run again.
        copied = next((r for r in runs if (r.settings, r.rows) == (run.settings, run.rows)), None)
        if copied is None:
            runs.append(run)
        else:
            skipped.append(f"{run.path}: a copy of {copied.path} (the same settings and metrics)")
    if not runs:
        raise UnreadableRun("no run to compare: " + "; ".join(skipped))
    summaries = [summarize_group(label, group) for label, group in group_runs(runs).items()]
    make_writable_directory(out, "--out")
    plot_comparison(summaries, out / FIGURE_FILE)
    (out / TABLE_FILE).write_text(groups_table(summaries))
    return summaries, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    parser.add_argument("--out", type=Path, help="default: runs/compare-<date>-<time>")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    out = args.out or Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    if missing := [str(path) for path in args.runs if not path.exists()]:
        print(f"error: no such run directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        summaries, skipped = compare(args.runs, out)
    except (UnreadableRun, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for why in skipped:
        print(f"skipped {why}", file=sys.stderr)
    print(groups_table(summaries), end="")
    print(f"figure: {out / FIGURE_FILE}\ntable: {out / TABLE_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
