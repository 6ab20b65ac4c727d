"""Clairvoyant prefetching (NoPFS, Dryden et al., SC21) for postcast's map-style datasets.

The training shuffle is a pure function of (seed, epoch, rank, world size, dataset length,
drop_last): ``torch.utils.data.DistributedSampler`` permutes with a generator seeded ``seed + epoch``,
pads by wrapping around (or truncates with ``drop_last``) and takes the stride ``[rank::world]``;
Lightning injects exactly that sampler (seed ``PL_GLOBAL_SEED``, else 0) in distributed runs.
So every future access of this rank is known before training starts, and the loader can:

1. replay the access stream (:func:`access_stream`, equal to the sampler's, padding included;
   module :mod:`.stream`);
2. plan a static tiered cache under a byte budget (:func:`plan_cache`, module :mod:`.plan`): count
   each sample's accesses over the planned epochs, drop zeros, sort by count (descending) then first
   access, fill the RAM tier, then the optional local-disk tier (module :mod:`.tiers`); the rest is
   never cached. No eviction;
3. prefetch in the background (:class:`ClairvoyantDataset`, module :mod:`.dataset`): threads fill
   tier slots in order of first access and stage uncached samples a bounded window ahead of the
   consumer, each read exactly once, so backing-store reads = accesses - predicted hits; each thread
   claims its next few reads at once and, with a base that has ``read_many`` (StoreDataset), fetches
   their chunks in one round trip (:class:`RowReader`, module :mod:`.chunks`);
4. report per epoch (:class:`PrefetchStats`, a Lightning Callback, module :mod:`.callback`): hit
   rate per tier, stall seconds (time the consumer waited for data), backing-store reads and bytes;
5. serve one fixed batch forever (:class:`FixedBatchLoader`, module :mod:`.dataset`) to tell
   whether training is loader-bound.

The dataset wrapper serves from the main process: use it with ``num_workers=0`` (its threads do the
parallel reading that worker processes would otherwise do). Samples served from the RAM tier are
views into the cache: read-only (``default_collate`` copies them into the batch).

The zarr utilities :func:`read_rows` and :class:`CountingStore` live in the torch-free
:mod:`postcast.datasets.reads` and are re-exported here.
"""

from postcast.datasets.loaders.prefetch.callback import PrefetchStats
from postcast.datasets.loaders.prefetch.chunks import RowReader
from postcast.datasets.loaders.prefetch.dataset import (
    ClairvoyantDataset,
    FixedBatchLoader,
    clairvoyant_loader,
    sample_nbytes,
)
from postcast.datasets.loaders.prefetch.plan import CachePlan, plan_cache
from postcast.datasets.loaders.prefetch.stream import ReplaySampler, StreamSpec, access_stream, lightning_seed
from postcast.datasets.loaders.prefetch.tiers import TIERS, EpochStats, Sample
from postcast.datasets.reads import CountingStore, read_rows

__all__ = [
    "TIERS",
    "CachePlan",
    "ClairvoyantDataset",
    "CountingStore",
    "EpochStats",
    "FixedBatchLoader",
    "PrefetchStats",
    "ReplaySampler",
    "RowReader",
    "Sample",
    "StreamSpec",
    "access_stream",
    "clairvoyant_loader",
    "lightning_seed",
    "plan_cache",
    "read_rows",
    "sample_nbytes",
]
