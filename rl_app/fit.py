"""Whether a run fits the machine it starts on, checked before anything is created.

At its full size a run holds ``replay.capacity`` stored transitions (memory-mapped files in
the run directory, or GPU memory with ``replay.device=cuda``), the sampler's state in RAM,
and on disk up to ``checkpoint.keep_last`` + 2 checkpoints (the kept ones, the best, and the
one being saved), each with the sampler's state but not the data, and the undo journals of
the kept ones, up to an evaluation interval's data each (:mod:`rl_app.replay.journal`); with
``replay.device=cuda`` each checkpoint copies the data. :func:`check_fit` estimates them from the
env's specs and the settings, and refuses a run this machine cannot hold with a
:class:`~rl_app.config.ConfigError` naming ``replay.capacity``. The networks, their
optimizer state and an iteration's sampled batches are not counted: they do not grow with
the buffer (networks too large for the memory are refused as they are built:
:func:`rl_app.run.make_networks`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torchrl.envs import EnvBase

from rl_app.algorithms import make_algorithm
from rl_app.checkpointing import SAVE_MARGIN
from rl_app.config import Config, ConfigError, nearest_existing
from rl_app.envs import make_env
from rl_app.replay import stored_transition
from rl_app.rundir import CHECKPOINTS_DIR, JOURNAL_DIR, REPLAY_DIR
from rl_app.upstream.torchrl import GENERATION_BYTES, TREE_LEAF_BYTES, TREE_VALUE_BYTES

# cgroup v2 and v1 memory controllers: where they are mounted, their limit and usage files.
CGROUP_MEMORY = {
    "": ("/sys/fs/cgroup", "memory.max", "memory.current"),
    "memory": ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),
}


@dataclass(frozen=True)
class Footprint:
    """What a run holds at its full size, in bytes."""

    capacity: int
    transition: int  # one stored transition
    trees: int  # the prioritized sampler's trees, in RAM
    ram: int  # the trees, the generations on the CPU, and the peak of saving or growing them
    gpu: int  # with replay.device=cuda: the replay data and its generations
    replay_files: int  # the memory-mapped replay files, their disk space taken at start
    checkpoint: int  # one checkpoint's replay state (with replay.device=cuda, its data too)
    checkpoints: int  # checkpoints on disk at once, at most
    journals: int  # the undo journals of the checkpoints a run resumes from

    @property
    def disk(self) -> int:
        """The disk it takes in all: replay files, checkpoints and journals."""
        return self.replay_files + self.checkpoints_disk + self.journals

    @property
    def checkpoints_disk(self) -> int:
        """The checkpoints on disk before a save, and the free space that save asks for."""
        return math.ceil(self.checkpoint * (self.checkpoints - 1 + SAVE_MARGIN))


@dataclass(frozen=True)
class Resource:
    """RAM, GPU memory or one file system: what this machine has of it, and which parts of
    a :class:`Footprint` it must hold."""

    name: str  # "RAM", "GPU memory", "disk"
    available: int
    room: str  # how the available bytes are described: "of RAM available", "free in /runs"
    parts: tuple[str, ...]  # Footprint fields: ("replay_files", "checkpoints_disk")

    def needed(self, fp: Footprint) -> int:
        return sum(getattr(fp, part) for part in self.parts)


def footprint(config: Config, transition_bytes: int, capacity: int | None = None) -> Footprint:
    """The footprint of ``config``'s run (with ``capacity`` in place of
    ``replay.capacity`` if given), each stored transition taking ``transition_bytes``."""
    capacity = config.replay.capacity if capacity is None else capacity
    prioritized = config.replay.sampler.startswith("prioritized")  # the segment-tree samplers
    on_gpu = config.replay.device.startswith("cuda")
    data = transition_bytes * capacity
    generations = GENERATION_BYTES * capacity
    trees = 2 * 2 * 2 ** capacity.bit_length() * TREE_VALUE_BYTES if prioritized else 0
    leaves = TREE_LEAF_BYTES * capacity if prioritized else 0
    saving = (trees + leaves if prioritized else 0) + generations
    # Generations grow by doubling: the old buffer and the new one, for a moment.
    gpu = data + 2 * generations if on_gpu else 0
    ram = trees + saving if on_gpu else trees + generations + saving
    return Footprint(
        capacity=capacity,
        transition=transition_bytes,
        trees=trees,
        ram=ram,
        gpu=gpu,
        replay_files=0 if on_gpu else data,
        checkpoint=(data if on_gpu else 0) + generations + leaves,
        checkpoints=config.checkpoint.keep_last + 2,
        # Each journal holds the overwritten slots of one evaluation interval, at most.
        journals=0
        if on_gpu
        else config.checkpoint.keep_last
        * min(config.eval.interval_frames, capacity)
        * transition_bytes,
    )


def holds(config: Config) -> str:
    """What ``config``'s run holds at full size, in one line (each preset's comment says it:
    ``--help`` lists them)."""
    fp = footprint(config, transition_bytes(config))
    return (
        f"{fp.capacity:,} transitions of {fp.transition:,} B: {size(fp.replay_files)} of replay "
        f"files, {size(fp.ram)} of RAM, {size(fp.disk)} of disk in all"
    )


def transition_bytes(config: Config) -> int:
    """Bytes of one transition as the run's buffer stores it, from its env's specs."""
    env = make_env(config.env, config.seed, network=config.network)
    try:
        return stored_transition(env, stored_keys(config, env)).bytes()
    finally:
        env.close()


def stored_keys(config: Config, env: EnvBase) -> list:
    """The keys the algorithm learns from, which the loop stores. They follow from its
    structure, not its sizes: read from a copy with one-unit layers, built on the CPU
    without compiling (milliseconds, whatever the run's sizes and device)."""
    sketch = dataclasses.replace(
        config,
        network=dataclasses.replace(config.network, hidden_sizes=[1], lstm_size=1),
        optim=dataclasses.replace(config.optim, compile=False, cudagraphs=False),
    )
    return make_algorithm(sketch, env, torch.device("cpu")).replay_keys()


def resources(config: Config) -> list[Resource]:
    """What this machine has for ``config``'s run: RAM, GPU memory with
    ``replay.device=cuda``, and free disk on each file system its replay files, checkpoints
    and replay journals go to, counting the space the run's own files hold there (a file system
    this process cannot write to is left to the start, which reports it as such)."""
    found = [Resource("RAM", available_ram(), "of RAM available", ("ram",))]
    if config.replay.device.startswith("cuda"):
        device = torch.device(config.replay.device)
        free = torch.cuda.mem_get_info(device)[0]
        found.append(Resource("GPU memory", free, f"of GPU memory free on {device}", ("gpu",)))
    run_dir = Path(config.run_dir).absolute()
    shown = nearest_existing(run_dir)  # the place named, unless a part is mounted elsewhere
    disks: dict[int, Resource] = {}  # one per file system
    places = {
        "replay_files": REPLAY_DIR,
        "checkpoints_disk": CHECKPOINTS_DIR,
        "journals": JOURNAL_DIR,
    }
    for part, name in places.items():
        place = nearest_existing(run_dir / name)
        if not os.access(place, os.W_OK):
            continue
        device = place.stat().st_dev
        if device in disks:  # parts on one file system: one budget
            disks[device] = dataclasses.replace(disks[device], parts=(*disks[device].parts, part))
            continue
        place = shown if shown.stat().st_dev == device else place
        free = shutil.disk_usage(place).free + own_files_disk(run_dir, device)
        disks[device] = Resource("disk", free, f"free in {place}", (part,))
    return [*found, *disks.values()]


def fits(fp: Footprint, found: list[Resource]) -> bool:
    return all(resource.needed(fp) <= resource.available for resource in found)


def check_fit(config: Config) -> str:
    """Refuse, with :class:`ConfigError`, a run this machine cannot hold at its full size;
    return the estimate as one line, for the run's log."""
    fp = footprint(config, transition_bytes(config))
    found = resources(config)
    if fits(fp, found):
        return describe(fp, found, verb="takes")
    largest = largest_fitting(config, fp.transition, found)
    advice = (
        f"at most replay.capacity={largest} fits here"
        if largest >= 1
        else "not even replay.capacity=1 fits here"
    )
    raise ConfigError(f"{describe(fp, found, verb='needs')}: {advice}")


def describe(fp: Footprint, found: list[Resource], verb: str) -> str:
    """``replay.capacity=N (B bytes per transition) <verb> about 7.4 MB of RAM for the
    prioritized sampler and ...; this machine has ...``."""
    labels = {
        "ram": "the prioritized sampler" if fp.trees else "the buffer's slot generations",
        "gpu": "the replay data",
        "replay_files": "the replay files",
        "checkpoints_disk": f"{fp.checkpoints} checkpoints",
        "journals": "their replay journals",
    }
    wanted, room = [], []
    for resource in found:
        parts = [labels[part] for part in resource.parts if getattr(fp, part)]
        if parts:
            needed = size(resource.needed(fp))
            wanted.append(f"{needed} of {resource.name} for {' and '.join(parts)}")
            room.append(f"{size(resource.available)} {resource.room}")
    return (
        f"replay.capacity={fp.capacity} ({fp.transition} bytes per transition) {verb} about "
        f"{' and '.join(wanted)}; this machine has {' and '.join(room)}"
    )


def largest_fitting(config: Config, transition_bytes: int, found: list[Resource]) -> int:
    """The largest ``replay.capacity`` that fits (0 if none does), by bisection: every
    footprint grows with the capacity."""
    low, high = 0, config.replay.capacity
    while low < high:
        middle = (low + high + 1) // 2
        if fits(footprint(config, transition_bytes, middle), found):
            low = middle
        else:
            high = middle - 1
    return low


def size(count: float) -> str:
    """Bytes in decimal units, to three digits: ``5.3 MB``, ``146 GB``, ``2,120 TB``."""
    for unit in ("B", "kB", "MB", "GB"):
        if count < 999.5:  # three digits once rounded
            return f"{count:.3g} {unit}"
        count /= 1000
    return f"{count:.3g} TB" if count < 999.5 else f"{count:,.0f} TB"


def own_files_disk(run_dir: Path, device: int) -> int:
    """Disk space that the run's own files hold on file system ``device``: a restart empties
    the replay files and journals, and a resume keeps them and its checkpoints."""
    return sum(
        stat.st_blocks * 512
        for file in run_files(run_dir)
        if (stat := file.stat()).st_dev == device
    )


def run_files(run_dir: Path) -> Iterator[Path]:
    """The replay files, journals and checkpoints of the run in ``run_dir`` (none if it is
    new)."""
    directories = (run_dir / REPLAY_DIR, run_dir / JOURNAL_DIR)
    for directory in (*directories, *(run_dir / CHECKPOINTS_DIR).glob("checkpoint-*")):
        yield from (file for file in directory.rglob("*") if file.is_file())


def available_ram() -> int:
    """Memory this process may still take: the kernel's MemAvailable, or less where its
    cgroup caps it (a SLURM job's allocation, a container)."""
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    available = int((meminfo.get("MemAvailable") or meminfo["MemTotal"]).split()[0]) * 1024
    return min(available, cgroup_room())


def cgroup_room() -> int:
    """Memory left under the limits of this process's cgroups and their ancestors (cgroup
    v2 or v1); the largest int64 where none is set."""
    room = 2**63 - 1
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in set(controllers.split(",")) & CGROUP_MEMORY.keys():
            mount, limit_file, usage_file = CGROUP_MEMORY[controller]
            group = Path(mount, path.lstrip("/"))
            for level in (group, *group.parents)[: len(Path(path).parts)]:
                try:
                    limit = int((level / limit_file).read_text())
                    usage = int((level / usage_file).read_text())
                except (OSError, ValueError):  # no such file here, or "max": no limit
                    continue
                room = min(room, limit - usage)
    return room
