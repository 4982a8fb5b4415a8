"""A run's settings: the schema (:mod:`~rl_app.config.schema`, each algorithm's own group in
:mod:`~rl_app.config.algorithms`), how a setting is declared and its values checked
(:mod:`~rl_app.config.settings`), and how a config is resolved from presets, overrides and
a resumed run (:mod:`~rl_app.config.loading`).

The ground floor: it imports no owner. Which algorithms ``algo`` accepts is the registry's
(:mod:`rl_app.algorithms`); :func:`rl_app.checks.load_config` resolves a config here and
runs every owner's check.

To add a setting: a field with :func:`setting` (its default, doc line and what it
accepts) in its group in :mod:`~rl_app.config.schema` (an algorithm's own settings in
:mod:`~rl_app.config.algorithms`); ``on_resume=True`` if a resumed run may change it. A
check that involves other keys or the machine goes with the part it concerns
(``rl_app/replay/checks.py``, ``rl_app/envs/checks.py``, an algorithm's ``check``,
``rl_app/checks.py``)."""

from rl_app.config.algorithms import DQNConfig, SACConfig, TD3Config
from rl_app.config.loading import (
    DEFAULT_PRESET,
    HOLDS_PREFIX,
    PRESETS_DIR,
    available_presets,
    check_run_dir,
    describe_presets,
    describe_settings,
    file_in_the_way,
    holds_checkpoint,
    nearest_existing,
    parse_overrides,
    preset_config,
    preset_file,
    read_run_config,
    read_yaml,
    refuse_a_file_in_the_way,
    refuse_experiment_changes,
    resolve_config,
)
from rl_app.config.schema import (
    DEVICE_DOC,
    MAX_SEED,
    SEGMENT_TREE_MAX_SIZE,
    CheckpointConfig,
    CollectorConfig,
    Config,
    EnvConfig,
    EvalConfig,
    LoggerConfig,
    NetworkConfig,
    OptimConfig,
    ReplayConfig,
    RunConfig,
    SlurmConfig,
)
from rl_app.config.settings import (
    ConfigError,
    check_declared,
    conform,
    conform_value,
    flatten,
    setting,
    settings_of,
    to_yaml,
    violation,
)

__all__ = [
    "DEFAULT_PRESET",
    "DEVICE_DOC",
    "HOLDS_PREFIX",
    "MAX_SEED",
    "PRESETS_DIR",
    "SEGMENT_TREE_MAX_SIZE",
    "CheckpointConfig",
    "CollectorConfig",
    "Config",
    "ConfigError",
    "DQNConfig",
    "EnvConfig",
    "EvalConfig",
    "LoggerConfig",
    "NetworkConfig",
    "OptimConfig",
    "ReplayConfig",
    "RunConfig",
    "SACConfig",
    "SlurmConfig",
    "TD3Config",
    "available_presets",
    "check_declared",
    "check_run_dir",
    "conform",
    "conform_value",
    "describe_presets",
    "describe_settings",
    "file_in_the_way",
    "flatten",
    "holds_checkpoint",
    "nearest_existing",
    "parse_overrides",
    "preset_config",
    "preset_file",
    "read_run_config",
    "read_yaml",
    "refuse_a_file_in_the_way",
    "refuse_experiment_changes",
    "resolve_config",
    "setting",
    "settings_of",
    "to_yaml",
    "violation",
]
