"""The command: ``python -m rl_app.sweep SWEEP.yaml [--summary | --worker]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rl_app.config import ConfigError, settings_of
from rl_app.sweep.spec import JOURNAL_FILE, SweepSettings, load_sweep
from rl_app.sweep.summary import write_summary
from rl_app.sweep.worker import run_sweep, submit_to_slurm, work


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m rl_app.sweep",
        description="Run a hyperparameter sweep (continues it if its sweep_dir holds one).",
        epilog="sweep file keys:\n"
        + "\n".join(
            f"  {key}  ({meta['doc']})"
            for key, _, meta in settings_of(SweepSettings)
            if key != "slurm.array"  # jobs says how many worker jobs run
        )
        + "\n  overrides  (key=value settings of every trial)"
        + "\n  space  (key: {low, high, log, step} or {choices: [...]}, per setting)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sweep_file", type=Path, help="the sweep's YAML file")
    parser.add_argument("--summary", action="store_true", help="write the summary and exit")
    parser.add_argument("--worker", action="store_true", help="be one worker of a running sweep")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        sweep = load_sweep(args.sweep_file)
        if args.summary and not (sweep.dir / JOURNAL_FILE).is_file():
            raise ConfigError(f"sweep_dir={str(sweep.dir)!r} holds no sweep yet")
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.summary:
        print(f"summary: {write_summary(sweep)}")
        return 0
    if args.worker:
        return work(sweep, args.sweep_file)
    try:  # what the cluster refuses, or a sweep_dir that cannot be written
        if sweep.settings.launcher == "slurm":
            return submit_to_slurm(sweep, args.sweep_file)
        return run_sweep(sweep, args.sweep_file)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
