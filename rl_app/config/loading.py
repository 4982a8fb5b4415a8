"""A run's configuration, loaded in three layers, each overriding the one before: the
schema's defaults, a preset from ``configs/<name>.yaml``, and ``key=value`` overrides from
the command line. Each layer is checked key by key against the schema
(:func:`~rl_app.config.settings.conform`) and the result value by value
(:func:`~rl_app.config.settings.check_declared`); a resumed run takes its saved config as the
preset and may change only the keys declared ``on_resume``.

Nothing here knows an owner: :func:`rl_app.checks.load_config` resolves a config here and
then runs every owner's check.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from rl_app.config.schema import RunConfig
from rl_app.config.settings import ConfigError, check_declared, conform, flatten, settings_of
from rl_app.rundir import CHECKPOINTS_DIR, CONFIG_FILE, HOLDER_FILE, LOCK_FILE

PRESETS_DIR = Path(__file__).resolve().parent.parent.parent / "configs"
DEFAULT_PRESET = "default"
# Each preset's comment line saying what it holds at full size (rl_app/fit.py estimates it).
HOLDS_PREFIX = "# Holds at full size: "


def resolve_config(preset: str | None, overrides: list[str]) -> RunConfig:
    """Merge the schema's defaults, a preset and ``key=value`` overrides into a
    :class:`RunConfig` whose every value is one its setting accepts (how the values fit one
    another, the env and the machine is checked by :func:`rl_app.checks.load_config`).

    ``preset`` names a file in ``configs/`` or is the path of a YAML file (None: the default
    preset). When ``run_dir`` names a run that holds a checkpoint, the config saved in that
    run replaces the preset (the run resumes), and only keys declared ``on_resume`` may be
    overridden; a preset given then must train the run's algorithm on its env. A run that
    stopped before its first checkpoint starts again from its saved config, with any key
    overridden, unless a preset is given. Every
    mistake raises :class:`ConfigError` naming the file (and line) or the key."""
    given = conform(parse_overrides(overrides), RunConfig, "")
    if "run_dir" in given and not given["run_dir"]:
        raise ConfigError(
            "run_dir is empty: give a directory, or leave run_dir out for runs/<preset>-<time>"
        )
    if "run_dir" in given:  # "~" is the user's home wherever it was given, not a folder "~"
        given["run_dir"] = os.path.expanduser(given["run_dir"])
    run_dir = given.get("run_dir")
    if run_dir is not None and holds_checkpoint(Path(run_dir)):
        saved = read_run_config(Path(run_dir))
        if preset is not None:
            refuse_another_preset(preset, given, saved)
        config = build(RunConfig, merge(dataclasses.asdict(saved), given))
        refuse_experiment_changes(saved, config)
    elif preset is None and run_dir is not None and (Path(run_dir) / CONFIG_FILE).is_file():
        # A run stopped before its first checkpoint starts again as it was set.
        saved = read_run_config(Path(run_dir))
        config = build(RunConfig, merge(dataclasses.asdict(saved), given))
    else:
        preset = preset or DEFAULT_PRESET
        preset_tree = conform(read_yaml(preset_file(preset)), RunConfig, "")
        config = build(RunConfig, merge(preset_tree, given))
    tree = dataclasses.asdict(config)
    for key, _, accepted in settings_of(RunConfig):
        value = tree
        for part in key.split("."):
            value = value[part]
        check_declared(key, value, accepted)
    if config.run_dir is None:
        config.run_dir = f"runs/{Path(preset).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    config.run_dir = os.path.expanduser(config.run_dir)  # (a preset's own run_dir)
    check_run_dir(Path(config.run_dir))
    return config


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, group by group (a list is one value: ``top``'s replaces)."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def build(schema: type, tree: dict[str, Any]) -> Any:
    """An instance of ``schema`` with the values of a conformed ``tree``, defaults elsewhere."""
    values = {}
    for item in dataclasses.fields(schema):
        if dataclasses.is_dataclass(item.default_factory):
            values[item.name] = build(item.default_factory, tree.get(item.name, {}))
        elif item.name in tree:
            value = tree[item.name]
            values[item.name] = list(value) if isinstance(value, list) else value
    return schema(**values)


def available_presets() -> list[str]:
    return sorted(path.stem for path in PRESETS_DIR.glob("*.yaml"))


def describe_presets() -> str:
    """One line per preset, with what it holds at full size, for ``--help``."""
    lines = []
    for preset in available_presets():
        text = (PRESETS_DIR / f"{preset}.yaml").read_text().splitlines()
        holds = next((line.removeprefix(HOLDS_PREFIX) for line in text
                      if line.startswith(HOLDS_PREFIX)), "")  # fmt: skip
        lines.append(f"  {preset}: {holds}")
    return "\n".join(lines)


def preset_config(preset: str) -> RunConfig:
    """The config ``preset`` holds before any override, each value as its file gives it
    (what ``train.py --help`` shows)."""
    return build(RunConfig, conform(read_yaml(preset_file(preset)), RunConfig, ""))


def describe_settings(config: RunConfig, docs: dict[str, str]) -> str:
    """The text of ``train.py --help``: every group and key, with its value in ``config``
    and its meaning; ``docs`` replaces the meaning of a key that only an owner can write."""
    lines = []
    group_shown = None
    groups = {f.name: f.default_factory for f in dataclasses.fields(RunConfig)}
    tree = flatten(dataclasses.asdict(config))
    for key, _, metadata in settings_of(RunConfig):
        group_name = key.rpartition(".")[0]
        if group_name and group_name != group_shown:
            lines.append(f"\n  {group_name}: {groups[group_name].__doc__.splitlines()[0].strip()}")
            group_shown = group_name
        lines.append(f"    {key}={tree[key]}  ({docs.get(key, metadata['doc'])})")
    return "\n".join(lines)


def preset_file(preset: str, key: str = "--config") -> Path:
    """``configs/<preset>.yaml``, or ``preset`` itself when it is a path to a YAML file;
    :class:`ConfigError` names ``key``, where ``preset`` was given."""
    if preset.endswith((".yaml", ".yml")) or "/" in preset:
        if not Path(preset).is_file():
            stem = Path(preset).stem
            hint = f" (the preset: {key} {stem})" if stem in available_presets() else ""
            what = "is a directory: give a file" if Path(preset).is_dir() else "no such file"
            raise ConfigError(f"{key} {preset}: {what}{hint}")
        return Path(preset)
    path = PRESETS_DIR / f"{preset}.yaml"
    if not path.is_file():
        raise ConfigError(
            f"unknown preset {preset!r}: accepted presets are {', '.join(available_presets())}"
            " (or give the path of a YAML file)"
        )
    return path


MERGE_TAG = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML whose mappings give each key once: PyYAML would keep the last silently."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:  # "<<: *base": what follows may override it
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):  # ([a, b]: 1) SafeLoader refuses it below
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping of settings; a syntax error is named with its file and line."""
    try:
        tree = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)
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


def read_run_config(run_dir: Path) -> RunConfig:
    """The config a run saved in its directory (reads only; its values were checked then)."""
    tree = read_yaml(run_dir / CONFIG_FILE)
    if not tree:  # a run saves every setting: an empty file is damaged
        raise ConfigError(f"{run_dir / CONFIG_FILE}: holds no settings")
    return build(RunConfig, conform(tree, RunConfig, ""))


def holds_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a run with at least one checkpoint (it will resume)."""
    return (run_dir / CONFIG_FILE).is_file() and any(
        (run_dir / CHECKPOINTS_DIR).glob("checkpoint-*")
    )


def check_run_dir(run_dir: Path) -> None:
    """A run directory is new, empty, or a run (resumed, or restarted if it never saved), on
    a file system that stores files."""
    refuse_a_file_in_the_way("run_dir", run_dir)
    existing = nearest_existing(run_dir)
    if shutil.disk_usage(existing).total == 0:  # /proc, /sys
        raise ConfigError(
            f"run_dir={str(run_dir)!r} is on a file system that stores no files ({existing}): "
            "give a directory on a disk"
        )
    if not run_dir.is_dir():
        return
    # Lock files alone are left by a run killed before it wrote its config.
    others = [p for p in run_dir.iterdir() if p.name not in (LOCK_FILE, HOLDER_FILE)]
    if (run_dir / CHECKPOINTS_DIR).is_dir() and not (run_dir / CONFIG_FILE).exists():
        raise ConfigError(
            f"run_dir={str(run_dir)!r} holds checkpoints but no {CONFIG_FILE}, which resuming "
            "reads: put it back, or give another run_dir"
        )
    if others and not (run_dir / CONFIG_FILE).exists():
        raise ConfigError(
            f"run_dir={str(run_dir)!r} holds other files and is not a run directory: "
            "give a new or empty directory, or an earlier run's directory to resume it"
        )


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest existing parent: where a run directory's files would go."""
    return next(p for p in (path, *path.parents) if p.exists())


def file_in_the_way(directory: Path) -> Path | None:
    """The file that stands where ``directory`` or one of its parents would be made, or
    None."""
    existing = nearest_existing(directory)
    return None if existing.is_dir() else existing


def refuse_a_file_in_the_way(key: str, directory: Path) -> None:
    """Raise :class:`ConfigError` where a file stands at the directory ``key`` names, or
    above it."""
    blocking = file_in_the_way(directory)
    if blocking == directory:
        raise ConfigError(f"{key}={str(directory)!r} is a file: give a directory")
    if blocking is not None:
        raise ConfigError(f"{key}={str(directory)!r} cannot be made: {str(blocking)!r} is a file")


def refuse_another_preset(preset: str, given: dict[str, Any], saved: RunConfig) -> None:
    """A run resumed with ``--config`` given: the preset, with the overrides given, must
    train the algorithm and the env the run was started with (its other values are the
    run's own, saved in it)."""
    named = build(RunConfig, merge(conform(read_yaml(preset_file(preset)), RunConfig, ""), given))
    for key, ours, theirs in (
        ("algo", named.algo, saved.algo),
        ("env.name", named.env.name, saved.env.name),
    ):
        if ours != theirs:
            raise ConfigError(
                f"--config {preset} trains {key}={ours!r}, but run_dir={str(given['run_dir'])!r} "
                f"holds a run of {key}={theirs!r}: leave --config out to resume that run (it "
                "resumes from its own config.yaml), or give another run_dir"
            )


def refuse_experiment_changes(saved: RunConfig, resumed: RunConfig) -> None:
    """Raise :class:`ConfigError` if a resume would change the experiment itself."""
    before = flatten(dataclasses.asdict(saved))
    after = flatten(dataclasses.asdict(resumed))
    changeable = changeable_on_resume(type(saved))
    changed = [key for key in after if after[key] != before[key] and key not in changeable]
    if changed:
        key = changed[0]
        raise ConfigError(
            f"{key}={after[key]!r} cannot change when resuming (the run was started with "
            f"{before[key]!r}); keys that may change on resume: {', '.join(changeable)}"
        )


def changeable_on_resume(schema: type) -> list[str]:
    """Keys a resumed run may change (declared with ``on_resume=True``)."""
    return [key for key, _, metadata in settings_of(schema) if metadata["on_resume"]]
