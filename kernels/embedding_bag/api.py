"""The public function of the grouped embedding bag: validation, normalisation, and which path a
call takes.

The public function :func:`grouped_embedding_bag` takes either a list of per-table
``F.embedding_bag`` inputs or the packed (KeyedJaggedTensor-style) form, validates everything with
messages that name the table, normalises (mixed index dtypes, per-table offsets, fixed bag sizes)
and calls the op.

Eager calls with the Triton kernels take the eager fast path (``eager.py``); traced calls and the
plain-torch path call ``torch.ops.optimus.grouped_embedding_bag`` (``op.py``).
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Union

import torch
from torch import Tensor

from ..runtime.checks import ALLOWED_DTYPES, PLAIN_TYPES, is_tracing, triton_ok
from . import op  # noqa: F401  (importing registers the optimus:: ops)
from .eager import _PLANS, _EagerPlan, _eager_packed, _fast_key, _geb_apply, _put_plan
from .reference import host_check

__all__ = ["grouped_embedding_bag", "MODES"]

FN = "grouped_embedding_bag"
MODES = {"sum": 0, "mean": 1, "embedding": 2}
KEY_PIECE_ENV = "OPTIMUS_EMB_KEY_PIECE"


def key_piece() -> int:
    """Index entries per piece of the deterministic backward with fixed bags, whose key and sort
    buffers hold one piece at a time: ``OPTIMUS_EMB_KEY_PIECE``, else 65,536 (about 2.8 MiB of
    buffers). The kernels read it once; the graph rule's memory estimate reads it too."""
    return int(os.environ.get(KEY_PIECE_ENV) or 1 << 16)


def table_pieces(entries: Sequence[int], cap: Optional[int] = None) -> List[tuple]:
    """The runs of consecutive tables ``(first, end)`` the deterministic backward sorts one at a
    time (fixed bags): as many tables as fit ``cap`` index entries together (default
    ``key_piece()``); a larger table is a run of its own."""
    cap = key_piece() if cap is None else cap
    out, first, total = [], 0, 0
    for t, n in enumerate(entries):
        if total and total + n > cap:
            out.append((first, t))
            first, total = t, 0
        total += n
    out.append((first, len(entries)))
    return out


_INDEX_DTYPES = (torch.int32, torch.int64)


def _per_table(value, T, name, kinds):
    """A per-table list from a scalar or a length-T sequence."""
    if isinstance(value, (list, tuple)):
        if len(value) != T:
            raise ValueError(f"{FN}: {name} has {len(value)} entries for {T} tables")
        out = list(value)
    else:
        out = [value] * T
    for t, v in enumerate(out):
        if not isinstance(v, kinds) or (bool not in kinds and isinstance(v, bool)):
            raise TypeError(f"{FN}: {name}[{t}] = {v!r} has type {type(v).__name__}")
    return out


def _mode_codes(mode, T) -> List[int]:
    modes = _per_table(mode, T, "mode", (str,))
    codes = []
    for t, m in enumerate(modes):
        ml = m.lower()
        if ml == "max":
            raise ValueError(f"{FN}: mode[{t}] = 'max' is not supported (sum, mean, embedding)")
        if ml not in MODES:
            raise ValueError(f"{FN}: mode[{t}] = {m!r}; expected 'sum', 'mean' or 'embedding'")
        codes.append(MODES[ml])
    return codes


def _pad_codes(padding_idx, weights) -> List[int]:
    T = len(weights)
    if isinstance(padding_idx, (list, tuple)):
        if len(padding_idx) != T:
            raise ValueError(f"{FN}: padding_idx has {len(padding_idx)} entries for {T} tables")
        pads = list(padding_idx)
    else:
        pads = [padding_idx] * T
    out = []
    for t, (p, w) in enumerate(zip(pads, weights)):
        if p is None:
            out.append(-1)
            continue
        if isinstance(p, bool) or not isinstance(p, int):
            raise TypeError(f"{FN}: padding_idx[{t}] must be an int or None, got {type(p).__name__}")
        n = w.shape[0]
        if not (-n <= p < n):
            raise ValueError(f"{FN}: table {t}: padding_idx {p} must be within num_embeddings ({n})")
        out.append(p + n if p < 0 else p)
    return out


def _check_weights(weights):
    if isinstance(weights, Tensor) or not isinstance(weights, (list, tuple)):
        raise TypeError(f"{FN}: weights must be a list or tuple of [N_t, D_t] tensors, got {type(weights).__name__}")
    if len(weights) == 0:
        raise ValueError(f"{FN}: empty list of tables (weights)")
    w0 = weights[0]
    if not isinstance(w0, Tensor):
        raise TypeError(f"{FN}: weights[0] is a {type(w0).__name__}, not a tensor")
    if w0.dtype not in ALLOWED_DTYPES:
        raise TypeError(f"{FN}: weights[0] has dtype {w0.dtype}; supported: float16, bfloat16, float32 "
                        f"(float64 on the plain-torch path)")
    for t, w in enumerate(weights):
        if not isinstance(w, Tensor):
            raise TypeError(f"{FN}: weights[{t}] is a {type(w).__name__}, not a tensor")
        if w.dim() != 2:
            raise ValueError(f"{FN}: weights[{t}] must be 2-D [num_embeddings, dim], got shape {tuple(w.shape)}")
        if w.dtype != w0.dtype:
            raise TypeError(f"{FN}: weights[{t}] has dtype {w.dtype} but weights[0] has {w0.dtype}; "
                            f"all tables must share one dtype")
        if w.device != w0.device:
            raise ValueError(f"{FN}: weights[{t}] is on {w.device} but weights[0] is on {w0.device}")
        if not w.is_contiguous():
            raise ValueError(f"{FN}: weights[{t}] is not contiguous (stride {w.stride()}); the gradient is "
                             f"produced in the contiguous [N, D] layout")
    return w0


def _check_index_tensor(name, x, device, dims=(1,)):
    if not isinstance(x, Tensor):
        raise TypeError(f"{FN}: {name} is a {type(x).__name__}, not a tensor")
    if x.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{FN}: {name} has dtype {x.dtype}; indices and offsets must be int32 or int64")
    if x.device != device:
        raise ValueError(f"{FN}: {name} is on {x.device} but the weights are on {device}")
    if x.dim() not in dims:
        raise ValueError(f"{FN}: {name} must be {' or '.join(f'{d}-D' for d in dims)}, got shape {tuple(x.shape)}")


def _check_psw(name, p, like_shape, w0):
    if not isinstance(p, Tensor):
        raise TypeError(f"{FN}: {name} is a {type(p).__name__}, not a tensor")
    if p.dtype != w0.dtype:
        raise TypeError(f"{FN}: {name} has dtype {p.dtype}; per-sample weights need the weights' dtype {w0.dtype}")
    if p.device != w0.device:
        raise ValueError(f"{FN}: {name} is on {p.device} but the weights are on {w0.device}")
    if tuple(p.shape) != tuple(like_shape):
        raise ValueError(f"{FN}: {name} has shape {tuple(p.shape)} but its indices have shape {tuple(like_shape)}")


def _from_lists(weights, indices, offsets, psw, modes, include_last_offset):
    """Per-table F.embedding_bag inputs -> (indices, offsets or None, psw, bag_sizes, index_counts)."""
    T = len(weights)
    w0 = weights[0]
    dev = w0.device
    if len(indices) != T:
        raise ValueError(f"{FN}: got {T} tables but {len(indices)} index tensors")
    if offsets is not None and (isinstance(offsets, Tensor) or len(offsets) != T):
        raise ValueError(f"{FN}: with per-table indices, offsets must be None or a list of {T} entries "
                         f"(None for 2-D indices)")
    if psw is not None and (isinstance(psw, Tensor) or len(psw) != T):
        raise ValueError(f"{FN}: with per-table indices, per_sample_weights must be None or a list of {T} entries")
    offs = list(offsets) if offsets is not None else [None] * T
    psws = list(psw) if psw is not None else [None] * T
    B = None
    fixed = []
    for t in range(T):
        x, o = indices[t], offs[t]
        if o is None:
            _check_index_tensor(f"indices[{t}]", x, dev, dims=(2,))
            b, L = x.shape
            fixed.append(L)
        else:
            _check_index_tensor(f"indices[{t}]", x, dev, dims=(1,))
            _check_index_tensor(f"offsets[{t}]", o, dev, dims=(1,))
            b = o.shape[0] - (1 if include_last_offset else 0)
            if include_last_offset and o.shape[0] < 1:
                raise ValueError(f"{FN}: offsets[{t}] is empty but include_last_offset=True needs B + 1 entries")
            fixed.append(None)
        if B is None:
            B = b
        elif b != B:
            raise ValueError(f"{FN}: table {t} has {b} bags but table 0 has {B}; all tables need the same batch")
        if psws[t] is not None:
            _check_psw(f"per_sample_weights[{t}]", psws[t], x.shape, w0)
            if modes[t] != MODES["sum"]:
                raise ValueError(f"{FN}: table {t}: per_sample_weights are only supported with mode 'sum'")
    idx_dtype = indices[0].dtype if all(x.dtype == indices[0].dtype for x in indices) else torch.int64
    flat = [x.reshape(-1) for x in indices]
    counts = [x.numel() for x in flat]
    cat_idx = torch.cat([x.to(idx_dtype) for x in flat]) if T > 1 else flat[0].to(idx_dtype)
    cat_psw = None
    if any(p is not None for p in psws):
        cat_psw = torch.cat([(p.reshape(-1) if p is not None else torch.ones(n, dtype=w0.dtype, device=dev))
                             for p, n in zip(psws, counts)])
    if all(L is not None for L in fixed) and sum(fixed) > 0:
        return cat_idx, None, cat_psw, fixed, counts, B
    # jagged (or every bag size 0): global offsets over the concatenated indices
    parts, base = [], 0
    for t in range(T):
        if fixed[t] is not None:
            parts.append(torch.arange(B, device=dev, dtype=torch.int64) * fixed[t] + base)
        else:
            o = offs[t][:B] if include_last_offset else offs[t]
            parts.append(o.to(torch.int64) + base)
        base += counts[t]
    parts.append(torch.full((1,), base, dtype=torch.int64, device=dev))
    return cat_idx, torch.cat(parts), cat_psw, [], counts, B


def grouped_embedding_bag(
    weights: Sequence[Tensor],
    indices: Union[Tensor, Sequence[Tensor]],
    offsets: Union[Tensor, Sequence[Optional[Tensor]], None] = None,
    per_sample_weights: Union[Tensor, Sequence[Optional[Tensor]], None] = None,
    *,
    mode: Union[str, Sequence[str]] = "mean",
    padding_idx: Union[int, None, Sequence[Optional[int]]] = None,
    sparse: Union[bool, Sequence[bool]] = False,
    bag_size: Union[int, Sequence[int], None] = None,
    include_last_offset: bool = False,
    deterministic: bool = True,
    check_indices: Optional[bool] = None,
    index_counts: Optional[Sequence[int]] = None,
    max_norm: Optional[float] = None,
    scale_grad_by_freq: bool = False,
) -> Tensor:
    """T embedding-bag lookups over tables of different sizes and dims in one kernel.

    Returns ``out`` [B, sum_t D_t]: table t's pooled output is the column slice
    ``out[:, col_t : col_t + D_t]`` (``col_t = D_0 + ... + D_{t-1}``), i.e. ``out`` equals
    ``torch.cat([F.embedding_bag(indices[t], weights[t], offsets[t], mode=mode[t], ...)
    for t in range(T)], dim=1)``; ``out.split(dims, dim=1)`` gives the per-table views.

    Two input forms:

    * **per table** (a list of ``F.embedding_bag`` inputs): ``indices[t]`` is 1-D with
      ``offsets[t]`` (B entries, or B + 1 with ``include_last_offset``), or 2-D [B, L_t] with
      ``offsets[t] = None`` (fixed bag size L_t; [B, 1] with mode "embedding" is ``F.embedding``);
      ``per_sample_weights`` None or a list with entries None or shaped like ``indices[t]``.
      Index tensors of mixed int32 / int64 dtypes are converted to int64.
    * **packed** (TorchRec KeyedJaggedTensor layout, no copies): ``indices`` one 1-D tensor, the
      tables' indices concatenated; ``offsets`` one 1-D tensor of T * B + 1 global bag boundaries
      (``kjt.values()``, ``kjt.offsets()``), or ``offsets=None`` with ``bag_size`` (int or per
      table); ``per_sample_weights`` None or 1-D like ``indices``.

    ``mode`` ("mean" by default, as in ``F.embedding_bag``; "sum"; "embedding"), ``padding_idx``
    (int or None) and ``sparse`` are one value or one per table.  "embedding" follows ``F.embedding``: the padding row is returned in the
    forward and gets no gradient; "sum" / "mean" skip padding entries like ``F.embedding_bag``
    (mean divides by the non-padding count); empty bags give zeros.  Per-sample weights: "sum" only.

    Gradients: each weight gets a dense [N_t, D_t] gradient, or for ``sparse`` tables an
    (uncoalesced) sparse COO gradient with one row per index entry (padding entries are zero rows at
    ``padding_idx``; eager only).  ``deterministic=True`` (default) reduces sorted segments (bitwise
    reproducible); ``False`` uses fp32 atomics (faster when few rows repeat).  Accumulation is fp32
    for 16-bit weights.

    Bad input raises ``ValueError`` / ``TypeError`` / ``IndexError`` naming the table.  Index
    ranges and offsets are checked on the host when the tensors are on the CPU (``check_indices``
    None or True) and on CUDA only with ``check_indices=True`` (one synchronisation); unchecked,
    the kernels never access memory out of bounds: out-of-range indices contribute nothing and get
    no gradient.  ``index_counts`` (packed form with offsets and sparse tables): entries per table;
    computed from ``offsets`` when omitted (one synchronisation on CUDA).  ``max_norm`` and
    ``scale_grad_by_freq`` are not supported (error).
    """
    fast_key = None
    if max_norm is None and not scale_grad_by_freq and isinstance(indices, Tensor):
        fast_key = _fast_key(weights, indices, offsets, per_sample_weights, mode, padding_idx, sparse, bag_size,
                             deterministic, check_indices)
        if fast_key is not None:
            plan = _PLANS.get(fast_key)
            if plan is not None:
                out = _eager_packed(plan, weights, indices, offsets, per_sample_weights, index_counts)
                if out is not None:
                    return out
    if max_norm is not None:
        raise ValueError(f"{FN}: max_norm is not supported (it renormalises weight rows in place during the "
                         f"lookup); use F.embedding_bag")
    if scale_grad_by_freq:
        raise ValueError(f"{FN}: scale_grad_by_freq is not supported; use F.embedding_bag")
    w0 = _check_weights(weights)
    T = len(weights)
    dev = w0.device
    modes = _mode_codes(mode, T)
    pads = _pad_codes(padding_idx, weights)
    sparse_l = [bool(s) for s in _per_table(sparse, T, "sparse", (bool,))]
    if not isinstance(deterministic, bool):
        raise TypeError(f"{FN}: deterministic must be a bool, got {type(deterministic).__name__}")
    per_table_offsets = None
    if isinstance(indices, (list, tuple)):
        if bag_size is not None:
            raise ValueError(f"{FN}: bag_size is for the packed form; per-table fixed bags are 2-D indices")
        per_table_offsets = list(offsets) if isinstance(offsets, (list, tuple)) else None
        idx, off, psw, bag_sizes, counts, B = _from_lists(weights, indices, offsets, per_sample_weights, modes,
                                                          include_last_offset)
    else:
        _check_index_tensor("indices", indices, dev, dims=(1,))
        idx, psw = indices, per_sample_weights
        if psw is not None:
            if isinstance(psw, (list, tuple)):
                raise TypeError(f"{FN}: with packed indices, per_sample_weights must be one tensor like indices")
            _check_psw("per_sample_weights", psw, idx.shape, w0)
            bad = [t for t in range(T) if modes[t] != MODES["sum"]]
            if bad:
                raise ValueError(f"{FN}: table {bad[0]}: per_sample_weights are only supported with mode 'sum'")
        counts = list(index_counts) if index_counts is not None else None
        if offsets is not None:
            if bag_size is not None:
                raise ValueError(f"{FN}: give offsets or bag_size, not both")
            _check_index_tensor("offsets", offsets, dev, dims=(1,))
            if offsets.numel() < 1 or (offsets.numel() - 1) % T:
                raise ValueError(f"{FN}: packed offsets must have T * B + 1 entries (T = {T}), got {offsets.numel()}")
            off, bag_sizes = offsets, []
            B = (offsets.numel() - 1) // T
        else:
            if bag_size is None:
                raise ValueError(f"{FN}: packed indices need offsets (T * B + 1 entries) or bag_size")
            bag_sizes = [int(v) for v in _per_table(bag_size, T, "bag_size", (int,))]
            if any(v < 0 for v in bag_sizes):
                raise ValueError(f"{FN}: bag_size must be >= 0, got {bag_sizes}")
            s = sum(bag_sizes)
            if s == 0 or idx.numel() % s:
                raise ValueError(f"{FN}: {idx.numel()} indices is not B * sum(bag_size) = B * {s}")
            off = None
            B = idx.numel() // s
            counts = [B * v for v in bag_sizes]
        if counts is not None and len(counts) != T:
            raise ValueError(f"{FN}: index_counts has {len(counts)} entries for {T} tables")
    tensors = [*weights, idx, off, psw]
    tracing = is_tracing(tensors)
    if tracing and any(sparse_l):
        raise ValueError(f"{FN}: sparse gradients are not supported under torch.compile / tracing; use dense "
                         f"gradients (sparse=False) in compiled code")
    if check_indices is None:
        check_indices = dev.type == "cpu"
    if check_indices and not tracing:
        host_check(weights, idx, off, bag_sizes, per_table_offsets, counts, include_last_offset)
    if any(sparse_l) and off is not None and counts is None:
        bnd = off[:: B].tolist() if B else [0] * (T + 1)  # one synchronisation on CUDA
        counts = [int(bnd[t + 1]) - int(bnd[t]) for t in range(T)]
    ic = [int(c) for c in counts] if (any(sparse_l) and off is not None) else []
    if off is None and not idx.is_contiguous():
        idx = idx.contiguous()
    if not tracing and triton_ok(w0) and all(t is None or type(t) in PLAIN_TYPES for t in tensors):
        plan = _EagerPlan(weights, modes, pads, bag_sizes, sparse_l, deterministic, bool(check_indices))
        if fast_key is not None:
            _put_plan(fast_key, plan)
        return _geb_apply(plan, ic, idx, off, psw, weights)
    return torch.ops.optimus.grouped_embedding_bag(list(weights), idx, off, psw, modes, pads, bag_sizes, sparse_l,
                                                   deterministic, ic)
