"""The command: ``python -m tools.bench [--only SECTIONS] [key=value ...]``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import tools.bench
from rl_app.checks import load_config
from rl_app.config import ConfigError
from tools.bench.checkpoint import bench_checkpoint, print_checkpoint
from tools.bench.collection import bench_collection, print_collection
from tools.bench.evaluation import bench_evaluation, print_evaluation
from tools.bench.gpu import bench_gpu, print_gpu
from tools.bench.machine import machine_description, print_machine
from tools.bench.overlap import bench_overlap, print_overlap
from tools.bench.pixels import PIXELS_PRESET, PIXELS_SETTINGS, bench_pixels, print_pixels
from tools.bench.replay_service import bench_replay_service, print_replay_service
from tools.bench.sb3 import bench_against_sb3, print_sb3
from tools.bench.shared import BENCH_CAPACITY, BENCH_FRAMES
from tools.bench.training import bench_training, print_training
from tools.bench.update import bench_update, print_update

SECTIONS = (
    "update", "training", "checkpoint", "pixels", "collection", "replay_service", "overlap",
    "evaluation", "sb3", "gpu",
)  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench", description=tools.bench.__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections: {','.join(SECTIONS)}"
    )
    parser.add_argument("overrides", nargs="*", help="key=value settings of the default preset")
    args = parser.parse_args(argv)
    sections = args.only.split(",")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        print(
            f"error: --only {','.join(unknown)}: choose from {','.join(SECTIONS)}", file=sys.stderr
        )
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    overrides = [
        f"collector.total_frames={BENCH_FRAMES}", f"replay.capacity={BENCH_CAPACITY}",
        "logger.backend=none", *args.overrides,
    ]  # fmt: skip
    if not any(item.startswith("run_dir=") for item in overrides):
        overrides.append(f"run_dir=runs/bench-{stamp}")
    try:
        config = load_config("default", overrides)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    run_dir = Path(config.run_dir)
    # Settings of every section: the user's, without where and how long the main run goes.
    base = [
        item for item in overrides if not item.startswith(("run_dir=", "collector.total_frames="))
    ]
    machine = machine_description(config.threads)
    print_machine(machine)
    report: dict[str, Any] = {"machine": machine}
    measure = {
        "update": lambda: bench_update(
            [item for item in base if not item.startswith("replay.capacity=")],
            machine["matmul_256_gflops"] * 1e9,
        ),
        "training": lambda: bench_training(config),
        "checkpoint": lambda: bench_checkpoint(
            load_config("default", overrides), run_dir / "checkpoint-bench"
        ),
        "pixels": lambda: bench_pixels(
            load_config(PIXELS_PRESET, [*PIXELS_SETTINGS, f"run_dir={run_dir / 'pixels'}"])
        ),
        "collection": lambda: bench_collection(base, run_dir / "collection"),
        "replay_service": lambda: bench_replay_service(base, run_dir / "replay-service"),
        "overlap": lambda: bench_overlap(run_dir / "overlap"),
        "evaluation": lambda: bench_evaluation(run_dir / "evaluation"),
        "sb3": lambda: bench_against_sb3(
            [item for item in base if not item.startswith("replay.capacity=")], run_dir / "sb3"
        ),
        "gpu": lambda: bench_gpu(run_dir / "gpu"),
    }
    printers = {"update": print_update, "training": print_training,
                "checkpoint": print_checkpoint, "pixels": print_pixels,
                "collection": print_collection, "replay_service": print_replay_service,
                "overlap": print_overlap, "evaluation": print_evaluation, "sb3": print_sb3,
                "gpu": print_gpu}  # fmt: skip
    for section in SECTIONS:
        if section in sections:
            report[section] = measure[section]()
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "bench.json").write_text(json.dumps(report, indent=2))  # each lands
            printers[section](report[section])
    print(f"\nresults: {run_dir / 'bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
