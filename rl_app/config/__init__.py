"""A run's settings: the schema (:mod:`~rl_app.config.schema`) and how a config is loaded
from presets, overrides and a resumed run (:mod:`~rl_app.config.loading`).

The ground floor: it names no algorithm, sampler or env and imports no owner. A run's full
schema (the core groups and one group per algorithm) is assembled in
:mod:`rl_app.algorithms`; :mod:`rl_app.checks` loads it and runs every owner's check.

To add a setting: a field with :func:`setting` (its default, doc line and what it
accepts) in its group in :mod:`~rl_app.config.schema` (an algorithm's own settings live in
its module); ``on_resume=True`` if a resumed run may change it. A check that involves other
keys or the machine goes with the part it concerns (``rl_app/replay/checks.py``,
``rl_app/envs/checks.py``, an algorithm's ``check``, ``rl_app/checks.py``)."""

from rl_app.config.loading import (
    DEFAULT_PRESET,
    HOLDS_PREFIX,
    PRESETS_DIR,
    available_presets,
    check_run_dir,
    describe_presets,
    describe_settings,
    holds_checkpoint,
    load_config,
    parse_overrides,
    read_run_config,
    read_yaml,
    refuse_experiment_changes,
)
from rl_app.config.schema import (
    C_INT_MAX,
    DEVICE_DOC,
    SEGMENT_TREE_MAX_SIZE,
    CheckpointConfig,
    CollectorConfig,
    Config,
    ConfigError,
    EnvConfig,
    EvalConfig,
    LoggerConfig,
    NetworkConfig,
    OptimConfig,
    ReplayConfig,
    SlurmConfig,
    check_declared,
    conform,
    conform_value,
    flatten,
    run_schema,
    setting,
    settings_of,
    to_yaml,
    violation,
)

__all__ = [
    "C_INT_MAX",
    "DEFAULT_PRESET",
    "DEVICE_DOC",
    "HOLDS_PREFIX",
    "PRESETS_DIR",
    "SEGMENT_TREE_MAX_SIZE",
    "CheckpointConfig",
    "CollectorConfig",
    "Config",
    "ConfigError",
    "EnvConfig",
    "EvalConfig",
    "LoggerConfig",
    "NetworkConfig",
    "OptimConfig",
    "ReplayConfig",
    "SlurmConfig",
    "available_presets",
    "check_declared",
    "check_run_dir",
    "conform",
    "conform_value",
    "describe_presets",
    "describe_settings",
    "flatten",
    "holds_checkpoint",
    "load_config",
    "parse_overrides",
    "read_run_config",
    "read_yaml",
    "refuse_experiment_changes",
    "run_schema",
    "setting",
    "settings_of",
    "to_yaml",
    "violation",
]
