"""``make results`` (``python -m tools.results``): the shipped presets over several seeds.

An entry is a preset, or a preset with overrides (``ENTRIES``: e.g. the feed-forward DQN on
the masked CartPole the recurrent preset learns). ``--entries`` also takes any preset in
``configs/`` by its name, as it is: a new preset is measured without an entry here. Each
(entry, seed) trains in ``runs/results/<entry>-seed<seed>`` (a run already complete
there is not trained again: ``train`` finds its checkpoint and returns; a stopped one
resumes, and a stop ends the tool, summarizing nothing). The summary, per entry, is
``rl_app.compare``'s: final and best evaluation return (mean ± std over seeds), frames,
wall time and the learning curve (mean and 95% bootstrap interval over seeds).
Summaries are kept per entry in ``--store`` (committed, ``docs/results.json``): entries run
now replace their stored summary, the others stay, and ``results.md`` next to the runs and
``--figure`` show every stored entry. So one preset can be measured again without
re-running the others (the recurrent one takes over an hour per seed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
from pathlib import Path

from torchrl.envs.utils import RandomPolicy

from rl_app.checks import load_config
from rl_app.compare import (
    GroupSummary,
    groups_table,
    plot_comparison,
    read_run,
    summarize_group,
)
from rl_app.config import Config, ConfigError, available_presets
from rl_app.envs import make_env
from rl_app.evaluation import play_episodes
from rl_app.loop import RunFailed
from rl_app.run import train

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
    "dqn_bitflip": ("dqn_bitflip", []),
    # The same DQN without hindsight relabelling.
    "dqn_bitflip_her_off": ("dqn_bitflip", ["replay.her_ratio=0"]),
    # Relabelled prioritized slices of 4 steps (one goal each) with 4-step targets.
    "dqn_bitflip_slices": (
        "dqn_bitflip",
        ["replay.sampler=prioritized_slice", "replay.slice_len=4", "optim.target=nstep"],
    ),
    "sac_pointreach": ("sac_pointreach", []),
    "sac_pointreach_her_off": ("sac_pointreach", ["replay.her_ratio=0"]),
    # DrQ(epsilon) on three games of the Atari 100k benchmark (the preset plays Pong).
    "dqn_atari100k_breakout": ("dqn_atari100k", ["env.name=BreakoutNoFrameskip-v4"]),
    "dqn_atari100k_boxing": ("dqn_atari100k", ["env.name=BoxingNoFrameskip-v4"]),
    "dqn_atari100k_freeway": ("dqn_atari100k", ["env.name=FreewayNoFrameskip-v4"]),
    # A lost life ends the targets, as DrQ(eps) trains (docs/results.md, Breakout).
    "dqn_atari100k_breakout_life_loss": (
        "dqn_atari100k",
        ["env.name=BreakoutNoFrameskip-v4", "env.life_loss_terminal=true"],
    ),
}
# Entries measured by default: the Atari ones take hours per seed on a CPU.
DEFAULT_ENTRIES = [name for name in ENTRIES if not name.startswith("dqn_atari100k")]
SEEDS = (1, 2, 3, 4, 5)


def entry_names() -> list[str]:
    """Every entry ``--entries`` takes: ``ENTRIES``, then each preset not among them."""
    return [*ENTRIES, *(preset for preset in available_presets() if preset not in ENTRIES)]


def entry_settings(name: str) -> tuple[str, list[str]]:
    """An entry's preset and overrides; a preset named alone has none."""
    return ENTRIES.get(name, (name, []))


def run_dir_of(root: Path, entry: str, seed: int) -> Path:
    return root / f"{entry}-seed{seed}"


def run_config(entry: str, seed: int, run_dir: Path) -> Config:
    """The config of ``entry``'s run of ``seed`` in ``run_dir`` (logged to its files only)."""
    preset, overrides = entry_settings(entry)
    settings = [*overrides, f"seed={seed}", f"run_dir={run_dir}", "logger.backend=none"]
    return load_config(preset, settings)


def stored_summaries(store: Path) -> dict[str, GroupSummary]:
    """The summaries kept in ``store`` by earlier runs of this tool, by entry name."""
    if not store.is_file():
        return {}
    return {name: GroupSummary(**fields) for name, fields in json.loads(store.read_text()).items()}


def store_summaries(store: Path, summaries: dict[str, GroupSummary]) -> dict[str, GroupSummary]:
    """Replace the stored summaries of the entries in ``summaries``, keep the others; return
    them all, in the order of :func:`entry_names` (a stored entry no longer there is
    dropped)."""
    merged = {**stored_summaries(store), **summaries}
    merged = {name: merged[name] for name in entry_names() if name in merged}
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(
        json.dumps({name: dataclasses.asdict(group) for name, group in merged.items()}, indent=2)
    )
    return merged


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.results", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--entries",
        nargs="+",
        default=DEFAULT_ENTRIES,
        choices=entry_names(),
        metavar="ENTRY",
        help=f"entries or presets, of: {', '.join(entry_names())} "
        f"(default: {', '.join(DEFAULT_ENTRIES)})",
    )
    parser.add_argument(
        "--random-policy",
        action="store_true",
        help="instead of training, score a random policy on each entry's evaluation "
        "episodes (per seed) and store it in --random-store",
    )
    parser.add_argument("--random-store", type=Path, default=Path("docs/random_policy.json"))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--root", type=Path, default=Path("runs/results"))
    parser.add_argument("--figure", type=Path, default=Path("docs/results.png"))
    parser.add_argument("--store", type=Path, default=Path("docs/results.json"))
    return parser.parse_args(argv)


def random_policy_return(config: Config) -> float:
    """The mean return of a uniformly random policy over ``config``'s evaluation episodes:
    the seeded starts its evaluations play (its actions drawn from the evaluation's own
    seeded generator)."""
    env = make_env(dataclasses.replace(config.env, num_envs=1), config.seed)
    actions = env.full_action_spec
    env.close()
    policy = RandomPolicy(actions.expand(config.eval.episodes, *actions.shape))
    return play_episodes(config, policy, config.eval.episodes).returns.mean().item()


def store_random_policy(args: argparse.Namespace) -> int:
    """``--random-policy``: each entry's random-policy score per seed, kept per entry in
    ``--random-store`` beside those of other entries."""
    store = json.loads(args.random_store.read_text()) if args.random_store.is_file() else {}
    for name in args.entries:
        preset, overrides = entry_settings(name)
        returns = [
            random_policy_return(load_config(preset, [*overrides, f"seed={seed}"]))
            for seed in args.seeds
        ]
        store[name] = {"seeds": args.seeds, "eval_returns": returns}
        per_seed = ", ".join(f"{value:.1f}" for value in returns)
        print(f"{name}: a random policy scores {statistics.mean(returns):.1f} ({per_seed})")
    args.random_store.parent.mkdir(parents=True, exist_ok=True)
    args.random_store.write_text(json.dumps(store, indent=2))
    return 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.random_policy:
        return store_random_policy(args)

    runs = {
        name: [run_dir_of(args.root, name, seed) for seed in args.seeds] for name in args.entries
    }
    try:
        # Every run's settings are checked before the first one trains.
        configs = [
            run_config(name, seed, run)
            for name in args.entries
            for seed, run in zip(args.seeds, runs[name], strict=True)
        ]
        for config in configs:
            result = train(config)
            if result.stopped_by is not None:
                print(
                    f"stopped by {result.stopped_by} in {config.run_dir}; nothing summarized: "
                    "the same command resumes it",
                    file=sys.stderr,
                )
                return 1
    except ConfigError as error:  # a run directory another process trains in, among them
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RunFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    measured = {name: summarize_group(name, [read_run(run) for run in runs[name]]) for name in runs}
    every_entry = list(store_summaries(args.store, measured).values())
    table = groups_table(every_entry)
    (args.root / "results.md").write_text(table)
    args.figure.parent.mkdir(parents=True, exist_ok=True)
    plot_comparison(every_entry, args.figure)
    print(table)
    print(f"summaries: {args.store}; curves: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
