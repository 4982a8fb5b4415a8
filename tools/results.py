"""``make results`` (``python -m tools.results``): the shipped presets over several seeds.

Each (preset, seed) trains in ``runs/results/<preset>-seed<seed>`` (a run already complete
there is not trained again: ``train`` finds its checkpoint and returns). The summary, per
preset: final evaluation return (the last evaluation of each run) as mean ± std over
seeds, frames and wall time; written to ``results.json`` and ``results.md`` next to the
runs, and the learning curves (mean ± std over seeds) to ``--figure``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from rl_app.config import load_config
from rl_app.logger import EVAL_KEY, label_eval_axes, read_metrics
from rl_app.loop import train

PRESETS = ("default", "dqn_cartpole")
SEEDS = (1, 2, 3, 4, 5)


def run_dir_of(root: Path, preset: str, seed: int) -> Path:
    return root / f"{preset}-seed{seed}"


def summarize_preset(runs: list[Path]) -> dict[str, Any]:
    """Final and best evaluation returns, frames and wall time of a preset's runs."""
    rows = [read_metrics(run) for run in runs]
    evals = [[row for row in run_rows if EVAL_KEY in row] for run_rows in rows]
    final = [run_evals[-1][EVAL_KEY] for run_evals in evals]
    return {
        "runs": [str(run) for run in runs],
        "frames": rows[0][-1]["frames"],
        "final_eval_returns": final,
        "final_eval_mean": statistics.mean(final),
        "final_eval_std": statistics.stdev(final) if len(final) > 1 else 0.0,
        "best_eval_returns": [max(row[EVAL_KEY] for row in run_evals) for run_evals in evals],
        "wall_seconds": [run_rows[-1]["wall_seconds"] for run_rows in rows],
    }


def markdown_table(summary: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| preset | seeds | frames | final eval return (mean ± std) | best eval return (mean) "
        "| wall time per run |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for preset, result in summary.items():
        wall = statistics.mean(result["wall_seconds"]) / 60
        lines.append(
            f"| `{preset}` | {len(result['runs'])} | {result['frames']:,} | "
            f"{result['final_eval_mean']:.1f} ± {result['final_eval_std']:.1f} | "
            f"{statistics.mean(result['best_eval_returns']):.1f} | {wall:.1f} min |"
        )
    return "\n".join(lines) + "\n"


def plot_curves(summary: dict[str, dict[str, Any]], path: Path) -> None:
    """Evaluation return against frames, mean ± std over seeds, one panel per preset."""
    figure, panels = plt.subplots(1, len(summary), figsize=(4.5 * len(summary), 3.2))
    for axes, (preset, result) in zip(np.atleast_1d(panels), summary.items(), strict=True):
        curves = [
            [(row["frames"], row[EVAL_KEY]) for row in read_metrics(Path(run)) if EVAL_KEY in row]
            for run in result["runs"]
        ]
        frames = np.array([frame for frame, _ in curves[0]])
        returns = np.array([[value for _, value in curve] for curve in curves])
        mean, std = returns.mean(axis=0), returns.std(axis=0)
        axes.plot(frames, mean, marker="o", markersize=3)
        axes.fill_between(frames, mean - std, mean + std, alpha=0.25)
        axes.set_title(f"{preset} ({len(curves)} seeds)")
        label_eval_axes(axes)
    figure.tight_layout()
    figure.savefig(path, dpi=70)
    plt.close(figure)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--root", type=Path, default=Path("runs/results"))
    parser.add_argument("--figure", type=Path, default=Path("docs/results.png"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    summary = {}
    for preset in args.presets:
        runs = [run_dir_of(args.root, preset, seed) for seed in args.seeds]
        for seed, run in zip(args.seeds, runs, strict=True):
            train(load_config(preset, [f"seed={seed}", f"run_dir={run}", "logger.backend=none"]))
        summary[preset] = summarize_preset(runs)
    (args.root / "results.json").write_text(json.dumps(summary, indent=2))
    table = markdown_table(summary)
    (args.root / "results.md").write_text(table)
    args.figure.parent.mkdir(parents=True, exist_ok=True)
    plot_curves(summary, args.figure)
    print(table)
    print(f"summary: {args.root / 'results.json'}; curves: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
