"""A run that cannot fit this machine is refused before anything is created, with one line
naming replay.capacity; the estimate is what a real run takes; the replay files take their
disk space at the start, so a full disk stops a run there and never mid-run."""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torchrl.collectors import Collector
from torchrl.envs.utils import RandomPolicy

from rl_app.algorithms import make_algorithm
from rl_app.checks import load_config
from rl_app.config import HOLDS_PREFIX, PRESETS_DIR, available_presets
from rl_app.envs import make_env
from rl_app.fit import available_ram, footprint, holds, size, transition_bytes
from rl_app.loop import RunFailed
from rl_app.replay import (
    TRAJECTORY_KEY,
    allocate_storage,
    make_replay_buffer,
    stored_transition,
)
from rl_app.run import build_run, train
from rl_app.rundir import CHECKPOINTS_DIR, REPLAY_DIR
from tests.helpers import PYTHON, RECURRENT_DQN, ROOT, TINY_RUN, TRAIN_PY

SMALL_DISK = 8 * 2**20  # bytes of the tmpfs below


@pytest.fixture
def small_disk(tmp_path: Path, tmpfs) -> Path:
    """An 8 MB file system (tmpfs) for the test."""
    return tmpfs(tmp_path / "small", f"size={SMALL_DISK}")


def run_measured(cwd: Path, *args: str) -> tuple[int, str, int]:
    """``train.py args`` in a process of its own: its exit status, its stderr and its peak
    resident memory in bytes."""
    command = [PYTHON, str(TRAIN_PY), *args]
    pipes = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE}
    with subprocess.Popen(command, cwd=cwd, text=True, **pipes) as process:
        stderr = process.stderr.read()
        _, status, usage = os.wait4(process.pid, 0)  # reaped here, with its resource usage
        process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, stderr, usage.ru_maxrss * 1024  # ru_maxrss: kilobytes


def assert_refused_in_one_line(code: int, stderr: str, *named: str) -> None:
    assert code == 2, stderr
    assert "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith("error: replay.capacity="), stderr
    for words in named:
        assert words in stderr, stderr


def test_a_buffer_larger_than_the_ram_is_refused_before_allocating(tmp_path: Path) -> None:
    memory = int(Path("/proc/meminfo").read_text().split()[1]) * 1024  # MemTotal
    capacity = memory // 4  # the prioritized sampler's trees alone: 16 bytes a slot and more
    config = load_config("default", [f"replay.capacity={capacity}", f"run_dir={tmp_path / 'run'}"])
    fp = footprint(config, transition_bytes(config))
    assert fp.ram > available_ram()

    code, stderr, peak = run_measured(tmp_path, f"replay.capacity={capacity}", "run_dir=run")
    assert_refused_in_one_line(code, stderr, "of RAM for the prioritized sampler", "at most")
    assert list(tmp_path.iterdir()) == []  # no run directory
    # Refused before allocating: the process holds torch, TorchRL and an env (under 1 GB
    # where measured), far from the trees it was asked for or the RAM there is.
    assert peak < min(fp.trees, available_ram()) / 4


def test_networks_larger_than_the_memory_are_refused_naming_their_sizes(tmp_path: Path) -> None:
    def limit_memory() -> None:  # as a job's limit would: under the 40 GB one layer asks
        resource.setrlimit(resource.RLIMIT_AS, (16 * 2**30, 16 * 2**30))

    run_dir = tmp_path / "run"
    refused = subprocess.run(
        [PYTHON, TRAIN_PY, *TINY_RUN, f"run_dir={run_dir}", "network.hidden_sizes=[100000,100000]"],
        capture_output=True, text=True, timeout=300, preexec_fn=limit_memory,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines()[-1] == (
        "error: network.hidden_sizes=[100000, 100000]: the networks do not fit in RAM "
        "(40 GB asked for at once); choose smaller layers"
    )
    assert not (run_dir / "config.yaml").exists()


def test_a_buffer_larger_than_the_free_disk_is_refused_at_start(small_disk: Path) -> None:
    config = load_config("default", ["replay.capacity=200000", f"run_dir={small_disk / 'run'}"])
    assert footprint(config, transition_bytes(config)).replay_files > SMALL_DISK

    code, stderr, _ = run_measured(small_disk, "replay.capacity=200000", "run_dir=run")
    assert_refused_in_one_line(code, stderr, "of disk for the replay files", str(small_disk))
    assert list(small_disk.iterdir()) == []


@pytest.mark.parametrize("capacity", ["1e99", str(2**62)])
def test_capacities_beyond_what_torchrl_takes_exit_2_with_one_line(
    refused: Callable[..., str], capacity: str
) -> None:
    """1e99 is past int64 (TorchRL's C++ binding raised); 2**62 made its segment trees
    loop forever."""
    error = refused(f"replay.capacity={capacity}")
    assert f"replay.capacity={capacity}" in error.replace("'", "")
    assert "<= 576460752303423487" in error  # 2**59 - 1, the trees' limit


def test_a_full_disk_stops_a_run_at_its_start(small_disk: Path, tiny_config) -> None:
    """Past the check (build_run alone), the replay files cannot take their space: the run
    stops before collecting, with the reason, and leaves no replay file behind."""
    config = tiny_config("replay.capacity=200000", run_dir=small_disk / "run")
    with pytest.raises(RunFailed, match="No space left on device") as refused:
        build_run(config)
    assert "replay" in str(refused.value)
    assert not list((small_disk / "run" / REPLAY_DIR).rglob("*.memmap"))


def test_the_estimate_is_what_a_short_run_takes(
    tiny_config, caplog: pytest.LogCaptureFixture
) -> None:
    config = tiny_config("replay.capacity=100000", "collector.total_frames=400")
    fp = footprint(config, transition_bytes(config))
    with caplog.at_level(logging.INFO, logger="rl_app"):
        train(config)
    [logged] = [r.message for r in caplog.records if r.message.startswith("replay.capacity=")]
    assert "takes about" in logged and "of RAM" in logged and "of disk" in logged

    files = list((Path(config.run_dir) / REPLAY_DIR).rglob("*.memmap"))
    taken = sum(path.stat().st_blocks * 512 for path in files)
    assert all(path.stat().st_blocks * 512 >= path.stat().st_size for path in files)
    assert taken == pytest.approx(fp.replay_files, rel=0.1)
    [checkpoint] = (Path(config.run_dir) / CHECKPOINTS_DIR).glob("checkpoint-*")
    [saved_buffer] = checkpoint.glob("components/*replay_buffer")
    saved = sum(path.stat().st_blocks * 512 for path in saved_buffer.rglob("*") if path.is_file())
    assert saved == pytest.approx(fp.checkpoint, rel=0.1)

    # The trees: what creating the sampler of a 3M-slot buffer adds to a fresh process (this
    # one's allocator keeps the memory that runs freed: rl_app.upstream.glibc.keep_freed_memory).
    grown = subprocess.run([PYTHON, "-c", SAMPLER_MEMORY], capture_output=True, text=True, cwd=ROOT)
    trees = footprint(config, fp.transition, 3_000_000).trees
    assert int(grown.stdout) == pytest.approx(trees, rel=0.1), grown.stderr


SAMPLER_MEMORY = """
from pathlib import Path
from rl_app.config import ReplayConfig
from rl_app.replay import make_sampler

def anonymous_memory():
    status = Path("/proc/self/status").read_text()
    return int(status.split("RssAnon:")[1].split()[0]) * 1024

before = anonymous_memory()
sampler = make_sampler(ReplayConfig(capacity=3_000_000))
print(anonymous_memory() - before)
"""


def test_a_resumed_run_counts_its_own_files_as_free(small_disk: Path, tiny_config) -> None:
    """On a disk the run fills, it still resumes: the space its files hold is its own."""
    settings = ["checkpoint.keep_last=1", "collector.total_frames=400"]
    one_slot = footprint(tiny_config(*settings), transition_bytes(tiny_config()), capacity=1)
    capacity = int(0.85 * SMALL_DISK / (one_slot.replay_files + one_slot.checkpoints_disk))
    config = tiny_config(*settings, f"replay.capacity={capacity}", run_dir=small_disk / "run")
    train(config)
    disk = footprint(config, one_slot.transition)
    assert shutil.disk_usage(small_disk).free < disk.replay_files + disk.checkpoints_disk

    run_dir = f"run_dir={small_disk / 'run'}"
    assert train(load_config("default", [run_dir, "collector.total_frames=600"])).frames == 600


@pytest.mark.parametrize(
    ("preset", "overrides"), [("default", []), ("dqn_cartpole", []), ("default", RECURRENT_DQN)]
)
def test_the_storage_laid_out_at_start_is_what_the_first_extend_makes(
    tmp_path: Path, preset: str, overrides: list[str]
) -> None:
    """The same files, sizes and dtypes as TorchRL's own layout from collected frames, so
    that checkpoints load into it either way; their bytes are the estimate's."""
    config = load_config(preset, [*TINY_RUN, *overrides, f"run_dir={tmp_path / 'run'}"])
    env = make_env(config.env, 0, network=config.network)
    keys = make_algorithm(config, env, torch.device("cpu")).replay_keys()
    collector = Collector(env, RandomPolicy(env.action_spec), frames_per_batch=50, total_frames=50)
    frames = next(iter(collector)).reshape(-1).select(*keys, TRAJECTORY_KEY)
    collector.shutdown()

    first_extend = make_replay_buffer(config.replay, tmp_path / "extended", 0)
    first_extend.extend(frames)
    at_start = make_replay_buffer(config.replay, tmp_path / "allocated", 0)
    allocate_storage(at_start, stored_transition(env, keys))
    assert layout(tmp_path / "allocated") == layout(tmp_path / "extended")
    files = (tmp_path / "allocated").rglob("*.memmap")
    per_transition = sum(path.stat().st_size for path in files) // config.replay.capacity
    assert per_transition == transition_bytes(config)


def layout(directory: Path) -> dict[str, object]:
    """Every file of a memory-mapped storage with its size, and its key's dtype and shape."""
    found: dict[str, object] = {}
    for path in sorted(directory.rglob("*")):
        name = str(path.relative_to(directory))
        if path.suffix == ".memmap":
            found[name] = path.stat().st_size
        elif path.name == "meta.json":
            found[name] = json.loads(path.read_text())
    return found


@pytest.mark.parametrize("preset", available_presets())
def test_each_preset_says_what_it_holds_as_the_estimate_does(preset: str) -> None:
    text = (PRESETS_DIR / f"{preset}.yaml").read_text().splitlines()
    said = [line.removeprefix(HOLDS_PREFIX) for line in text if line.startswith(HOLDS_PREFIX)]
    assert said == [holds(load_config(preset, ["run_dir=runs/unused"])) + "."]


def test_the_capacity_doc_lists_every_preset_as_the_estimate_does() -> None:
    """docs/capacity.md's table of the shipped presets: each cell starts with the estimate's
    figure (a cell may explain it after), and no preset is missing."""
    rows = {}
    for line in (ROOT / "docs" / "capacity.md").read_text().splitlines():
        if line.startswith("| `") and line.count("|") == 9:
            preset, *cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows[preset.strip("`")] = cells
    assert sorted(rows) == sorted(available_presets())
    for preset, cells in rows.items():
        config = load_config(preset, ["run_dir=runs/unused"])
        fp = footprint(config, transition_bytes(config))
        estimate = [f"{fp.capacity:,}", f"{fp.transition:,}"] + [
            size(part) for part in (fp.ram, fp.replay_files, fp.checkpoint, fp.journals, fp.disk)
        ]
        assert [cell.split(" (")[0] for cell in cells] == estimate, preset
