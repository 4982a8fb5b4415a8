"""How a setting is declared (:func:`setting`: its default, doc line and accepted values)
and how values are checked against the schema: :func:`conform` is the one check of key
names and types; :func:`check_declared` checks a value against what its setting declares.
Checks that involve several keys, an env or the machine live with their owners and run
from :func:`rl_app.checks.check_config`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import field
from typing import Any

import yaml


class ConfigError(ValueError):
    """A user's configuration mistake: reported as one line, exit status 2."""


# Whole numbers reach torch and the OS as int64.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


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
    values it accepts, which :func:`check_declared` checks for every field: ``choices``, or
    bounds (``at_least``/``above``/``at_most``; for a list, each element). ``on_resume``: the key
    may change when a run resumes (budgets, cadence, bookkeeping, not the experiment);
    a group declared with ``metadata={"on_resume": True}`` hands that to all its keys."""
    metadata = {"doc": doc, "choices": choices, "at_least": at_least, "above": above,
                "at_most": at_most, "on_resume": on_resume}  # fmt: skip
    if isinstance(default, tuple):  # a list setting: each config gets its own list
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def settings_of(
    schema: type, prefix: str = "", inherited: bool = False
) -> Iterator[tuple[str, dataclasses.Field, dict[str, Any]]]:
    """Every key of the schema (``"optim.lr"``, ...) with its field and metadata, groups
    walked into; a group's ``on_resume`` is handed down to its keys."""
    for item in dataclasses.fields(schema):
        on_resume = inherited or item.metadata.get("on_resume", False)
        if dataclasses.is_dataclass(item.default_factory):
            yield from settings_of(item.default_factory, f"{prefix}{item.name}.", on_resume)
        else:
            yield prefix + item.name, item, {**item.metadata, "on_resume": on_resume}


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
        # the declared bounds alone are checked by check_declared().
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


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def to_yaml(config: Any) -> str:
    """The config as YAML, groups as mappings, in the schema's order (what a run saves)."""
    return yaml.safe_dump(dataclasses.asdict(config), sort_keys=False)
