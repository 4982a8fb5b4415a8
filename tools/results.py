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

The README's results table is ``TABLE``, one row per entry or group of entries, written
between its marker comments from the committed files it reads (``TABLE_SOURCES``) each time
one of them is written (``--table-only``: the table alone, nothing trained). With no
``--entries`` the tool measures the table's rows (``DEFAULT_ENTRIES``), except those that
say why not. Before it starts, it names the files it will rewrite.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from torchrl.envs.utils import RandomPolicy

from rl_app.checks import load_config
from rl_app.compare import (
    GroupSummary,
    groups_table,
    mean_std,
    plot_comparison,
    read_run,
    summarize_group,
)
from rl_app.config import Config, ConfigError, available_presets
from rl_app.envs import make_env
from rl_app.evaluation import play_episodes
from rl_app.loop import RunFailed
from rl_app.run import train
from rl_app.runlock import make_writable_file

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The committed files, relative to the checkout's root.
STORE = Path("docs/results.json")
ATARI_STORE = Path("docs/results-atari.json")  # Atari 100k: one evaluation a run
RANDOM_STORE = Path("docs/random_policy.json")
TABLE_SOURCES = (STORE, ATARI_STORE, RANDOM_STORE)
TABLE_START = "<!-- results table: written by make results (tools/results.py) -->"
TABLE_END = "<!-- end of the results table -->"

# name -> (preset, overrides)
ENTRIES = {
    "default": ("default", []),
    "td3_pendulum": ("td3_pendulum", []),
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
SEEDS = (1, 2, 3, 4, 5)
# Entries measured over other seeds by default (--seeds sets them for every entry).
ENTRY_SEEDS = {"rdqn_cartpole_masked": (1, 2, 3)}  # over an hour a seed on 2 cores
# Published scores quoted beside an entry's (not measured here).
PUBLISHED = {
    "dqn_atari100k_breakout": "DrQ(ε) 19.8",
    "dqn_atari100k_boxing": "DrQ(ε) 9.0",
    "dqn_atari100k_freeway": "DrQ(ε) 20.3",
}


@dataclass(frozen=True)
class Row:
    """A row of the README's results table: the stored entries that fill it (several: one
    per game) and what it says of them."""

    entries: tuple[str, ...]
    what: str
    label: str = ""  # the first cell; by default the entry's preset and overrides
    not_run: str = ""  # why the tool does not measure it by default
    unstored: str = ""  # what the row says while its entries are not stored


RECURRENT = "[docs/recurrent.md](docs/recurrent.md#measured-on-masked-cartpole)"
ATARI_100K = "[docs/results.md](docs/results.md#atari-100k)"
TABLE = (
    Row(("default",), "SAC on `Pendulum-v1`, its loss compiled"),
    Row(
        ("td3_pendulum",),
        "TD3 on `Pendulum-v1` (RL Zoo's settings; Stable-Baselines3's published agent: "
        "-196 ± 119, one run)",
    ),
    Row(("dqn_cartpole",), "DQN on `CartPole-v1`, TD(lambda) over prioritized slices"),
    Row(
        ("rdqn_cartpole_masked",),
        "recurrent DQN on `CartPole-v1` without velocities",
        unstored=f"3 seeds measured before `docs/results.json` existed: {RECURRENT}",
    ),
    Row(
        ("sac_halfcheetah",),
        "SAC on MuJoCo `HalfCheetah-v5`",
        not_run="meant for a GPU",
        unstored="not measured yet (meant for a GPU)",
    ),
    Row(
        ("dqn_bitflip",),
        "DQN with hindsight relabelling on 15-bit flipping ([docs/goals.md](docs/goals.md))",
    ),
    Row(("dqn_bitflip_her_off",), "the same without relabelling"),
    Row(
        ("dqn_bitflip_slices",),
        "prioritized 4-step slices, one goal each, 4-step targets",
        label="`dqn_bitflip`, relabelled slices",
    ),
    Row(
        ("sac_pointreach",),
        "SAC with hindsight relabelling on the 2-D `PointReach` ([docs/goals.md](docs/goals.md))",
    ),
    Row(("sac_pointreach_her_off",), "the same without relabelling"),
    Row(
        ("dqn_atari",),
        "Nature-CNN DQN on `BreakoutNoFrameskip-v4` (CleanRL's settings, double, n-step over "
        "prioritized slices), 10M agent steps",
        not_run="meant for a GPU",
        unstored="not measured yet (meant for a GPU)",
    ),
    Row(
        ("dqn_atari100k_boxing", "dqn_atari100k_freeway", "dqn_atari100k_breakout"),
        f"DrQ(ε) on the Atari 100k benchmark (100k agent steps), three games ({ATARI_100K})",
        label="`dqn_atari100k`",
        not_run="about an hour a run on a CPU: `--entries dqn_atari100k_boxing "
        "dqn_atari100k_freeway dqn_atari100k_breakout --seeds 1 2 --store "
        "docs/results-atari.json`",
        unstored=f"not measured yet ({ATARI_100K})",
    ),
)
# Entries measured by default: the table's, but those of rows that say why not.
DEFAULT_ENTRIES = [name for row in TABLE if not row.not_run for name in row.entries]


def entry_names() -> list[str]:
    """Every entry ``--entries`` takes: ``ENTRIES``, then each preset not among them."""
    return [*ENTRIES, *(preset for preset in available_presets() if preset not in ENTRIES)]


def entry_settings(name: str) -> tuple[str, list[str]]:
    """An entry's preset and overrides; a preset named alone has none."""
    return ENTRIES.get(name, (name, []))


def entry_seeds(name: str, seeds: list[int] | None) -> list[int]:
    """The seeds ``name`` runs: ``--seeds`` when given, else its own (``SEEDS`` mostly)."""
    return list(seeds if seeds is not None else ENTRY_SEEDS.get(name, SEEDS))


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


# -- the README's table ----------------------------------------------------------------------


def row_label(row: Row) -> str:
    if row.label:
        return row.label
    preset, overrides = entry_settings(row.entries[0])
    return ", ".join(f"`{cell}`" for cell in [preset, *overrides])


def returns_cell(returns: list[float], success_rates: list[float]) -> str:
    success = f", success {mean_std(success_rates, percent=True)}" if success_rates else ""
    return mean_std(returns) + success


def random_score(random: dict, name: str) -> str:
    """``name``'s random-policy score over its stored seeds, if stored."""
    if name not in random:
        return ""
    return f"random {statistics.mean(random[name]['eval_returns']):.1f}"


def games_cells(entries: list[GroupSummary], random: dict) -> list[str]:
    """The cells of a row of several one-evaluation entries (a game each): seeds, frames,
    final return per game with its seeds, the random policy's and a published score."""
    cells = []
    for group in entries:
        game = group.env_name.removesuffix("NoFrameskip-v4")
        per_seed = ", ".join(f"{value:.1f}" for value in group.final_eval_returns)
        anchors = [random_score(random, group.label), PUBLISHED.get(group.label, "")]
        anchors_text = ", ".join(anchor for anchor in anchors if anchor)
        cells.append(
            f"{game} {mean_std(group.final_eval_returns)} ({per_seed}"
            + (f"; {anchors_text})" if anchors_text else ")")
        )
    seeds = {len(group.runs) for group in entries}
    frames = {group.frames for group in entries}
    same = all(group.best_eval_returns == group.final_eval_returns for group in entries)
    walls = [
        f"{group.env_name.removesuffix('NoFrameskip-v4')} "
        + ", ".join(f"{seconds / 60:.0f}" for seconds in group.wall_seconds)
        for group in entries
    ]
    return [
        ", ".join(str(count) for count in sorted(seeds)),
        ", ".join(f"{count:,}" for count in sorted(frames)),
        "; ".join(cells),
        "the same (one evaluation a run)" if same else "",
        "; ".join(walls) + " min",
    ]


def row_cells(row: Row, stored: dict[str, GroupSummary], random: dict) -> list[str]:
    entries = [stored[name] for name in row.entries if name in stored]
    if len(entries) < len(row.entries):
        return ["", "", row.unstored or "not measured yet", "", ""]
    if len(entries) > 1:
        return games_cells(entries, random)
    (group,) = entries
    return [
        str(len(group.runs)),
        f"{group.frames:,}",
        returns_cell(group.final_eval_returns, group.final_success_rates),
        returns_cell(group.best_eval_returns, group.best_success_rates),
        f"{statistics.mean(group.wall_seconds) / 60:.1f} min",
    ]


def results_table(root: Path = ROOT) -> str:
    """The README's results table, from the committed files under ``root``."""
    stored = {**stored_summaries(root / STORE), **stored_summaries(root / ATARI_STORE)}
    random_file = root / RANDOM_STORE
    random = json.loads(random_file.read_text()) if random_file.is_file() else {}
    lines = [
        "| preset | what | seeds | frames | final eval return (mean ± std) "
        "| best eval return (mean ± std) | wall time per run |",
        "| --- " * 7 + "|",
    ]
    for row in TABLE:
        cells = [row_label(row), row.what, *row_cells(row, stored, random)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def readme_table(text: str) -> str:
    """The table between the README's marker comments."""
    if TABLE_START not in text or TABLE_END not in text:
        raise ValueError(f"the README has no {TABLE_START} ... {TABLE_END} markers")
    return text.split(TABLE_START + "\n", 1)[1].split(TABLE_END, 1)[0]


def write_readme_table(readme: Path, table: str) -> None:
    text = readme.read_text()
    before = text.split(TABLE_START, 1)[0]
    after = text.split(TABLE_END, 1)[1]
    readme_table(text)  # the markers are there
    readme.write_text(f"{before}{TABLE_START}\n{table}{TABLE_END}{after}")


# -- the command -----------------------------------------------------------------------------


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
        f"(default: the README table's, {', '.join(DEFAULT_ENTRIES)})",
    )
    parser.add_argument(
        "--random-policy",
        action="store_true",
        help="instead of training, score a random policy on each entry's evaluation "
        "episodes (per seed) and store it in --random-store",
    )
    parser.add_argument("--random-store", type=Path, default=RANDOM_STORE)
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=None,
        help=f"seeds of every entry (default: {' '.join(map(str, SEEDS))}; "
        + "; ".join(f"{name}: {' '.join(map(str, s))}" for name, s in ENTRY_SEEDS.items())
        + ")",
    )
    parser.add_argument("--root", type=Path, default=Path("runs/results"))
    parser.add_argument(
        "--figure", type=Path, default=None, help="the curves (default: --store's name, .png)"
    )
    parser.add_argument("--store", type=Path, default=STORE)
    parser.add_argument(
        "--table-only",
        action="store_true",
        help="train nothing: rewrite the README's results table from "
        + ", ".join(map(str, TABLE_SOURCES)),
    )
    args = parser.parse_args(argv)
    if args.figure is None:
        args.figure = args.store.with_suffix(".png")
    return args


def writes_table_source(args: argparse.Namespace) -> bool:
    """Whether this command writes a committed file the README's table is made from."""
    written = args.random_store if args.random_policy else args.store
    return written.resolve() in {(ROOT / source).resolve() for source in TABLE_SOURCES}


def rewritten_files(args: argparse.Namespace) -> list[str]:
    """The files that exist now and that this command will rewrite."""
    written = [args.random_store] if args.random_policy else [args.store, args.figure]
    files = [str(path) for path in written if path.is_file()]
    if writes_table_source(args):
        files.append(f"{README.relative_to(ROOT)} (its results table)")
    return files


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
        seeds = entry_seeds(name, args.seeds)
        returns = [
            random_policy_return(load_config(preset, [*overrides, f"seed={seed}"]))
            for seed in seeds
        ]
        store[name] = {"seeds": seeds, "eval_returns": returns}
        per_seed = ", ".join(f"{value:.1f}" for value in returns)
        print(f"{name}: a random policy scores {statistics.mean(returns):.1f} ({per_seed})")
    args.random_store.parent.mkdir(parents=True, exist_ok=True)
    args.random_store.write_text(json.dumps(store, indent=2))
    return 0


def check_outputs(args: argparse.Namespace) -> None:
    """Raise :class:`ConfigError` where the command could not write what it ends with, or
    read a store it adds to: before anything is trained or played."""
    if args.seeds is not None and len(set(args.seeds)) < len(args.seeds):
        raise ConfigError(f"--seeds {' '.join(map(str, args.seeds))}: give each seed once")
    stores = [("--random-store", args.random_store)] if args.random_policy else [
        ("--store", args.store), ("--figure", args.figure)
    ]  # fmt: skip
    for flag, path in stores:
        make_writable_file(path, flag)
        if flag != "--figure" and path.is_file():
            try:
                json.loads(path.read_text())
            except (OSError, ValueError) as error:
                raise ConfigError(f"{flag} {str(path)!r} cannot be read: {error}") from None


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        check_outputs(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.table_only:
        write_readme_table(README, results_table())
        print(f"rewrote the results table of {README.relative_to(ROOT)}")
        return 0
    if files := rewritten_files(args):
        print(f"this rewrites {', '.join(files)} when it ends: review them with git diff")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.random_policy:
        store_random_policy(args)
        if writes_table_source(args):
            write_readme_table(README, results_table())
        return 0

    runs = {
        name: [run_dir_of(args.root, name, seed) for seed in entry_seeds(name, args.seeds)]
        for name in args.entries
    }
    try:
        # Every run's settings are checked before the first one trains.
        configs = [
            run_config(name, seed, run)
            for name in args.entries
            for seed, run in zip(entry_seeds(name, args.seeds), runs[name], strict=True)
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
    if writes_table_source(args):
        write_readme_table(README, results_table())
    print(table)
    print(f"summaries: {args.store}; curves: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
