"""The sweep file: its keys, the search space as Optuna distributions, and the checks of
every trial config its space can make, before anything is created; the layout of a sweep
directory."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from rl_app.algorithms import ALGORITHMS
from rl_app.checks import load_config
from rl_app.config import (
    DEFAULT_PRESET,
    MAX_SEED,
    Config,
    ConfigError,
    RunConfig,
    SlurmConfig,
    check_declared,
    conform,
    conform_value,
    flatten,
    parse_overrides,
    preset_file,
    read_yaml,
    refuse_a_file_in_the_way,
    setting,
    settings_of,
)

# Inside a sweep directory:
SWEEP_FILE = "sweep.yaml"  # the sweep file it was started from
JOURNAL_FILE = "study.journal"  # Optuna's journal of every trial
CLAIM_LOCK = ".claim.lock"  # held while a worker picks its next trial
SUMMARY_LOCK = ".summary.lock"  # held while a worker job writes the summary
CLAIMS_DIR = "claims"  # claims/<number>/.lock: held by the worker training that trial
LOGS_DIR = "logs"  # one log per worker process

SPACE_KEYS = ("low", "high", "log", "step", "choices")
# Settings that say where and how a trial runs, not what it learns.
NOT_SWEPT = ("run_dir", "launcher", "slurm.")
# A whole-number range with at most this many values is checked value by value.
CHECKED_VALUES = 64


@dataclass
class SweepSettings:
    """A sweep file's own keys (besides ``overrides`` and ``space``)."""

    preset: str = setting(DEFAULT_PRESET, "the preset trials start from: configs/ name or file")
    objective: str = setting(
        "last", "a trial's value, maximized: its last or best evaluation return",
        choices=("last", "best"),
    )  # fmt: skip
    trials: int = setting(20, "trials run to their end (complete, pruned or failed)", at_least=1)
    jobs: int = setting(1, "worker processes, each training one trial at a time", at_least=1)
    seed: int = setting(0, "seed of the TPE sampler", at_least=0, at_most=MAX_SEED)
    pruner: str = setting(
        "none",
        "none | median: stop a trial whose evaluation return is below the median of earlier "
        "trials' at the same frame count",
        choices=("none", "median"),
    )
    startup_trials: int = setting(
        2, "median pruner: trials finished before any is pruned", at_least=0
    )
    warmup_frames: int = setting(
        0, "median pruner: frames a trial trains before it may be pruned", at_least=0
    )
    launcher: str = setting(
        "local",
        "local: worker processes here | slurm: worker jobs on SLURM (submitted, then the "
        "command returns)",
        choices=("local", "slurm"),
    )
    sweep_dir: str | None = setting(None, "where the study and trials go (runs/sweep-<file>)")
    # The worker jobs' settings (launcher: slurm), also every trial's slurm.* settings.
    slurm: SlurmConfig = field(default_factory=SlurmConfig)


@dataclass(frozen=True)
class Sweep:
    """A validated sweep file."""

    settings: SweepSettings
    overrides: list[str]
    space: dict[str, BaseDistribution]

    @property
    def dir(self) -> Path:
        return Path(self.settings.sweep_dir)

    def definition(self) -> dict[str, Any]:
        """What makes two sweeps the same study (their budget and workers aside)."""
        return {
            "settings": kept_settings(self.settings),
            "overrides": self.overrides,
            "space": self.space,
        }


def kept_settings(settings: SweepSettings) -> SweepSettings:
    """The settings that make the study: not its budget, nor where its trials run."""
    return dataclasses.replace(
        settings, trials=0, jobs=0, sweep_dir=None, launcher="", slurm=SlurmConfig()
    )


def load_sweep(path: Path) -> Sweep:
    """Read and check a sweep file, and every trial config its space can make alone (each
    value of a dimension, the others at the preset's); :class:`ConfigError` names the key.
    Reads only: nothing is created."""
    tree = read_yaml(path)
    accepted = [f.name for f in dataclasses.fields(SweepSettings)] + ["overrides", "space"]
    for key in tree:
        if key not in accepted:
            raise ConfigError(
                f"{path}: unknown key {key!r}: accepted keys are {', '.join(accepted)}"
            )
    settings = read_settings(tree)
    preset_file(settings.preset, key="preset:")
    if settings.sweep_dir is None:
        settings.sweep_dir = f"runs/sweep-{path.stem}"
    settings.sweep_dir = os.path.expanduser(settings.sweep_dir)  # "~": the user's home
    refuse_a_file_in_the_way("sweep_dir", Path(settings.sweep_dir))
    sweep = Sweep(settings, read_overrides(tree.get("overrides", [])),
                  read_space(tree.get("space")))  # fmt: skip
    check_trial_configs(sweep)
    refuse_other_sweep(sweep)
    return sweep


def read_settings(tree: dict[str, Any]) -> SweepSettings:
    own = {key: value for key, value in tree.items() if key not in ("overrides", "space")}
    conformed = conform(own, SweepSettings, "")
    settings = SweepSettings(**{**conformed, "slurm": SlurmConfig(**conformed.get("slurm", {}))})
    for key, _, declared in settings_of(SweepSettings):
        value = settings
        for part in key.split("."):
            value = getattr(value, part)
        check_declared(key, value, declared)
    if settings.slurm.array is not None:
        raise ConfigError(
            f"slurm.array={settings.slurm.array!r} is not accepted in a sweep file: "
            "jobs sets how many worker jobs run"
        )
    return settings


def read_overrides(overrides: Any) -> list[str]:
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"overrides={overrides!r} is not accepted: give a list of key=value")
    for item in overrides:
        if item.startswith(NOT_SWEPT):
            raise ConfigError(
                f"overrides: {item!r} is not accepted: the sweep sets run_dir, launcher and slurm.*"
            )
    return overrides


def read_space(space: Any) -> dict[str, BaseDistribution]:
    """``space:`` as Optuna distributions, each checked against its setting's type and range."""
    if not isinstance(space, dict) or not space:
        given = " is missing" if space is None else f"={space!r} is not accepted"
        raise ConfigError(
            f"space{given}: give one or more keys to search, e.g. "
            "space: {optim.lr: {low: 1.0e-4, high: 1.0e-3, log: true}}"
        )
    schema = {key: (item, declared) for key, item, declared in settings_of(RunConfig)}
    distributions = {}
    for key, spec in space.items():
        if key not in schema or key.startswith(NOT_SWEPT):
            raise ConfigError(
                f"space: unknown key {key!r}: give a setting of the preset (train.py --help "
                "lists them), other than run_dir, launcher and slurm.*"
            )
        item, declared = schema[key]
        distributions[key] = distribution(f"space.{key}", spec, str(item.type), declared)
    return distributions


def distribution(key: str, spec: Any, kind: str, declared: dict[str, Any]) -> BaseDistribution:
    """One dimension: ``{choices: [...]}`` for any setting, ``{low, high, log?, step?}`` for
    a number; every value within what the setting accepts."""
    if not isinstance(spec, dict) or not set(spec) <= set(SPACE_KEYS):
        raise ConfigError(
            f"{key}={spec!r} is not accepted: give {{choices: [...]}} or "
            "{low: ..., high: ..., log: true|false, step: ...}"
        )
    if kind.startswith("list"):
        raise ConfigError(f"{key} is a list setting: only single values can be searched")
    if "choices" in spec:
        return choices_distribution(key, spec, kind, declared)
    if kind.removesuffix("| None").strip() not in ("int", "float"):
        raise ConfigError(f"{key} takes {kind} values: give {{choices: [...]}}")
    return range_distribution(key, spec, kind.removesuffix("| None").strip(), declared)


def choices_distribution(
    key: str, spec: dict[str, Any], kind: str, declared: dict[str, Any]
) -> CategoricalDistribution:
    choices = spec["choices"]
    if set(spec) != {"choices"} or not isinstance(choices, list) or len(choices) < 2:
        raise ConfigError(f"{key}={spec!r} is not accepted: give two or more choices, alone")
    values = [conform_value(key, choice, kind, declared) for choice in choices]
    for value in values:
        check_declared(key, value, declared)
    if len(set(values)) != len(values):
        raise ConfigError(f"{key}={spec!r} is not accepted: a choice is repeated")
    return CategoricalDistribution(values)


def range_distribution(
    key: str, spec: dict[str, Any], kind: str, declared: dict[str, Any]
) -> IntDistribution | FloatDistribution:
    if "low" not in spec or "high" not in spec:
        raise ConfigError(f"{key}={spec!r} is not accepted: give low and high (or choices)")
    low, high = (
        conform_value(f"{key}.{end}", spec[end], kind, declared) for end in ("low", "high")
    )
    for value in (low, high):
        check_declared(key, value, declared)
    if low >= high:
        raise ConfigError(f"{key}: low={low!r} is not accepted: it must be below high={high!r}")
    log = conform_value(f"{key}.log", spec.get("log", False), "bool", {})
    step = spec.get("step")
    if log and (step is not None or low <= 0):
        raise ConfigError(f"{key}: log=true is not accepted with a step or with low <= 0")
    if step is not None:
        step = conform_value(f"{key}.step", step, kind, {})
        span = Decimal(str(high)) - Decimal(str(low))  # as Optuna checks it (then lowers high)
        if step <= 0 or span % Decimal(str(step)):
            raise ConfigError(
                f"{key}.step={step!r} is not accepted: it must be above 0 and divide "
                f"high - low = {span}"
            )
    if kind == "int":
        return IntDistribution(low, high, log=log, step=step or 1)
    return FloatDistribution(low, high, log=log, step=step)


def checked_values(dist: BaseDistribution) -> list[Any]:
    """The values of a dimension that are tried alone before a sweep starts."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, IntDistribution) and not dist.log:
        values = range(dist.low, dist.high + 1, dist.step)  # its length known before a list
        if len(values) <= CHECKED_VALUES:
            return list(values)
    return [dist.low, dist.high]


def check_trial_configs(sweep: Sweep) -> None:
    """The preset with the overrides, and with each checked value of each dimension, must
    make a valid config: a mistake is found now, not in the middle of the sweep."""
    fixed = fixed_overrides(sweep)
    base = load_config(sweep.settings.preset, fixed)
    check_sweepable(base)
    trained = set(sweep.space["algo"].choices) if "algo" in sweep.space else {base.algo}
    for key in sweep.space:  # a group of settings no trial's algorithm reads
        if key.partition(".")[0] in ALGORITHMS.keys() - trained:
            raise ConfigError(
                f"space.{key} changes no trial: every trial trains algo="
                f"{'|'.join(sorted(trained))}; search a setting that algorithm reads"
            )
    for key, dist in sweep.space.items():
        for value in checked_values(dist):
            try:
                check_sweepable(load_config(sweep.settings.preset, [*fixed, override(key, value)]))
            except ConfigError as error:
                raise ConfigError(f"space.{key}={value!r} makes no valid run: {error}") from None


def check_sweepable(config: Config) -> None:
    """A sweep's worker trains its trials one after another in one process, and a process
    runs one RPC collector (torch's RPC starts once per process)."""
    if config.collector.mode == "rpc":
        raise ConfigError(
            "collector.mode='rpc' is not accepted in a sweep: a worker trains its trials in one "
            "process, which runs one RPC collector; accepted: direct, sync, async, "
            "distributed, ray"
        )


def refuse_other_sweep(sweep: Sweep) -> None:
    """A sweep directory continues the sweep it was started with; only ``trials``,
    ``jobs``, ``launcher`` and ``slurm`` may change. A folder of other files (a run, a
    sweep whose file is gone) is no sweep's."""
    saved = sweep.dir / SWEEP_FILE
    if not saved.is_file():
        if sweep.dir.is_dir() and any(sweep.dir.iterdir()):
            raise ConfigError(
                f"sweep_dir={str(sweep.dir)!r} holds other files and no {SWEEP_FILE}: give a "
                "new or empty directory"
            )
        return
    before, after = (
        flatten_definition(saved_definition(saved)),
        flatten_definition(sweep.definition()),
    )
    changed = sorted(
        key for key in before.keys() | after.keys() if before.get(key) != after.get(key)
    )
    if changed:
        raise ConfigError(
            f"sweep_dir={str(sweep.dir)!r} holds another sweep ({saved}; {changed[0]} "
            "differs): only trials, jobs, launcher and slurm may change when continuing it; "
            "give another sweep_dir for a new one"
        )


def flatten_definition(definition: dict[str, Any]) -> dict[str, Any]:
    """A sweep's definition key by key: its settings, ``overrides.<key>`` (in any order) and
    ``space.<key>``."""
    overrides = flatten(parse_overrides(definition["overrides"]), "overrides.")
    return {
        **dataclasses.asdict(definition["settings"]),
        **overrides,
        **{f"space.{key}": value for key, value in definition["space"].items()},
    }


def saved_definition(saved: Path) -> dict[str, Any]:
    tree = read_yaml(saved)
    kept = kept_settings(read_settings(tree))
    overrides = read_overrides(tree.get("overrides", []))
    return {"settings": kept, "overrides": overrides, "space": read_space(tree.get("space"))}


def override(key: str, value: Any) -> str:
    """``key=value`` as train.py takes it (JSON is YAML: numbers, text and booleans)."""
    return f"{key}={json.dumps(value)}"


def fixed_overrides(sweep: Sweep) -> list[str]:
    """What every trial overrides: the sweep's ``overrides`` and its ``slurm:`` settings
    (those given), which collection jobs of ``collector.mode=distributed`` use."""
    slurm = {k: v for k, v in dataclasses.asdict(sweep.settings.slurm).items() if v is not None}
    return [*sweep.overrides, *(override(f"slurm.{k}", v) for k, v in slurm.items())]
