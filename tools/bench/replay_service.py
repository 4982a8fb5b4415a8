"""The replay buffer in the learner's process next to the Ray replay service
(``replay.service=ray``), both fed by the same two asynchronous Ray collector actors:
frames/s collected into the buffer (the learner extends it with each batch, or the actors
write into the service themselves) and batches/s sampled by the learner (a batch of
``optim.batch_size``, as each update draws), and the service's ratio to the in-process
buffer."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rl_app.checks import load_config
from rl_app.run import build_run

# Two Ray actors of half a CPU each (they fit a 2-core machine), asynchronous.
RAY_ACTORS = ["collector.mode=ray", "collector.workers=2", "ray.worker_cpus=0.5", "ray.sync=false"]
PLACEMENTS = {"in-process": "replay.service=none", "ray-service": "replay.service=ray"}
SERVICE_FRAMES = 4_000
SERVICE_BATCHES = 200


def replay_rates(overrides: list[str]) -> dict[str, float]:
    """Frames/s collected into the buffer of the run ``overrides`` describe (the clock
    starts after the first batch: actor start-up is not collection), then batches/s
    sampled from what they stored."""
    run = build_run(load_config("default", overrides))
    try:
        frames, started = 0, None
        for batch in run.collector:
            run.buffer.extend(batch)
            if started is None:
                started = time.perf_counter()
                continue
            frames += batch.numel()
            if frames >= SERVICE_FRAMES:
                break
        collected = frames / (time.perf_counter() - started)
        batch_size = run.config.optim.batch_size
        started = time.perf_counter()
        for _ in range(SERVICE_BATCHES):
            run.buffer.sample_batches(batch_size, 1)
        sampled = SERVICE_BATCHES / (time.perf_counter() - started)
    finally:
        run.close()
    return {"frames_per_second": collected, "batches_per_second": sampled}


def bench_replay_service(overrides: list[str], run_dir: Path) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for name, placement in PLACEMENTS.items():
        report[name] = replay_rates(
            [*overrides, *RAY_ACTORS, placement, f"run_dir={run_dir / name}",
             "collector.init_random_frames=0"]
        )  # fmt: skip
    for rate in ("frames_per_second", "batches_per_second"):
        report[f"ray-service/in-process {rate}"] = (
            report["ray-service"][rate] / report["in-process"][rate]
        )
    return report


def print_replay_service(report: dict[str, Any]) -> None:
    print("\n== replay service: 2 async Ray collector actors on Pendulum-v1, the buffer in the "
          "learner's process or owned by a Ray actor")  # fmt: skip
    print(f"  {'buffer':<12} {'frames/s collected':>19} {'batches/s sampled':>18}")
    for name in PLACEMENTS:
        rates = report[name]
        print(f"  {name:<12} {rates['frames_per_second']:19.0f} "
              f"{rates['batches_per_second']:18.1f}")  # fmt: skip
    print(f"  {'ratio':<12} {report['ray-service/in-process frames_per_second']:19.2f} "
          f"{report['ray-service/in-process batches_per_second']:18.2f}")  # fmt: skip
