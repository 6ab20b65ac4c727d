"""The optional jobs of a pipeline config: compressing a training store's fields (:class:`CompressJob`) and
downloading the real ENS-10 files first (:class:`DownloadJob`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from postcast.datasets import schema
from postcast.datasets.core import config
from postcast.datasets.core.errors import ConfigError


@dataclass(frozen=True)
class CompressJob:
    """One artefact of the compress stage: every field that ``preset`` reads on ``split`` of the store
    -> ``WORKDIR/compressed/<preset stem>_<split>.pcnf``."""

    preset: str  # a Lightning training preset (its data.cfg names the fields), e.g. configs/train/unet_t850.yaml
    split: str = "train"
    field: dict[str, Any] = field(default_factory=dict)  # FieldConfig keys: width, depth, steps, weights, ...

    def __post_init__(self) -> None:
        if not Path(self.preset).exists():
            msg = f"compress.preset {self.preset!r}: file not found (paths are relative to the working directory)"
            raise ConfigError(msg)
        if self.split not in ("train", "val", "test"):
            msg = f"compress.split {self.split!r}: use train, val or test"
            raise ConfigError(msg)
        self.field_config()  # validate on load

    @property
    def name(self) -> str:
        return f"{Path(self.preset).stem}_{self.split}"

    def field_config(self) -> Any:
        from postcast.compression.field import FieldConfig

        return config.from_dict(FieldConfig, dict(self.field), where=f"compress[{self.preset}].field")

    def check_fields(self) -> None:
        """Refuse, before any stage runs, a preset that reads a variable with gaps (SST is undefined over
        land): its fields are NaN there, and a neural field fits gap-free fields only; and one of a derived
        target, whose members the artefact does not hold."""
        spec = self.data_config(Path("store.zarr")).sample
        gappy = sorted({i.variable for i in spec.inputs() if schema.VARIABLES[i.variable].missing_over_land})
        gappy += [spec.land_source] if spec.land_feature and spec.land_source not in gappy else []
        if gappy:
            msg = (
                f"compress.preset {self.preset}: it reads {', '.join(gappy)}, undefined over land (NaN), and a "
                f"neural field fits gap-free fields only; give compress a preset without {', '.join(gappy)} "
                "(e.g. configs/train/emos_t850.yaml) or remove this compress entry"
            )
            raise ConfigError(msg)
        if spec.resolved_target.derived:
            msg = (
                f"compress.preset {self.preset}: its target {spec.target} is derived from the members "
                f"({', '.join(spec.resolved_target.input_variables)}), which an artefact of ensemble "
                "statistics does not hold; give compress a preset of a variable target (e.g. "
                "configs/train/emos_t850.yaml) or remove this compress entry"
            )
            raise ConfigError(msg)

    def data_config(self, store_path: Path) -> Any:
        """The preset's data config as training resolves it, pointed at ``store_path`` (members off)."""
        from postcast.pipeline.train import data_config

        try:
            return data_config(
                ["-c", self.preset, "--data.cfg.store", str(store_path), "--data.cfg.sample.members", "false"]
            )
        except ValueError as err:
            msg = f"compress.preset {self.preset}: {err}"
            raise ConfigError(msg) from err


@dataclass(frozen=True)
class DownloadJob:
    """The download stage: the real ENS-10 files holding the init dates ``start``..``end`` (by month-day,
    groups ``pl``/``sfc``) and the ERA5 analyses of ``era5_years`` -> ``out`` (resumable; see
    ``postcast download ens10``)."""

    start: str
    end: str | None = None
    groups: tuple[str, ...] = ("pl", "sfc")
    era5_years: tuple[int, ...] = ()
    out: str = "data/ens10"
    jobs: int = 4

    def __post_init__(self) -> None:
        if self.jobs < 1:
            msg = f"download.jobs {self.jobs}: use 1 or more transfers at once"
            raise ConfigError(msg)
        self.files()  # dates and groups checked on load, offline

    def files(self) -> list[Any]:
        from postcast.datasets import download

        return download.ens10_files(self.start, self.end or self.start, self.groups) + download.era5_files(
            self.era5_years, self.groups
        )

    def listing(self) -> list[dict[str, Any]]:
        """What a dry run shows: each file, its address and its expected size (nominal; no network)."""
        from postcast.datasets import download

        out = Path(self.out)
        return [
            {
                "file": str(out / f.name),
                "url": f.url,
                "expected_bytes": download.nominal_size(f),
                "present": (out / f.name).exists(),
            }
            for f in self.files()
        ]
