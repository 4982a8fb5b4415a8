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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

PRESETS_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_PRESET = "default"
# Inside a run directory:
CONFIG_FILE = "config.yaml"
CHECKPOINTS_DIR = "checkpoints"
# Keys a resumed run may change: budgets, evaluation cadence, bookkeeping, logging, and
# every slurm.* key (where and how the run is launched).
CHANGEABLE_ON_RESUME = (
    "run_dir",
    "launcher",
    "threads",
    "optim.compile",
    "collector.total_frames",
    "eval.interval_frames",
    "eval.episodes",
    "checkpoint.keep_last",
    "logger.backend",
    "logger.project",
)


class ConfigError(ValueError):
    """A user's configuration mistake: reported as one line, exit status 2."""


def setting(default: Any, doc: str) -> Any:
    """A config field with a one-line description shown by ``train.py --help``."""
    return field(default=default, metadata={"doc": doc})


@dataclass
class EnvConfig:
    """The environment trained on."""

    name: str = setting("Pendulum-v1", "Gymnasium environment id, or module:id")
    num_envs: int = setting(1, "envs stepped as one batch by each collector (a vector env)")


@dataclass
class NetworkConfig:
    """Sizes of the policy and value networks."""

    hidden_sizes: list[int] = field(
        default_factory=lambda: [256, 256], metadata={"doc": "hidden layer widths of every MLP"}
    )


@dataclass
class CollectorConfig:
    """How environment frames are gathered."""

    total_frames: int = setting(20_000, "environment frames to train for")
    frames_per_batch: int = setting(200, "frames collected per training iteration")
    init_random_frames: int = setting(1_000, "frames of uniform random actions before learning")
    mode: str = setting(
        "direct",
        "direct (in-process) | sync | async (worker processes) | distributed (SLURM jobs)",
    )
    workers: int = setting(
        2, "worker processes (sync and async modes; distributed: one collector per job)"
    )
    nodes: int = setting(2, "collection jobs submitted to SLURM (distributed mode)")
    address: str | None = setting(
        None, "address collection jobs reach the learner at (distributed; unset: this host's)"
    )
    port: int | None = setting(
        None, "learner's rendezvous TCP port (distributed; unset: a free one; +1, +2 used too)"
    )
    connect_timeout_s: int = setting(
        600, "how long collection jobs may take to start and join (distributed mode)"
    )
    device: str = setting("cpu", "where worker processes run the policy: cpu | cuda")
    sync_every: int = setting(1, "push learner weights to the workers every N iterations")
    compile_policy: bool = setting(
        False, "torch.compile the acting policy (faster stepping after a few seconds' compile)"
    )


@dataclass
class OptimConfig:
    """The learner's updates."""

    lr: float = setting(3e-4, "Adam learning rate of every network")
    batch_size: int = setting(256, "transitions per gradient update")
    utd_ratio: float = setting(1.0, "gradient updates per collected frame")
    gamma: float = setting(0.99, "discount factor")
    tau: float = setting(0.005, "soft target-network update rate")
    target: str = setting(
        "td0",
        "value target: td0 | nstep (rewards to the slice end, then bootstrap) | td_lambda "
        "(TD(lambda) over each slice); multi-step targets need a slice sampler",
    )
    lmbda: float = setting(0.9, "lambda of optim.target=td_lambda")
    compile: bool = setting(
        False, "torch.compile the loss: faster updates after a one-time compile (cached on disk)"
    )


@dataclass
class DQNConfig:
    """DQN's own settings (algo=dqn)."""

    eps_start: float = setting(1.0, "exploration epsilon at the start")
    eps_end: float = setting(0.05, "exploration epsilon after annealing")
    eps_annealing_frames: int = setting(10_000, "frames over which epsilon decreases linearly")
    target_update_interval: int = setting(10, "copy the Q-network to its target every N updates")
    loss: str = setting("l2", "TD loss: l2 | smooth_l1 (Huber)")
    double: bool = setting(True, "double DQN: the online network picks the next action")


@dataclass
class ReplayConfig:
    """The replay buffer (memmap storage inside the run directory)."""

    capacity: int = setting(100_000, "transitions kept in the buffer")
    sampler: str = setting("prioritized_slice", "prioritized_slice | slice | prioritized | uniform")
    slice_len: int = setting(8, "consecutive steps per sampled slice (slice samplers)")
    alpha: float = setting(0.6, "priority exponent (prioritized samplers)")
    beta: float = setting(0.4, "importance-weight exponent (prioritized samplers)")
    device: str = setting("cpu", "where replay data are stored: cpu | cuda")


@dataclass
class EvalConfig:
    """Deterministic evaluation, which also drives checkpoints."""

    interval_frames: int = setting(2_000, "evaluate every N collected frames")
    episodes: int = setting(10, "episodes per evaluation")


@dataclass
class CheckpointConfig:
    """Checkpoints saved after each evaluation."""

    keep_last: int = setting(2, "most recent checkpoints kept (the best is kept too)")


@dataclass
class LoggerConfig:
    """Where metrics go (metrics.jsonl and curve.png are always written)."""

    backend: str = setting("csv", "none | csv | wandb | tensorboard")
    project: str = setting("rl_app", "wandb project name")


@dataclass
class SlurmConfig:
    """SLURM launch (launcher=slurm): a profile from slurm/profiles/, overridable key by key."""

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

    launcher: str = setting("local", "local (train here) | slurm (submit with submitit)")
    algo: str = setting("sac", "sac (continuous actions) | dqn (discrete actions)")
    seed: int = setting(0, "seed of every random number generator")
    device: str = setting("auto", "learner device: auto | cpu | cuda | cuda:N")
    threads: int = setting(1, "torch intra-op threads (one is fastest on small machines)")
    run_dir: str | None = setting(None, "where the run's files go (default runs/<preset>-<time>)")
    env: EnvConfig = field(default_factory=EnvConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    dqn: DQNConfig = field(default_factory=DQNConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)


LAUNCHERS = ("local", "slurm")
# Each algorithm and the action space it needs.
ALGORITHM_ACTIONS = {"sac": "continuous", "dqn": "discrete"}
COLLECTOR_MODES = ("direct", "sync", "async", "distributed")
SAMPLERS = ("prioritized_slice", "slice", "prioritized", "uniform")
VALUE_TARGETS = ("td0", "nstep", "td_lambda")
DQN_LOSSES = ("l2", "smooth_l1")
LOGGER_BACKENDS = ("none", "csv", "wandb", "tensorboard")


def available_presets() -> list[str]:
    return sorted(path.stem for path in PRESETS_DIR.glob("*.yaml"))


def load_config(preset: str = DEFAULT_PRESET, overrides: list[str] | None = None) -> Config:
    """Merge defaults, a preset and ``key=value`` overrides into a validated :class:`Config`.

    When ``run_dir`` names a run that holds a checkpoint, the config saved in that run
    replaces the preset (the run resumes), and only keys in ``CHANGEABLE_ON_RESUME`` may
    be overridden."""
    overrides = overrides or []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
    try:
        given = OmegaConf.from_dotlist(overrides)
        run_dir = given.get("run_dir")
        if run_dir is not None and holds_checkpoint(Path(run_dir)):
            saved = OmegaConf.load(Path(run_dir) / CONFIG_FILE)
            config = OmegaConf.to_object(
                OmegaConf.merge(OmegaConf.structured(Config), saved, given)
            )
            refuse_experiment_changes(OmegaConf.to_object(OmegaConf.merge(Config, saved)), config)
        else:
            preset_path = PRESETS_DIR / f"{preset}.yaml"
            if not preset_path.is_file():
                raise ConfigError(
                    f"unknown preset {preset!r}: accepted presets are "
                    + ", ".join(available_presets())
                )
            layers = [OmegaConf.structured(Config), OmegaConf.load(preset_path), given]
            config = OmegaConf.to_object(OmegaConf.merge(*layers))
    except OmegaConfBaseException as error:
        raise ConfigError(describe_omegaconf_error(error)) from None
    validate(config)
    if config.run_dir is None:
        config.run_dir = f"runs/{preset}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_run_dir(Path(config.run_dir))
    return config


def holds_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a run with at least one checkpoint (it will resume)."""
    return (run_dir / CONFIG_FILE).is_file() and any(
        (run_dir / CHECKPOINTS_DIR).glob("checkpoint-*")
    )


def check_run_dir(run_dir: Path) -> None:
    """A run directory is new, empty, or a run (resumed, or restarted if it never saved)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run_dir={str(run_dir)!r} is a file: give a directory")
    if run_dir.is_dir() and any(run_dir.iterdir()) and not (run_dir / CONFIG_FILE).exists():
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
    changed = [
        key
        for key in after
        if after[key] != before[key]
        and key not in CHANGEABLE_ON_RESUME
        and not key.startswith("slurm.")
    ]
    if changed:
        key = changed[0]
        raise ConfigError(
            f"{key}={after[key]!r} cannot change when resuming (the run was started with "
            f"{before[key]!r}); keys that may change on resume: "
            f"{', '.join(CHANGEABLE_ON_RESUME)}, slurm.*"
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
    """Check values and ranges; raise :class:`ConfigError` naming the first bad key."""

    def choose(key: str, value: str, accepted: tuple[str, ...]) -> None:
        if value not in accepted:
            raise ConfigError(
                f"{key}={value!r} is not accepted: choose one of {', '.join(accepted)}"
            )

    def positive(key: str, value: float, *, allow_zero: bool = False) -> None:
        if value < 0 or (value == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            raise ConfigError(f"{key}={value!r} is out of range: it must be {bound}")

    choose("launcher", config.launcher, LAUNCHERS)
    choose("algo", config.algo, tuple(ALGORITHM_ACTIONS))
    choose("collector.mode", config.collector.mode, COLLECTOR_MODES)
    choose("replay.sampler", config.replay.sampler, SAMPLERS)
    choose("logger.backend", config.logger.backend, LOGGER_BACKENDS)
    if config.device != "auto" and config.device.split(":")[0] not in ("cpu", "cuda"):
        raise ConfigError(
            f"device={config.device!r} is not accepted: choose auto, cpu, cuda or cuda:N"
        )
    choose("replay.device", config.replay.device.split(":")[0], ("cpu", "cuda"))
    choose("collector.device", config.collector.device.split(":")[0], ("cpu", "cuda"))

    for key, value in [
        ("threads", config.threads),
        ("collector.total_frames", config.collector.total_frames),
        ("collector.frames_per_batch", config.collector.frames_per_batch),
        ("collector.sync_every", config.collector.sync_every),
        ("collector.workers", config.collector.workers),
        ("collector.nodes", config.collector.nodes),
        ("env.num_envs", config.env.num_envs),
        ("collector.connect_timeout_s", config.collector.connect_timeout_s),
        ("dqn.eps_annealing_frames", config.dqn.eps_annealing_frames),
        ("dqn.target_update_interval", config.dqn.target_update_interval),
        ("optim.lr", config.optim.lr),
        ("optim.batch_size", config.optim.batch_size),
        ("optim.utd_ratio", config.optim.utd_ratio),
        ("optim.tau", config.optim.tau),
        ("replay.capacity", config.replay.capacity),
        ("replay.slice_len", config.replay.slice_len),
        ("eval.interval_frames", config.eval.interval_frames),
        ("eval.episodes", config.eval.episodes),
        ("checkpoint.keep_last", config.checkpoint.keep_last),
    ]:
        positive(key, value)
    for key, value in [
        ("seed", config.seed),
        ("collector.init_random_frames", config.collector.init_random_frames),
        ("replay.alpha", config.replay.alpha),
        ("replay.beta", config.replay.beta),
    ]:
        positive(key, value, allow_zero=True)
    for key, value in [
        ("optim.gamma", config.optim.gamma),
        ("dqn.eps_start", config.dqn.eps_start),
        ("dqn.eps_end", config.dqn.eps_end),
    ]:
        if not 0 <= value <= 1:
            raise ConfigError(f"{key}={value!r} is out of range: it must be in [0, 1]")
    if not config.network.hidden_sizes or min(config.network.hidden_sizes) <= 0:
        raise ConfigError(
            f"network.hidden_sizes={config.network.hidden_sizes!r} is out of range: "
            "give one or more positive widths"
        )
    if config.collector.total_frames < config.collector.frames_per_batch:
        raise ConfigError(
            f"collector.total_frames={config.collector.total_frames} is out of range: "
            f"it must be at least collector.frames_per_batch={config.collector.frames_per_batch}"
        )
    check_batch_split(config.collector, config.env.num_envs)
    if config.optim.batch_size > config.replay.capacity:
        raise ConfigError(
            f"optim.batch_size={config.optim.batch_size} is out of range: "
            f"it must not exceed replay.capacity={config.replay.capacity}"
        )

    check_env_registered(config.env.name)
    env_spec = gym.spec(config.env.name.split(":")[-1])
    if "mujoco" in str(env_spec.entry_point) and importlib.util.find_spec("mujoco") is None:
        raise ConfigError(
            f"env.name={config.env.name!r} needs MuJoCo, an optional extra: "
            "install it with .venv/bin/pip install 'gymnasium[mujoco]==1.4.0'"
        )
    check_action_space(config.algo, config.env.name)
    episode_len = env_spec.max_episode_steps
    if config.replay.sampler.endswith("slice"):
        if episode_len is not None and config.replay.slice_len > episode_len:
            raise ConfigError(
                f"replay.slice_len={config.replay.slice_len} is out of range: "
                f"{config.env.name} episodes last at most {episode_len} steps"
            )
        if config.optim.batch_size % config.replay.slice_len:
            raise ConfigError(
                f"optim.batch_size={config.optim.batch_size} is not accepted: with a slice "
                f"sampler it must be a multiple of replay.slice_len={config.replay.slice_len}"
            )

    # Learning targets: the value target (multi-step ones need slices) and DQN's loss.
    check_value_target(config.optim, config.replay.sampler)
    choose("dqn.loss", config.dqn.loss, DQN_LOSSES)


def check_value_target(optim: OptimConfig, sampler: str) -> None:
    """Multi-step targets run along the time dimension of sampled slices."""
    if optim.target not in VALUE_TARGETS:
        raise ConfigError(
            f"optim.target={optim.target!r} is not accepted: choose one of "
            + ", ".join(VALUE_TARGETS)
        )
    if not 0 <= optim.lmbda <= 1:
        raise ConfigError(f"optim.lmbda={optim.lmbda!r} is out of range: it must be in [0, 1]")
    if optim.target != "td0" and not sampler.endswith("slice"):
        raise ConfigError(
            f"optim.target={optim.target!r} needs a slice sampler (replay.sampler="
            f"prioritized_slice or slice): replay.sampler={sampler!r} samples single steps"
        )


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
        if collector.port is not None and not 1024 <= collector.port <= 65533:
            raise ConfigError(
                f"collector.port={collector.port} is out of range: give 1024..65533 (the "
                "learner listens on port, port+1 and port+2), or leave it unset for a free one"
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
        except ImportError as error:
            raise ConfigError(
                f"env.name={env_name!r}: cannot import {module!r} ({error})"
            ) from None
    if env_name.split(":")[-1] not in gym.envs.registry:
        raise ConfigError(
            f"env.name={env_name!r} is not a registered Gymnasium environment "
            "(see gymnasium.envs.registry for the accepted ids, or give module:id)"
        )


def check_action_space(algo: str, env_name: str) -> None:
    """The algorithm must fit the env's actions (building the Gymnasium env is the only way
    to read its action space; no TorchRL env, file or process is created)."""
    probe = gym.make(env_name)
    actions = "discrete" if isinstance(probe.action_space, gym.spaces.Discrete) else "continuous"
    probe.close()
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

    def walk(schema: Any, prefix: str) -> None:
        for item in dataclasses.fields(schema):
            if dataclasses.is_dataclass(item.default_factory):
                group = item.default_factory
                lines.append(f"\n  {prefix}{item.name}: {group.__doc__.strip()}")
                walk(group, f"{prefix}{item.name}.")
            else:
                default = (
                    item.default
                    if item.default is not dataclasses.MISSING
                    else item.default_factory()
                )
                lines.append(f"    {prefix}{item.name}={default}  ({item.metadata['doc']})")

    walk(Config, "")
    return "\n".join(lines)
