"""A sweep's summary: ``summary.md`` (the best trial, a table of all), ``trials.csv``,
``best.yaml`` (the best trial's settings as a preset) and Optuna's plots."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from rl_app.config import read_run_config, to_yaml
from rl_app.sweep.spec import Sweep
from rl_app.sweep.study import open_study

SUMMARY_FILE = "summary.md"
TRIALS_FILE = "trials.csv"
BEST_FILE = "best.yaml"
PLOTS = {
    "history.png": "plot_optimization_history",
    "importances.png": "plot_param_importances",
}


def write_summary(sweep: Sweep) -> Path:
    """``summary.md`` (the best trial, a table of all), ``trials.csv``, ``best.yaml`` (the
    best trial's settings as a preset for ``train.py --config``) and Optuna's plots."""
    study = open_study(sweep)
    trials = study.get_trials()
    rows = [trial_row(trial) for trial in trials]
    with open(sweep.dir / TRIALS_FILE, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=table_columns(sweep))
        writer.writeheader()
        writer.writerows(rows)
    complete = [trial for trial in trials if trial.state == TrialState.COMPLETE]
    lines = [f"# Sweep {sweep.dir}", ""]
    if complete:
        best = study.best_trial
        (sweep.dir / BEST_FILE).write_text(best_preset(sweep, best))
        lines += [
            f"Best: trial {best.number}, {sweep.settings.objective} evaluation return "
            f"{best.value:.2f}, {best.params}; its settings: `train.py --config "
            f"{sweep.dir / BEST_FILE}`",
            "",
        ]
    counts = {state.name: sum(t.state == state for t in trials) for state in TrialState}
    lines += [
        f"{len(trials)} of {sweep.settings.trials} trials: "
        + ", ".join(f"{n} {name.lower()}" for name, n in counts.items() if n),
        "",
        *trials_table(table_columns(sweep), rows),
        "",
        *draw_plots(study, sweep.dir),
    ]
    (sweep.dir / SUMMARY_FILE).write_text("\n".join(lines) + "\n")
    return sweep.dir / SUMMARY_FILE


def failed_trials(sweep: Sweep) -> list[str]:
    """Each failed trial of the sweep, and why, in words."""
    failed = open_study(sweep).get_trials(deepcopy=False, states=(TrialState.FAIL,))
    return [
        f"trial {t.number} failed: {t.user_attrs.get('error', '(see its log)')}" for t in failed
    ]


def unfinished_trials(sweep: Sweep) -> list[int]:
    """The trials a stop left running: the sweep's next run resumes them."""
    running = open_study(sweep).get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    return [trial.number for trial in running]


def table_columns(sweep: Sweep) -> list[str]:
    return ["number", "state", *sweep.space, "objective", "frames", "run_dir"]


def trial_row(trial: FrozenTrial) -> dict[str, Any]:
    """A trial's row; frames are those of its last evaluation."""
    return {
        "number": trial.number,
        "state": trial.state.name,
        **trial.params,
        "objective": "" if trial.value is None else round(trial.value, 3),
        "frames": max(trial.intermediate_values, default=0),
        "run_dir": trial.user_attrs.get("run_dir", ""),
    }


def trials_table(columns: list[str], rows: list[dict[str, Any]]) -> list[str]:
    """The trials as the lines of a Markdown table, one row each (``trial_row``)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return lines


def best_preset(sweep: Sweep, best: FrozenTrial) -> str:
    """The best trial's resolved config, without its run directory, as a preset file."""
    config = read_run_config(Path(best.user_attrs["run_dir"]))
    config.run_dir = None
    return (
        f"# The best trial ({best.number}) of the sweep in {sweep.dir}: {sweep.settings.objective} "
        f"evaluation return {best.value:.2f}\n# with {best.params}\n" + to_yaml(config)
    )


def draw_plots(study: optuna.Study, folder: Path) -> list[str]:
    """Optuna's own plots as PNGs; returns the summary's lines about them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    lines = []
    for name, function in PLOTS.items():
        try:
            axes = getattr(plots, function)(study)
        except (ValueError, RuntimeError) as error:  # e.g. too few complete trials
            lines.append(f"{name}: not drawn ({error})")
            continue
        axes.figure.savefig(folder / name, bbox_inches="tight")
        plt.close(axes.figure)
        lines.append(f"![{function}]({name})")
    return lines
