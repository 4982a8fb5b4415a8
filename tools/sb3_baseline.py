"""Stable-Baselines3 SAC baseline for ``make bench``: the same Pendulum workload, timed alike.

SB3 runs in its own virtual environment (``.venv-sb3``, pinned by ``requirements-sb3.txt``) so
that its dependencies never touch the project's. This file is both a library for the project
(``run_sb3_sac``, ``evaluate_on_fixed_seeds``) and the script that the SB3 venv's python runs:
``python tools/sb3_baseline.py --seed S --frames N --learning-starts L`` prints one JSON line.

Only gymnasium, numpy and the standard library are imported at module level (torch and SB3 are
imported inside ``main``), and nothing from rl_app, torchrl or tensordict: run as a script, the
repository root is not on ``sys.path`` and the SB3 venv has none of them.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = REPO_ROOT / "requirements-sb3.txt"
SB3_VENV = REPO_ROOT / ".venv-sb3"
STAMP = SB3_VENV / ".installed-requirements"
ENV_NAME = "Pendulum-v1"
EVAL_SEEDS: tuple[int, ...] = tuple(1_000_003 + i for i in range(10))


def evaluate_on_fixed_seeds(
    act: Callable[[np.ndarray], np.ndarray], env_name: str, seeds: Sequence[int] = EVAL_SEEDS
) -> list[float]:
    """One episode per reset seed, acting with ``act(obs)``; the undiscounted return of each.

    Pure gymnasium and numpy, so the project's agent and SB3's are scored identically.
    """
    returns = []
    for seed in seeds:
        env = gym.make(env_name)
        try:
            obs, _ = env.reset(seed=seed)
            total, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(act(obs))
                total += float(reward)
                done = terminated or truncated
        finally:
            env.close()
        returns.append(total)
    return returns


def sb3_python() -> Path:
    """The SB3 venv's python, creating the venv and installing ``requirements-sb3.txt`` first.

    Skipped when the stamp inside the venv holds the current requirements (like a Makefile
    stamp); a lock file makes concurrent callers wait for one install.
    """
    python = SB3_VENV / "bin" / "python"
    wanted = REQUIREMENTS.read_text()
    SB3_VENV.mkdir(parents=True, exist_ok=True)
    with open(SB3_VENV / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and STAMP.exists() and STAMP.read_text() == wanted:
            return python
        print(
            f"creating {SB3_VENV} from {REQUIREMENTS.name} (first use)", file=sys.stderr, flush=True
        )
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(SB3_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--requirement", str(REQUIREMENTS)],
            check=True,
            stdout=2,  # pip's output to fd 2: the caller's stdout stays its own
        )
        STAMP.write_text(wanted)
    return python


def run_sb3_sac(
    seed: int,
    total_frames: int,
    learning_starts: int,
    timeout_s: float,
    env_name: str = ENV_NAME,
    device: str = "cpu",
) -> dict:
    """Train and evaluate SB3 SAC on ``env_name`` (on ``device``) in a subprocess of the SB3
    venv; the JSON dict it printed.

    The venv is created first if needed (outside ``timeout_s``). Raises ``RuntimeError`` if the
    script fails, ``subprocess.TimeoutExpired`` if it runs past ``timeout_s``.
    """
    python = sb3_python()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [
        str(python), str(Path(__file__).resolve()), "--seed", str(seed),
        "--frames", str(total_frames), "--learning-starts", str(learning_starts),
        "--env", env_name, "--device", device,
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        output = done.stderr[-4000:] + done.stdout[-2000:]
        raise RuntimeError(f"SB3 baseline failed (exit {done.returncode}):\n{output}")
    return json.loads(lines[-1])


def main(argv: Sequence[str] | None = None) -> None:
    """Train SB3 SAC with the bench's workload (Pendulum-v1 on the CPU unless told) and
    print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--frames", type=int, required=True)
    parser.add_argument("--learning-starts", type=int, required=True)
    parser.add_argument("--env", default=ENV_NAME)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    import stable_baselines3 as sb3
    import torch
    from stable_baselines3 import SAC

    torch.set_num_threads(1)
    model = SAC(
        "MlpPolicy",
        args.env,
        learning_rate=3e-4,
        buffer_size=1_000_000,
        learning_starts=args.learning_starts,
        batch_size=256,
        tau=0.005,
        gamma=0.99,
        train_freq=1,
        gradient_steps=1,
        policy_kwargs=dict(net_arch=[256, 256]),  # two Q-nets: SB3's default n_critics=2
        ent_coef="auto",
        seed=args.seed,
        device=args.device,
        verbose=0,
    )
    started = time.perf_counter()
    model.learn(total_timesteps=args.frames)
    wall = time.perf_counter() - started
    returns = evaluate_on_fixed_seeds(
        lambda obs: model.predict(obs, deterministic=True)[0], args.env
    )
    result: dict[str, Any] = {
        "impl": "stable-baselines3",
        "version": sb3.__version__,
        "torch": torch.__version__,
        "env": args.env,
        "device": args.device,
        "seed": args.seed,
        "frames": args.frames,
        "wall_seconds": wall,
        "frames_per_second": args.frames / wall,
        "eval_returns": returns,
        "eval_mean": float(np.mean(returns)),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
