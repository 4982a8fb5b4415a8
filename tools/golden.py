"""Golden runs (``python -m tools.golden record|check FILE``): short runs of five presets,
same seed, on the CPU, whose metrics rows must not change when the code is reorganised.

``record`` writes each preset's rows (wall times left out) to FILE; ``check`` trains them
again and names every row that differs from FILE, to the bit. Compile is off: a compiled
update may fuse differently after an edit that changes nothing an eager run computes."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from rl_app.checks import load_config
from rl_app.config import ConfigError
from rl_app.logger import read_metrics
from rl_app.run import train
from rl_app.runlock import make_writable_file

SHORT_RUN = [
    "collector.total_frames=1600",
    "collector.frames_per_batch=200",
    "collector.init_random_frames=400",
    "eval.interval_frames=800",
    "eval.episodes=2",
    "logger.backend=none",
    "optim.compile=false",
    "device=cpu",
]
# preset -> its own overrides on top of SHORT_RUN
PRESETS = {
    "default": [],
    "dqn_cartpole": [],
    "dqn_bitflip": ["collector.frames_per_batch=300", "collector.total_frames=1800"],
    "rdqn_cartpole_masked": ["network.lstm_size=16"],
    "dqn_atari": [
        "replay.capacity=4000",
        "collector.frames_per_batch=128",
        "collector.total_frames=768",
        "collector.init_random_frames=256",
        "eval.interval_frames=384",
        "eval.episodes=1",
    ],
}
TIMED = ("wall_seconds", "fps", "seconds", "per_s")


def golden_rows(preset: str, overrides: list[str], runs: Path) -> list[dict[str, Any]]:
    config = load_config(preset, [*SHORT_RUN, *overrides, f"run_dir={runs / preset}"])
    train(config)
    return [
        {key: value for key, value in row.items() if not any(t in key for t in TIMED)}
        for row in read_metrics(runs / preset)
    ]


def checked_file(action: str, file: Path, presets: list[str]) -> dict[str, Any]:
    """The rows ``file`` records (none to record), or :class:`ConfigError` where it cannot be
    written, read, or lacks one of ``presets``."""
    if action == "record":
        make_writable_file(file, "file")
        return {}
    if file.is_dir():
        raise ConfigError(f"{file} is a directory: give a file")
    try:
        recorded = json.loads(file.read_text())
    except OSError as error:
        raise ConfigError(f"{file} cannot be read: {error.strerror}") from None
    except ValueError as error:
        raise ConfigError(f"{file} is not a golden record: {error}") from None
    if missing := [name for name in presets if name not in recorded]:
        raise ConfigError(f"{file} records no {', '.join(missing)}")
    return recorded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["record", "check"])
    parser.add_argument("file", type=Path)
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    args = parser.parse_args(argv)
    try:  # what it reads or writes, before the runs
        recorded = checked_file(args.action, args.file, args.presets)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as runs:
        rows = {name: golden_rows(name, PRESETS[name], Path(runs)) for name in args.presets}
    if args.action == "record":
        args.file.write_text(json.dumps(rows, indent=1) + "\n")
        return 0
    differing = 0
    for name, now in rows.items():
        before = recorded[name]
        for index, (old, new) in enumerate(zip(before, now, strict=False)):
            if old != new:
                differing += 1
                keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
                print(f"{name} row {index}: {', '.join(keys)} differ")
        if len(before) != len(now):
            differing += 1
            print(f"{name}: {len(before)} rows recorded, {len(now)} now")
        print(f"{name}: {len(now)} rows checked")
    print("golden runs: " + ("all identical" if not differing else f"{differing} differences"))
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
