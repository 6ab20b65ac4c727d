"""Typed configuration: YAML presets -> frozen dataclasses, validated on load.

Every preset in ``configs/`` carries ``kind: <name>`` naming the dataclass it fills; unknown keys,
wrong types and failed cross-field checks raise :class:`ConfigError` with the key path and the fix.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from postcast.datasets.errors import ConfigError

T = TypeVar("T")
_KINDS: dict[str, type] = {}


def register(kind: str) -> Any:
    """Class decorator: make a config dataclass loadable from YAML as ``kind: <kind>``."""

    def deco(cls: type[T]) -> type[T]:
        _KINDS[kind] = cls
        return cls

    return deco


def kinds() -> dict[str, type]:
    _load_builtin_kinds()
    return dict(_KINDS)


def _load_builtin_kinds() -> None:
    if _KINDS:
        return
    from postcast.datasets import ingest, synthetic

    _KINDS.setdefault("synth", synthetic.SynthConfig)
    _KINDS.setdefault("ingest", ingest.IngestConfig)


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(a, value, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if dataclasses.is_dataclass(tp):
        if hasattr(tp, "from_dict"):
            try:
                return tp.from_dict(value)  # type: ignore[union-attr]
            except (ValueError, TypeError) as err:
                raise ConfigError(f"{where}: {err}") from err
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return from_dict(tp, value, where)  # type: ignore[arg-type]
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{where}: expected {len(args)} values, got {len(value)}")
        return tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return value
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp in (int, str, bool) and not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build dataclass ``cls`` from a plain mapping, checking names and types."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; allowed: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {k: _convert(hints[k], v, f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from err


def load(path: str | Path, expect_kind: str | None = None, **overrides: Any) -> Any:
    """Load a YAML preset into its typed config; ``overrides`` (non-None values) win over the file."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{p}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level")
    kind = data.pop("kind", None)
    known = kinds()
    if kind is None or kind not in known:
        raise ConfigError(f"{p}: set 'kind:' to one of {sorted(known)} (got {kind!r})")
    if expect_kind is not None and kind != expect_kind:
        raise ConfigError(f"{p}: is a {kind!r} config, expected {expect_kind!r}")
    data.update({k: v for k, v in overrides.items() if v is not None})
    return from_dict(known[kind], data, where=str(p))
