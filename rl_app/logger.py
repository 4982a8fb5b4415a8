"""What a user sees of a run: a progress bar, ``metrics.jsonl``, ``curve.png`` and,
when ``logger.backend`` asks for one, a TorchRL logger (CSV, wandb or TensorBoard)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed
import matplotlib.pyplot as plt
from torchrl.record.loggers import Logger, get_logger
from tqdm import tqdm

from rl_app.config import LoggerConfig

METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "curve.png"


def make_backend_logger(logger: LoggerConfig, run_dir: Path, run_name: str) -> Logger | None:
    """The TorchRL logger named by ``logger.backend`` (``none`` gives no logger).

    wandb runs offline unless an API key is configured, so no account is ever needed."""
    if logger.backend == "none":
        return None
    options: dict[str, Any] = {}
    if logger.backend == "wandb":
        offline = not os.environ.get("WANDB_API_KEY")
        wandb_kwargs = {"project": logger.project, "offline": offline}
        if offline:
            wandb_kwargs["mode"] = "offline"
        options = {"wandb_kwargs": wandb_kwargs}
    return get_logger(
        logger.backend, logger_name=str(run_dir / "logs"), experiment_name=run_name, **options
    )


class RunLogger:
    """Writes each iteration's metrics everywhere they go, and redraws the curve after
    each evaluation."""

    def __init__(self, logger: LoggerConfig, run_dir: Path, total_frames: int) -> None:
        self.run_dir = run_dir
        self.backend = make_backend_logger(logger, run_dir, run_dir.name)
        self.eval_curve: list[tuple[int, float]] = []
        self.progress = tqdm(total=total_frames, unit="frame", unit_scale=True, dynamic_ncols=True)

    def log(self, frames: int, metrics: Mapping[str, float]) -> None:
        """Record one iteration, ``frames`` being the frames collected so far."""
        row = {"frames": frames, **metrics}
        with open(self.run_dir / METRICS_FILE, "a") as file:
            file.write(json.dumps(row) + "\n")
        if self.backend is not None:
            for name, value in metrics.items():
                self.backend.log_scalar(name, value, step=frames)
        self.progress.update(frames - self.progress.n)

    def log_eval(self, frames: int, eval_reward: float) -> None:
        self.eval_curve.append((frames, eval_reward))
        self.progress.set_postfix(eval_return=f"{eval_reward:.1f}")
        plot_curve(self.eval_curve, self.run_dir / CURVE_FILE)

    def close(self) -> None:
        self.progress.close()
        if self.backend is not None and hasattr(self.backend, "close"):
            self.backend.close()


def plot_curve(points: list[tuple[int, float]], path: Path) -> None:
    """Evaluation return against environment frames, written to ``path``."""
    figure, axes = plt.subplots(figsize=(6, 4))
    frames, returns = zip(*points, strict=True)
    axes.plot(frames, returns, marker="o")
    axes.set_xlabel("environment frames")
    axes.set_ylabel("mean evaluation return")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
