"""Typed configuration: YAML presets -> frozen dataclasses, validated on load.

Every preset in ``configs/`` carries ``kind: <name>`` naming the dataclass it fills (registered by
the module that owns it with ``@register("<name>")``); unknown keys,
wrong types and failed cross-field checks raise :class:`ConfigError` with the key path and the fix.
The kinds are found through the package's entry points (group :data:`ENTRY_POINTS`, declared in
pyproject.toml as ``<kind> = "module:Class"``): a kind's module is imported when a preset of that kind
is loaded, so no driver keeps a list of modules to import first.

Every YAML file postcast reads goes through :func:`load_yaml` (typed presets here, Lightning training
presets through the jsonargparse loader that ``postcast train`` registers): UTF-8 only, at most
:data:`MAX_YAML_BYTES` bytes and :data:`MAX_YAML_NODES` nodes once aliases are expanded, so an alias bomb
("billion laughs": each level repeats the previous one ten times) is refused before it is built.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import yaml

from postcast.datasets.core.errors import ConfigError

T = TypeVar("T")
_KINDS: dict[str, type] = {}
# [project.entry-points."postcast.config_kinds"] in pyproject.toml: <kind> = "<module>:<dataclass>"
ENTRY_POINTS = "postcast.config_kinds"


def register(kind: str) -> Any:
    """Class decorator: make a config dataclass loadable from YAML as ``kind: <kind>``. Declare it as an
    entry point too (group :data:`ENTRY_POINTS`), so that the kind is known before its module is imported
    (``tests/test_config_kinds.py`` checks each registered kind has one)."""

    def deco(cls: type[T]) -> type[T]:
        _KINDS[kind] = cls
        return cls

    return deco


def _entry_points() -> dict[str, metadata.EntryPoint]:
    """The kinds' entry points of every distribution on the path. Not ``metadata.entry_points(group=...)``:
    it reads only the first distribution of each name, and a process started in a source checkout (``python
    -m``, ``python -c``) finds the checkout's ``postcast.egg-info`` first, left by an older build and
    without the kinds declared since, before the metadata of the installed package."""
    found: dict[str, metadata.EntryPoint] = {}
    for dist in metadata.distributions():
        for ep in dist.entry_points.select(group=ENTRY_POINTS):
            found.setdefault(ep.name, ep)
    return found


def kind_names() -> list[str]:
    """Every kind there is, registered or declared (nothing is imported)."""
    return sorted(set(_KINDS) | set(_entry_points()))


def kind(name: str) -> type | None:
    """The dataclass of kind ``name`` (its module imported through its entry point), None if unknown."""
    if name not in _KINDS:
        ep = _entry_points().get(name)
        if ep is not None:
            _KINDS.setdefault(name, ep.load())  # importing its module registered it (@register) or not
    return _KINDS.get(name)


def kinds() -> dict[str, type]:
    """Every kind and its dataclass (the module of each imported through its entry point)."""
    return {name: cls for name in kind_names() if (cls := kind(name)) is not None}


def _convert_union(args: tuple[Any, ...], value: Any, where: str) -> Any:
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


def _convert_dataclass(tp: Any, value: Any, where: str) -> Any:
    if hasattr(tp, "from_dict"):
        try:
            return tp.from_dict(value)
        except (ValueError, TypeError) as err:
            msg = f"{where}: {err}"
            raise ConfigError(msg) from err
    if not isinstance(value, dict):
        msg = f"{where}: expected a mapping, got {value!r}"
        raise ConfigError(msg)
    return from_dict(tp, value, where)


def _convert_tuple(args: tuple[Any, ...], value: Any, where: str) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        msg = f"{where}: expected a list, got {value!r}"
        raise ConfigError(msg)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if len(args) != len(value):
        msg = f"{where}: expected {len(args)} values, got {len(value)}"
        raise ConfigError(msg)
    return tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))


def _number(value: Any, where: str) -> float:
    """A float option's value: a number, or text that reads as one (PyYAML reads ``1e-3``, without a dot, as
    text); a boolean, a list or other text is refused naming the option."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    elif isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    msg = f"{where}: expected a number, got {value!r}"
    raise ConfigError(msg)


def _convert(tp: Any, value: Any, where: str) -> Any:
    """Check ``value`` against the type hint ``tp`` (YAML lists become tuples, ints become floats)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _convert_union(args, value, where)
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(tp, value, where)
    if origin is tuple:
        return _convert_tuple(args, value, where)
    if origin is dict:
        if not isinstance(value, dict):
            msg = f"{where}: expected a mapping, got {value!r}"
            raise ConfigError(msg)
        return value
    if tp is float:
        return _number(value, where)
    if (tp in (int, str, bool) and not isinstance(value, tp)) or (tp is int and isinstance(value, bool)):
        msg = f"{where}: expected {tp.__name__}, got {value!r}"
        raise ConfigError(msg)
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build dataclass ``cls`` from a plain mapping, checking names and types."""
    if not isinstance(data, dict):
        msg = f"{where}: expected a mapping, got {type(data).__name__}"
        raise ConfigError(msg)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        msg = f"{where}: unknown keys {unknown}; allowed: {sorted(fields)}"
        raise ConfigError(msg)
    hints = typing.get_type_hints(cls)
    kwargs = {k: _convert(hints[k], v, f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        msg = f"{where}: {err}"
        raise ConfigError(msg) from err


MAX_YAML_BYTES = 1 << 20  # a preset is a few hundred bytes; the largest in configs/ is under 4 kB
MAX_YAML_NODES = 100_000  # scalars, lists and mappings after expanding aliases (a preset has < 500)


def _expanded_nodes(node: yaml.Node, memo: dict[int, int], limit: int) -> int:
    """Nodes of ``node``'s document once every alias is expanded (an alias is the node it names, so
    the count is memoised per node: linear in the text, whatever the expansion); stops past ``limit``."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = limit + 1  # a node that contains itself (``&a [*a]``) expands without end
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    total = 1
    for child in children:
        total += _expanded_nodes(child, memo, limit)
        if total > limit:
            break
    memo[key] = total
    return total


def check_yaml(text: str, where: str) -> None:
    """Refuse YAML text larger than :data:`MAX_YAML_BYTES` or that expands to more than
    :data:`MAX_YAML_NODES` nodes (:class:`ConfigError`, naming the limit), without constructing it."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        msg = f"{where}: {size} bytes of YAML, more than the limit of {MAX_YAML_BYTES} bytes for a config file"
        raise ConfigError(msg)
    reader = yaml.SafeLoader(text)
    try:
        node = reader.get_single_node()
        nodes = _expanded_nodes(node, {}, MAX_YAML_NODES) if node is not None else 0
    except RecursionError as err:
        msg = f"{where}: the YAML nests too deeply to read; a config file needs a few levels"
        raise ConfigError(msg) from err
    finally:
        reader.dispose()
    if nodes > MAX_YAML_NODES:
        msg = (
            f"{where}: the YAML expands to more than {MAX_YAML_NODES} nodes (aliases repeating aliases, "
            "an alias bomb?); write the values out instead of nesting aliases"
        )
        raise ConfigError(msg)


def load_yaml(text: str, where: str) -> Any:
    """YAML text -> plain data (yaml.safe_load) within the limits of :func:`check_yaml`."""
    check_yaml(text, where)
    return yaml.safe_load(text)


def read_yaml(path: str | Path) -> Any:
    """A YAML file -> plain data, within the limits of :func:`check_yaml`; :class:`ConfigError` (one line
    naming the file) when it is missing, unreadable, larger than the byte limit, not UTF-8 or not YAML."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_YAML_BYTES:  # refused before reading it into memory
            msg = f"{p}: {p.stat().st_size} bytes, more than the limit of {MAX_YAML_BYTES} bytes for a config file"
            raise ConfigError(msg)
        raw = p.read_bytes()
    except FileNotFoundError as err:
        msg = f"config file {p} does not exist"
        raise ConfigError(msg) from err
    except OSError as err:
        msg = f"{p}: cannot read the config file ({err.strerror or err})"
        raise ConfigError(msg) from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        msg = f"{p}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); save the file as UTF-8"
        raise ConfigError(msg) from err
    try:
        return load_yaml(text, str(p))
    except yaml.YAMLError as err:
        msg = f"{p}: not valid YAML: {' '.join(str(err).split())}"
        raise ConfigError(msg) from err


def is_lightning_preset(path: str | Path) -> bool:
    """A Lightning CLI preset (``trainer``/``model``/``data`` sections, no ``kind``)."""
    try:
        data = read_yaml(path)
    except ConfigError:
        return False
    return isinstance(data, dict) and "kind" not in data and bool({"trainer", "model", "data"} & set(data))


def load(path: str | Path, expect_kind: str | None = None, **overrides: Any) -> Any:
    """Load a YAML preset into its typed config; ``overrides`` (non-None values) win over the file."""
    p = Path(path)
    data = read_yaml(p) or {}
    if not isinstance(data, dict):
        msg = f"{p}: expected a mapping at the top level"
        raise ConfigError(msg)
    name = data.pop("kind", None)
    cls = kind(name) if isinstance(name, str) else None
    if cls is None:
        msg = f"{p}: set 'kind:' to one of {kind_names()} (got {name!r})"
        raise ConfigError(msg)
    if expect_kind is not None and name != expect_kind:
        msg = f"{p}: is a {name!r} config, expected {expect_kind!r}"
        raise ConfigError(msg)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return from_dict(cls, data, where=str(p))
