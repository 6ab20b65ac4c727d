"""Network architectures: one small config dataclass per architecture, registered where the network lives.

An architecture is a frozen dataclass decorated with :func:`architecture`; its fields are the
architecture's own hyperparameters (nothing else), and ``build(io)`` returns the network for the data
described by :class:`NetIO`. ``needs_members`` declares that the network reads the raw members (the
sample spec must set ``members: true``). Adding a model is one file under ``models/``:
:func:`architectures` imports every module of :mod:`postcast.models` to find the registered ones.
("Family" is the predictive family, :mod:`postcast.datasets.laws`.)

In a training preset the key keeps its first name, ``family`` (presets, ``--model.family`` and the
hyperparameters of saved checkpoints carry it): ``model: {family: unet, net: {base_filters: 32}, lr: 0.002}``.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from torch import nn

from postcast.datasets.core import config
from postcast.datasets.core.errors import ConfigError


@dataclass(frozen=True)
class NetIO:
    """What the data gives a network: channels, grid and members (derived from the sample spec)."""

    in_channels: int  # normalised fields + features, (B, C, H, W)
    grid: tuple[int, int]  # (H, W)
    n_members: int
    n_variables: int  # input variables V (members are (B, M, V, H, W))
    target_variable: int  # index of the target variable among the inputs
    outputs: int = 2  # head outputs per point: the predictive distribution's raw parameters (models/distributions.py)
    season_channels: tuple[int, int] | None = None  # the inputs' sine and cosine of the day of year, if given

    @property
    def target_channels(self) -> tuple[int, int]:
        """Channels of the target variable's normalised ensemble mean and std."""
        return (2 * self.target_variable, 2 * self.target_variable + 1)


class Architecture(Protocol):
    __dataclass_fields__: ClassVar[dict[str, Any]]  # a (frozen) dataclass: its options travel in checkpoints
    name: ClassVar[str]
    needs_members: ClassVar[bool]

    def build(self, io: NetIO) -> nn.Module: ...


_ARCHITECTURES: dict[str, type] = {}


def architecture(name: str, *, needs_members: bool = False) -> Any:
    """Class decorator: register a config dataclass as the network architecture ``name``."""

    def deco(cls: type) -> type:
        if name in _ARCHITECTURES and _ARCHITECTURES[name] is not cls:
            msg = f"architecture {name!r} is registered twice ({_ARCHITECTURES[name].__module__}, {cls.__module__})"
            raise ValueError(msg)
        cls.name = name  # type: ignore[attr-defined]
        cls.needs_members = needs_members  # type: ignore[attr-defined]
        _ARCHITECTURES[name] = cls
        return cls

    return deco


def _discover() -> None:
    import postcast.models as package

    for info in pkgutil.iter_modules(package.__path__):
        if not info.ispkg:
            importlib.import_module(f"{package.__name__}.{info.name}")


def architectures() -> dict[str, type]:
    """Every registered architecture by name."""
    _discover()
    return dict(sorted(_ARCHITECTURES.items()))


def get(name: str) -> type:
    """The architecture ``name`` (the preset's ``model.family``); :class:`ConfigError` naming the known ones."""
    known = architectures()
    if name not in known:
        msg = f"model.family {name!r} (the network architecture): choose one of {list(known)}"
        raise ConfigError(msg)
    return known[name]


def make(name: str, options: dict[str, Any] | None) -> Architecture:
    """The architecture's config from plain options, checked (unknown keys and wrong types name the fix)."""
    cls = get(name)
    return config.from_dict(cls, dict(options or {}), where=f"model.net ({name})")
