"""Configuration: presets and overrides resolve as documented, and every user mistake exits 2
with one line that names the key, before anything is created."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest
import yaml

from rl_app.algorithms import ALGORITHMS, RunConfig
from rl_app.checks import load_config
from tests.helpers import run_train


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["optim.lrr=1e-3"], "optim.lrr"),
        (["optim.lr=fast"], "optim.lr"),
        (["optim.lr=-1e-3"], "optim.lr"),
        (["replay.slice_len=500"], "replay.slice_len"),
        (["env.name=NoSuchEnv-v9"], "env.name"),
        (["replay.sampler=sometimes"], "replay.sampler"),
        (["collector.total_frames=0"], "collector.total_frames"),
        (["--config", "no_such_preset"], "no_such_preset"),
        (["optim.lr"], "optim.lr"),
        (["algo=dqn"], "use algo=sac"),
        (["dqn.eps_end=1.5"], "dqn.eps_end"),
        (["collector.mode=sync", "collector.workers=3"], "collector.frames_per_batch"),
        (["--config", "dqn_cartpole", "algo=sac"], "use algo=dqn"),
        (["collector.mode=distributed", "collector.nodes=3"], "collector.frames_per_batch"),
        (["collector.mode=distributed", "collector.port=80"], "collector.port"),
        (["env.num_envs=3"], "env.num_envs"),
        (["collector.total_frames=9223372036854775808"], "<= 9223372036854775807"),  # int64
        (["threads=2147483648"], "<= 2147483647"),  # torch.set_num_threads takes a C int
    ],
)
def test_bad_input_exits_2_naming_the_key_and_creates_nothing(
    tmp_path: Path, args: list[str], named: str
) -> None:
    result = run_train(tmp_path, *args)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert list(tmp_path.iterdir()) == []  # no run directory, no files


def test_unknown_key_lists_accepted_keys(tmp_path: Path) -> None:
    result = run_train(tmp_path, "optim.lrr=1e-3")
    assert "optim.lr" in result.stderr.replace("optim.lrr", "")
    assert "optim.batch_size" in result.stderr


def test_out_of_range_message_says_what_is_accepted(tmp_path: Path) -> None:
    result = run_train(tmp_path, "replay.slice_len=500")
    assert "500" in result.stderr and "200" in result.stderr  # Pendulum episodes: 200 steps


def test_help_lists_every_group(tmp_path: Path) -> None:
    result = run_train(tmp_path, "--help")
    assert result.returncode == 0
    for group in ["env", "network", "collector", "optim", "replay", "eval", "checkpoint", "logger"]:
        assert f"\n  {group}:" in result.stdout
    assert "optim.lr=0.0003" in result.stdout
    assert "  dqn_atari: 1,000,000 transitions of 7,118 B: 7.12 GB of replay files" in result.stdout


def test_print_config_resolves_preset_and_overrides(tmp_path: Path) -> None:
    result = run_train(tmp_path, "--print-config", "optim.lr=1e-3", "collector.total_frames=5000")
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed["optim"]["lr"] == 1e-3
    assert printed["collector"]["total_frames"] == 5000
    assert printed["env"]["name"] == "Pendulum-v1"
    assert printed["run_dir"].startswith("runs/default-")
    assert list(tmp_path.iterdir()) == []


def test_every_preset_validates() -> None:
    for preset in (Path(__file__).parent.parent / "configs").glob("*.yaml"):
        assert load_config(preset.stem).env.name


def test_the_run_schema_holds_every_registered_algorithm() -> None:
    """``algo`` names the registry's algorithms and each brings its own group; a config
    pickles (worker processes and SLURM jobs receive it so) with every group."""
    algo = next(item for item in dataclasses.fields(RunConfig) if item.name == "algo")
    assert algo.metadata["choices"] == tuple(ALGORITHMS)
    groups = {item.name for item in dataclasses.fields(RunConfig)}
    assert {name for name, kind in ALGORITHMS.items() if kind.settings} <= groups
    config = load_config("dqn_cartpole", ["dqn.eps_end=0.1", "sac.tau=0.01"])
    assert pickle.loads(pickle.dumps(config)) == config
    assert isinstance(config.dqn, ALGORITHMS["dqn"].settings)
