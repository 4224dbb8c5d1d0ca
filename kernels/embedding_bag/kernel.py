"""Grouped embedding bag: T tables of different sizes and dims pooled in one launch, with backward.

Math
----
Table t has weight ``W_t`` (N_t x D_t) and B bags; bag b of table t holds the index entries
``j in [s_tb, e_tb)`` of the concatenated index tensor.  With ``ok_j`` = "index in [0, N_t) and not
the padding index" (``embedding`` mode: the padding index counts in the forward, as in F.embedding)
and the per-entry scale ``c_j`` (``psw_j`` for sum tables with per-sample weights, else 1)::

    out[b, col_t + d] = sum_{j in bag, ok_j} c_j W_t[idx_j, d]                   (sum, embedding)
                      = (1 / max(1, #{ok_j})) sum_{j in bag, ok_j} W_t[idx_j, d]  (mean)

``col_t = D_0 + ... + D_{t-1}``: the T pooled outputs sit side by side in ONE ``[B, sum D_t]``
buffer (table t's output is the column slice ``[:, col_t : col_t + D_t]``).  Backward, with
``g_j = dout[bag(j), col_t:col_t+D_t]`` and ``a_j`` = ``c_j`` (sum) or ``1/#ok`` (mean), padding
entries never contributing::

    dW_t[r]  = sum_{j: idx_j = r} a_j g_j          (dense, in W_t's own [N_t, D_t] layout)
    sparse   : one COO row (idx_j, a_j g_j) per index entry of the table (uncoalesced, like
               F.embedding_bag(sparse=True); padding entries become zero rows at padding_idx)
    dpsw_j   = <g_j, W_t[idx_j]>                   (sum tables; 0 elsewhere)

Memory plan
-----------
* Metadata: one int64 row per table (``C_*`` columns: N, D, the weight's element offset from
  ``weights[0]``, output column, mode, padding index, width class, fixed bag size, dense-gradient
  offset, row base for sort keys, sparse-buffer offsets), built on the host and cached on the device
  per (signature, weight pointers): weights are parameters, so a training step uploads nothing.
* Tiles: the forward grid has one program per (table, bag block, D block) tile; a cached int64 array
  (per signature and batch size B) maps program id -> (table, local tile), so a program finds its
  table with one load.  A table's width class ``BLOCK_D = 16 << cls >= D_t`` (<= 256; wider
  tables get several D blocks) fixes the tile: ``BLOCK_B = E / BLOCK_D`` bags x ``BLOCK_D``
  columns (``E`` elements per tile), so narrow and wide tables both fill the tile.  The kernel
  branches on the class at run time (only the classes present are compiled in).
* Forward tile: per bag the [start, end) range (offsets, or fixed bag size), then a loop over the
  longest bag of the tile; each step gathers two entries per bag (2 x ``BLOCK_B`` weight rows of
  ``BLOCK_D``, masked) and loads the next step's indices before this step's rows, so the index
  latency hides behind the row gathers; rows are read with 16-byte vector loads when every dim,
  offset and pointer is 16-byte aligned (``ALIGN``), accumulated in fp32 registers, stored once in
  the weight dtype.  Reads: the gathered rows + indices + offsets; writes: the output once.
* Backward, deterministic (default): a walk kernel over (table, bag block) tiles writes per index
  entry a sort key ``rbase_t + idx`` (global row; a sentinel for padding / out-of-range / sparse
  entries), its global bag id and its scale ``a_j``; ``torch.sort(stable=True)`` groups equal rows
  (stable: inside a segment the order is the entry order, so the sums are bitwise reproducible); a
  segment kernel takes C consecutive sorted positions per program, makes every segment that starts
  there a row of its [C, BLOCK_D] tile, and sums the segment's rows ``a_j g_j`` in order in fp32,
  stepping past the chunk end when the segment does, then writes each gradient row once (no
  atomics).  Its step count is the longest segment of the chunk: a row hit by a large share of all
  entries costs its program a long sequential loop (a known load-balance limit for extremely hot
  rows).  With fixed bags the entries go through this in pieces of whole tables (at most
  ``key_piece`` entries, ``EBSignature.key_pieces``): a table's keys lie in its own row range, so
  the pieces sorted one by one give one sort's order, and the key and sort buffers hold one
  piece at a time.  Launches: memset of the dense gradients, then per piece key fill, walk, sort
  (torch), segment.
* The output gradient is read at its row stride (the slice of a ``cat``'s gradient, uncopied).
* Backward, atomic (``deterministic=False``): the walk kernel adds ``a_j g_j`` into an fp32
  accumulator with ``tl.atomic_add`` (the dout tile is loaded once per tile); fp32 weights
  accumulate into the gradient itself, 16-bit weights into an fp32 workspace that is cast once.
  Launches: memset, walk (+ cast).
* Sparse tables and per-sample-weight gradients are produced by the walk kernel in both modes
  (values ``a_j g_j`` per entry; ``<g_j, W_t[idx_j]>``).
* Bad input never reads or writes out of bounds: bag bounds are clamped to [0, len(indices)],
  out-of-range indices are masked (they contribute nothing and get no gradient), bag / table ids
  read back in the segment kernel are range-checked.  The host-side checks that raise are in
  ``api.py`` and ``reference.py``.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import torch
import triton
import triton.language as tl

from ..runtime import tables as _dt
from ..runtime.backend import device_guard, interpret_mode, next_pow2
from ..runtime.layout import unit_stride_rows
from .api import key_piece, table_pieces

# ---------------------------------------------------------------------------------------------
# metadata table layout: int64 [T, NCOL], one row per table
# ---------------------------------------------------------------------------------------------
NCOL = 16
C_N = tl.constexpr(0)
C_D = tl.constexpr(1)
C_WOFF = tl.constexpr(2)    # element offset of weights[t] from weights[0]
C_COL = tl.constexpr(3)     # first output column
C_MODE = tl.constexpr(4)
C_PAD = tl.constexpr(5)     # padding index or -1
C_CLS = tl.constexpr(6)     # width class: BLOCK_D = 16 << cls
C_BAGL = tl.constexpr(7)    # fixed bag size (fixed mode)
C_IBASE = tl.constexpr(8)   # fixed mode: first entry of the table = IBASE * B
C_GOFF = tl.constexpr(9)    # dense gradient element offset (flat buffer) or -1
C_RBASE = tl.constexpr(10)  # global row base (sort keys)
C_SPARSE = tl.constexpr(11)  # 1: sparse gradient wanted
C_SPROW = tl.constexpr(12)  # first row of the table in the sparse buffers
C_SPLEN = tl.constexpr(13)  # number of entries (rows) of the table in the sparse buffers
C_SPVAL = tl.constexpr(14)  # first element of the table in the sparse values buffer
NCOL_C = tl.constexpr(NCOL)
COL = dict(N=0, D=1, WOFF=2, COL=3, MODE=4, PAD=5, CLS=6, BAGL=7, IBASE=8, GOFF=9, RBASE=10,
           SPARSE=11, SPROW=12, SPLEN=13, SPVAL=14)

MODE_SUM = tl.constexpr(0)
MODE_MEAN = tl.constexpr(1)
MODE_EMB = tl.constexpr(2)
MODES = {"sum": 0, "mean": 1, "embedding": 2}

NCLS = 5            # width classes 16, 32, 64, 128, 256
MAX_BLOCK_D = 256
TILE_SHIFT = 20     # tile entry = table | (local tile << TILE_SHIFT)
TILE_SHIFT_C = tl.constexpr(TILE_SHIFT)
TILE_MASK_C = tl.constexpr((1 << TILE_SHIFT) - 1)

_INTERPRET = interpret_mode()


# Only Triton builtins and this module's own jitted helpers are called in the kernels (no tl.sum,
# tl.max, tl.cumsum: @jit functions of triton.language), so the interpreter runs them even when
# triton was imported before TRITON_INTERPRET was set (see docs/kernels.md, interpreter rules).
@triton.jit
def _max_c(a, b):
    return tl.maximum(a, b)


# Reductions use Triton's own sum / max combiners, which the interpreter maps to numpy.sum /
# numpy.max (a combiner of our own runs element by element in Python there).
_SUM = tl.standard._sum_combine
_MAX = getattr(tl.standard, "_elementwise_max", _max_c)


@triton.jit
def _bag_bounds(off_ptr, row, t, bags, bmask, B, NIDX, HAS_OFFSETS: tl.constexpr):
    """[start, end) of every bag of the tile, clamped to [0, NIDX]; masked bags are empty."""
    if HAS_OFFSETS:
        g = t.to(tl.int64) * B + bags
        s = tl.load(off_ptr + g, mask=bmask, other=0).to(tl.int64)
        e = tl.load(off_ptr + g + 1, mask=bmask, other=0).to(tl.int64)
    else:
        bag_l = tl.load(row + C_BAGL)
        base = tl.load(row + C_IBASE) * B
        s = base + bags.to(tl.int64) * bag_l
        e = s + bag_l
    s = tl.minimum(tl.maximum(s, 0), NIDX)
    e = tl.minimum(tl.maximum(e, s), NIDX)
    e = tl.where(bmask, e, s)
    return s, e


@triton.jit
def _table_first(off_ptr, row, t, B, NIDX, HAS_OFFSETS: tl.constexpr):
    """First index entry of table t (clamped)."""
    if HAS_OFFSETS:
        f = tl.load(off_ptr + t.to(tl.int64) * B).to(tl.int64)
    else:
        f = tl.load(row + C_IBASE) * B
    return tl.minimum(tl.maximum(f, 0), NIDX)


# ---------------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------------
@triton.jit
def _fwd_row(w_ptr, w_off, psw_ptr, idx, j, e, N, D, pad_f, mode, cols, cmask, HAS_PSW: tl.constexpr):
    """One index entry per bag: its weight row (times its per-sample weight) and whether it counts."""
    ok = (j < e) & (idx >= 0) & (idx < N) & (idx != pad_f)
    v = tl.load(w_ptr + w_off + idx[:, None] * D + cols[None, :], mask=ok[:, None] & cmask[None, :],
                other=0.0).to(tl.float32)
    if HAS_PSW:
        p = tl.load(psw_ptr + j, mask=ok, other=0.0).to(tl.float32)
        p = tl.where(mode == MODE_SUM, p, 1.0)
        v = v * p[:, None]
    return v, ok.to(tl.float32)


@triton.jit
def _fwd_tile(w_ptr, idx_ptr, off_ptr, psw_ptr, out_ptr, row, t, local, B, SUMD, NIDX,
              HAS_OFFSETS: tl.constexpr, HAS_PSW: tl.constexpr, ALIGN: tl.constexpr,
              BB: tl.constexpr, BD: tl.constexpr):
    N = tl.load(row + C_N)
    D = tl.load(row + C_D)
    w_off = tl.load(row + C_WOFF)
    col = tl.load(row + C_COL)
    mode = tl.load(row + C_MODE)
    pad = tl.load(row + C_PAD)
    sumd = SUMD
    if ALIGN > 1:
        D = tl.multiple_of(D, ALIGN)
        w_off = tl.multiple_of(w_off, ALIGN)
        col = tl.multiple_of(col, ALIGN)
        sumd = tl.multiple_of(sumd, ALIGN)
    n_db = (D + BD - 1) // BD
    bblk = local // n_db
    d0 = (local - bblk * n_db) * BD
    bags = bblk * BB + tl.arange(0, BB)
    bmask = bags < B
    s, e = _bag_bounds(off_ptr, row, t, bags, bmask, B, NIDX, HAS_OFFSETS)
    maxlen = tl.reduce(e - s, 0, _MAX)
    cols = d0 + tl.arange(0, BD)
    cmask = cols < D
    acc = tl.full((BB, BD), 0.0, tl.float32)
    cnt = tl.full((BB,), 0.0, tl.float32)
    pad_f = tl.where(mode == MODE_EMB, -1, pad)  # embedding mode: the padding row counts in the forward
    # two entries per bag per step, and the next step's indices loaded before this step's rows:
    # 2 * BLOCK_B row gathers in flight, the index latency hidden behind them
    nxt_a = tl.load(idx_ptr + s, mask=s < e, other=-1)
    nxt_b = tl.load(idx_ptr + s + 1, mask=(s + 1) < e, other=-1)
    for l in range(0, maxlen, 2):
        j = s + l
        xa = nxt_a.to(tl.int64)
        xb = nxt_b.to(tl.int64)
        nxt_a = tl.load(idx_ptr + j + 2, mask=(j + 2) < e, other=-1)
        nxt_b = tl.load(idx_ptr + j + 3, mask=(j + 3) < e, other=-1)
        va, oka = _fwd_row(w_ptr, w_off, psw_ptr, xa, j, e, N, D, pad_f, mode, cols, cmask, HAS_PSW)
        vb, okb = _fwd_row(w_ptr, w_off, psw_ptr, xb, j + 1, e, N, D, pad_f, mode, cols, cmask, HAS_PSW)
        acc += va + vb
        cnt += oka + okb
    inv = tl.where(mode == MODE_MEAN, 1.0 / tl.maximum(cnt, 1.0), 1.0)
    acc = acc * inv[:, None]
    out_idx = bags[:, None].to(tl.int64) * sumd + col + cols[None, :]
    tl.store(out_ptr + out_idx, acc.to(out_ptr.dtype.element_ty), mask=bmask[:, None] & cmask[None, :])


@triton.jit(do_not_specialize=["B", "NIDX"])
def _emb_fwd_kernel(w_ptr, idx_ptr, off_ptr, psw_ptr, out_ptr, meta_ptr, tiles_ptr, B, SUMD, NIDX,
                    HAS_OFFSETS: tl.constexpr, HAS_PSW: tl.constexpr, ALIGN: tl.constexpr,
                    CLASSES: tl.constexpr, BB0: tl.constexpr, BB1: tl.constexpr, BB2: tl.constexpr,
                    BB3: tl.constexpr, BB4: tl.constexpr):
    pid = tl.program_id(0)
    ent = tl.load(tiles_ptr + pid)
    t = (ent & TILE_MASK_C).to(tl.int32)
    local = (ent >> TILE_SHIFT_C).to(tl.int32)
    row = meta_ptr + t * NCOL_C
    cls = tl.load(row + C_CLS)
    if CLASSES & 1:
        if cls == 0:
            _fwd_tile(w_ptr, idx_ptr, off_ptr, psw_ptr, out_ptr, row, t, local, B, SUMD, NIDX,
                      HAS_OFFSETS, HAS_PSW, ALIGN, BB0, 16)
    if CLASSES & 2:
        if cls == 1:
            _fwd_tile(w_ptr, idx_ptr, off_ptr, psw_ptr, out_ptr, row, t, local, B, SUMD, NIDX,
                      HAS_OFFSETS, HAS_PSW, ALIGN, BB1, 32)
    if CLASSES & 4:
        if cls == 2:
            _fwd_tile(w_ptr, idx_ptr, off_ptr, psw_ptr, out_ptr, row, t, local, B, SUMD, NIDX,
                      HAS_OFFSETS, HAS_PSW, ALIGN, BB2, 64)
    if CLASSES & 8:
        if cls == 3:
            _fwd_tile(w_ptr, idx_ptr, off_ptr, psw_ptr, out_ptr, row, t, local, B, SUMD, NIDX,
                      HAS_OFFSETS, HAS_PSW, ALIGN, BB3, 128)
    if CLASSES & 16:
        if cls == 4:
            _fwd_tile(w_ptr, idx_ptr, off_ptr, psw_ptr, out_ptr, row, t, local, B, SUMD, NIDX,
                      HAS_OFFSETS, HAS_PSW, ALIGN, BB4, 256)


# ---------------------------------------------------------------------------------------------
# backward pass 1: walk the bags (atomic accumulation, or sort keys; sparse rows; dpsw)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _walk_tile(w_ptr, idx_ptr, off_ptr, psw_ptr, dout_ptr, ws_ptr, key_ptr, bag_ptr, scale_ptr,
               spv_ptr, spr_ptr, pswg_ptr, row, t, bblk, B, GSTRIDE, NIDX, SENT, E0,
               ATOMIC: tl.constexpr, KEYS: tl.constexpr, HAS_OFFSETS: tl.constexpr, HAS_PSW: tl.constexpr,
               NEED_PSWG: tl.constexpr, HAS_SPARSE: tl.constexpr, ALIGN: tl.constexpr,
               BB: tl.constexpr, BD: tl.constexpr):
    N = tl.load(row + C_N)
    D = tl.load(row + C_D)
    w_off = tl.load(row + C_WOFF)
    col = tl.load(row + C_COL)
    mode = tl.load(row + C_MODE)
    pad = tl.load(row + C_PAD)
    goff = tl.load(row + C_GOFF)
    rbase = tl.load(row + C_RBASE)
    is_sp = tl.load(row + C_SPARSE) != 0
    gstride = GSTRIDE
    dense = goff >= 0
    # goff is -1 for tables without a dense gradient: clamp before the hint (a false multiple_of is
    # undefined behaviour on the GPU; the interpreter ignores hints, so no CPU test would notice)
    goff = tl.maximum(goff, 0)
    if ALIGN > 1:
        D = tl.multiple_of(D, ALIGN)
        w_off = tl.multiple_of(w_off, ALIGN)
        col = tl.multiple_of(col, ALIGN)
        gstride = tl.multiple_of(gstride, ALIGN)
        goff = tl.multiple_of(goff, ALIGN)
    bags = bblk * BB + tl.arange(0, BB)
    bmask = bags < B
    s, e = _bag_bounds(off_ptr, row, t, bags, bmask, B, NIDX, HAS_OFFSETS)
    maxlen = tl.reduce(e - s, 0, _MAX)
    # a_j without the per-sample weight: 1 / #ok for mean bags, else 1
    inv = tl.full((BB,), 1.0, tl.float32)
    if mode == MODE_MEAN:
        cnt = tl.full((BB,), 0.0, tl.float32)
        for l in range(0, maxlen):
            j = s + l
            m = j < e
            idx = tl.load(idx_ptr + j, mask=m, other=-1).to(tl.int64)
            cnt += (m & (idx >= 0) & (idx < N) & (idx != pad)).to(tl.float32)
        inv = 1.0 / tl.maximum(cnt, 1.0)
    if KEYS:
        bag_id = t * B + bags
        for l in range(0, maxlen):
            j = s + l
            m = j < e
            idx = tl.load(idx_ptr + j, mask=m, other=-1).to(tl.int64)
            okg = m & (idx >= 0) & (idx < N) & (idx != pad)
            a = inv
            if HAS_PSW:
                p = tl.load(psw_ptr + j, mask=okg, other=0.0).to(tl.float32)
                a = tl.where(mode == MODE_SUM, p, a)
            key = tl.where(okg, tl.where(dense, rbase + idx, SENT), SENT)
            jk = j - E0  # the key arrays hold this launch's piece of the entries
            tl.store(key_ptr + jk, key.to(key_ptr.dtype.element_ty), mask=m)
            tl.store(bag_ptr + jk, bag_id, mask=m)
            tl.store(scale_ptr + jk, tl.where(okg, a, 0.0), mask=m)
    need_rows = is_sp
    if NEED_PSWG:
        need_rows = True
    if ATOMIC:
        need_rows = need_rows | dense
    if need_rows:
        first = _table_first(off_ptr, row, t, B, NIDX, HAS_OFFSETS)
        sprow = tl.load(row + C_SPROW)
        splen = tl.load(row + C_SPLEN)
        spval = tl.load(row + C_SPVAL)
        n_db = (D + BD - 1) // BD
        for db in range(0, n_db):
            cols = db * BD + tl.arange(0, BD)
            cmask = cols < D
            g = tl.load(dout_ptr + bags[:, None].to(tl.int64) * gstride + col + cols[None, :],
                        mask=bmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
            for l in range(0, maxlen):
                j = s + l
                m = j < e
                idx = tl.load(idx_ptr + j, mask=m, other=-1).to(tl.int64)
                inr = m & (idx >= 0) & (idx < N)
                okg = inr & (idx != pad)
                a = inv
                if HAS_PSW:
                    p = tl.load(psw_ptr + j, mask=okg, other=0.0).to(tl.float32)
                    a = tl.where(mode == MODE_SUM, p, a)
                a = tl.where(okg, a, 0.0)
                contrib = g * a[:, None]
                if ATOMIC:
                    if dense:
                        tl.atomic_add(ws_ptr + goff + idx[:, None] * D + cols[None, :], contrib,
                                      mask=okg[:, None] & cmask[None, :], sem="relaxed")
                if HAS_SPARSE:
                    r = j - first
                    spm = m & (r >= 0) & (r < splen)  # splen is 0 unless the table is sparse
                    tl.store(spv_ptr + spval + r[:, None] * D + cols[None, :],
                             contrib.to(spv_ptr.dtype.element_ty), mask=spm[:, None] & cmask[None, :])
                    if db == 0:
                        safe = tl.where(okg, idx, tl.where(pad >= 0, pad, 0))
                        tl.store(spr_ptr + sprow + r, safe, mask=spm)
                if NEED_PSWG:
                    okf = inr & (idx != tl.where(mode == MODE_EMB, -1, pad))
                    wv = tl.load(w_ptr + w_off + idx[:, None] * D + cols[None, :],
                                 mask=okf[:, None] & cmask[None, :], other=0.0).to(tl.float32)
                    part = tl.reduce(g * wv, 1, _SUM)
                    part = tl.where(mode == MODE_SUM, tl.where(okf, part, 0.0), 0.0)
                    if db > 0:
                        part += tl.load(pswg_ptr + j, mask=m, other=0.0).to(tl.float32)
                    tl.store(pswg_ptr + j, part.to(pswg_ptr.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["B", "NIDX", "SENT", "E0"])
def _emb_walk_kernel(w_ptr, idx_ptr, off_ptr, psw_ptr, dout_ptr, ws_ptr, key_ptr, bag_ptr, scale_ptr,
                     spv_ptr, spr_ptr, pswg_ptr, meta_ptr, tiles_ptr, B, GSTRIDE, NIDX, SENT, E0,
                     ATOMIC: tl.constexpr, KEYS: tl.constexpr, HAS_OFFSETS: tl.constexpr,
                     HAS_PSW: tl.constexpr, NEED_PSWG: tl.constexpr, HAS_SPARSE: tl.constexpr,
                     ALIGN: tl.constexpr,
                     CLASSES: tl.constexpr, BB0: tl.constexpr, BB1: tl.constexpr, BB2: tl.constexpr,
                     BB3: tl.constexpr, BB4: tl.constexpr):
    pid = tl.program_id(0)
    ent = tl.load(tiles_ptr + pid)
    t = (ent & TILE_MASK_C).to(tl.int32)
    bblk = (ent >> TILE_SHIFT_C).to(tl.int32)
    row = meta_ptr + t * NCOL_C
    cls = tl.load(row + C_CLS)
    if CLASSES & 1:
        if cls == 0:
            _walk_tile(w_ptr, idx_ptr, off_ptr, psw_ptr, dout_ptr, ws_ptr, key_ptr, bag_ptr, scale_ptr,
                       spv_ptr, spr_ptr, pswg_ptr, row, t, bblk, B, GSTRIDE, NIDX, SENT, E0,
                       ATOMIC, KEYS, HAS_OFFSETS, HAS_PSW, NEED_PSWG, HAS_SPARSE, ALIGN, BB0, 16)
    if CLASSES & 2:
        if cls == 1:
            _walk_tile(w_ptr, idx_ptr, off_ptr, psw_ptr, dout_ptr, ws_ptr, key_ptr, bag_ptr, scale_ptr,
                       spv_ptr, spr_ptr, pswg_ptr, row, t, bblk, B, GSTRIDE, NIDX, SENT, E0,
                       ATOMIC, KEYS, HAS_OFFSETS, HAS_PSW, NEED_PSWG, HAS_SPARSE, ALIGN, BB1, 32)
    if CLASSES & 4:
        if cls == 2:
            _walk_tile(w_ptr, idx_ptr, off_ptr, psw_ptr, dout_ptr, ws_ptr, key_ptr, bag_ptr, scale_ptr,
                       spv_ptr, spr_ptr, pswg_ptr, row, t, bblk, B, GSTRIDE, NIDX, SENT, E0,
                       ATOMIC, KEYS, HAS_OFFSETS, HAS_PSW, NEED_PSWG, HAS_SPARSE, ALIGN, BB2, 64)
    if CLASSES & 8:
        if cls == 3:
            _walk_tile(w_ptr, idx_ptr, off_ptr, psw_ptr, dout_ptr, ws_ptr, key_ptr, bag_ptr, scale_ptr,
                       spv_ptr, spr_ptr, pswg_ptr, row, t, bblk, B, GSTRIDE, NIDX, SENT, E0,
                       ATOMIC, KEYS, HAS_OFFSETS, HAS_PSW, NEED_PSWG, HAS_SPARSE, ALIGN, BB3, 128)
    if CLASSES & 16:
        if cls == 4:
            _walk_tile(w_ptr, idx_ptr, off_ptr, psw_ptr, dout_ptr, ws_ptr, key_ptr, bag_ptr, scale_ptr,
                       spv_ptr, spr_ptr, pswg_ptr, row, t, bblk, B, GSTRIDE, NIDX, SENT, E0,
                       ATOMIC, KEYS, HAS_OFFSETS, HAS_PSW, NEED_PSWG, HAS_SPARSE, ALIGN, BB4, 256)


# ---------------------------------------------------------------------------------------------
# backward pass 2 (deterministic): segmented reduction over the sorted keys
# ---------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["L", "B", "T", "SENT"])
def _emb_seg_kernel(skey_ptr, perm_ptr, bag_ptr, scale_ptr, dout_ptr, grad_ptr, meta_ptr,
                    L, B, T, GSTRIDE, SENT, ALIGN: tl.constexpr, C: tl.constexpr, BD: tl.constexpr):
    """Rows of the tile = the segments that START among C consecutive sorted positions; each sums
    its entries in order (stepping on past the chunk end when the segment does) and writes its
    gradient row once."""
    pid = tl.program_id(0)
    p = pid.to(tl.int64) * C + tl.arange(0, C)
    pm = p < L
    k = tl.load(skey_ptr + p, mask=pm, other=SENT).to(tl.int64)
    kp = tl.load(skey_ptr + p - 1, mask=pm & (p > 0), other=-1).to(tl.int64)
    seg = pm & (k != kp) & (k < SENT)
    i0 = tl.load(perm_ptr + p, mask=seg, other=0)
    bag0 = tl.load(bag_ptr + i0, mask=seg, other=0)
    t = bag0 // B
    seg = seg & (t >= 0) & (t < T)
    row = meta_ptr + t * NCOL_C
    N = tl.load(row + C_N, mask=seg, other=0)
    D = tl.load(row + C_D, mask=seg, other=0)
    col = tl.load(row + C_COL, mask=seg, other=0)
    goff = tl.load(row + C_GOFF, mask=seg, other=-1)
    rbase = tl.load(row + C_RBASE, mask=seg, other=0)
    r = k - rbase
    seg = seg & (r >= 0) & (r < N) & (goff >= 0)
    goff = tl.maximum(goff, 0)  # -1 in the lanes seg masks off: no false multiple_of hint below
    maxd = tl.reduce(tl.where(seg, D, 0), 0, _MAX)
    gstride = GSTRIDE
    if ALIGN > 1:  # every dim, column and gradient offset is a multiple of ALIGN: vector loads / stores
        D = tl.multiple_of(D, [ALIGN])
        col = tl.multiple_of(col, [ALIGN])
        goff = tl.multiple_of(goff, [ALIGN])
        gstride = tl.multiple_of(gstride, ALIGN)
    tb = t.to(tl.int64) * B
    for d0 in range(0, maxd, BD):
        cols = d0 + tl.arange(0, BD)
        cm = cols[None, :] < D[:, None]
        acc = tl.full((C, BD), 0.0, tl.float32)
        act = seg
        q = p
        go = tl.reduce(act.to(tl.int32), 0, _MAX) > 0
        while go:
            ii = tl.load(perm_ptr + q, mask=act, other=0)
            bg = tl.load(bag_ptr + ii, mask=act, other=0)
            sc = tl.load(scale_ptr + ii, mask=act, other=0.0).to(tl.float32)
            b = bg - tb
            ok = act & (b >= 0) & (b < B)
            v = tl.load(dout_ptr + b[:, None] * gstride + col[:, None] + cols[None, :], mask=ok[:, None] & cm,
                        other=0.0).to(tl.float32)
            acc += v * sc[:, None]
            q += 1
            kk = tl.load(skey_ptr + q, mask=act & (q < L), other=-1).to(tl.int64)
            act = act & (q < L) & (kk == k)
            go = tl.reduce(act.to(tl.int32), 0, _MAX) > 0
        tl.store(grad_ptr + goff[:, None] + r[:, None] * D[:, None] + cols[None, :],
                 acc.to(grad_ptr.dtype.element_ty), mask=seg[:, None] & cm)


# ---------------------------------------------------------------------------------------------
# host side: signatures, device tables, launch configuration
# ---------------------------------------------------------------------------------------------
_ESIZE = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}
_SIG_IDS = itertools.count(1)

# tile elements (E) and warps; the interpreter uses tiny tiles to exercise masking, several bag
# blocks per table and segments crossing chunk boundaries
_CFG = {
    "fwd_elems": {2: 2048, 4: 1024},
    "walk_elems": {2: 2048, 4: 1024},
    "seg_elems": {2: 2048, 4: 1024},
    "fwd_warps": 4,
    "walk_warps": 8,
    "seg_warps": 4,
    "seg_block_d": 64,
    # entries per piece of the deterministic backward (fixed bags): its buffers, about 44 bytes
    # an entry (keys, bag ids, scales, the sorted keys, the permutation and the sort's own), are
    # a few MiB whatever the group's size (api.key_piece: OPTIMUS_EMB_KEY_PIECE)
    "key_piece": key_piece(),
}
if _INTERPRET:
    _CFG.update(fwd_elems={2: 64, 4: 64}, walk_elems={2: 64, 4: 64}, seg_elems={2: 64, 4: 64}, fwd_warps=1,
                walk_warps=1, seg_warps=1, seg_block_d=32, key_piece=40)
for _k, _env in (("fwd_elems", "OPTIMUS_EMB_TILE_ELEMS"), ("walk_elems", "OPTIMUS_EMB_WALK_ELEMS"),
                 ("seg_elems", "OPTIMUS_EMB_SEG_ELEMS")):
    if os.environ.get(_env):
        _v = int(os.environ[_env])
        _CFG[_k] = {2: _v, 4: _v}


def set_config(**kw) -> None:
    """Override launch parameters: ``fwd_elems`` / ``walk_elems`` / ``seg_elems`` (tile elements;
    an int for every dtype or a dict {element size: int}), ``*_warps``, ``seg_block_d``,
    ``key_piece`` (entries per piece of the deterministic backward).  Clears the signature cache
    (tile maps depend on the tile sizes).  For benchmarks and tests."""
    for k, v in kw.items():
        if k not in _CFG:
            raise KeyError(f"unknown config key {k!r}; known: {sorted(_CFG)}")
        if k.endswith("elems"):
            _CFG[k] = {int(e): int(n) for e, n in v.items()} if isinstance(v, dict) else {2: int(v), 4: int(v)}
        else:
            _CFG[k] = int(v)
    _SIGS.clear()


def get_config() -> dict:
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in _CFG.items()}


def width_class(d: int) -> int:
    """Smallest class with ``16 << cls >= d`` (capped at the widest; wider tables take D blocks)."""
    c = 0
    while (16 << c) < d and c < NCLS - 1:
        c += 1
    return c


class EBSignature:
    """Everything about a group of tables that depends only on static facts (cached per tuple):
    table shapes, modes, padding indices, fixed bag sizes, dtype."""

    def __init__(self, ns, ds, modes, pads, bag_sizes, dtype: torch.dtype):
        self.id = next(_SIG_IDS)  # cache key of the device tables (never reused, unlike id())
        self.T = T = len(ns)
        self.ns = [int(n) for n in ns]
        self.ds = [int(d) for d in ds]
        self.modes = [int(m) for m in modes]
        self.pads = [int(p) for p in pads]
        self.fixed = bag_sizes is not None and len(bag_sizes) > 0
        self.bag_sizes = [int(v) for v in bag_sizes] if self.fixed else [0] * T
        self.dtype = dtype
        self.es = _ESIZE[dtype]
        self.cols = [0] * T
        c = 0
        for t, d in enumerate(self.ds):
            self.cols[t] = c
            c += d
        self.sumd = c
        self.cls = [width_class(d) for d in self.ds]
        self.bd = [16 << c for c in self.cls]
        self.ndb = [(d + bd - 1) // bd for d, bd in zip(self.ds, self.bd)]
        e = _CFG["fwd_elems"][self.es]
        self.bb_cls = [max(1, e // (16 << c)) for c in range(NCLS)]
        self.bb = [self.bb_cls[c] for c in self.cls]
        e = _CFG["walk_elems"][self.es]
        self.bbw_cls = [max(1, e // (16 << c)) for c in range(NCLS)]
        self.bbw = [self.bbw_cls[c] for c in self.cls]
        self.seg_elems = _CFG["seg_elems"][self.es]
        self.classes = 0
        for t in range(T):
            if self.ds[t] > 0:
                self.classes |= 1 << self.cls[t]
        rb, r = [], 0
        for n in self.ns:
            rb.append(r)
            r += n
        self.rbase = rb
        self.total_rows = r
        self.sent = r  # sort-key sentinel: after every real row
        self.key_dtype = torch.int32 if r < 2 ** 31 - 1 else torch.int64
        self.sum_bag = sum(self.bag_sizes)
        ib, acc = [], 0
        for v in self.bag_sizes:
            ib.append(acc)
            acc += v
        tmpl = np.zeros((T, NCOL), dtype=np.int64)
        tmpl[:, COL["N"]] = self.ns
        tmpl[:, COL["D"]] = self.ds
        tmpl[:, COL["COL"]] = self.cols
        tmpl[:, COL["MODE"]] = self.modes
        tmpl[:, COL["PAD"]] = self.pads
        tmpl[:, COL["CLS"]] = self.cls
        tmpl[:, COL["BAGL"]] = self.bag_sizes
        tmpl[:, COL["IBASE"]] = ib
        tmpl[:, COL["GOFF"]] = -1
        tmpl[:, COL["RBASE"]] = rb
        self.template = tmpl
        a = 16 // self.es
        self.dims_aligned = all(d % a == 0 for d in self.ds)
        self.align_elems = a
        self.max_d = max(self.ds) if T else 0
        self._tiles: dict = {}
        self._grad_plan: dict = {}

    def batch_size(self, n_indices: int, n_offsets: int) -> int:
        if self.fixed:
            return n_indices // self.sum_bag if self.sum_bag else 0
        return (n_offsets - 1) // self.T

    def key_pieces(self, B: int, nidx: int) -> list:
        """The deterministic backward's pieces, each walked, sorted and reduced on its own:
        (first walk tile, end walk tile, first entry, end entry).  Fixed bags: runs of
        consecutive tables with at most ``key_piece`` entries (a larger table is a piece of its
        own); a table's entries and walk tiles are contiguous, and its sort keys lie in its own
        row range, so sorting the pieces one by one orders the entries as one sort of them all
        would.  Jagged bags: one piece (a table's first entry is in the offsets, on the device)."""
        n_tiles = [-(-B // self.bbw[t]) if self.ds[t] else 0 for t in range(self.T)]
        if not self.fixed:
            return [(0, sum(n_tiles), 0, nidx)]
        entries = [B * n for n in self.bag_sizes]
        tile_at = list(itertools.accumulate(n_tiles, initial=0))
        entry_at = list(itertools.accumulate(entries, initial=0))
        return [(tile_at[a], tile_at[b], entry_at[a], entry_at[b])
                for a, b in table_pieces(entries, _CFG["key_piece"])]

    def tiles(self, B: int, device: torch.device):
        """(fwd tile map, #fwd tiles, walk tile map, #walk tiles) for batch size B, cached."""
        cap = _dt.capturing(device)
        key = (B, device, _dt.stream_key(device))
        ent = self._tiles.get(key)
        if ent is None:
            fwd, walk = [], []
            for t in range(self.T):
                if self.ds[t] == 0:
                    continue
                nf = -(-B // self.bb[t]) * self.ndb[t]
                nw = -(-B // self.bbw[t])
                if nf:
                    fwd.append(t | (np.arange(nf, dtype=np.int64) << TILE_SHIFT))
                if nw:
                    walk.append(t | (np.arange(nw, dtype=np.int64) << TILE_SHIFT))
            fwd_a = np.concatenate(fwd) if fwd else np.zeros(1, dtype=np.int64)
            walk_a = np.concatenate(walk) if walk else np.zeros(1, dtype=np.int64)
            ent = (_dt.upload(fwd_a, device, cap), sum(len(a) for a in fwd),
                   _dt.upload(walk_a, device, cap), sum(len(a) for a in walk))
            if not cap:
                if len(self._tiles) > 64:
                    self._tiles.clear()
                self._tiles[key] = ent
        if cap:
            _CAPTURE_KEEPALIVE.append(ent)
        return ent

    def grad_plan(self, need, sparse):
        """Dense-gradient layout for the tables that need a gradient: (goff per table or -1,
        total dense elements, dense table ids)."""
        key = (tuple(need), tuple(sparse))
        gp = self._grad_plan.get(key)
        if gp is None:
            goff, tot, dense_ids = [-1] * self.T, 0, []
            for t in range(self.T):
                if need[t] and not sparse[t]:
                    goff[t] = tot
                    tot += self.ns[t] * self.ds[t]
                    dense_ids.append(t)
            gp = self._grad_plan[key] = (goff, tot, dense_ids)
        return gp


_SIGS: dict = {}


def signature(ns, ds, modes, pads, bag_sizes, dtype) -> EBSignature:
    key = (tuple(ns), tuple(ds), tuple(modes), tuple(pads), tuple(bag_sizes) if bag_sizes else None, dtype)
    s = _SIGS.get(key)
    if s is None:
        if len(_SIGS) > 1024:
            _SIGS.clear()
        s = _SIGS[key] = EBSignature(ns, ds, modes, pads, bag_sizes, dtype)
    return s


_TABLES = _dt.TableCache()
# Device tables used while a CUDA graph is being captured: the graph reads them at every replay,
# so they must outlive any cache eviction (cached entries of the capturing stream are reused;
# missing ones are staged through the capture arena of ``runtime/tables.py``).
_CAPTURE_KEEPALIVE: list = []


def clear_caches() -> None:
    _TABLES.clear()
    _SIGS.clear()


def _weight_offsets(weights, es):
    ptrs = [w.data_ptr() for w in weights]
    base = ptrs[0]
    offs = []
    orr = 0
    for p in ptrs:
        d = p - base
        if d % es:  # pragma: no cover - same-dtype tensors are always element aligned
            raise RuntimeError("grouped_embedding_bag: weight pointers are not element aligned")
        offs.append(d // es)
        orr |= p
    return ptrs, offs, orr


def _meta(sig, weights, device, extra=None, extra_key=()):
    """Device metadata table for these weights (cached by signature, pointers and ``extra_key``).
    ``extra``: callable(numpy table) that fills backward-only columns."""
    ptrs, offs, orr = _weight_offsets(weights, sig.es)
    cap = _dt.capturing(device)
    key = (sig.id, _dt.stream_key(device), tuple(ptrs), extra_key)
    ent = _TABLES.get(key)
    if ent is None:
        tab = sig.template.copy()
        tab[:, COL["WOFF"]] = offs
        if extra is not None:
            extra(tab)
        ent = (_dt.upload(tab, device, cap), orr)
        if not cap:
            _TABLES.put(key, ent)
    if cap:
        _CAPTURE_KEEPALIVE.append(ent)
    return ent


def _align(sig, ptr_or: int) -> int:
    a = sig.align_elems
    if not sig.dims_aligned or sig.sumd % a:
        return 1
    return a if ptr_or % 16 == 0 else 1


def _bb_kwargs(bb_cls):
    return {f"BB{c}": bb_cls[c] for c in range(NCLS)}


def forward(weights, indices, offsets, psw, sig: EBSignature) -> torch.Tensor:
    """out [B, sum D_t] (weights' dtype).  Inputs validated by the caller; indices / offsets 1-D
    contiguous int32 or int64, psw None or 1-D like indices."""
    w0 = weights[0]
    dev = w0.device
    B = sig.batch_size(indices.numel(), offsets.numel() if offsets is not None else 0)
    out = torch.empty(B, sig.sumd, dtype=w0.dtype, device=dev)
    if B == 0 or sig.sumd == 0:
        return out
    tab, orr = _meta(sig, weights, dev)
    tiles, n_tiles, _, _ = sig.tiles(B, dev)
    if n_tiles == 0:
        return out
    align = _align(sig, orr | out.data_ptr())
    with device_guard(dev):  # Triton launches on the current device, not the tensors'
        _emb_fwd_kernel[(n_tiles,)](
            w0, indices, offsets if offsets is not None else indices, psw if psw is not None else w0, out,
            tab, tiles, B, sig.sumd, indices.numel(),
            HAS_OFFSETS=offsets is not None, HAS_PSW=psw is not None, ALIGN=align, CLASSES=sig.classes,
            num_warps=_CFG["fwd_warps"], **_bb_kwargs(sig.bb_cls))
    return out


def sparse_layout(sig, B, sparse_need, index_counts):
    """Where each sparse table's rows go in the packed sparse buffers: (first row, #rows, first
    value element) per table, total rows, total value elements.  ``index_counts``: host-known
    number of index entries per table (fixed mode: B * bag size)."""
    first, lens, vbase, tot, vtot = [0] * sig.T, [0] * sig.T, [0] * sig.T, 0, 0
    for t in range(sig.T):
        if sparse_need[t]:
            n = B * sig.bag_sizes[t] if sig.fixed else int(index_counts[t])
            first[t], lens[t], vbase[t] = tot, n, vtot
            tot += n
            vtot += n * sig.ds[t]
    return first, lens, vbase, tot, vtot


def backward(grad_out, weights, indices, offsets, psw, sig: EBSignature, need_w, sparse, deterministic: bool,
             need_psw: bool, index_counts):
    """(dense flat grad, sparse values flat, sparse rows, psw grad).

    dense flat: the dense tables that need a gradient, in table order, each N_t * D_t elements in
    the weights' dtype; sparse values: per sparse table (needing a gradient) L_t rows of D_t
    values; sparse rows: int64, L_t per sparse table; psw grad: like psw (or empty)."""
    w0 = weights[0]
    dev, dt = w0.device, w0.dtype
    nidx = indices.numel()
    B = sig.batch_size(nidx, offsets.numel() if offsets is not None else 0)
    if sig.T * B >= 2 ** 31:
        raise ValueError(f"grouped_embedding_bag: T * B = {sig.T} * {B} bags must stay below 2**31")
    sp_need = [bool(n and s) for n, s in zip(need_w, sparse)]
    goff, tot_dense, _ = sig.grad_plan(need_w, sparse)
    sp_first, sp_lens, sp_vbase, sp_tot, sp_vals_n = sparse_layout(sig, B, sp_need, index_counts)
    has_sparse = sp_tot > 0
    # zero-filled: entries no bag covers (malformed offsets, tables of width 0) stay defined
    spv = torch.zeros(sp_vals_n, dtype=dt, device=dev)
    spr = torch.zeros(sp_tot, dtype=torch.int64, device=dev)
    pswg = torch.zeros(nidx if need_psw else 0, dtype=psw.dtype if psw is not None else dt, device=dev)
    atomic = not deterministic
    acc_in_place = dt == torch.float32
    if atomic and not acc_in_place:
        ws = torch.zeros(tot_dense, dtype=torch.float32, device=dev)
    else:
        ws = torch.zeros(tot_dense, dtype=dt, device=dev)
    if B == 0 or nidx == 0 or sig.sumd == 0:
        return ws.to(dt), spv, spr, pswg

    def fill_bwd(tab):
        tab[:, COL["GOFF"]] = goff
        tab[:, COL["SPARSE"]] = [1 if s else 0 for s in sp_need]
        tab[:, COL["SPROW"]] = sp_first
        tab[:, COL["SPLEN"]] = sp_lens
        tab[:, COL["SPVAL"]] = sp_vbase

    extra_key = ("bwd", tuple(goff), tuple(sp_first), tuple(sp_lens))
    tab, orr = _meta(sig, weights, dev, fill_bwd, extra_key)
    _, _, walk_tiles, n_walk = sig.tiles(B, dev)
    grad_out = unit_stride_rows(grad_out)
    g_rs = grad_out.stride(0)  # the row stride: a slice of a wider gradient (a cat's) is read in place
    align = _align(sig, orr | grad_out.data_ptr() | (g_rs * grad_out.element_size()) | (ws.data_ptr() if tot_dense else 0))
    dense_any = tot_dense > 0
    if not (dense_any or has_sparse or need_psw) or n_walk == 0:
        return ws, spv, spr, pswg
    need_keys = deterministic and dense_any
    # the deterministic backward walks, sorts and reduces one piece of the entries at a time
    # (EBSignature.key_pieces), so its key arrays and the sort's buffers hold one piece
    pieces = sig.key_pieces(B, nidx) if need_keys else [(0, n_walk, 0, nidx)]
    if need_keys:  # the segment kernel's tile: the widest dense table's columns, C sorted positions
        dense_d = max([sig.ds[t] for t in range(sig.T) if goff[t] >= 0], default=1)
        bd = min(_CFG["seg_block_d"], max(16, next_pow2(dense_d)))
        c = max(2, sig.seg_elems // bd)
    with device_guard(dev):  # Triton launches on the current device, not the tensors'
        dummy = w0
        for p0, p1, e0, e1 in pieces:
            if p1 == p0:
                continue  # tables of width 0 only: nothing to walk
            n = e1 - e0
            if need_keys:
                # entries the walk does not reach (malformed offsets, tables of width 0) keep the sentinel
                keys = torch.full((n,), sig.sent, dtype=sig.key_dtype, device=dev)
                bag_ids = torch.empty(n, dtype=torch.int32, device=dev)
                scales = torch.empty(n, dtype=torch.float32, device=dev)
            else:
                keys = bag_ids = scales = ws
            _emb_walk_kernel[(p1 - p0,)](
                w0, indices, offsets if offsets is not None else indices, psw if psw is not None else dummy,
                grad_out, ws if (atomic and dense_any) else dummy, keys, bag_ids, scales,
                spv if has_sparse else dummy, spr if has_sparse else dummy, pswg if need_psw else dummy,
                tab, walk_tiles[p0:], B, g_rs, nidx, sig.sent, e0,
                ATOMIC=atomic, KEYS=need_keys, HAS_OFFSETS=offsets is not None, HAS_PSW=psw is not None,
                NEED_PSWG=need_psw,
                HAS_SPARSE=has_sparse, ALIGN=align, CLASSES=sig.classes, num_warps=_CFG["walk_warps"],
                **_bb_kwargs(sig.bbw_cls))
            if need_keys:
                skeys, perm = torch.sort(keys, stable=True)
                _emb_seg_kernel[((n + c - 1) // c,)](
                    skeys, perm, bag_ids, scales, grad_out, ws, tab, n, B, sig.T, g_rs, sig.sent,
                    ALIGN=align, C=c, BD=bd, num_warps=_CFG["seg_warps"])
                del keys, bag_ids, scales, skeys, perm  # freed before the next piece allocates its own
    if atomic and not acc_in_place:
        ws = ws.to(dt)
    return ws, spv, spr, pswg
