"""A trained checkpoint opened once per process and handed down as an object (:class:`OpenedCheckpoint`), and
the one-thread predictions that give the same bits wherever they run (:func:`one_thread`): what evaluate and
forecast share."""

from __future__ import annotations

import contextlib
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from postcast.datasets.core.errors import BadInputError
from postcast.datasets.sample import SampleSpec
from postcast.models.module import PostProcessor, load_checkpoint


def open_checkpoint(path: str) -> tuple[PostProcessor, dict[str, Any]]:
    """:func:`~postcast.models.module.load_checkpoint`, with a checkpoint whose settings (target, layout,
    family: the model they build) contradict its weights named as bad data (65): torch's "size mismatch for
    norm_mean" or 'Missing key(s) "net.extra"' was an internal error (70)."""
    try:
        return load_checkpoint(path)
    except RuntimeError as err:
        if "state_dict" not in str(err):
            raise
        detail = " ".join(ln.strip() for ln in str(err).splitlines()[1:] if ln.strip())[:400]
        msg = (
            f"{path}: the checkpoint's settings (target, inputs, family) describe another model than its weights "
            f"({detail}); use the checkpoint `postcast train` saved, unchanged"
        )
        raise BadInputError(msg) from err


@dataclass(frozen=True, eq=False)
class OpenedCheckpoint:
    """A checkpoint read once (torch.load, checksum, network built: :func:`open_checkpoint`) and handed down as
    this object: its path, model and sample spec. Pickled (to a dask worker process) it travels as its path and
    token, and each process reads it once (:func:`reopened`), however many tasks there predict with it."""

    path: str
    model: PostProcessor
    spec: SampleSpec
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def open(cls, path: str, token: str | None = None) -> OpenedCheckpoint:
        model, meta = open_checkpoint(path)
        opened = cls(path, model, SampleSpec.from_dict(meta["sample"]), token or uuid.uuid4().hex)
        _OPENED_CHECKPOINTS[opened.token] = opened
        while len(_OPENED_CHECKPOINTS) > CHECKPOINTS_KEPT:
            _OPENED_CHECKPOINTS.popitem(last=False)  # the one opened first
        return opened

    @property
    def family(self) -> str:
        """The predictive family it was trained with (:mod:`postcast.models.distributions`)."""
        return self.model.meta.family

    def __reduce__(self) -> tuple[Callable[[str, str], OpenedCheckpoint], tuple[str, str]]:
        return reopened, (self.path, self.token)


# this process's checkpoints opened last, by token: a worker may receive a job more than once (dask fetches a
# scattered value again from a peer), and each copy finds its checkpoint here
_OPENED_CHECKPOINTS: OrderedDict[str, OpenedCheckpoint] = OrderedDict()
CHECKPOINTS_KEPT = 4


def reopened(path: str, token: str) -> OpenedCheckpoint:
    """The checkpoint ``token`` opened in this process: the one already open, else read here once."""
    opened = _OPENED_CHECKPOINTS.get(token)
    return opened if opened is not None else OpenedCheckpoint.open(path, token)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch's intra-op threads at 1 in this thread while inside, then back as they were. A float32 sum split
    over N threads adds in another order than over 1 (a convolution's GEMM does; so does MKL's choice of
    threads, which may change with the machine's load), so a checkpoint's predictions, and every score of
    it, depended on where they ran: a dask worker process starts with OMP_NUM_THREADS=1, this process and
    its thread workers have a thread per core. On one thread they are the same bits everywhere (the OpenMP
    and MKL thread counts torch sets are the calling thread's: a thread worker's setting is its own)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
