"""The machine: platform, cores, versions, and the float32 matmul rate of one thread."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

import torch
import torchrl


def matmul_flops_per_second(size: int = 256, repeats: int = 400) -> float:
    """float32 ``size``-cubed matrix products per second, on this process's threads."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(20):
        a @ b
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - started)


def machine_description(threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchrl": torchrl.__version__,
        "threads": threads,
        "matmul_256_gflops": matmul_flops_per_second() / 1e9,
    }


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.machine()


def print_machine(machine: dict[str, Any]) -> None:
    print(f"\n== machine: {machine['cpu_model']}, {machine['cores']} cores, one torch thread: "
          f"{machine['matmul_256_gflops']:.0f} GFLOP/s (256x256x256 float32 matmul)")  # fmt: skip
