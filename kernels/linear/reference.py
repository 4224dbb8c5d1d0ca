"""Grouped linear in plain torch: the CPU / no-Triton path and the test oracle.

Two flavours:

* list form (:func:`grouped_linear_list`): a loop of ``F.linear`` and the activation, with
  ordinary autograd. Used by the public function in eager mode when the Triton kernels are not
  used (CPU tensors, no Triton, ``set_backend("torch")``).
* packed form (``grouped_linear_packed`` / ``*_backward_packed``, and ``*_layout`` for either
  layout): the same math on the ops' packed convention (:mod:`optimus.kernels.runtime.layout`),
  forward and explicit backward. The ops' implementation off Triton, so graphs containing them
  run anywhere. 16-bit inputs are computed in fp32 and rounded once, like the kernels.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from ..runtime.activation import (  # noqa: F401  (the family's activation names, re-exported)
    ACTIVATIONS, NEEDS_PREACT, USES_OUTPUT, activation_code, activation_grad, apply_activation, saved_activation)
from ..runtime.layout import empty_like_layout, member_blocks


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def grouped_linear_list(xs: Sequence[torch.Tensor], weights: Sequence[torch.Tensor],
                        biases: Optional[Sequence[Optional[torch.Tensor]]], act: str) -> List[torch.Tensor]:
    bs = biases if biases is not None else [None] * len(xs)
    return [apply_activation(F.linear(x, w, b), act) for x, w, b in zip(xs, weights, bs)]


def _offsets(sizes):
    out, o = [], 0
    for s in sizes:
        out.append(o)
        o = o + s
    return out, o


def grouped_linear_layout(x, w, b, ms, ks, ns, act, layout):
    """Forward in either layout (``"columns"``: x (M, sum K) -> y (M, sum N)); (y, pre-activation
    or empty)."""
    ct = _compute_dtype(x.dtype)
    ow, _ = _offsets([n * k for n, k in zip(ns, ks)])
    ob, _ = _offsets(list(ns))
    y = empty_like_layout(x, ms, ns, layout)
    z = empty_like_layout(x, ms, ns, layout) if act in NEEDS_PREACT else x.new_empty(0)
    z_blocks = member_blocks(z, ms, ns, layout) if act in NEEDS_PREACT else [None] * len(ms)
    for g, (xb, yb, zb, m, k, n) in enumerate(zip(member_blocks(x, ms, ks, layout), member_blocks(y, ms, ns, layout),
                                                  z_blocks, ms, ks, ns)):
        zg = xb.to(ct) @ w[ow[g]: ow[g] + n * k].view(n, k).to(ct).t()
        if b is not None:
            zg = zg + b[ob[g]: ob[g] + n].to(ct)
        yb.copy_(apply_activation(zg, act))
        if zb is not None:
            zb.copy_(zg)  # rounded like the kernel's stored pre-activation
    return y, z


def grouped_linear_packed(x, w, b, ms, ks, ns, act):
    return grouped_linear_layout(x, w, b, ms, ks, ns, act, "packed")


def grouped_linear_backward_layout(dy, x, w, aux, ms, ks, ns, act, has_bias, need_dx, need_dw, need_db, layout):
    """Backward in either layout: dx in x's layout, dw / db packed."""
    ct = _compute_dtype(x.dtype)
    ow, tw = _offsets([n * k for n, k in zip(ns, ks)])
    ob, tb = _offsets(list(ns))
    dx = empty_like_layout(x, ms, ks, layout) if need_dx else x.new_empty(0)
    dw = w.new_empty(tw if need_dw else 0)
    db = w.new_empty(tb if (need_db and has_bias) else 0)
    use_aux = aux is not None and act != "none"
    aux_blocks = member_blocks(aux, ms, ns, layout) if use_aux else [None] * len(ms)
    dx_blocks = member_blocks(dx, ms, ks, layout) if need_dx else [None] * len(ms)
    for g, (dyb, xb, auxb, dxb, m, k, n) in enumerate(zip(member_blocks(dy, ms, ns, layout),
                                                          member_blocks(x, ms, ks, layout), aux_blocks, dx_blocks,
                                                          ms, ks, ns)):
        dz = activation_grad(dyb.to(ct), auxb.to(ct) if auxb is not None else None, act)
        # the kernels feed dz to the GEMMs in the input dtype
        dz_op = dz.to(x.dtype).to(ct) if act != "none" else dz
        wg = w[ow[g]: ow[g] + n * k].view(n, k).to(ct)
        if need_dx:
            dxb.copy_(dz_op @ wg)
        if need_dw:
            dw[ow[g]: ow[g] + n * k].view(n, k).copy_(dz_op.t() @ xb.to(ct))
        if need_db and has_bias:
            db[ob[g]: ob[g] + n] = dz.sum(0)
    return dx, dw, db


def grouped_linear_backward_packed(dy, x, w, aux, ms, ks, ns, act, has_bias, need_dx, need_dw, need_db):
    return grouped_linear_backward_layout(dy, x, w, aux, ms, ks, ns, act, has_bias, need_dx, need_dw, need_db,
                                          "packed")
