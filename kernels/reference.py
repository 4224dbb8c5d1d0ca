"""Plain-torch implementations of the grouped ops (the CPU / no-Triton path and the test oracle).

Two flavours:

* list form (:func:`grouped_linear_list`, :func:`batched_layer_norm_list`): a loop of
  ``F.linear`` / ``F.layer_norm`` with ordinary autograd.  Used by the public functions in eager
  mode when the Triton kernels are not used (CPU tensors, no Triton, ``set_backend("torch")``).
* packed form (``*_packed``): the same math on the packed-buffer convention of the custom ops
  (see ``optimus.kernels.ops``), forward and explicit backward.  Registered as the ops' CPU (and
  fallback) implementation, so graphs containing the ops run anywhere.  16-bit inputs are computed
  in fp32 and rounded once, like the kernels.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from ._common import NEEDS_PREACT


def _act(z: torch.Tensor, act: str) -> torch.Tensor:
    if act == "none":
        return z
    if act == "relu":
        return F.relu(z)
    if act == "gelu":
        return F.gelu(z)
    if act == "silu":
        return F.silu(z)
    if act == "sigmoid":
        return torch.sigmoid(z)
    if act == "tanh":
        return torch.tanh(z)
    raise ValueError(f"unknown activation {act!r}")


def _act_grad(dy: torch.Tensor, aux: Optional[torch.Tensor], act: str) -> torch.Tensor:
    """dz from dy and aux (y for relu/sigmoid/tanh, z for gelu/silu); fp32 or fp64 math."""
    if act == "none":
        return dy
    if act == "relu":
        return torch.where(aux > 0, dy, torch.zeros_like(dy))
    if act == "gelu":
        cdf = 0.5 * (1.0 + torch.erf(aux * (1.0 / math.sqrt(2.0))))
        pdf = torch.exp(-0.5 * aux * aux) / math.sqrt(2.0 * math.pi)
        return dy * (cdf + aux * pdf)
    if act == "silu":
        s = torch.sigmoid(aux)
        return dy * (s * (1.0 + aux * (1.0 - s)))
    if act == "sigmoid":
        return dy * aux * (1.0 - aux)
    if act == "tanh":
        return dy * (1.0 - aux * aux)
    raise ValueError(f"unknown activation {act!r}")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ------------------------------------------------------------------------------------------------
# list form (autograd through torch)
# ------------------------------------------------------------------------------------------------
def grouped_linear_list(xs: Sequence[torch.Tensor], weights: Sequence[torch.Tensor],
                        biases: Optional[Sequence[Optional[torch.Tensor]]], act: str) -> List[torch.Tensor]:
    bs = biases if biases is not None else [None] * len(xs)
    return [_act(F.linear(x, w, b), act) for x, w, b in zip(xs, weights, bs)]


def batched_layer_norm_list(xs, weights, biases, eps: float) -> List[torch.Tensor]:
    ws = weights if weights is not None else [None] * len(xs)
    bs = biases if biases is not None else [None] * len(xs)
    return [F.layer_norm(x, (x.shape[-1],), w, b, eps) for x, w, b in zip(xs, ws, bs)]


# ------------------------------------------------------------------------------------------------
# packed form
# ------------------------------------------------------------------------------------------------
def _offsets(sizes):
    out, o = [], 0
    for s in sizes:
        out.append(o)
        o = o + s
    return out, o


def grouped_linear_packed(x, w, b, ms, ks, ns, act):
    ct = _compute_dtype(x.dtype)
    ox, _ = _offsets([m * k for m, k in zip(ms, ks)])
    ow, _ = _offsets([n * k for n, k in zip(ns, ks)])
    ob, _ = _offsets(list(ns))
    ys, zs = [], []
    for g, (m, k, n) in enumerate(zip(ms, ks, ns)):
        xg = x[ox[g]: ox[g] + m * k].view(m, k).to(ct)
        wg = w[ow[g]: ow[g] + n * k].view(n, k).to(ct)
        z = xg @ wg.t()
        if b is not None:
            z = z + b[ob[g]: ob[g] + n].to(ct)
        ys.append(_act(z, act).to(x.dtype).reshape(-1))
        if act in NEEDS_PREACT:
            zs.append(z.to(x.dtype).reshape(-1))  # rounded like the kernel's stored pre-activation
    y = torch.cat(ys) if ys else x.new_empty(0)
    z = (torch.cat(zs) if zs else x.new_empty(0)) if act in NEEDS_PREACT else x.new_empty(0)
    return y, z


def grouped_linear_backward_packed(dy, x, w, aux, ms, ks, ns, act, has_bias, need_dx, need_dw, need_db):
    ct = _compute_dtype(x.dtype)
    ox, tx = _offsets([m * k for m, k in zip(ms, ks)])
    ow, tw = _offsets([n * k for n, k in zip(ns, ks)])
    ob, tb = _offsets(list(ns))
    oy, _ = _offsets([m * n for m, n in zip(ms, ns)])
    dxs, dws, dbs = [], [], []
    for g, (m, k, n) in enumerate(zip(ms, ks, ns)):
        dyg = dy[oy[g]: oy[g] + m * n].view(m, n).to(ct)
        auxg = aux[oy[g]: oy[g] + m * n].view(m, n).to(ct) if aux is not None and act != "none" else None
        dz = _act_grad(dyg, auxg, act)
        if act != "none":
            dz_op = dz.to(x.dtype).to(ct)  # the kernels feed dz to the GEMMs in the input dtype
        else:
            dz_op = dz
        xg = x[ox[g]: ox[g] + m * k].view(m, k).to(ct)
        wg = w[ow[g]: ow[g] + n * k].view(n, k).to(ct)
        if need_dx:
            dxs.append((dz_op @ wg).to(x.dtype).reshape(-1))
        if need_dw:
            dws.append((dz_op.t() @ xg).to(w.dtype).reshape(-1))
        if need_db and has_bias:
            dbs.append(dz.sum(0).to(w.dtype))
    dx = torch.cat(dxs) if (need_dx and dxs) else x.new_empty(tx if need_dx else 0)
    dw = torch.cat(dws) if (need_dw and dws) else w.new_empty(tw if need_dw else 0)
    db = torch.cat(dbs) if (need_db and has_bias and dbs) else w.new_empty(tb if (need_db and has_bias) else 0)
    return dx, dw, db


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


# ------------------------------------------------------------------------------------------------
# the column layout: members side by side in one (rows, sum widths) matrix
# ------------------------------------------------------------------------------------------------
def columns_to_packed(t: torch.Tensor, widths: Sequence[int]) -> torch.Tensor:
    """(R, sum widths) -> the packed 1-D buffer of its column blocks (an empty t stays empty)."""
    if t.numel() == 0:
        return t.reshape(-1)
    return torch.cat([c.reshape(-1) for c in t.split(list(widths), 1)])


def packed_to_columns(t: torch.Tensor, rows: int, widths: Sequence[int]) -> torch.Tensor:
    """The packed 1-D buffer of R-row members -> their (R, sum widths) side-by-side matrix."""
    if t.numel() == 0:
        return t
    return torch.cat([p.view(rows, w) for p, w in zip(t.split([rows * w for w in widths]), widths)], 1)


def grouped_linear_layout(x, w, b, ms, ks, ns, act, layout):
    """``grouped_linear_packed`` in either layout (``"columns"``: x (M, sum K) -> y (M, sum N))."""
    if layout == "packed":
        return grouped_linear_packed(x, w, b, ms, ks, ns, act)
    m = ms[0]
    y, z = grouped_linear_packed(columns_to_packed(x, ks), w, b, ms, ks, ns, act)
    return packed_to_columns(y, m, ns), packed_to_columns(z, m, ns)


def grouped_linear_backward_layout(dy, x, w, aux, ms, ks, ns, act, has_bias, need_dx, need_dw, need_db, layout):
    if layout == "packed":
        return grouped_linear_backward_packed(dy, x, w, aux, ms, ks, ns, act, has_bias, need_dx, need_dw, need_db)
    m = ms[0]
    dx, dw, db = grouped_linear_backward_packed(
        columns_to_packed(dy, ns), columns_to_packed(x, ks), w,
        columns_to_packed(aux, ns) if aux is not None else None, ms, ks, ns, act, has_bias, need_dx, need_dw, need_db)
    return packed_to_columns(dx, m, ks), dw, db


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
