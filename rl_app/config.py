"""Every setting of a run: a typed schema, YAML presets, command-line overrides, validation.

A run's configuration is built in three layers, each overriding the one before:
the dataclass defaults below, a preset from ``configs/<name>.yaml``, and ``key=value``
overrides from the command line. OmegaConf merges the layers and checks key names and
types; :func:`validate` then checks values and ranges, so that a mistake stops the run
before any environment, directory or process exists.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

PRESETS_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_PRESET = "default"
# Inside a run directory:
CONFIG_FILE = "config.yaml"
CHECKPOINTS_DIR = "checkpoints"
REPLAY_DIR = "replay"  # the replay buffer's memory-mapped files
JOURNAL_DIR = "replay-journal"  # what restores those files to a checkpoint's state
LOCK_FILE = ".lock"  # held by the process training in it (rl_app.runlock)
HOLDER_FILE = ".lock.holder"  # who holds it


class ConfigError(ValueError):
    """A user's configuration mistake: reported as one line, exit status 2."""


# Whole numbers reach torch and the OS as int64.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# TorchRL's C++ segment trees (every prioritized sampler) hold 2 x the power of two above
# their size in a std::vector<float>: larger sizes raise (from 2**59) or never return
# (from 2**62, the power of two overflows).
SEGMENT_TREE_MAX_SIZE = 2**59 - 1
# torch.set_num_threads takes a C int.
C_INT_MAX = 2**31 - 1


def setting(
    default: Any,
    doc: str,
    *,
    choices: tuple[str, ...] | None = None,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    on_resume: bool = False,
) -> Any:
    """A config field with a one-line description (shown by ``train.py --help``) and the
    values it accepts, which :func:`validate` checks for every field: ``choices``, or bounds
    (``at_least``/``above``/``at_most``; for a list, each element). ``on_resume``: the key
    may change when a run resumes (budgets, cadence, bookkeeping, not the experiment);
    a group declared with ``metadata={"on_resume": True}`` hands that to all its keys."""
    metadata = {"doc": doc, "choices": choices, "at_least": at_least, "above": above,
                "at_most": at_most, "on_resume": on_resume}  # fmt: skip
    if isinstance(default, tuple):  # a list setting: each config gets its own list
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


DEVICE_DOC = "auto | cpu | cuda | cuda:N"


@dataclass
class EnvConfig:
    """The environment trained on."""

    name: str = setting("Pendulum-v1", "Gymnasium environment id, or module:id")
    num_envs: int = setting(
        1, "envs stepped as one batch by each collector (a vector env)", at_least=1
    )
    normalize_observations: bool = setting(
        False,
        "shift and scale observations to zero mean and unit variance, with statistics of "
        "random play from a fixed seed (TorchRL's ObservationNorm; the same in every env)",
    )
    observation_indices: list[int] | None = setting(  # noqa: RUF009
        None,
        "keep only these entries of a Box observation, e.g. [0, 2]: CartPole without its "
        "velocities (unset: the whole observation)",
        at_least=0,
    )
    max_episode_steps: int | None = setting(
        None,
        "end episodes (truncated) after this many agent steps, on top of the env's own limit "
        "(unset: the env's own only; Atari games end at 108,000 frames = 27,000 steps)",
        at_least=1,
    )


@dataclass
class NetworkConfig:
    """Sizes of the policy and value networks."""

    # A tuple default: setting() gives each config its own list of it.
    hidden_sizes: list[int] = setting((256, 256), "hidden layer widths of every MLP", at_least=1)  # noqa: RUF009
    recurrent: str = setting(
        "none",
        "none | lstm: an LSTM between the MLP and the Q-values (algo=dqn), its state carried "
        "through each episode and stored with every frame",
        choices=("none", "lstm"),
    )
    lstm_size: int = setting(64, "size of the LSTM's state (network.recurrent=lstm)", at_least=1)


@dataclass
class CollectorConfig:
    """How environment frames are gathered."""

    total_frames: int = setting(20_000, "environment frames to train for", at_least=1,
                                on_resume=True)  # fmt: skip
    frames_per_batch: int = setting(200, "frames collected per training iteration", at_least=1)
    init_random_frames: int = setting(
        1_000, "frames of uniform random actions before learning", at_least=0
    )
    mode: str = setting(
        "direct",
        "direct (in-process) | sync | async (worker processes) | distributed (SLURM jobs)",
        choices=("direct", "sync", "async", "distributed"),
    )
    workers: int = setting(
        2, "worker processes (sync and async modes; distributed: one collector per job)",
        at_least=1,
    )  # fmt: skip
    nodes: int = setting(2, "collection jobs submitted to SLURM (distributed mode)", at_least=1)
    address: str | None = setting(
        None, "address collection jobs reach the learner at (distributed; unset: this host's)"
    )
    port: int | None = setting(
        None,
        "learner's rendezvous TCP port (distributed; unset: a free one; +1, +2 used too)",
        at_least=1024, at_most=65533,
    )  # fmt: skip
    connect_timeout_s: int = setting(
        600, "how long collection jobs may take to start and join (distributed mode)", at_least=1
    )
    device: str = setting("cpu", f"where worker processes run the policy: {DEVICE_DOC}")
    sync_every: int = setting(
        1, "push learner weights to the workers every N iterations", at_least=1
    )
    compile_policy: bool = setting(
        False, "torch.compile the acting policy (faster stepping after a few seconds' compile)"
    )


@dataclass
class OptimConfig:
    """The learner's updates."""

    lr: float = setting(3e-4, "Adam learning rate of every network", above=0)
    anneal_lr: bool = setting(
        False,
        "decay the learning rate linearly from optim.lr to 0 over collector.total_frames",
    )
    batch_size: int = setting(256, "transitions per gradient update", at_least=1)
    utd_ratio: float = setting(1.0, "gradient updates per collected frame", above=0)
    gamma: float = setting(0.99, "discount factor", at_least=0, at_most=1)
    target: str = setting(
        "td0",
        "value target: td0 | nstep (rewards to the slice end, then bootstrap) | td_lambda "
        "(TD(lambda) over each slice); multi-step targets need a slice sampler",
        choices=("td0", "nstep", "td_lambda"),
    )
    lmbda: float = setting(0.9, "lambda of optim.target=td_lambda", at_least=0, at_most=1)
    compile: bool = setting(
        False,
        "torch.compile the loss: faster updates after a one-time compile (cached on disk)",
        on_resume=True,
    )
    cudagraphs: bool = setting(
        False,
        "capture each update in a CUDA graph, replayed in one launch (a CUDA learner only)",
        on_resume=True,
    )
    fused_adam: bool = setting(
        True,
        "Adam's fused kernel: one kernel steps every parameter (same steps up to float rounding)",
    )
    adam_eps: float = setting(
        1e-8, "Adam's epsilon, added to the root of its second moment (DrQ(eps): 1.5e-4)", above=0
    )


@dataclass
class SACConfig:
    """SAC's own settings (algo=sac)."""

    tau: float = setting(0.005, "soft target-network update rate", above=0, at_most=1)
    init_alpha: float = setting(1.0, "initial entropy temperature (learned from there)", above=0)
    vmap_qnets: bool = setting(
        False,
        "run the Q-networks under torch.vmap (off: one after the other, which measured faster "
        "on CPUs and gives the same values up to float rounding); always on with optim.compile",
        on_resume=True,
    )


@dataclass
class DQNConfig:
    """DQN's own settings (algo=dqn)."""

    eps_start: float = setting(1.0, "exploration epsilon at the start", at_least=0, at_most=1)
    eps_end: float = setting(0.05, "exploration epsilon after annealing", at_least=0, at_most=1)
    eps_annealing_frames: int = setting(
        10_000, "frames over which epsilon decreases linearly", at_least=1
    )
    target_update_interval: int = setting(
        10, "copy the Q-network to its target every N updates", at_least=1
    )
    loss: str = setting("l2", "TD loss: l2 | smooth_l1 (Huber)", choices=("l2", "smooth_l1"))
    double: bool = setting(True, "double DQN: the online network picks the next action")
    max_grad_norm: float = setting(
        10.0, "clip each update's gradient norm to this (0: no clipping)", at_least=0
    )
    eval_eps: float = setting(
        0.0,
        "epsilon of evaluation episodes, and of playing a run (0: greedy)",
        at_least=0,
        at_most=1,
    )
    random_shift: int = setting(
        0,
        "shift each sampled observation and next observation by up to N pixels (edge-padded, "
        "randomly cropped back; DrQ), independently (0: none; Atari only)",
        at_least=0,
    )


@dataclass
class ReplayConfig:
    """The replay buffer (memmap storage inside the run directory, or GPU memory)."""

    capacity: int = setting(
        100_000, "transitions kept in the buffer", at_least=1, at_most=SEGMENT_TREE_MAX_SIZE
    )
    sampler: str = setting(
        "prioritized_slice",
        "prioritized_slice | slice | prioritized_sequence (TorchRL's Sequence windows: "
        "replay.burn_in steps, then replay.slice_len learning steps, padded and masked at "
        "episode ends) | prioritized | uniform",
        choices=("prioritized_slice", "slice", "prioritized_sequence", "prioritized", "uniform"),
    )
    slice_len: int = setting(
        8, "consecutive steps per sampled slice or sequence (sequence samplers)", at_least=1
    )
    burn_in: int = setting(
        0,
        "steps before each sampled sequence that only warm up the recurrent state: no loss "
        "(replay.sampler=prioritized_sequence)",
        at_least=0,
    )
    refresh_states: bool = setting(
        True,
        "write the recurrent states the learner recomputes back into the sampled records "
        "that are still in the buffer (network.recurrent=lstm)",
    )
    her_ratio: float = setting(
        0.0,
        "hindsight experience replay: the fraction of each sampled batch whose goal is "
        "replaced by one its episode achieved (0: off; a goal env, algo=dqn or sac with an "
        "MLP; a slice takes one goal for all its steps)",
        at_least=0, at_most=1,
    )  # fmt: skip
    her_strategy: str = setting(
        "future",
        "the achieved goal a transition is relabelled with: future (after a step from it to "
        "its episode's end) | final (after its episode's last step) | episode (after any step "
        "of its episode)",
        choices=("future", "final", "episode"),
    )
    alpha: float = setting(0.6, "priority exponent (prioritized samplers)", at_least=0)
    beta: float = setting(0.4, "importance-weight exponent (prioritized samplers)", at_least=0)
    device: str = setting(
        "cpu",
        "where replay data are stored: cpu (memory-mapped files in the run directory) | cuda | "
        "cuda:N (GPU memory: no host-to-GPU copy per batch)",
    )


@dataclass
class EvalConfig:
    """Deterministic evaluation, which also picks the best checkpoint."""

    interval_frames: int = setting(
        2_000, "evaluate every N collected frames", at_least=1, on_resume=True
    )
    episodes: int = setting(10, "episodes per evaluation", at_least=1, on_resume=True)
    video: bool = setting(
        False, "record an evaluation episode and send it to the logger backend", on_resume=True
    )
    video_every: int = setting(
        1, "record the video at every N-th evaluation (eval.video=true)", at_least=1,
        on_resume=True,
    )  # fmt: skip


@dataclass
class CheckpointConfig:
    """Checkpoints saved after each evaluation, on a stop, and every ``interval_minutes``."""

    keep_last: int = setting(
        2, "most recent checkpoints kept (the best is kept too)", at_least=1, on_resume=True
    )
    interval_minutes: float = setting(
        5.0, "also save at the first iteration boundary this long after the last save "
        "(0: every iteration)", at_least=0, on_resume=True,
    )  # fmt: skip


@dataclass
class LoggerConfig:
    """Where metrics go (metrics.jsonl and curve.png are always written)."""

    backend: str = setting(
        "csv", "none | csv | wandb | tensorboard",
        choices=("none", "csv", "wandb", "tensorboard"), on_resume=True,
    )  # fmt: skip
    project: str = setting("rl_app", "wandb project name", on_resume=True)


@dataclass
class SlurmConfig:
    """SLURM launch (launcher=slurm): a profile from slurm/profiles/, overridable key by key.
    Profile values are checked against the cluster when submitting."""

    profile: str = setting("local", "cluster profile: slurm/profiles/<profile>.yaml")
    partition: str | None = setting(None, "partition (unset: the profile's)")
    account: str | None = setting(None, "account (unset: the profile's)")
    qos: str | None = setting(None, "quality of service (unset: the profile's)")
    time_min: int | None = setting(None, "time limit in minutes (unset: the profile's)")
    gpus_per_node: int | None = setting(None, "GPUs for the job (unset: the profile's)")
    cpus_per_task: int | None = setting(None, "CPUs for the job (unset: the profile's)")
    mem_gb: int | None = setting(None, "memory in GB (unset: the profile's)")
    constraint: str | None = setting(None, "node constraint (unset: the profile's)")
    signal_delay_s: int | None = setting(None, "USR2 this long before the time limit")
    max_requeues: int | None = setting(None, "preemptions/timeouts a job may be requeued for")
    array: str | None = setting(None, "one job per value of one key, e.g. seed=1,2,3")
    collector_partition: str | None = setting(
        None, "partition of collection jobs (collector.mode=distributed; unset: the job's)"
    )
    collector_cpus_per_task: int | None = setting(
        None, "CPUs of each collection job (unset: the job's, slurm.cpus_per_task)"
    )
    collector_mem_gb: int | None = setting(None, "memory of each collection job in GB")
    collector_time_min: int | None = setting(
        None, "time limit of collection jobs in minutes (unset: the job's)"
    )


@dataclass
class Config:
    """A whole run."""

    launcher: str = setting(
        "local", "local (train here) | slurm (submit with submitit)",
        choices=("local", "slurm"), on_resume=True,
    )  # fmt: skip
    algo: str = setting(
        "sac", "sac (continuous actions) | dqn (discrete actions)", choices=("sac", "dqn")
    )
    seed: int = setting(0, "seed of every random number generator", at_least=0, at_most=2**32 - 1)
    device: str = setting("auto", f"learner device: {DEVICE_DOC}")
    threads: int = setting(
        1, "torch intra-op threads (one is fastest on small machines)", at_least=1,
        at_most=C_INT_MAX, on_resume=True,
    )  # fmt: skip
    run_dir: str | None = setting(
        None, "where the run's files go (default runs/<preset>-<time>)", on_resume=True
    )
    env: EnvConfig = field(default_factory=EnvConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    dqn: DQNConfig = field(default_factory=DQNConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig, metadata={"on_resume": True})


# Each algorithm and the action space it needs.
ALGORITHM_ACTIONS = {"sac": "continuous", "dqn": "discrete"}


def settings_of(
    schema: type = Config, prefix: str = "", inherited: bool = False
) -> Iterator[tuple[str, dataclasses.Field, dict[str, Any]]]:
    """Every key of the schema (``"optim.lr"``, ...) with its field and metadata, groups
    walked into; a group's ``on_resume`` is handed down to its keys."""
    for item in dataclasses.fields(schema):
        on_resume = inherited or item.metadata.get("on_resume", False)
        if dataclasses.is_dataclass(item.default_factory):
            yield from settings_of(item.default_factory, f"{prefix}{item.name}.", on_resume)
        else:
            yield prefix + item.name, item, {**item.metadata, "on_resume": on_resume}


def changeable_on_resume() -> list[str]:
    """Keys a resumed run may change (declared with ``on_resume=True``)."""
    return [key for key, _, metadata in settings_of() if metadata["on_resume"]]


def available_presets() -> list[str]:
    return sorted(path.stem for path in PRESETS_DIR.glob("*.yaml"))


# Each preset's comment line saying what it holds at full size (rl_app/fit.py estimates it).
HOLDS_PREFIX = "# Holds at full size: "


def describe_presets() -> str:
    """One line per preset, with what it holds at full size, for ``--help``."""
    lines = []
    for preset in available_presets():
        text = (PRESETS_DIR / f"{preset}.yaml").read_text().splitlines()
        holds = next((line.removeprefix(HOLDS_PREFIX) for line in text
                      if line.startswith(HOLDS_PREFIX)), "")  # fmt: skip
        lines.append(f"  {preset}: {holds}")
    return "\n".join(lines)


def load_config(preset: str = DEFAULT_PRESET, overrides: list[str] | None = None) -> Config:
    """Merge defaults, a preset and ``key=value`` overrides into a validated :class:`Config`.

    ``preset`` names a file in ``configs/`` or is the path of a YAML file. When ``run_dir``
    names a run that holds a checkpoint, the config saved in that run replaces the preset
    (the run resumes), and only keys declared ``on_resume`` may be overridden. Every
    mistake raises :class:`ConfigError` naming the file (and line) or the key."""
    given = conform(parse_overrides(overrides or []), Config, "")
    run_dir = given.get("run_dir")
    try:
        if run_dir is not None and holds_checkpoint(Path(run_dir)):
            saved = read_run_config(Path(run_dir))
            config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(saved), given))
            refuse_experiment_changes(saved, config)
        else:
            preset_path = preset_file(preset)
            layers = [OmegaConf.structured(Config), conform(read_yaml(preset_path), Config, ""),
                      given]  # fmt: skip
            config = OmegaConf.to_object(OmegaConf.merge(*layers))
    except OmegaConfBaseException as error:
        raise ConfigError(describe_omegaconf_error(error)) from None
    validate(config)
    if config.run_dir is None:
        config.run_dir = f"runs/{Path(preset).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_run_dir(Path(config.run_dir))
    return config


def preset_file(preset: str) -> Path:
    """``configs/<preset>.yaml``, or ``preset`` itself when it is a path to a YAML file."""
    if preset.endswith((".yaml", ".yml")) or "/" in preset:
        if not Path(preset).is_file():
            raise ConfigError(f"--config {preset}: no such file")
        return Path(preset)
    path = PRESETS_DIR / f"{preset}.yaml"
    if not path.is_file():
        raise ConfigError(
            f"unknown preset {preset!r}: accepted presets are {', '.join(available_presets())}"
            " (or give the path of a YAML file)"
        )
    return path


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping of settings; a syntax error is named with its file and line."""
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({problem})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot be read ({error})") from None
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: must be a mapping of settings (key: value), not {tree!r}")
    return tree


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["optim.lr=1e-3", ...]`` into a nested mapping; values are read as YAML."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, equals, text = item.partition("=")
        if not equals or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key=value")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            raise ConfigError(
                f"{key}={text!r} is not a value: quote text, e.g. {key}='...'"
            ) from None
        parts = key.split(".")
        node = tree
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r} conflicts with {'.'.join(parts[:-1])}=...")
            node = child
        node[parts[-1]] = value
    return tree


def conform(tree: dict[str, Any], schema: type, prefix: str) -> dict[str, Any]:
    """``tree`` checked against ``schema`` key by key: unknown keys, a value where a group is
    expected (or the other way round) and values of the wrong type raise
    :class:`ConfigError`; whole numbers written as floats (``1e4``) become integers."""
    fields = {item.name: item for item in dataclasses.fields(schema)}
    conformed = {}
    for name, value in tree.items():
        key = f"{prefix}{name}"
        item = fields.get(str(name))
        if item is None:
            accepted = ", ".join(prefix + f for f in fields)
            raise ConfigError(f"unknown key {key!r}: accepted keys here are {accepted}")
        if dataclasses.is_dataclass(item.default_factory):
            if not isinstance(value, dict):
                keys = ", ".join(
                    f"{key}.{f.name}" for f in dataclasses.fields(item.default_factory)
                )
                raise ConfigError(
                    f"{key}={value!r} is not accepted: {key} is a group of settings ({keys}): "
                    "give it a mapping of those keys"
                )
            conformed[name] = conform(value, item.default_factory, f"{key}.")
        else:
            conformed[name] = conform_value(key, value, str(item.type), dict(item.metadata))
    return conformed


def conform_value(key: str, value: Any, annotation: str, accepted: dict[str, Any]) -> Any:
    """One setting's value in the type its field declares (``int``, ``float | None``, ...);
    a whole number also within the bounds its setting declares (``accepted``) and int64."""
    optional = annotation.endswith("| None")
    kind = annotation.removesuffix("| None").strip()
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key} is empty: give a value ({kind})")
    if kind == "list[int]":
        if not isinstance(value, list):
            raise ConfigError(f"{key}={value!r} is not accepted: give a list, e.g. [256, 256]")
        return [conform_value(key, element, "int", accepted) for element in value]
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r} is not accepted: give true or false")
    if kind in ("int", "float"):
        number = as_number(value)
        if number is None:
            raise ConfigError(f"{key}={value!r} is not accepted: give a number ({kind})")
        if kind == "float":
            return float(number)
        if not float(number).is_integer():
            raise ConfigError(
                f"{key}={value!r} is not accepted: give a whole number (e.g. 10000 or 1e4)"
            )
        whole = int(number)
        # Beyond int64 here, where the value is still as written (1e99, not its 100 digits);
        # the declared bounds alone are checked by validate().
        if not INT64_MIN <= whole <= INT64_MAX:
            raise ConfigError(f"{key}={value!r} {violation(whole, whole_number_bounds(accepted))}")
        return whole
    if kind == "str" and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{key}={value!r} is not accepted: give a {kind}")


def whole_number_bounds(accepted: dict[str, Any]) -> dict[str, Any]:
    """The bounds a whole-number setting declares, narrowed to int64 (what torch and the
    OS take)."""
    at_least, at_most = accepted.get("at_least"), accepted.get("at_most")
    return {
        "at_least": INT64_MIN if at_least is None else max(at_least, INT64_MIN),
        "at_most": INT64_MAX if at_most is None else min(at_most, INT64_MAX),
    }


def as_number(value: Any) -> float | int | None:
    """An int or float, also from text such as ``1e4`` (YAML reads that as text); None if
    ``value`` is no finite number (nor an integer a float can hold)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(number):
        return None
    return value if isinstance(value, int) else number


def read_run_config(run_dir: Path) -> Config:
    """The config a run saved in its directory (reads only; values were validated then)."""
    saved = conform(read_yaml(run_dir / CONFIG_FILE), Config, "")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), saved))
    except OmegaConfBaseException as error:
        raise ConfigError(f"{run_dir / CONFIG_FILE}: {describe_omegaconf_error(error)}") from None


def holds_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a run with at least one checkpoint (it will resume)."""
    return (run_dir / CONFIG_FILE).is_file() and any(
        (run_dir / CHECKPOINTS_DIR).glob("checkpoint-*")
    )


def check_run_dir(run_dir: Path) -> None:
    """A run directory is new, empty, or a run (resumed, or restarted if it never saved)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run_dir={str(run_dir)!r} is a file: give a directory")
    if not run_dir.is_dir():
        return
    # Lock files alone are left by a run killed before it wrote its config.
    others = [p for p in run_dir.iterdir() if p.name not in (LOCK_FILE, HOLDER_FILE)]
    if others and not (run_dir / CONFIG_FILE).exists():
        raise ConfigError(
            f"run_dir={str(run_dir)!r} holds other files and is not a run directory: "
            "give a new or empty directory, or an earlier run's directory to resume it"
        )


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def refuse_experiment_changes(saved: Config, resumed: Config) -> None:
    """Raise :class:`ConfigError` if a resume would change the experiment itself."""
    before = flatten(dataclasses.asdict(saved))
    after = flatten(dataclasses.asdict(resumed))
    changeable = changeable_on_resume()
    changed = [key for key in after if after[key] != before[key] and key not in changeable]
    if changed:
        key = changed[0]
        raise ConfigError(
            f"{key}={after[key]!r} cannot change when resuming (the run was started with "
            f"{before[key]!r}); keys that may change on resume: {', '.join(changeable)}"
        )


def describe_omegaconf_error(error: OmegaConfBaseException) -> str:
    """One line naming the key, the value and what is accepted."""
    key = getattr(error, "full_key", None) or "?"
    message = str(error).splitlines()[0]
    if "not in" in message or "Key" in type(error).__name__:
        group = key.rsplit(".", 1)[0] if "." in key else None
        accepted = ", ".join(field_names(group))
        return f"unknown key {key!r}: accepted keys here are {accepted}"
    return f"bad value for {key!r}: {message}"


def field_names(group: str | None) -> list[str]:
    """The keys accepted at the top level (``group=None``) or inside one group."""
    schema: Any = Config
    if group is not None:
        for part in group.split("."):
            match = {f.name: f for f in dataclasses.fields(schema)}.get(part)
            if match is None or not dataclasses.is_dataclass(match.default_factory):
                return [f.name for f in dataclasses.fields(Config)]
            schema = match.default_factory
    prefix = f"{group}." if group else ""
    return [prefix + f.name for f in dataclasses.fields(schema)]


def validate(config: Config) -> None:
    """Check values against what each setting declares, then what involves several keys or
    the machine; raise :class:`ConfigError` naming the first bad key."""
    tree = dataclasses.asdict(config)
    for key, _, accepted in settings_of():
        value = tree
        for part in key.split("."):
            value = value[part]
        check_declared(key, value, accepted)
    for key in ("device", "collector.device", "replay.device"):
        check_device(key, flatten(tree)[key], allow_auto=key == "device")
    check_cudagraphs(config)

    if config.collector.total_frames < config.collector.frames_per_batch:
        raise ConfigError(
            f"collector.total_frames={config.collector.total_frames} is out of range: "
            f"it must be at least collector.frames_per_batch={config.collector.frames_per_batch}"
        )
    check_batch_split(config.collector, config.env.num_envs)
    check_value_target(config.optim, config.replay.sampler)
    if config.optim.batch_size > config.replay.capacity:
        raise ConfigError(
            f"optim.batch_size={config.optim.batch_size} is out of range: "
            f"it must not exceed replay.capacity={config.replay.capacity}"
        )

    check_recurrent(config)

    check_env_registered(config.env.name)
    env_spec = gym.spec(config.env.name.split(":")[-1])
    check_spaces(config.algo, config.env)
    check_hindsight(config)
    check_atari(config)
    episode_len = env_spec.max_episode_steps
    if samples_sequences(config.replay.sampler):
        window = config.replay.burn_in + config.replay.slice_len
        if episode_len is not None and window > episode_len:
            keys = (
                "replay.burn_in + replay.slice_len" if config.replay.burn_in else "replay.slice_len"
            )
            raise ConfigError(
                f"{keys}={window} is out of range: {config.env.name} episodes last at most "
                f"{episode_len} steps"
            )
        if config.optim.batch_size % config.replay.slice_len:
            raise ConfigError(
                f"optim.batch_size={config.optim.batch_size} is not accepted: with a slice "
                f"sampler it must be a multiple of replay.slice_len={config.replay.slice_len}"
            )
    check_video(config)


# --- evaluation videos (eval.video) ---


def check_video(config: Config) -> None:
    """A run asked to record videos must be able to render its env headless and to encode
    for its logger backend: checked here, so that it fails at start and not mid-run."""
    if not config.eval.video:
        return
    if config.logger.backend == "none":
        raise ConfigError(
            "eval.video=true needs a logger backend to send videos to: "
            "set logger.backend to csv, wandb or tensorboard"
        )
    from rl_app.rendering import encoder_problem, render_problem  # torchrl: only for videos

    problem = render_problem(config.env.name) or encoder_problem(config.logger.backend)
    if problem is not None:
        raise ConfigError(f"eval.video=true cannot work here: {problem}")


def check_declared(key: str, value: Any, accepted: dict[str, Any]) -> None:
    """``value`` against the ``choices`` and bounds its setting declares (None: unset;
    a list: each element)."""
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"{key}=[] is out of range: give one or more values")
        for element in value:
            if (why := violation(element, accepted)) is not None:
                raise ConfigError(f"{key}={value!r} is not accepted: {element!r} {why}")
    elif value is not None and (why := violation(value, accepted)) is not None:
        raise ConfigError(f"{key}={value!r} {why}")


def violation(value: Any, accepted: dict[str, Any]) -> str | None:
    """What is wrong with one value, or None."""
    choices = accepted.get("choices")
    if choices is not None and value not in choices:
        return f"is not accepted: choose one of {', '.join(choices)}"
    bounds = {">=": accepted.get("at_least"), ">": accepted.get("above"),
              "<=": accepted.get("at_most")}  # fmt: skip
    holds = {">=": lambda b: value >= b, ">": lambda b: value > b, "<=": lambda b: value <= b}
    if any(bound is not None and not holds[word](bound) for word, bound in bounds.items()):
        described = " and ".join(f"{w} {b}" for w, b in bounds.items() if b is not None)
        return f"is out of range: it must be {described}"
    return None


def check_device(key: str, device: str, allow_auto: bool) -> None:
    """``cpu``, ``cuda`` or ``cuda:N`` (and ``auto`` where allowed), on a GPU this machine has."""
    kind, _, index = device.partition(":")
    accepted = "auto, cpu, cuda or cuda:N" if allow_auto else "cpu, cuda or cuda:N"
    if (allow_auto and device == "auto") or device == "cpu":
        return
    if kind != "cuda" or (index and not index.isdigit()):
        raise ConfigError(f"{key}={device!r} is not accepted: choose {accepted}")
    import torch  # only when a GPU is asked for: the check needs CUDA's device count

    count = torch.cuda.device_count()
    if count == 0:
        raise ConfigError(
            f"{key}={device!r} is not available: this machine has no CUDA GPU (use cpu"
            + (" or auto)" if allow_auto else ")")
        )
    if index and int(index) >= count:
        raise ConfigError(
            f"{key}={device!r} is not available: this machine has {count} CUDA GPU(s), "
            f"cuda:0 to cuda:{count - 1}"
        )


def check_cudagraphs(config: Config) -> None:
    """CUDA graphs need the learner on a GPU (``check_device`` has checked that one exists)
    and a constant learning rate."""
    if not config.optim.cudagraphs:
        return
    if config.optim.anneal_lr:
        raise ConfigError(
            "optim.anneal_lr=true cannot be combined with optim.cudagraphs=true: a captured "
            "update keeps the learning rate it was recorded with"
        )
    if config.device.startswith("cuda"):
        return
    import torch  # only when CUDA graphs are asked for

    if config.device == "cpu" or not torch.cuda.is_available():
        raise ConfigError(
            f"optim.cudagraphs=true needs a CUDA learner, but device={config.device!r} "
            + ("runs on the CPU" if config.device == "cpu" else "finds no CUDA GPU here")
            + ": set device=cuda on a GPU machine, or optim.cudagraphs=false"
        )


SEQUENCE_SAMPLERS = ("prioritized_slice", "slice", "prioritized_sequence")
# The samplers that rebuild an Atari game's frame stacks (check_atari).
FRAME_SAMPLERS = ("prioritized_slice", "slice")
# Gymnasium's entry point of every Atari game (ale_py).
ATARI_ENTRY_POINT = "ale_py.env:AtariEnv"


def samples_sequences(sampler: str) -> bool:
    """Whether ``replay.sampler`` yields ``[sequences, steps]`` batches (time last)."""
    return sampler in SEQUENCE_SAMPLERS


def check_value_target(optim: OptimConfig, sampler: str) -> None:
    """Multi-step targets run along the time dimension of sampled slices."""
    if optim.target != "td0" and not samples_sequences(sampler):
        raise ConfigError(
            f"optim.target={optim.target!r} needs a sequence sampler (replay.sampler="
            f"{', '.join(SEQUENCE_SAMPLERS)}): replay.sampler={sampler!r} samples single steps"
        )


def check_recurrent(config: Config) -> None:
    """A recurrent network learns from sequences, and only DQN has one; burn-in is a part
    of TorchRL's Sequence windows."""
    replay = config.replay
    if replay.burn_in and replay.sampler != "prioritized_sequence":
        raise ConfigError(
            f"replay.burn_in={replay.burn_in} needs replay.sampler=prioritized_sequence "
            f"(replay.sampler={replay.sampler!r} has no burn-in steps): set replay.burn_in=0"
        )
    if config.network.recurrent == "none":
        return
    if config.algo != "dqn":
        raise ConfigError(
            f"network.recurrent={config.network.recurrent!r} is not accepted with "
            f"algo={config.algo!r}: only algo=dqn has a recurrent network "
            "(set network.recurrent=none)"
        )
    if not samples_sequences(replay.sampler):
        raise ConfigError(
            f"network.recurrent={config.network.recurrent!r} learns from sequences: "
            f"replay.sampler={replay.sampler!r} samples single steps; choose one of "
            f"{', '.join(SEQUENCE_SAMPLERS)}"
        )


# What hindsight relabelling reads of a goal env, as gymnasium-robotics' GoalEnv offers it:
# its dict observation's entries, and the reward and termination of any goal.
GOAL_KEYS = ("desired_goal", "achieved_goal", "observation")
GOAL_FUNCTIONS = ("compute_reward", "compute_terminated")
# The algorithms whose networks read the desired goal (their MLPs: not a recurrent DQN).
GOAL_ALGORITHMS = ("dqn", "sac")
# What hindsight relabelling can relabel: transitions and slices.
HER_SAMPLERS = ("prioritized_slice", "slice", "prioritized", "uniform")


def check_hindsight(config: Config) -> None:
    """Hindsight relabelling (``replay.her_ratio``) needs a goal env, networks that read the
    goal (the MLPs of :data:`GOAL_ALGORITHMS`), transitions or slices (not Sequence
    windows), and episodes stored one after the other."""
    replay = config.replay
    if not replay.her_ratio:
        return
    her = f"replay.her_ratio={replay.her_ratio}"
    if config.algo not in GOAL_ALGORITHMS or config.network.recurrent != "none":
        raise ConfigError(
            f"{her} is not accepted with algo={config.algo!r} and network.recurrent="
            f"{config.network.recurrent!r}: only the MLPs of algo="
            f"{' and algo='.join(GOAL_ALGORITHMS)} read the goal (set replay.her_ratio=0)"
        )
    if replay.sampler == "prioritized_sequence":
        # A Sequence window (burn-in, padding) is not a slice of one goal's steps: its records
        # would take goals one by one.
        raise ConfigError(
            f"{her} is not accepted with replay.sampler='prioritized_sequence': relabelling "
            f"takes transitions or slices; set replay.sampler to one of {', '.join(HER_SAMPLERS)}"
        )
    if config.collector.mode != "direct" or config.env.num_envs != 1:
        # Relabelling finds episodes by their done flags in storage order alone.
        raise ConfigError(
            f"{her} needs each env's steps stored one after the other, as only "
            f"collector.mode=direct with env.num_envs=1 stores them (collector.mode="
            f"{config.collector.mode!r}, env.num_envs={config.env.num_envs}): episodes are "
            "found by their done flags alone, so interleaved envs would join into false episodes"
        )
    problem = goal_env_problem(config.env.name)
    if problem is not None:
        raise ConfigError(f"{her} relabels goals, but {config.env.name} {problem}")


def goal_env_problem(env_name: str) -> str | None:
    """What ``env_name`` lacks of a goal env (:data:`GOAL_KEYS`, :data:`GOAL_FUNCTIONS`),
    or None."""
    probe = gym.make(env_name)
    space, unwrapped = probe.observation_space, probe.unwrapped
    probe.close()
    observed = space.spaces if isinstance(space, gym.spaces.Dict) else {}
    missing_key = next((key for key in GOAL_KEYS if key not in observed), None)
    if missing_key is not None:
        return (
            f"observes no {missing_key!r} (its observation space is a {type(space).__name__}, "
            f"not a Dict of {', '.join(GOAL_KEYS)})"
        )
    missing = next(
        (name for name in GOAL_FUNCTIONS if not callable(getattr(unwrapped, name, None))), None
    )
    if missing is not None:
        return f"offers no {missing}(achieved_goal, desired_goal, info)"
    return None


def check_batch_split(collector: CollectorConfig, num_envs: int) -> None:
    """Sync and distributed batches are gathered evenly from every worker, and every
    collector's share is a whole number of steps of its ``num_envs`` envs."""
    if collector.mode == "sync" and collector.frames_per_batch % collector.workers:
        raise ConfigError(
            f"collector.frames_per_batch={collector.frames_per_batch} is not accepted: "
            f"in sync mode it is split evenly among collector.workers={collector.workers}"
        )
    if collector.mode == "distributed":
        if collector.frames_per_batch % collector.nodes:
            raise ConfigError(
                f"collector.frames_per_batch={collector.frames_per_batch} is not accepted: in "
                f"distributed mode it is split evenly among collector.nodes={collector.nodes}"
            )
    sources = {"sync": collector.workers, "distributed": collector.nodes}.get(collector.mode, 1)
    if (collector.frames_per_batch // sources) % num_envs:
        raise ConfigError(
            f"env.num_envs={num_envs} is not accepted: each collector's share of "
            f"collector.frames_per_batch={collector.frames_per_batch} must be a whole number "
            f"of steps of its {num_envs} envs"
        )


def check_env_registered(env_name: str) -> None:
    """Gymnasium ids, or ``module:id`` for an env that ``module`` registers on import."""
    module = env_name.split(":")[0] if ":" in env_name else None
    if module is not None:
        try:
            importlib.import_module(module)
        except Exception as error:  # any failure to import is the user's module's
            raise ConfigError(
                f"env.name={env_name!r}: cannot import {module!r} ({error})"
            ) from None
    if not is_registered(env_name.split(":")[-1]):
        raise ConfigError(
            f"env.name={env_name!r} is not a registered Gymnasium environment "
            "(see gymnasium.envs.registry for the accepted ids, or give module:id)"
        )


def is_registered(env_id: str) -> bool:
    """Whether Gymnasium knows ``env_id``. It learns the ids of the Atari games (e.g.
    BreakoutNoFrameskip-v4) from ale_py, imported here at the first id it does not know
    rather than by every run (it takes a quarter of a second)."""
    if env_id not in gym.envs.registry:
        import ale_py

        gym.register_envs(ale_py)
    return env_id in gym.envs.registry


def is_atari(env_name: str) -> bool:
    """Whether ``env.name`` is a game of the Arcade Learning Environment."""
    env_id = env_name.split(":")[-1]
    return is_registered(env_id) and gym.spec(env_id).entry_point == ATARI_ENTRY_POINT


def check_atari(config: Config) -> None:
    """An Atari game is learned from stacks of frames that the replay buffer stores once
    (:mod:`rl_app.replay.frames`): rebuilt along sampled slices, next to one-slot reset slots that
    only the slice samplers, with slices of two steps or more, never draw."""
    if not is_atari(config.env.name):
        if config.dqn.random_shift:
            raise ConfigError(
                f"dqn.random_shift={config.dqn.random_shift} shifts frames: {config.env.name} "
                "observes none (set dqn.random_shift=0, or train on an Atari game)"
            )
        return
    replay = config.replay
    if replay.sampler not in FRAME_SAMPLERS:
        raise ConfigError(
            f"replay.sampler={replay.sampler!r} is not accepted with an Atari game, whose frame "
            f"stacks are rebuilt along slices: choose one of {', '.join(FRAME_SAMPLERS)}"
        )
    if replay.slice_len < 2:
        raise ConfigError(
            f"replay.slice_len={replay.slice_len} is out of range with an Atari game: it must "
            "be at least 2 (one-step slices would draw the buffer's reset slots)"
        )
    if config.network.recurrent != "none" or config.env.normalize_observations:
        raise ConfigError(
            f"{config.env.name} is learned by the Nature CNN from raw frames: set "
            "network.recurrent=none and env.normalize_observations=false"
        )


def check_spaces(algo: str, env: EnvConfig) -> None:
    """The algorithm must fit the env's actions, and ``env.observation_indices`` its
    observation (building the Gymnasium env is the only way to read its spaces; no TorchRL
    env, file or process is created)."""
    env_name = env.name
    try:
        probe = gym.make(env_name)
    except Exception as error:  # a missing optional dependency, a broken env module
        raise ConfigError(f"env.name={env_name!r} cannot be built: {error}") from None
    actions = "discrete" if isinstance(probe.action_space, gym.spaces.Discrete) else "continuous"
    observation_space = probe.observation_space
    probe.close()
    if env.observation_indices is not None:
        if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
            raise ConfigError(
                f"env.observation_indices needs a flat Box observation: {env_name} observes "
                f"{observation_space}"
            )
        size = observation_space.shape[0]
        if max(env.observation_indices) >= size:
            raise ConfigError(
                f"env.observation_indices={env.observation_indices!r} is out of range: "
                f"{env_name} observations have {size} entries (indices 0 to {size - 1})"
            )
    if ALGORITHM_ACTIONS[algo] != actions:
        fitting = [name for name, kind in ALGORITHM_ACTIONS.items() if kind == actions]
        raise ConfigError(
            f"algo={algo!r} needs {ALGORITHM_ACTIONS[algo]} actions but {env_name} has "
            f"{actions} actions: use algo={' or algo='.join(fitting)}"
        )


def to_yaml(config: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))


def describe_settings() -> str:
    """The text of ``train.py --help``: every group and key, with default and meaning."""
    lines = []
    group_shown = None
    for key, item, metadata in settings_of():
        group_name = key.rpartition(".")[0]
        if group_name and group_name != group_shown:
            schema = {f.name: f.default_factory for f in dataclasses.fields(Config)}[group_name]
            lines.append(f"\n  {group_name}: {schema.__doc__.splitlines()[0].strip()}")
            group_shown = group_name
        default = item.default_factory() if item.default is dataclasses.MISSING else item.default
        lines.append(f"    {key}={default}  ({metadata['doc']})")
    return "\n".join(lines)
