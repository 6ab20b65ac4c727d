"""Sparse gradient all-reduce with error feedback: Top-k (all-gather) and Ok-Topk (Li & Hoefler, PPoPP'22).

Both run as DDP communication hooks (registered by :class:`postcast.models.plugins.ddp.CommDDPStrategy`,
which also does so on CPU). Per bucket ``g`` (N,) and rank:

* **Top-k**: ``acc = g + residual``; the k entries of largest ``|acc|`` are all-gathered as
  (int32 index, float32 value) pairs from every rank, scatter-added and divided by P; the residual
  keeps what was not sent. Volume (P - 1) k 8 bytes per rank.
* **Ok-Topk**: the local selection uses a threshold (exact k-th largest every ``recompute_every``
  steps, reused and nudged in between, one O(N) compare); the index range is cut into P regions
  with about equal numbers of selected entries (cuts re-proposed every ``repartition_every`` steps,
  averaged over ranks); pairs go to their region's owner with one uneven ``all_to_all``
  (a sparse reduce-scatter); each owner keeps its region's entries with ``|sum| >= global
  threshold`` (exact every ``recompute_every`` steps, else reused while the kept count stays in
  [2k/3, 4k/3], recomputed otherwise) and the kept pairs are all-gathered; the residual is zeroed
  where an entry was both selected locally and kept globally. Volume < 6 k 8 bytes per rank.
  Dense all-reduce for the first ``warmup_steps`` steps (DDP rebuilds its buckets after step 1).
"""

# no "from __future__ import annotations": DDP checks the hook annotations at run time

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from postcast.datasets.core.errors import ConfigError
from postcast.models.plugins.comm import ByteCounter, world_of


def _k_of(n: int, density: float) -> int:
    if not 0.0 < density <= 1.0:
        msg = f"density={density}: the fraction of gradient entries sent must be in (0, 1]"
        raise ConfigError(msg)
    return max(1, min(n, math.ceil(density * n)))


def _allgather_pairs(
    idx: torch.Tensor, val: torch.Tensor, group: dist.ProcessGroup | None, counter: ByteCounter
) -> tuple[torch.Tensor, torch.Tensor]:
    """All-gather variable-length (index (n_r,), value (n_r,)) pairs; padded to the longest."""
    _, world = world_of(group)
    if world == 1:
        return idx, val
    size = torch.tensor([idx.numel()], dtype=torch.int64)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = int(max(int(s) for s in sizes))
    pad_i = torch.zeros(longest, dtype=torch.int32)
    pad_v = torch.zeros(longest, dtype=torch.float32)
    pad_i[: idx.numel()] = idx
    pad_v[: val.numel()] = val
    all_i = [torch.empty_like(pad_i) for _ in range(world)]
    all_v = [torch.empty_like(pad_v) for _ in range(world)]
    dist.all_gather(all_i, pad_i, group=group)
    dist.all_gather(all_v, pad_v, group=group)
    counter.allgather(8 + longest * 8, world)
    keep_i = torch.cat([a[: int(s)] for a, s in zip(all_i, sizes, strict=True)])
    keep_v = torch.cat([a[: int(s)] for a, s in zip(all_v, sizes, strict=True)])
    return keep_i, keep_v


def topk_allreduce(
    acc: torch.Tensor, k: int, group: dist.ProcessGroup | None = None, counter: ByteCounter | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k all-reduce of ``acc`` (N,) float32: returns (mean over ranks of everyone's top-k (N,),
    residual (N,) = ``acc`` with the sent entries zeroed). Every rank sends exactly k pairs."""
    counter = counter if counter is not None else ByteCounter()
    _, world = world_of(group)
    _, idx = acc.abs().topk(k, sorted=False)  # (k,)
    vals = acc[idx]
    residual = acc.clone()
    residual[idx] = 0.0
    idx32 = idx.to(torch.int32)
    if world > 1:
        all_i = [torch.empty_like(idx32) for _ in range(world)]
        all_v = [torch.empty_like(vals) for _ in range(world)]
        dist.all_gather(all_i, idx32, group=group)
        dist.all_gather(all_v, vals, group=group)
        counter.allgather(k * 8, world)
    else:
        all_i, all_v = [idx32], [vals]
    out = torch.zeros_like(acc)
    for i, v in zip(all_i, all_v, strict=True):
        out.index_add_(0, i.long(), v)
    counter.calls += 1
    return out / world, residual


@dataclass
class OkTopkBucket:
    """Per-bucket Ok-Topk state (thresholds, region cuts, residual)."""

    residual: torch.Tensor
    step: int = 0
    local_thr: float | None = None
    global_thr: float | None = None
    cuts: torch.Tensor | None = None  # (P + 1,) int64 region boundaries
    last_nnz: int = 0


def _exact_kth(values: torch.Tensor, k: int) -> float:
    """k-th largest of ``values`` (>= 0), or 0 when there are fewer than k."""
    if values.numel() <= k:
        return 0.0
    return float(values.topk(k, sorted=False).values.min())


def _local_select(acc: torch.Tensor, k: int, st: OkTopkBucket, exact: bool) -> torch.Tensor:
    """Indices (n_sel,) with |acc| >= the local threshold; the threshold is exact or reused/nudged."""
    mag = acc.abs()
    if exact or st.local_thr is None:
        st.local_thr = _exact_kth(mag, k)
    else:
        for _ in range(5):  # raise a stale threshold while far too many entries pass
            if int((mag >= st.local_thr).sum()) <= 4 * k // 3:
                break
            st.local_thr *= 1.03
    idx = torch.nonzero(mag >= st.local_thr).reshape(-1)
    if idx.numel() < 2 * k // 3:
        st.local_thr /= 1.03
    elif idx.numel() > 5 * k // 4:
        st.local_thr *= 1.03
    return idx


def _repartition(
    idx: torch.Tensor, n: int, world: int, group: dist.ProcessGroup | None, counter: ByteCounter
) -> torch.Tensor:
    """Region cuts (P + 1,) splitting 0..n so that each region holds ~equal selected entries."""
    if idx.numel() == 0:
        cuts = torch.linspace(0, n, world + 1).double()
    else:
        q = torch.quantile(idx.double(), torch.linspace(0, 1, world + 1, dtype=torch.float64))
        cuts = q
    if world > 1:
        dist.all_reduce(cuts, group=group)
        cuts /= world
        counter.allreduce(cuts.numel() * 8, world)
    out = cuts.round().long()
    out[0], out[-1] = 0, n
    return torch.cummax(out, 0).values  # (P + 1,) monotone


def _reduce_scatter(
    idx: torch.Tensor, vals: torch.Tensor, cuts: torch.Tensor, group: dist.ProcessGroup | None, counter: ByteCounter
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse reduce-scatter: pairs (index (n_sel,) ascending, value) go to their region's owner, who
    sums them. Returns this rank's region sums (hi - lo,) and which offsets received a pair (bool)."""
    rank, world = world_of(group)
    dest = torch.bucketize(idx, cuts[1:-1], right=True)  # (n_sel,) owner of each index
    send = torch.bincount(dest, minlength=world)  # (P,) pairs per owner; idx ascending => grouped
    idx32 = idx.to(torch.int32)
    if world > 1:
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        s_list, r_list = send.tolist(), recv.tolist()
        r_idx = torch.empty(sum(r_list), dtype=torch.int32)
        r_val = torch.empty(sum(r_list), dtype=torch.float32)
        dist.all_to_all_single(r_idx, idx32, r_list, s_list, group=group)
        dist.all_to_all_single(r_val, vals, r_list, s_list, group=group)
        counter.send((sum(s_list) - s_list[rank]) * 8 + (world - 1) * 8)
    else:
        r_idx, r_val = idx32, vals
    lo, hi = int(cuts[rank]), int(cuts[rank + 1])
    region = torch.zeros(hi - lo)
    touched = torch.zeros(hi - lo, dtype=torch.bool)
    local = r_idx.long() - lo
    region.index_add_(0, local, r_val)
    touched[local] = True
    return region, touched


def _global_select(
    region: torch.Tensor,
    touched: torch.Tensor,
    k: int,
    st: OkTopkBucket,
    exact: bool,
    group: dist.ProcessGroup | None,
    counter: ByteCounter,
) -> torch.Tensor:
    """Region offsets (n_kept,) whose |sum| >= the global threshold; the threshold is reused while
    the total kept count stays in [2k/3, 4k/3], else (and when ``exact``) the exact k-th largest."""
    _, world = world_of(group)
    cand = torch.nonzero(touched).reshape(-1)  # (n_cand,) offsets that received something
    mag = region[cand].abs()

    def keep_with(thr: float) -> tuple[torch.Tensor, int]:
        sel = cand[mag >= thr]
        kept_n = torch.tensor([sel.numel()])
        if world > 1:
            dist.all_reduce(kept_n, group=group)
            counter.allreduce(8, world)
        return sel, int(kept_n)

    if not exact and st.global_thr is not None:
        sel, kept = keep_with(st.global_thr)
        if 2 * k // 3 <= kept <= 4 * k // 3:
            return sel
    # exact global threshold: the k-th largest |sum| over all regions (all-gather of the candidates)
    _, all_mag = _allgather_pairs(cand.to(torch.int32), mag, group, counter)
    st.global_thr = _exact_kth(all_mag, k)
    return keep_with(st.global_thr)[0]


def oktopk_allreduce(
    acc: torch.Tensor,
    k: int,
    st: OkTopkBucket,
    group: dist.ProcessGroup | None = None,
    counter: ByteCounter | None = None,
    *,
    recompute_every: int = 32,
    repartition_every: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ok-Topk sparse all-reduce of ``acc`` (N,): (mean of the globally kept sums (N,), residual (N,))."""
    counter = counter if counter is not None else ByteCounter()
    rank, world = world_of(group)
    n = acc.numel()
    exact = st.step % recompute_every == 0
    idx = _local_select(acc, k, st, exact)  # (n_sel,) ascending
    if st.cuts is None or st.step % repartition_every == 0:
        st.cuts = _repartition(idx, n, world, group, counter)
    region, touched = _reduce_scatter(idx, acc[idx], st.cuts, group, counter)
    sel = _global_select(region, touched, k, st, exact, group, counter)
    lo = int(st.cuts[rank])
    g_idx, g_val = _allgather_pairs((sel + lo).to(torch.int32), region[sel], group, counter)
    out = torch.zeros_like(acc)
    out[g_idx.long()] = g_val  # regions are disjoint: assignment, not addition
    kept = torch.zeros(n, dtype=torch.bool)
    kept[g_idx.long()] = True
    residual = acc.clone()
    residual[idx[kept[idx]]] = 0.0  # zeroed where selected locally and kept globally
    st.step += 1
    st.last_nnz = int(g_idx.numel())
    counter.calls += 1
    return out / world, residual


@dataclass
class SparseHookState:
    """State of the Top-k / Ok-Topk DDP hooks: residual per bucket, counters, options."""

    method: str = "topk"  # topk | oktopk
    density: float = 0.01
    warmup_steps: int = 2  # dense all-reduce first (DDP rebuilds its buckets after the first step)
    recompute_every: int = 32
    repartition_every: int = 64
    group: dist.ProcessGroup | None = None
    counter: ByteCounter = field(default_factory=ByteCounter)
    buckets: dict[int, OkTopkBucket] = field(default_factory=dict)
    step: int = 0

    def __setstate__(self, state: dict[str, object]) -> None:  # DDP may pickle hook states
        self.__dict__.update(state)


def sparse_hook(state: SparseHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: Top-k or Ok-Topk with error feedback on each gradient bucket."""
    buf = bucket.buffer()  # (N,) flat gradients of this bucket
    _, world = world_of(state.group)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    if state.step < state.warmup_steps:
        out = buf.detach().clone().float()
        if world > 1:
            dist.all_reduce(out, group=state.group)
        state.counter.allreduce(out.numel() * 4, world)
        state.counter.calls += 1
        fut.set_result((out / world).to(buf.dtype))
    else:
        st = state.buckets.get(bucket.index())
        if st is None or st.residual.numel() != buf.numel():
            st = state.buckets[bucket.index()] = OkTopkBucket(residual=torch.zeros(buf.numel()))
        acc = buf.detach().float() + st.residual
        k = _k_of(acc.numel(), state.density)
        if state.method == "topk":
            out, st.residual = topk_allreduce(acc, k, state.group, state.counter)
        else:
            out, st.residual = oktopk_allreduce(
                acc,
                k,
                st,
                state.group,
                state.counter,
                recompute_every=state.recompute_every,
                repartition_every=state.repartition_every,
            )
        fut.set_result(out.to(buf.dtype))
    if bucket.is_last():
        state.step += 1
    return fut
