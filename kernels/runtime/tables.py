"""Device-resident int64 metadata tables: upload without host syncs, cache by what they encode.

The grouped kernels read one small int64 table per launch (member shapes and element offsets).
On the eager path the offsets are pointer differences between the members' own tensors, so a
table is a pure function of (shape plan, data pointers): :class:`TableCache` keeps the device copy
keyed by exactly that, and a steady-state training step (the caching allocator hands out the same
addresses every step) uploads nothing at all.  A miss costs one asynchronous host-to-device copy
through pinned memory (no host synchronisation).

Cached tables and cudagraph trees: Inductor's CUDA graphs (``mode="reduce-overhead"``) warm a
graph up, and record it, with every allocation *of the current thread* routed to the graph's
private pool, and refuse a graph that leaves a tensor alive in that pool which is not one of its
outputs.  A table cached on a first call made there would be such a tensor.  So the device copy
of a table made outside capture is allocated by a helper thread (``_alloc_thread``), whose
allocations the routing does not see, and the caller's stream waits for it on an event.  (Without
that, every graph with a grouped op fails with "Detected N tensor(s) in the cudagraph pool not
tracked as outputs".)

CUDA-graph capture: while the current stream is capturing, the pinned caching host allocator must
not be touched (its event queries are illegal during capture) and a table created during capture
holds garbage until the graph is replayed, so it must not be cached.  :func:`upload` therefore
stages tables of captured calls in a pinned *arena* allocated outside capture (the first eager
call allocates it), hands out slices that are never reused (the graph's memcpy node reads them at
every replay), and :func:`capturing` lets callers bypass the cache.  ``CAPTURE_ARENA_BYTES`` (4 MiB)
are available for captures per process (about 170 captured grouped-linear steps at G = 64).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

__all__ = ["TableCache", "upload", "capturing", "stream_key", "stats", "reset_stats", "keep_for_graphs",
           "kept_for_graphs"]

CAPTURE_ARENA_BYTES = 4 << 20

_arena: dict = {}          # device index -> [pinned int64 tensor, next free slot]
# Cached device tensors (tables, fill buffers) that a CUDA graph captured: the graph reads them at
# every replay, so they must outlive the cache that holds them (signature caches are cleared when
# full, plans dropped).  Without this a replay after an eviction reads freed memory, which the
# caching allocator may have handed to another tensor: wrong results or illegal addresses, on the
# GPU only (CPU tests never capture).  Kept for the life of the process; id -> tensor.
_GRAPH_KEEP: dict = {}
_STATS = {"uploads": 0, "captured_uploads": 0, "hits": 0, "misses": 0}


def stats() -> dict:
    """Counters: table uploads (host->device copies), of them made during capture, cache hits / misses."""
    return dict(_STATS)


def reset_stats() -> None:
    for k in _STATS:
        _STATS[k] = 0


def capturing(device: torch.device) -> bool:
    """True while the current CUDA stream of ``device`` is being captured into a CUDA graph."""
    if device.type != "cuda":
        return False
    if device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device.index):  # the query is about the current device's stream
            return torch.cuda.is_current_stream_capturing()
    return torch.cuda.is_current_stream_capturing()


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def keep_for_graphs(t: torch.Tensor, capture: bool) -> torch.Tensor:
    """``t`` (a cached device tensor used by the current call); kept alive for good when the call
    is being captured into a CUDA graph (see ``_GRAPH_KEEP``)."""
    if capture:
        _GRAPH_KEEP[id(t)] = t
    return t


def kept_for_graphs() -> int:
    """How many cached tensors captured graphs keep alive (for tests)."""
    return len(_GRAPH_KEEP)


def stream_key(device: torch.device) -> int:
    """Identity of the current stream (part of the cache key: a table uploaded on one stream is only
    known to be ready on that stream)."""
    if device.type != "cuda":
        return 0
    if _raw_stream is not None:
        return _raw_stream(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream  # pragma: no cover - older torch


def _ensure_arena(device: torch.device):
    idx = device.index if device.index is not None else torch.cuda.current_device()
    a = _arena.get(idx)
    if a is None:
        a = _arena[idx] = [torch.empty(CAPTURE_ARENA_BYTES, dtype=torch.uint8, pin_memory=True), 0]
    return a


def upload(arr: np.ndarray, device: torch.device, capture: Optional[bool] = None) -> torch.Tensor:
    """A device copy of the integer array ``arr`` (int32 / int64); asynchronous, no host
    synchronisation, capture-safe.  ``capture``: whether the current stream is capturing (computed
    when None)."""
    host = torch.from_numpy(np.ascontiguousarray(arr))
    if device.type != "cuda":
        return host.clone()
    if capture is None:
        capture = capturing(device)
    if not capture:
        _STATS["uploads"] += 1
        _ensure_arena(device)  # allocate the capture arena while it is still legal to do so
        pinned = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
        pinned.copy_(host)
        return _copy_outside_graph_pools(pinned, device)
    idx = device.index if device.index is not None else torch.cuda.current_device()
    a = _arena.get(idx)
    if a is None:
        raise RuntimeError(
            "optimus.kernels: the first call of a grouped kernel on this device happens during CUDA-graph "
            "capture; run it once eagerly first (the usual warm-up before capture)")
    nbytes = host.numel() * host.element_size()
    if a[1] + nbytes > CAPTURE_ARENA_BYTES:
        raise RuntimeError(
            f"optimus.kernels: capture arena exhausted ({CAPTURE_ARENA_BYTES} bytes); raise "
            f"optimus.kernels.runtime.tables.CAPTURE_ARENA_BYTES before the first call")
    sl = a[0][a[1]: a[1] + nbytes].view(host.dtype)
    a[1] += (nbytes + 15) // 16 * 16
    sl.copy_(host.reshape(-1))
    out = torch.empty(host.shape, dtype=host.dtype, device=device)
    out.view(-1).copy_(sl, non_blocking=True)
    _STATS["captured_uploads"] += 1
    return out


_executor = None


def _alloc_thread():
    """One daemon worker thread (see the module docstring: its allocations escape the
    per-thread routing of cudagraph trees to a graph pool)."""
    global _executor
    if _executor is None:
        from concurrent.futures import ThreadPoolExecutor

        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="optimus-kernel-tables")
    return _executor


def _copy_outside_graph_pools(pinned: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``pinned`` copied to ``device``, allocated by the helper thread on its own stream;
    the current stream waits for the copy (no host synchronisation)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()

    def copy():
        with torch.cuda.device(idx):
            out = torch.empty(pinned.shape, dtype=pinned.dtype, device=device)
            out.copy_(pinned, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            return out, done

    out, done = _alloc_thread().submit(copy).result()
    consumer = torch.cuda.current_stream(idx)
    consumer.wait_event(done)
    out.record_stream(consumer)  # freed (cache eviction) only once the consumer is done with it
    return out


class TableCache:
    """key -> entry (a tuple holding device tables and launch facts), bounded; never used during capture."""

    def __init__(self, capacity: int = 1024):
        self.capacity = capacity
        self._d: dict = {}
        self.enabled = True

    def get(self, key):
        if not self.enabled:
            return None
        e = self._d.get(key)
        if e is None:
            _STATS["misses"] += 1
        else:
            _STATS["hits"] += 1
        return e

    def put(self, key, entry) -> None:
        if not self.enabled:
            return
        if len(self._d) >= self.capacity:
            # drop the oldest half (dicts keep insertion order)
            for k in list(self._d)[: self.capacity // 2]:
                del self._d[k]
        self._d[key] = entry

    def clear(self) -> None:
        self._d.clear()

    def __len__(self) -> int:
        return len(self._d)
