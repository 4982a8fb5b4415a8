"""What a user sees of a run: a progress bar, ``metrics.jsonl``, ``curve.png`` and,
when ``logger.backend`` asks for one, a TorchRL logger (CSV, wandb or TensorBoard); and the
wall time of each phase of the loop (:class:`PhaseTimer`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
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
LOGS_DIR = "logs"
EVAL_KEY = "eval/return"
SUCCESS_RATE_KEY = "eval/success_rate"  # goal envs only


def make_backend_logger(
    logger: LoggerConfig, run_dir: Path, saved_state: Mapping[str, Any] | None = None
) -> Logger | None:
    """The TorchRL logger named by ``logger.backend`` (``none`` gives no logger).

    ``saved_state`` (a logger's ``state_dict``) continues the same run, e.g. the same wandb
    run id. wandb runs offline unless ``WANDB_API_KEY`` is set, so no account is needed."""
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
        logger.backend,
        logger_name=str(run_dir / LOGS_DIR),
        experiment_name=run_dir.name,
        state_dict=saved_state,
        **options,
    )


class RunLogger:
    """Writes each iteration's metrics everywhere they go, and redraws the curve after
    each evaluation. Checkpointed: a resumed run continues the same logger run."""

    def __init__(self, logger: LoggerConfig, run_dir: Path, total_frames: int) -> None:
        self.config = logger
        self.run_dir = run_dir
        self.eval_curve: list[tuple[int, float]] = []
        self.progress = tqdm(total=total_frames, unit="frame", unit_scale=True, dynamic_ncols=True)
        # Created at the first log call, so that a resume can hand it the saved run first.
        self._backend: Logger | None = None
        self._saved_backend_state: Mapping[str, Any] | None = None
        # Wall time of the run, continued across resumes (rewind sets the earlier part).
        self._started = time.monotonic()
        self._seconds_before = 0.0

    @property
    def backend(self) -> Logger | None:
        if self._backend is None and self.config.backend != "none":
            self._backend = make_backend_logger(
                self.config, self.run_dir, self._saved_backend_state
            )
        return self._backend

    def log(self, frames: int, metrics: Mapping[str, float]) -> None:
        """Record one iteration, ``frames`` being the frames collected so far; the row
        also gets the run's wall time so far (``wall_seconds``)."""
        wall_seconds = self._seconds_before + time.monotonic() - self._started
        row = {"frames": frames, "wall_seconds": round(wall_seconds, 3), **metrics}
        with open(self.run_dir / METRICS_FILE, "a") as file:
            file.write(json.dumps(row) + "\n")
        if self.backend is not None:
            for name, value in metrics.items():
                self.backend.log_scalar(name, value, step=frames)
        if EVAL_KEY in metrics:
            self.eval_curve.append((frames, metrics[EVAL_KEY]))
            self.progress.set_postfix(eval_summary(metrics))
            plot_curve(self.eval_curve, self.run_dir / CURVE_FILE)
        self.progress.update(frames - self.progress.n)

    def state_dict(self) -> dict[str, Any]:
        backend = self.backend
        return {
            "backend": self.config.backend,
            "backend_state": backend.state_dict() if backend is not None else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        # A backend changed on resume starts its own run; the same backend continues.
        if state["backend"] == self.config.backend:
            self._saved_backend_state = state["backend_state"]

    def rewind(self, frames: int) -> None:
        """Continue after ``frames``: drop rows logged after the checkpoint a run resumes
        from (they will be logged again), so no step is missing or repeated."""
        rows = read_metrics(self.run_dir)
        kept = [row for row in rows if row["frames"] <= frames]
        (self.run_dir / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in kept))
        for scalars in (self.run_dir / LOGS_DIR).glob("*/scalars/**/*.csv"):
            lines = scalars.read_text().splitlines(keepends=True)
            scalars.write_text("".join(ln for ln in lines if int(ln.split(",")[0]) <= frames))
        self.eval_curve = [(row["frames"], row[EVAL_KEY]) for row in kept if EVAL_KEY in row]
        self._seconds_before = kept[-1].get("wall_seconds", 0.0) if kept else 0.0
        self._started = time.monotonic()
        evaluations = [row for row in kept if EVAL_KEY in row]
        if evaluations:
            self.progress.set_postfix(eval_summary(evaluations[-1]))
        self.progress.update(frames - self.progress.n)

    def close(self) -> None:
        self.progress.close()
        if self._backend is not None and hasattr(self._backend, "close"):
            self._backend.close()


def eval_summary(metrics: Mapping[str, float]) -> dict[str, str]:
    """What the progress bar shows of an evaluation: its return and, in a goal env, its
    success rate."""
    summary = {"eval_return": f"{metrics[EVAL_KEY]:.1f}"}
    if SUCCESS_RATE_KEY in metrics:
        summary["success"] = f"{metrics[SUCCESS_RATE_KEY]:.0%}"
    return summary


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    lines = path.read_text().splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):  # a row cut short: its process was killed
        lines.pop()
    return [json.loads(line) for line in lines if line.strip()]


def label_eval_axes(axes: Any) -> None:
    axes.set_xlabel("environment frames")
    axes.set_ylabel("mean evaluation return")
    axes.grid(alpha=0.3)


def plot_curve(points: list[tuple[int, float]], path: Path) -> None:
    """Evaluation return against environment frames, written to ``path``."""
    figure, axes = plt.subplots(figsize=(6, 4))
    frames, returns = zip(*points, strict=True)
    axes.plot(frames, returns, marker="o")
    label_eval_axes(axes)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


# The phases of an iteration, in order: wall time is kept per phase (a run's result holds
# it: ``TrainResult.seconds_per_phase``), and an error message names the phase it happened in.
PHASES = (
    "collecting", "extending the buffer", "sampling", "updating", "writing back",
    "checking metrics", "syncing weights", "evaluating",
    "recording a video", "logging", "saving a checkpoint",
)  # fmt: skip


class PhaseTimer:
    """Wall time per phase of the loop: ``with phases("sampling"): ...``. ``current``
    names the phase in progress, or the last one entered (for error messages)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.last: dict[str, float] = {}  # the latest time of each phase that completed
        self.current = "starting"

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if phase not in self.seconds:
            raise KeyError(f"unknown phase {phase!r}: the phases are {', '.join(PHASES)}")
        self.current = phase
        started = time.perf_counter()
        try:
            yield
            self.last[phase] = time.perf_counter() - started
        finally:
            self.seconds[phase] += time.perf_counter() - started
