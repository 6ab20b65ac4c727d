"""4. Per-epoch reports of the clairvoyant loader (:class:`PrefetchStats`, a Lightning Callback):
hit rate per tier, stall seconds (time the consumer waited for data), backing-store reads and bytes."""

from __future__ import annotations

import lightning as L

from postcast.datasets.loaders.prefetch.dataset import ClairvoyantDataset


class PrefetchStats(L.Callback):
    """Logs, after each training epoch, the clairvoyant loader's hit rate per tier, stall seconds,
    backing-store reads and bytes (``loader/<name>``); ``history`` keeps one dict per epoch."""

    def __init__(self) -> None:
        self.history: list[dict[str, float]] = []

    @staticmethod
    def find(trainer: L.Trainer) -> ClairvoyantDataset | None:
        loader = trainer.train_dataloader
        data = getattr(loader, "dataset", None)
        return data if isinstance(data, ClairvoyantDataset) else None

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        data = self.find(trainer)
        st = data.end_epoch() if data is not None else None
        if data is None or st is None:
            return
        summary = st.summary(data.plan.sample_bytes)
        self.history.append({"epoch": float(st.epoch), **summary})
        pl_module.log_dict({f"loader/{k}": float(v) for k, v in summary.items()}, on_epoch=True)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        data = self.find(trainer)
        if data is not None:
            data.close()
