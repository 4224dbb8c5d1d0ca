"""Batched layer norm in plain torch: the CPU / no-Triton path and the test oracle.

* list form (:func:`batched_layer_norm_list`): a loop of ``F.layer_norm`` with ordinary
  autograd. Used by the public function in eager mode when the Triton kernels are not used.
* packed form (``batched_layer_norm_packed`` / ``*_backward_packed``, and ``*_layout`` for either
  layout): the same math on the ops' packed convention, forward and explicit backward; the
  statistics (mean, rstd per row) in fp32, as the kernels keep them. The ops' implementation off
  Triton. 16-bit inputs are computed in fp32 and rounded once, like the kernels.
"""

from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F

from ..runtime.layout import columns_to_packed, packed_to_columns


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def batched_layer_norm_list(xs, weights, biases, eps: float) -> List[torch.Tensor]:
    ws = weights if weights is not None else [None] * len(xs)
    bs = biases if biases is not None else [None] * len(xs)
    return [F.layer_norm(x, (x.shape[-1],), w, b, eps) for x, w, b in zip(xs, ws, bs)]


def _offsets(sizes):
    out, o = [], 0
    for s in sizes:
        out.append(o)
        o = o + s
    return out, o


def batched_layer_norm_packed(x, w, b, rows, widths, eps):
    ct = _compute_dtype(x.dtype)
    ox, _ = _offsets([r * d for r, d in zip(rows, widths)])
    ow, _ = _offsets(list(widths))
    ys, means, rstds = [], [], []
    for g, (r, d) in enumerate(zip(rows, widths)):
        xg = x[ox[g]: ox[g] + r * d].view(r, d).to(ct)
        if d > 0:
            mean = xg.mean(dim=1)
            var = ((xg - mean[:, None]) ** 2).mean(dim=1)
        else:
            mean = xg.new_zeros(r)
            var = xg.new_zeros(r)
        rstd = torch.rsqrt(var + eps)
        y = (xg - mean[:, None]) * rstd[:, None]
        if w is not None:
            y = y * w[ow[g]: ow[g] + d].to(ct)
        if b is not None:
            y = y + b[ow[g]: ow[g] + d].to(ct)
        ys.append(y.to(x.dtype).reshape(-1))
        means.append(mean.float())
        rstds.append(rstd.float())
    y = torch.cat(ys) if ys else x.new_empty(0)
    stats = torch.stack([torch.cat(means), torch.cat(rstds)]) if means else x.new_empty(2, 0, dtype=torch.float32)
    return y, stats


def batched_layer_norm_backward_packed(dy, x, w, stats, rows, widths, has_bias, need_dx, need_dw, need_db):
    ct = _compute_dtype(x.dtype)
    ox, tx = _offsets([r * d for r, d in zip(rows, widths)])
    ow, tw = _offsets(list(widths))
    orow, _ = _offsets(list(rows))
    pdt = w.dtype if w is not None else x.dtype
    dxs, dws, dbs = [], [], []
    for g, (r, d) in enumerate(zip(rows, widths)):
        xg = x[ox[g]: ox[g] + r * d].view(r, d).to(ct)
        dyg = dy[ox[g]: ox[g] + r * d].view(r, d).to(ct)
        mean = stats[0, orow[g]: orow[g] + r].to(ct)
        rstd = stats[1, orow[g]: orow[g] + r].to(ct)
        xhat = (xg - mean[:, None]) * rstd[:, None]
        wdy = dyg * w[ow[g]: ow[g] + d].to(ct) if w is not None else dyg
        if need_dx:
            if d > 0:
                c1 = (xhat * wdy).mean(dim=1, keepdim=True)
                c2 = wdy.mean(dim=1, keepdim=True)
                dxs.append(((wdy - (xhat * c1 + c2)) * rstd[:, None]).to(x.dtype).reshape(-1))
        if need_dw and w is not None:
            dws.append((dyg * xhat).sum(0).to(pdt))
        if need_db and has_bias:
            dbs.append(dyg.sum(0).to(pdt))
    dx = torch.cat(dxs) if dxs else x.new_empty(tx if need_dx else 0)
    dw = torch.cat(dws) if dws else x.new_empty(tw if (need_dw and w is not None) else 0, dtype=pdt)
    db = torch.cat(dbs) if dbs else x.new_empty(tw if (need_db and has_bias) else 0, dtype=pdt)
    return dx, dw, db


def batched_layer_norm_layout(x, w, b, rows, widths, eps, layout):
    if layout == "packed":
        return batched_layer_norm_packed(x, w, b, rows, widths, eps)
    y, stats = batched_layer_norm_packed(columns_to_packed(x, widths), w, b, rows, widths, eps)
    return packed_to_columns(y, rows[0], widths), stats


def batched_layer_norm_backward_layout(dy, x, w, stats, rows, widths, has_bias, need_dx, need_dw, need_db, layout):
    if layout == "packed":
        return batched_layer_norm_backward_packed(dy, x, w, stats, rows, widths, has_bias, need_dx, need_dw, need_db)
    dx, dw, db = batched_layer_norm_backward_packed(columns_to_packed(dy, widths), columns_to_packed(x, widths), w,
                                                    stats, rows, widths, has_bias, need_dx, need_dw, need_db)
    return packed_to_columns(dx, rows[0], widths), dw, db
