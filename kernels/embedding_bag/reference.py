"""Plain-torch implementation of the grouped embedding bag (the CPU / no-Triton path of the ops).

Same packed convention and semantics as ``kernel.py`` (see its docstring):
``indices`` is the tables' indices concatenated (table-major), bags are given by global
``offsets`` (``T * B + 1`` entries into ``indices``) or by fixed per-table bag sizes, the output
is one ``[B, sum D_t]`` buffer.  16-bit weights are gathered, pooled in fp32 and rounded once, like
the kernels.  Everything here is vectorised per table (``index_select`` / ``index_add_``), and the
index and offset checks raise with the table named, as ``F.embedding_bag`` does on the CPU.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

MODE_SUM, MODE_MEAN, MODE_EMB = 0, 1, 2
FN = "grouped_embedding_bag"


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def batch_size(T: int, n_indices: int, offsets: Optional[Tensor], bag_sizes: Sequence[int]) -> int:
    if offsets is not None:
        return (offsets.numel() - 1) // T
    s = sum(bag_sizes)
    return n_indices // s if s else 0


def check_offsets(offsets: Tensor, n_indices: int, T: int) -> None:
    """Global offsets: 1-D, T * B + 1 entries, starting at 0, non-decreasing, ending at len(indices)."""
    if offsets.dim() != 1 or offsets.numel() < 1 or (offsets.numel() - 1) % T:
        raise ValueError(f"{FN}: offsets must be 1-D with T * B + 1 = {T} * B + 1 entries, got shape "
                         f"{tuple(offsets.shape)}")
    o = offsets.detach()
    first, last = int(o[0]), int(o[-1])
    if first != 0:
        raise ValueError(f"{FN}: offsets[0] has to be 0 (the first bag starts at the first index), got {first}")
    if last != n_indices:
        raise ValueError(f"{FN}: offsets[-1] must equal the number of indices ({n_indices}), got {last}")
    if o.numel() > 1:
        d = o[1:] - o[:-1]
        bad = (d < 0).nonzero()
        if bad.numel():
            k = int(bad[0, 0])
            B = (o.numel() - 1) // T
            raise ValueError(f"{FN}: offsets must be non-decreasing; offsets[{k + 1}] = {int(o[k + 1])} < "
                             f"offsets[{k}] = {int(o[k])} (table {k // B if B else 0})")


def table_spans(T: int, B: int, n_indices: int, offsets: Optional[Tensor], bag_sizes: Sequence[int]):
    """[(first entry, end entry)] per table (host ints; offsets are read, so CPU/fallback only)."""
    if offsets is not None:
        bnd = offsets.detach()[:: B].tolist() if B else [0] * (T + 1)
        if B == 0:
            return [(0, 0)] * T
        return [(int(bnd[t]), int(bnd[t + 1])) for t in range(T)]
    spans, acc = [], 0
    for L in bag_sizes:
        spans.append((acc, acc + B * L))
        acc += B * L
    return spans


def check_indices(weights: Sequence[Tensor], indices: Tensor, spans) -> None:
    """Every index of table t in [0, N_t); raises naming the table, like F.embedding_bag."""
    for t, (w, (a, b)) in enumerate(zip(weights, spans)):
        if b <= a:
            continue
        seg = indices[a:b]
        n = w.shape[0]
        bad = ((seg < 0) | (seg >= n)).nonzero()
        if bad.numel():
            k = int(bad[0, 0])
            raise IndexError(f"{FN}: table {t}: index {k} of its indices takes value {int(seg[k])} which is "
                             f"not in the valid range [0, {n})")


def _table_entries(t, B, spans, offsets, bag_sizes, device):
    """(first entry, #entries, bag id of every entry) of table t."""
    a, b = spans[t]
    n = b - a
    if offsets is not None:
        o = offsets[t * B: (t + 1) * B + 1].to(torch.int64)
        lens = o[1:] - o[:-1]
        bag = torch.repeat_interleave(torch.arange(B, device=device), lens, output_size=n)
    else:
        bag = torch.arange(B, device=device).repeat_interleave(bag_sizes[t])
    return a, n, bag


def _scales(idx, bag, B, mode, pad, psw_t, ct, keep_pad_fwd):
    """(forward-included mask, gradient mask, per-entry scale a_j) of one table."""
    okf = torch.ones_like(idx, dtype=torch.bool)
    if pad >= 0:
        okg = idx != pad
        if not keep_pad_fwd:
            okf = okg
    else:
        okg = okf
    a = okg.to(ct)
    if mode == MODE_MEAN:
        cnt = torch.zeros(B, dtype=ct, device=idx.device).index_add_(0, bag, okg.to(ct))
        a = a / cnt.clamp(min=1)[bag]
    elif mode == MODE_SUM and psw_t is not None:
        a = a * psw_t.to(ct)
    return okf, okg, a


def forward(weights: Sequence[Tensor], indices: Tensor, offsets: Optional[Tensor], psw: Optional[Tensor],
            modes: Sequence[int], pads: Sequence[int], bag_sizes: Sequence[int], check: bool = True) -> Tensor:
    T = len(weights)
    w0 = weights[0]
    ct = compute_dtype(w0.dtype)
    B = batch_size(T, indices.numel(), offsets, bag_sizes)
    if check and offsets is not None:
        check_offsets(offsets, indices.numel(), T)
    spans = table_spans(T, B, indices.numel(), offsets, bag_sizes)
    if check:
        check_indices(weights, indices, spans)
    # one [B, sum D_t] buffer, each table pooled into its column block (as the kernel writes it):
    # no per-table result and no concatenation of them
    out = torch.zeros(B, sum(w.shape[1] for w in weights), dtype=ct, device=w0.device)
    col = 0
    for t, w in enumerate(weights):
        D = w.shape[1]
        a, n, bag = _table_entries(t, B, spans, offsets, bag_sizes, w.device)
        idx = indices[a:a + n].to(torch.int64)
        psw_t = psw[a:a + n] if psw is not None else None
        mode = modes[t]
        okf, okg, s = _scales(idx, bag, B, mode, pads[t], psw_t, ct, keep_pad_fwd=(mode == MODE_EMB))
        if mode == MODE_EMB:  # the padding row counts in the forward (F.embedding)
            s = torch.ones_like(s)
        rows = w.index_select(0, idx).to(ct)  # a fresh tensor: scaled in place
        rows.mul_((s * okf.to(ct))[:, None])
        out[:, col:col + D].index_add_(0, bag, rows)
        col += D
    return out.to(w0.dtype)


GATHER_PIECE = 1 << 12  # index entries whose gradient rows the backward gathers at once


def backward(grad_out: Tensor, weights: Sequence[Tensor], indices: Tensor, offsets: Optional[Tensor],
             psw: Optional[Tensor], modes: Sequence[int], pads: Sequence[int], bag_sizes: Sequence[int],
             need_w: Sequence[bool], sparse: Sequence[bool], need_psw: bool,
             index_counts: Sequence[int]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dense flat grad, sparse values flat, sparse rows, psw grad); layout as the kernel's backward."""
    T = len(weights)
    w0 = weights[0]
    dt = w0.dtype
    ct = compute_dtype(dt)
    B = batch_size(T, indices.numel(), offsets, bag_sizes)
    spans = table_spans(T, B, indices.numel(), offsets, bag_sizes)
    # the dense gradients in one buffer, each table's accumulated into its own slice (as the
    # kernel writes them): no per-table gradient and no concatenation of them
    dense_flat = torch.zeros(sum(w.numel() for t, w in enumerate(weights) if need_w[t] and not sparse[t]),
                             dtype=dt, device=w0.device)
    dense_at = 0
    sp_vals: List[Tensor] = []
    sp_rows: List[Tensor] = []
    pswg = torch.zeros(indices.numel() if need_psw else 0, dtype=psw.dtype if psw is not None else dt,
                       device=w0.device)
    col = 0
    for t, w in enumerate(weights):
        N, D = w.shape
        g_t = grad_out[:, col:col + D].to(ct)
        col += D
        if not (need_w[t] or need_psw):
            continue
        a, n, bag = _table_entries(t, B, spans, offsets, bag_sizes, w.device)
        idx = indices[a:a + n].to(torch.int64)
        psw_t = psw[a:a + n] if psw is not None else None
        mode = modes[t]
        okf, okg, s = _scales(idx, bag, B, mode, pads[t], psw_t, ct, keep_pad_fwd=(mode == MODE_EMB))
        if need_w[t] and sparse[t]:
            cnt = int(index_counts[t]) if offsets is not None else B * bag_sizes[t]
            if cnt != n:
                raise ValueError(f"{FN}: index_counts[{t}] = {cnt} but table {t} has {n} index entries")
        dense_t = need_w[t] and not sparse[t]
        if dense_t:
            gw = dense_flat[dense_at:dense_at + N * D].view(N, D)
            dense_at += N * D
            # 16-bit tables: accumulated in fp32 and rounded once, like the kernels
            acc = gw if ct == dt else torch.zeros(N, D, dtype=ct, device=w.device)
        # the entries in pieces: the gathered gradient rows are one piece's at a time (a few
        # MiB; the kernels gather none); index_add_ keeps the entries' order, so the sums are
        # those of one piece
        for c0 in range(0, n, GATHER_PIECE):
            c = slice(c0, min(c0 + GATHER_PIECE, n))
            rows_g = g_t.index_select(0, bag[c])
            if need_w[t]:
                # rows_g is a fresh tensor: scaled in place unless the psw gradient reads it below
                contrib = rows_g * s[c, None] if (need_psw and mode == MODE_SUM) else rows_g.mul_(s[c, None])
                if sparse[t]:
                    pad = pads[t]
                    sp_rows.append(torch.where(okg[c], idx[c], torch.full_like(idx[c], pad if pad >= 0 else 0)))
                    sp_vals.append(contrib.to(dt).reshape(-1))
                elif pads[t] >= 0:  # entries of the padding row get no gradient
                    acc.index_add_(0, idx[c][okg[c]], contrib[okg[c]])
                else:  # without one, every entry counts: no masked copies
                    acc.index_add_(0, idx[c], contrib)
            if need_psw and mode == MODE_SUM:
                dots = (rows_g * w.index_select(0, idx[c]).to(ct)).sum(1) * okf[c].to(ct)
                pswg[a + c0:c.stop + a] = dots.to(pswg.dtype)
        if dense_t and acc is not gw:
            gw.copy_(acc)
    spv = torch.cat(sp_vals) if sp_vals else w0.new_zeros(0)
    spr = torch.cat(sp_rows) if sp_rows else torch.zeros(0, dtype=torch.int64, device=w0.device)
    return dense_flat, spv, spr, pswg


def host_check(weights, indices, offsets, bag_sizes, per_table_offsets, per_table_counts,
                include_last_offset):
    """Offsets and index ranges on the host (reads the data: CPU, or an explicit check on CUDA), with
    the messages of ``F.embedding_bag``, naming the table; the public function and the eager path
    run it before the op."""
    T = len(weights)
    if per_table_offsets is not None:
        # the same messages as F.embedding_bag, per table, before they are merged
        for t, o in enumerate(per_table_offsets):
            if o is None or o.numel() == 0:
                continue
            n = per_table_counts[t]
            if int(o[0]) != 0:
                raise ValueError(f"{FN}: table {t}: offsets[0] has to be 0 (the first bag starts at the first "
                                 f"index), got {int(o[0])}")
            last = int(o[-1])
            if last > n or (include_last_offset and last != n):
                raise ValueError(f"{FN}: table {t}: offsets[-1] = {last} but the table has {n} indices "
                                 f"(with include_last_offset it must equal that number, else not exceed it)")
            if o.numel() > 1 and bool((o[1:] < o[:-1]).any()):
                raise ValueError(f"{FN}: table {t}: offsets must be non-decreasing")
    if offsets is not None:
        check_offsets(offsets, indices.numel(), T)
    B = batch_size(T, indices.numel(), offsets, bag_sizes)
    spans = table_spans(T, B, indices.numel(), offsets, bag_sizes)
    if offsets is not None and per_table_offsets is None and per_table_counts is not None:
        for t, (a, b) in enumerate(spans):
            if int(per_table_counts[t]) != b - a:
                raise ValueError(f"{FN}: index_counts[{t}] = {per_table_counts[t]} but the offsets give table {t} "
                                 f"{b - a} indices")
    check_indices(weights, indices, spans)
