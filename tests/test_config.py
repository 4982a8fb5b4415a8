"""Configuration: presets and overrides resolve as documented, and every user mistake exits 2
with one line that names the key, before anything is created."""

from __future__ import annotations

import dataclasses
import logging
import pickle
import re
import shutil
import socket
import subprocess
import typing
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from rl_app.algorithms import ALGORITHMS, algorithm_class, available_algorithms
from rl_app.checks import load_config
from rl_app.config import Config, DQNConfig, RunConfig, SACConfig, TD3Config
from rl_app.run import train
from tests.helpers import PYTHON, ROOT, TINY_RUN, refusal, run_train
from train import main


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["optim.lrr=1e-3"], "optim.lrr"),
        (["optim.lr=fast"], "optim.lr"),
        (["optim.lr=-1e-3"], "optim.lr"),
        (["replay.slice_len=500"], "replay.slice_len"),
        # The override's limit, not Pendulum's 200 steps.
        (["env.max_episode_steps=4"], "at most 4 steps (env.max_episode_steps)"),
        (["run_dir="], "run_dir is empty: give a directory"),
        (["logger.backend=wandb", "logger.project=a/b"], "is not accepted by wandb: cannot"),
        (["dqn.eps_start=0.01", "dqn.eps_end=0.5"], "it must be >= dqn.eps_end"),
        (["run_dir=/dev/null/run"], "run_dir='/dev/null/run' cannot be made: '/dev/null' is"),
        (["run_dir=/proc/run"], "run_dir='/proc/run' is on a file system that stores no files"),
        (["--config", "td3_pendulum.yaml"], "no such file (the preset: --config td3_pendulum)"),
        (["--config", "/tmp"], "--config /tmp: is a directory: give a file"),
        (["algo=dqn", "env.name=FrozenLake-v1"], "observes Discrete(16): the networks read a Box"),
        (["algo=dqn", "env.name=Blackjack-v1"], "'Blackjack-v1' observes Tuple("),
        (["env.name=NoSuchEnv-v9"], "env.name"),
        (["replay.sampler=sometimes"], "replay.sampler"),
        (["collector.total_frames=0"], "collector.total_frames"),
        (["--config", "no_such_preset"], "no_such_preset"),
        (["optim.lr"], "optim.lr"),
        (["algo=dqn"], "use algo=sac"),
        (["algo=ppo"], "algo='ppo' is not accepted: choose one of sac, dqn, td3"),
        (["dqn.eps_end=1.5"], "dqn.eps_end"),
        (["collector.mode=sync", "collector.workers=3"], "collector.frames_per_batch"),
        (["--config", "dqn_cartpole", "algo=sac"], "use algo=dqn"),
        (["collector.mode=distributed", "collector.nodes=3"], "collector.frames_per_batch"),
        (["collector.mode=distributed", "collector.port=80"], "collector.port"),
        (["env.num_envs=3"], "env.num_envs"),
        (["collector.total_frames=9223372036854775808"], "<= 9223372036854775807"),  # int64
        (["threads=100000"], "<= 1024"),  # OpenMP crashed the process
        (["--config", "dqn_atari100k", "collector.mode=rpc"], "(set dqn.channels_last=false)"),
        (["replay.alpha=1e12"], "it must be >= 0 and <= 1"),  # NaN at the second iteration
        (["eval.backend=thread"], "eval.backend='thread' is not accepted: choose one of"),
        (["eval.backend=process", "eval.video=true"], "eval.video=true needs eval.backend"),
        (["eval.backend=process", "checkpoint.keep_last=1"], "checkpoint.keep_last >= 2"),
        (["eval.backend=ray"], "eval.backend=ray plays on the Ray cluster of collector.mode=ray"),
    ],
)
def test_bad_input_exits_2_naming_the_key_and_creates_nothing(
    refused: Callable[..., str], args: list[str], named: str
) -> None:
    assert named in refused(*args)


def test_a_rendezvous_port_in_use_here_is_refused_naming_it(refused: Callable[..., str]) -> None:
    with socket.socket() as listening:  # another program's server on the next port
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1] - 1
        error = refused("collector.mode=rpc", f"collector.port={port}")
    # (port itself, named first if another program happens to hold it too, is refused alike)
    assert re.match(rf"error: collector\.port={port}: port (?:{port}|{port + 1}), which the", error)
    assert "is in use here" in error


def test_the_command_line_refuses_in_one_line_before_any_work(tmp_path: Path) -> None:
    error = refusal(run_train(tmp_path, "optim.lrr=1e-3"), tmp_path)
    # An unknown key is answered with the keys accepted.
    assert "optim.lr" in error.replace("optim.lrr", "")
    assert "optim.batch_size" in error


def test_an_atari_game_refused_is_one_line_without_the_emulator_s_banner(tmp_path: Path) -> None:
    error = refusal(run_train(tmp_path, "env.name=ALE/Pong-v5"), tmp_path)
    assert "ALE/Pong-v5 has discrete actions: use algo=dqn" in error


def test_a_mujoco_env_refused_is_one_line_without_mujoco_s_warnings_or_log_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="mujoco")
    monkeypatch.chdir(tmp_path)
    # Refused once the env was made: one line on stderr, where MuJoCo's C code printed too
    # (capfd reads the file descriptors), and no MUJOCO_LOG.TXT in the working directory.
    code = main(["--config", "sac_halfcheetah", "env.observation_indices=[17]"])
    printed = capfd.readouterr()
    refused = refusal(subprocess.CompletedProcess([], code, printed.out, printed.err), tmp_path)
    assert "env.observation_indices=[17] is out of range" in refused
    # Its model uses an attribute MuJoCo deprecates: news to no user, logged at debug.
    assert [(r.levelno, "is deprecated" in r.message) for r in caplog.records] == [
        (logging.DEBUG, True)
    ]


def test_a_key_given_twice_in_a_config_file_is_refused_naming_its_line(
    refused: Callable[..., str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    twice = tmp_path_factory.mktemp("files") / "twice.yaml"
    # YAML would keep the last; "<<" merges another mapping, which what follows overrides.
    twice.write_text("base: &b {lr: 1.0e-3}\noptim:\n  <<: *b\n  lr: 2.0e-3\n  lr: 3.0e-3\n")
    assert f"error: {twice}:5: not valid YAML (key 'lr' is given twice)" in refused(
        "--config", str(twice)
    )
    twice.write_text("? [lr, lr]\n: 1\n")  # a key no mapping can hold
    assert "not valid YAML (found unhashable key)" in refused("--config", str(twice))


def test_out_of_range_message_says_what_is_accepted(refused: Callable[..., str]) -> None:
    error = refused("replay.slice_len=500")
    assert "500" in error and "200" in error  # Pendulum episodes: 200 steps


def test_help_lists_every_group(command: Callable[..., subprocess.CompletedProcess]) -> None:
    result = command("--help")
    assert result.returncode == 0
    for group in ["env", "network", "collector", "optim", "replay", "eval", "checkpoint", "logger"]:
        assert f"\n  {group}:" in result.stdout
    assert "optim.lr=0.0003" in result.stdout
    assert "  dqn_atari: 1,000,000 transitions of 7,118 B: 7.12 GB of replay files" in result.stdout
    assert "algo=sac  (sac (continuous actions) | dqn (discrete actions) | td3 (continuous " in (
        result.stdout
    )


def test_help_shows_the_values_of_the_preset_it_is_given(
    tmp_path: Path, command: Callable[..., subprocess.CompletedProcess]
) -> None:
    """What that run would use: dqn_cartpole discounts by 0.995, the schema by 0.99."""
    assert RunConfig().optim.gamma == 0.99
    result = command("--help", "--config", "dqn_cartpole")
    assert result.returncode == 0, result.stderr
    assert "settings (key=value in --config dqn_cartpole" in result.stdout
    assert "\n    optim.gamma=0.995  (discount factor)\n" in result.stdout
    assert "\n    algo=dqn  (" in result.stdout
    assert "\n    optim.gamma=0.99  (discount factor)\n" in command("-h").stdout
    assert list(tmp_path.iterdir()) == []


def test_print_config_resolves_preset_and_overrides(
    tmp_path: Path, command: Callable[..., subprocess.CompletedProcess]
) -> None:
    result = command("--print-config", "optim.lr=1e-3", "collector.total_frames=5000")
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed["optim"]["lr"] == 1e-3
    assert printed["collector"]["total_frames"] == 5000
    assert printed["env"]["name"] == "Pendulum-v1"
    assert printed["run_dir"].startswith("runs/default-")
    assert list(tmp_path.iterdir()) == []


def test_overrides_may_stand_on_both_sides_of_config(
    command: Callable[..., subprocess.CompletedProcess],
) -> None:
    result = command("optim.lr=1e-3", "--config", "td3_pendulum", "seed=1", "--print-config")
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert (printed["algo"], printed["optim"]["lr"], printed["seed"]) == ("td3", 1e-3, 1)


def test_a_run_dir_under_tilde_is_the_home_directory_s_whole_and_resumes_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A "~" the shell left (quoted, or in a YAML file) had split a run: its checkpoints in
    the home directory, everything else under a folder named "~" where it was started."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    config = load_config("default", [*TINY_RUN, "collector.total_frames=400", "run_dir=~/run"])
    assert config.run_dir == str(tmp_path / "home" / "run")
    train(config)
    assert not (tmp_path / "~").exists()
    resumed = load_config(None, ["run_dir=~/run", "collector.total_frames=600"])
    assert resumed.network.hidden_sizes == [32, 32]  # the run's own config: it resumes
    preset = tmp_path / "preset.yaml"
    preset.write_text("run_dir: ~/from-a-file\n")
    assert load_config(str(preset), []).run_dir == str(tmp_path / "home" / "from-a-file")


def test_a_resumed_run_refuses_a_config_of_another_algorithm_or_env(
    tiny_config: Callable[..., Config],
    command: Callable[..., subprocess.CompletedProcess],
    capsys: pytest.CaptureFixture,
) -> None:
    config = tiny_config("collector.total_frames=400")
    train(config)
    capsys.readouterr()  # its progress
    run_dir = f"run_dir={config.run_dir}"
    for preset, named in (
        ("dqn_cartpole", "--config dqn_cartpole trains algo='dqn', but run_dir="),
        ("td3_pendulum", "holds a run of algo='sac': leave --config out to resume that run"),
        ("no_such_preset", "unknown preset 'no_such_preset'"),
    ):
        result = command("--config", preset, run_dir, "--print-config")
        assert result.returncode == 2 and result.stdout == "", result.stderr
        assert len(result.stderr.splitlines()) == 1 and named in result.stderr
    # Its own preset, and no --config at all, resume it; so does another algorithm named.
    for args in (["--config", "default"], [], ["--config", "td3_pendulum", "algo=sac"]):
        result = command(*args, run_dir, "--print-config")
        assert result.returncode == 0, result.stderr
        assert yaml.safe_load(result.stdout)["collector"]["total_frames"] == 400


def test_every_preset_validates() -> None:
    for preset in (Path(__file__).parent.parent / "configs").glob("*.yaml"):
        assert load_config(preset.stem).env.name


def test_the_algorithm_groups_are_declared_fields_of_the_schema() -> None:
    """A type checker sees ``config.sac.tau``: each group is a field of ``RunConfig`` with
    its class, and each registered algorithm reads the group named as it is."""
    fields = {item.name: item for item in dataclasses.fields(RunConfig)}
    groups = {"sac": SACConfig, "dqn": DQNConfig, "td3": TD3Config}
    hints = typing.get_type_hints(RunConfig)
    for name, group in groups.items():
        assert fields[name].default_factory is group
        assert hints[name] is group
    assert set(ALGORITHMS) == set(groups)
    for name in available_algorithms():
        assert algorithm_class(name).settings is groups[name]


def test_a_config_pickles_with_every_group() -> None:
    """Worker processes and SLURM jobs receive the config pickled."""
    config = load_config("dqn_cartpole", ["dqn.eps_end=0.1", "sac.tau=0.01"])
    assert pickle.loads(pickle.dumps(config)) == config
    assert config.dqn.eps_end == 0.1 and config.sac.tau == 0.01
    assert isinstance(config.dqn, DQNConfig)


def test_a_dqn_run_imports_no_other_algorithm(tmp_path: Path) -> None:
    program = f"""
import sys
from rl_app.algorithms import make_policy
from rl_app.checks import load_config
from rl_app.envs import make_env

config = load_config("dqn_cartpole", ["run_dir={tmp_path / "run"}"])
make_policy(config, make_env(config.env, config.seed))
print(sorted(m for m in sys.modules if m.startswith("rl_app.algorithms.")))
"""
    result = subprocess.run(
        [PYTHON, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2] == "['rl_app.algorithms.base', 'rl_app.algorithms.dqn']"


def test_a_missing_algorithm_module_only_leaves_the_choices(tmp_path: Path) -> None:
    """A checkout without ``rl_app/algorithms/dqn.py``: ``algo=dqn`` is refused as any
    unknown value, and ``--help`` offers the others."""
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in ("rl_app", "configs"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=ignore)
    shutil.copy(ROOT / "train.py", tmp_path)
    (tmp_path / "rl_app" / "algorithms" / "dqn.py").unlink()

    def train(*args: str) -> subprocess.CompletedProcess:
        command = [PYTHON, str(tmp_path / "train.py"), *args]
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    refused = train("--config", "dqn_cartpole", "--print-config")
    assert refused.returncode == 2
    assert refused.stderr == "error: algo='dqn' is not accepted: choose one of sac, td3\n"
    shown = train("--help", "--config", "td3_pendulum")
    assert shown.returncode == 0, shown.stderr
    assert "algo=td3  (sac (continuous actions) | td3 (continuous actions))" in shown.stdout
    assert "\n    dqn.eps_end=0.05  (" in shown.stdout  # the settings group stays a group
