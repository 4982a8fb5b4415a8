"""Train an off-policy agent: ``python train.py [--config NAME|FILE] [key=value ...]``.

A mistake in the command line or the configuration (or a run directory another process is
training in) is reported in one line with exit status 2, before anything is created; a fault
during training (exit status 1) names the last good checkpoint. ``run_dir=`` an existing run
resumes it. ``launcher=slurm`` submits the run to SLURM instead (see slurm/README.md) and
returns once it is queued.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
from pathlib import Path


def stopped_before_training(signum: int, frame: object) -> None:
    """SIGTERM or SIGUSR2 before the run installs its own handlers (the loop saves then):
    say so, then end as the signal ends a process."""
    os.write(2, f"stopped by {signal.Signals(signum).name} before training started\n".encode())
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


if __name__ == "__main__":  # before torch's seconds of imports
    for signum in (signal.SIGTERM, signal.SIGUSR2):
        signal.signal(signum, stopped_before_training)

try:  # seconds of torch's imports: a Ctrl-C during them ends the command quietly
    from rl_app.checks import describe_settings, load_config
    from rl_app.config import (
        DEFAULT_PRESET,
        Config,
        ConfigError,
        available_presets,
        describe_presets,
        holds_checkpoint,
        to_yaml,
    )
except KeyboardInterrupt:
    sys.exit(130)


def argument_parser() -> argparse.ArgumentParser:
    """The command line. ``--help`` is answered by :func:`main` once the arguments are
    parsed: it shows the values of the preset ``--config`` names, wherever it is given."""
    parser = argparse.ArgumentParser(
        description="Train SAC, TD3 or DQN with TorchRL. Settings are overridden with key=value.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    parser.add_argument("-h", "--help", action="store_true", help="show this help message and exit")
    parser.add_argument(
        "--config",
        help=f"preset from configs/ (one of: {', '.join(available_presets())}), or a YAML file "
        f"(default: {DEFAULT_PRESET}; a resumed run takes its own)",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. optim.lr=1e-3")
    return parser


def help_text(parser: argparse.ArgumentParser, preset: str) -> str:
    """The options, the presets, and every setting with its value in ``preset``: what a run
    of it uses, unless overridden."""
    parser.epilog = (
        "presets (what each holds at full size):\n"
        + describe_presets()
        + f"\n\nsettings (key=value in --config {preset}  (meaning)):\n"
        + describe_settings(preset)
    )
    return parser.format_help()


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    # Intermixed: key=value may stand on both sides of --config.
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.help:
            print(help_text(parser, args.config or DEFAULT_PRESET), end="")
            return 0
        config = load_config(args.config, args.overrides)
        if args.print_config:
            print(to_yaml(config), end="")
            return 0
        if config.launcher == "slurm":
            from rl_app.launch.slurm import describe, submit

            print(describe(submit(args.config or DEFAULT_PRESET, args.overrides, config)))
            return 0
        return train_here(config)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before a run started: nothing to resume
        print("stopped by Ctrl-C before training started", file=sys.stderr)
        return 130


def train_here(config: Config) -> int:
    """Train in this process; a fault during training is exit status 1."""
    if config.collector.mode in ("distributed", "rpc"):  # jobs: ask the cluster first
        from rl_app.launch.cluster import check_collection_jobs

        check_collection_jobs(config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from rl_app.loop import RunFailed  # heavy imports only once the config is known good
    from rl_app.run import train

    try:
        result = train(config)
    except RunFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C (what it lost is said), or one before the loop
        if holds_checkpoint(Path(config.run_dir)):
            print(f"stopped by Ctrl-C; resume with: python train.py run_dir={config.run_dir}")
        else:
            print("stopped by Ctrl-C before the first checkpoint: run the same command again")
        return 130
    print(f"run directory: {result.run_dir}")
    if math.isnan(result.last_eval_return):  # stopped before its first evaluation
        print("no evaluation yet")
    else:
        print(
            f"best eval return: {result.best_eval_return:.1f} (last: {result.last_eval_return:.1f})"
        )
    if result.stopped_by is not None:
        print(
            f"stopped by {result.stopped_by} at {result.frames} frames; "
            f"checkpoint saved: {result.last_checkpoint}\n"
            f"resume with: python train.py run_dir={result.run_dir}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
