"""``make results`` (``python -m tools.results``): the shipped presets over several seeds.

An entry is a preset, or a preset with overrides (``ENTRIES``: e.g. the feed-forward DQN on
the masked CartPole the recurrent preset learns). Each (entry, seed) trains in
``runs/results/<entry>-seed<seed>`` (a run already complete
there is not trained again: ``train`` finds its checkpoint and returns). The summary, per
entry, is ``rl_app.compare``'s: final and best evaluation return (mean ± std over seeds),
frames and wall time, written to ``results.json`` and ``results.md`` next to the runs, and
the learning curves (mean and 95% bootstrap interval over seeds) to ``--figure``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

from rl_app.compare import markdown_table, plot_comparison, read_run, summarize_group
from rl_app.config import load_config
from rl_app.loop import train

# name -> (preset, overrides)
ENTRIES = {
    "default": ("default", []),
    "dqn_cartpole": ("dqn_cartpole", []),
    "rdqn_cartpole_masked": ("rdqn_cartpole_masked", []),
    # The feed-forward DQN on the same partial observations, for the same frames.
    "dqn_cartpole_masked": (
        "dqn_cartpole",
        [
            "env.observation_indices=[0,2]",
            "env.normalize_observations=true",
            "collector.total_frames=100000",
        ],
    ),
}
SEEDS = (1, 2, 3, 4, 5)


def run_dir_of(root: Path, entry: str, seed: int) -> Path:
    return root / f"{entry}-seed{seed}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", nargs="+", default=list(ENTRIES), choices=list(ENTRIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--root", type=Path, default=Path("runs/results"))
    parser.add_argument("--figure", type=Path, default=Path("docs/results.png"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    summary = {}
    for name in args.entries:
        preset, overrides = ENTRIES[name]
        runs = [run_dir_of(args.root, name, seed) for seed in args.seeds]
        for seed, run in zip(args.seeds, runs, strict=True):
            settings = [*overrides, f"seed={seed}", f"run_dir={run}", "logger.backend=none"]
            train(load_config(preset, settings))
        summary[name] = summarize_group(name, [read_run(run) for run in runs])
    (args.root / "results.json").write_text(
        json.dumps({name: dataclasses.asdict(group) for name, group in summary.items()}, indent=2)
    )
    table = markdown_table(list(summary.values()))
    (args.root / "results.md").write_text(table)
    args.figure.parent.mkdir(parents=True, exist_ok=True)
    plot_comparison(list(summary.values()), args.figure)
    print(table)
    print(f"summary: {args.root / 'results.json'}; curves: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
