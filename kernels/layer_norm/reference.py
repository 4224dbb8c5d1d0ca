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

from ..runtime.activation import USES_OUTPUT, activation_grad, apply_activation
from ..runtime.layout import empty_like_layout, member_blocks


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


def batched_layer_norm_layout(x, w, b, rows, widths, eps, layout, activation="none"):
    """Forward in either layout (``"columns"``: x, y are (R, sum widths) matrices); ``activation``
    is applied to the affine result (the kernels' epilogue)."""
    ct = _compute_dtype(x.dtype)
    ow, _ = _offsets(list(widths))
    orow, tr = _offsets(list(rows))
    y = empty_like_layout(x, rows, widths, layout)
    stats = torch.empty(2, tr, dtype=torch.float32, device=x.device)
    for g, (xb, yb, r, d) in enumerate(zip(member_blocks(x, rows, widths, layout),
                                           member_blocks(y, rows, widths, layout), rows, widths)):
        xg = xb.to(ct)
        if d > 0:
            mean = xg.mean(dim=1)
            var = ((xg - mean[:, None]) ** 2).mean(dim=1)
        else:
            mean = xg.new_zeros(r)
            var = xg.new_zeros(r)
        rstd = torch.rsqrt(var + eps)
        yg = (xg - mean[:, None]) * rstd[:, None]
        if w is not None:
            yg = yg * w[ow[g]: ow[g] + d].to(ct)
        if b is not None:
            yg = yg + b[ow[g]: ow[g] + d].to(ct)
        yb.copy_(apply_activation(yg, activation))
        stats[0, orow[g]: orow[g] + r] = mean
        stats[1, orow[g]: orow[g] + r] = rstd
    return y, stats


def batched_layer_norm_packed(x, w, b, rows, widths, eps):
    return batched_layer_norm_layout(x, w, b, rows, widths, eps, "packed")


def batched_layer_norm_backward_layout(dy, x, w, stats, rows, widths, has_bias, need_dx, need_dw, need_db, layout,
                                       b=None, activation="none"):
    """Backward in either layout: dx in x's layout, dw / db packed. With an ``activation``,
    ``dy`` is the gradient of its output, taken at the pre-activation recomputed from x, the
    statistics, w and the bias ``b`` (as the kernels do)."""
    ct = _compute_dtype(x.dtype)
    ow, tw = _offsets(list(widths))
    orow, _ = _offsets(list(rows))
    pdt = w.dtype if w is not None else x.dtype
    dx = empty_like_layout(x, rows, widths, layout) if need_dx else x.new_empty(0)
    dw = x.new_empty(tw if (need_dw and w is not None) else 0, dtype=pdt)
    db = x.new_empty(tw if (need_db and has_bias) else 0, dtype=pdt)
    dx_blocks = member_blocks(dx, rows, widths, layout) if need_dx else [None] * len(rows)
    for g, (xb, dyb, dxb, r, d) in enumerate(zip(member_blocks(x, rows, widths, layout),
                                                 member_blocks(dy, rows, widths, layout), dx_blocks, rows, widths)):
        xg, dyg = xb.to(ct), dyb.to(ct)
        mean = stats[0, orow[g]: orow[g] + r].to(ct)
        rstd = stats[1, orow[g]: orow[g] + r].to(ct)
        xhat = (xg - mean[:, None]) * rstd[:, None]
        if activation != "none":
            z = xhat * w[ow[g]: ow[g] + d].to(ct) if w is not None else xhat
            z = z + b[ow[g]: ow[g] + d].to(ct) if b is not None else z
            dyg = activation_grad(dyg, apply_activation(z, activation) if activation in USES_OUTPUT else z, activation)
        wdy = dyg * w[ow[g]: ow[g] + d].to(ct) if w is not None else dyg
        if need_dx and d > 0:
            c1 = (xhat * wdy).mean(dim=1, keepdim=True)
            c2 = wdy.mean(dim=1, keepdim=True)
            dxb.copy_((wdy - (xhat * c1 + c2)) * rstd[:, None])
        if need_dw and w is not None:
            dw[ow[g]: ow[g] + d] = (dyg * xhat).sum(0)
        if need_db and has_bias:
            db[ow[g]: ow[g] + d] = dyg.sum(0)
    return dx, dw, db


def batched_layer_norm_backward_packed(dy, x, w, stats, rows, widths, has_bias, need_dx, need_dw, need_db):
    return batched_layer_norm_backward_layout(dy, x, w, stats, rows, widths, has_bias, need_dx, need_dw, need_db,
                                              "packed")
