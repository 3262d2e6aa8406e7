"""Reading configuration values: TOML files, ``section.key=value`` overrides, and typed construction.

Nothing here knows the sections: :func:`build` fills any frozen dataclass from nested dicts, checking each
value against its annotation, so a wrong type or an unknown key is a :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from pathlib import Path
from typing import Any

from ddim.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


class ConfigError(UserError, ValueError):
    """A configuration file or override is invalid (the message says which key and why)."""


def choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")


def at_least(minimum: float, values: dict[str, float]) -> None:
    """Raise :class:`ConfigError` for the first ``key: value`` below ``minimum``."""
    for key, value in values.items():
        if value < minimum:
            raise ConfigError(f"{key} must be >= {minimum:g}, got {value}")


def plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value



def check_type(value: Any, annotation: Any, key: str) -> Any:
    """Return ``value`` converted to ``annotation`` or raise ConfigError naming ``key``."""
    origin = typing.get_origin(annotation)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_type,) = typing.get_args(annotation)[:1]
        items = [check_type(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            try:
                return check_type(value, option, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: {value!r} is not of type {annotation}")
    if annotation is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected nothing, got {value!r}")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {annotation}")  # pragma: no cover



def build(cls, values: dict[str, Any], prefix: str):
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a table, got {values!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown config key {prefix + unknown[0]!r} (known keys: {', '.join(sorted(known))})"
        )
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = build(hint, value, f"{prefix}{name}.")
        else:
            kwargs[name] = check_type(value, hint, prefix + name)
    return cls(**kwargs)


# Keys ("section.key") that configs once had and that mean nothing now: dropped on load (with no warning), so older
# config files and the configs stored in older checkpoints still load. Never reuse such a name.
RETIRED_KEYS = frozenset({
    "data.shuffle_buffer",  # each epoch is one global shuffle (ddim.data.loader), no buffer
})


def drop_retired_keys(values: dict[str, Any]) -> dict[str, Any]:
    """A copy of nested config dicts without the :data:`RETIRED_KEYS`."""
    if not isinstance(values, dict):
        return values  # _build reports it
    values = dict(values)
    for key in RETIRED_KEYS:
        section, _, leaf = key.rpartition(".")
        table = values.get(section)
        if isinstance(table, dict) and leaf in table:
            values[section] = {name: value for name, value in table.items() if name != leaf}
    return values



def parse_value(text: str) -> Any:
    """Parse an override value as TOML (``3``, ``1e-3``, ``true``, ``[32, 64]``, ``"x"``), else a bare string."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text



def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to nested dicts (validated later by :func:`from_dict`)."""
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {override!r} is not of the form section.key=value")
        *sections, leaf = key.strip().split(".")
        table = values
        for section in sections:
            table = table.setdefault(section, {})
            if not isinstance(table, dict):
                raise ConfigError(f"override {override!r}: {section!r} is not a section")
        table[leaf] = parse_value(text.strip())
    return values



def read_toml(path: str | Path) -> dict[str, Any]:
    """The values of a TOML config file, not yet validated; :class:`ConfigError` when missing or not TOML."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from None

