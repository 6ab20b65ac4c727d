"""The archive as the service sees it: which products exist, the models of each target ranked by
their verification scores (evaluate's ``metrics.json``), the best readable product per (target, model,
valid time), and the caches (loaded fields, rendered maps). The archive is rescanned at most every
``watch_s`` seconds; unreadable files are skipped with a warning and listed by ``/health``."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from fastapi import HTTPException

from postcast.datasets import schema
from postcast.datasets.core.errors import BadInputError
from postcast.pipeline.products import archive
from postcast.pipeline.products.archive import Product, Skipped
from postcast.serve.grid import Served

log = logging.getLogger(__name__)


class LRU:
    """A small thread-safe least-recently-used mapping."""

    def __init__(self, size: int) -> None:
        self.size, self._items, self._lock = size, OrderedDict[Any, Any](), threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


class MapCache(LRU):
    """Rendered PNG maps by (file, its signature, target, requested time); counts its renders."""

    def __init__(self, size: int = 64) -> None:
        super().__init__(size)
        self.renders = 0
        self.render_lock = threading.Lock()  # matplotlib is not thread-safe; one render at a time


Key = tuple[str, str | None, pd.Timestamp | None]  # (target, model or None = any, valid time or None = the latest)


@dataclass(frozen=True)
class TargetModels:
    """The models with forecasts of one target, best first (the first is the default), their scores
    (``crps``: only the scored ones), their number of forecasts and how the default was chosen."""

    order: tuple[str, ...]
    crps: dict[str, float]
    counts: dict[str, int]
    chosen_by: str

    def listing(self, target: str) -> dict[str, Any]:
        return {
            "target": target,
            "default_model": self.order[0],
            "chosen_by": self.chosen_by,
            "models": [{"model": m, "crps": self.crps.get(m), "forecasts": self.counts[m]} for m in self.order],
        }


class Catalog:
    """The archive under ``root``: which products exist, the models of each target ranked by their
    verification scores, the best product per (target, model, valid time), and the loaded fields (an
    LRU keyed by path and signature, so a replaced file is never served stale)."""

    def __init__(self, root: str | Path, watch_s: float | None = 2.0, cache_fields: int = 32) -> None:
        self.root, self.watch_s = Path(root), watch_s
        self._fields = LRU(cache_fields)
        self._unreadable: dict[Path, tuple[Product, str]] = {}  # until replaced
        self._lock = threading.Lock()
        self._next_scan = 0.0
        self.maps = MapCache()
        self.entries: list[Product] = []
        self.skipped: list[Skipped] = []
        self._ranked: dict[Key, list[Product]] = {}
        self._warned: set[str] = set()
        self.scores: dict[str, dict[str, float]] = {}  # target -> model -> archive.SCORE
        self.scores_file: tuple[str, Path] | None = None  # (name relative to the root, path) of the scores read
        self._scores_seen: tuple[str, archive.Signature] | None = None
        self._scores_skip: list[Skipped] = []
        self.models: dict[str, TargetModels] = {}  # target -> its models, best first
        self.all_models: tuple[str, ...] = ()  # every model of the archive, sorted
        self.refresh()

    def refresh(self) -> None:
        """Rescan the archive: new, replaced and removed files take effect now."""
        found, foreign = archive.scan(self.root)
        for skip in foreign:
            if skip.path not in self._warned:  # once per entry, not at every rescan
                log.warning("skipping %s: %s", skip.path, skip.reason)
                self._warned.add(skip.path)
        with self._lock:
            sigs = {p.path: p.signature for p in found}
            self._unreadable = {k: v for k, v in self._unreadable.items() if sigs.get(k) == v[0].signature}
            self._index(found, foreign + self._load_scores())
            self._next_scan = time.monotonic() + (self.watch_s or 0.0)

    def _load_scores(self) -> list[Skipped]:
        """Read the scores file (``archive.SCORE_FILES``) again when it changed; the skipped entry
        saying why when it cannot be read."""
        found = archive.scores_path(self.root)
        try:
            seen = (found[0], archive.signature(found[1])) if found else None
        except FileNotFoundError:  # removed since it was found
            found, seen = None, None
        if seen != self._scores_seen:
            self._scores_seen, self.scores, self.scores_file, self._scores_skip = seen, {}, None, []
            if found is not None:
                try:
                    self.scores, self.scores_file = archive.read_scores(found[1]), found
                except BadInputError as err:
                    log.warning("no verification scores: %s", err)
                    self._scores_skip = [Skipped(found[0], str(err), "not the metrics.json of postcast evaluate")]
        return self._scores_skip

    def _rank_models(self, good: list[Product]) -> dict[str, TargetModels]:
        """Per target, its models best first: the scored ones by their score (lowest first), then the
        others by name; a tie by name too."""
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        for p in good:
            counts[p.target][p.model] += 1
        out = {}
        for target in sorted(counts, key=list(schema.TARGETS).index):
            crps = {m: v for m, v in self.scores.get(target, {}).items() if m in counts[target]}
            order = tuple(sorted(counts[target], key=lambda m: (m not in crps, crps.get(m, 0.0), m)))
            why = (
                f"the lowest {archive.SCORE} in {self.scores_file[0]}"
                if self.scores_file and order[0] in crps
                else "no verification score for its models: the first by name"
            )
            out[target] = TargetModels(order, crps, dict(counts[target]), why)
        return out

    def _index(self, found: list[Product], foreign: list[Skipped]) -> None:
        good = [p for p in found if p.path not in self._unreadable]
        bad = [
            Skipped(str(path.relative_to(self.root)), why, "an unreadable forecast file (see the log)")
            for path, (_, why) in self._unreadable.items()
        ]
        models = self._rank_models(good)
        rank = {(t, m): k for t, tm in models.items() for k, m in enumerate(tm.order)}
        ranked: dict[Key, list[Product]] = defaultdict(list)
        # the target's better model first, then later init, then postprocessed over fallback, then written last
        for p in sorted(
            good,
            key=lambda p: (-rank[(p.target, p.model)], p.init, p.product == archive.POSTPROCESSED, p.signature[1]),
            reverse=True,
        ):
            for model in (None, p.model):
                ranked[(p.target, model, p.valid)].append(p)
                ranked[(p.target, model, None)].append(p)
        self.models, self.all_models = models, tuple(sorted({p.model for p in good}))
        self.entries, self.skipped, self._ranked = sorted(good, key=lambda p: (p.target, p.init)), foreign + bad, ranked

    def watch(self) -> None:
        if self.watch_s is not None and time.monotonic() >= self._next_scan:
            self.refresh()

    def check_model(self, target: str | None, model: str | None) -> None:
        """422 when ``model`` is not in the archive, 404 when it has no forecast of ``target``; both name
        the models there are."""
        if model is None:
            return
        if model not in self.all_models and self._unreadable_of(target, model, None):
            raise HTTPException(404, self._no_forecast(target, model, None))
        if model not in self.all_models:
            raise HTTPException(
                422, f"model {model!r} is not in the archive; its models: {', '.join(self.all_models) or 'none'}"
            )
        have = self.models[target].order if target in self.models else ()
        if target is not None and model not in have:
            raise HTTPException(
                404, f"no {target} forecast of model {model!r}; the models of {target}: {', '.join(have) or 'none'}"
            )

    def latest_target(self, model: str | None) -> str:
        """The target of the last forecast listed (of ``model`` if given); 404 when there is none."""
        self.watch()
        self.check_model(None, model)
        entries = [e for e in self.entries if model in (None, e.model)]
        if not entries:
            raise HTTPException(404, "no forecast in the archive")
        return entries[-1].target

    def resolve(self, target: str, model: str | None, valid: pd.Timestamp | None) -> tuple[Product, Served]:
        """The best readable product for ``target`` of ``model`` (None: the best-ranked model that has
        one) at ``valid`` (None: the latest) and its field; 404 when there is none."""
        self.watch()
        self.check_model(target, model)
        for p in list(self._ranked.get((target, model, valid), ())):
            try:
                return p, self.field(p)
            except archive.ProductGone:
                self._drop(p, None)
            except archive.UnreadableProduct as err:
                log.warning("skipping %s", err)
                self._drop(p, str(err))
        raise HTTPException(404, self._no_forecast(target, model, valid))

    def _unreadable_of(self, target: str | None, model: str | None, valid: pd.Timestamp | None) -> bool:
        """Whether a product of ``target`` (None: any) of ``model`` (None: any) valid at ``valid`` (None: any time)
        was taken out of service as unreadable."""
        return any(
            target in (None, p.target) and model in (None, p.model) and valid in (None, p.valid)
            for p, _ in self._unreadable.values()
        )

    def _no_forecast(self, target: str | None, model: str | None, valid: pd.Timestamp | None) -> str:
        """The 404's detail: the same whether the unreadable file was met in this request or an earlier one."""
        what = f"valid time {valid}" if valid is not None else "any time"
        of = f" of model {model!r}" if model is not None else ""
        bad = self._unreadable_of(target, model, valid)
        why = " (its files are unreadable; see /health)" if bad else "; see /forecasts"
        return f"no {target + ' ' if target else ''}forecast{of} for {what}{why}"

    def field(self, p: Product) -> Served:
        key = (p.path, p.signature)
        served = self._fields.get(key)
        if served is None:
            served = Served.of(p, archive.read_field(p))
            self._fields.put(key, served)
        return served

    def _drop(self, p: Product, reason: str | None) -> None:
        """Take ``p`` out of service: unreadable (``reason``, listed by /health until replaced) or gone."""
        with self._lock:
            if reason is not None:
                self._unreadable[p.path] = (p, reason)
            found = [e for e in self.entries if e.path != p.path]
            foreign = [s for s in self.skipped if (self.root / s.path) not in self._unreadable]
            self._index(found, foreign)
