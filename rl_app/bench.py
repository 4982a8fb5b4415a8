"""``make bench``: throughput of the default configuration and where an iteration's time goes.

Trains the default preset (shortened to ``BENCH_FRAMES`` frames unless overridden with
``ARGS="collector.total_frames=..."``), then prints and writes ``bench.json`` in the run
directory: environment frames/s, updates/s and the mean time per iteration of each phase.
Not part of the test suite: timings depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import json
import platform
import sys
import time

import torch

from rl_app.config import ConfigError, load_config
from rl_app.loop import train

BENCH_FRAMES = 6_000
PHASES = ("collect", "extend", "sample", "update", "priority", "sync", "eval", "checkpoint", "log")


def main(argv: list[str]) -> int:
    overrides = [f"collector.total_frames={BENCH_FRAMES}", "logger.backend=none", *argv]
    if not any(item.startswith("run_dir=") for item in overrides):
        overrides.append(f"run_dir=runs/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        config = load_config("default", overrides)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    started = time.perf_counter()
    result = train(config)
    wall = time.perf_counter() - started
    iterations = result.frames // config.collector.frames_per_batch
    seconds = result.seconds_per_phase
    report = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "config": {"frames": result.frames, "threads": config.threads},
        "wall_seconds": wall,
        "frames_per_second": result.frames / wall,
        "updates_per_second": result.updates / wall,
        "ms_per_update_step": 1000 * seconds.get("update", 0.0) / max(result.updates, 1),
        "ms_per_iteration": {p: 1000 * seconds.get(p, 0.0) / iterations for p in PHASES},
    }
    (result.run_dir / "bench.json").write_text(json.dumps(report, indent=2))

    print(f"\nenvironment frames/s (end to end): {report['frames_per_second']:.1f}")
    print(f"updates/s (end to end):             {report['updates_per_second']:.1f}")
    print(f"one update step:                    {report['ms_per_update_step']:.1f} ms")
    print("time per iteration:")
    total = sum(report["ms_per_iteration"].values())
    for phase, ms in report["ms_per_iteration"].items():
        print(f"  {phase:<10} {ms:8.1f} ms  {100 * ms / total:5.1f}%")
    print(f"results: {result.run_dir / 'bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
