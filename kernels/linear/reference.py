"""Grouped linear in plain torch: the activations, the CPU / no-Triton path and the test oracle.

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

import math
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from ..runtime.layout import empty_like_layout, member_blocks


# activation name -> code used by the kernels (constexpr ACT)
ACTIVATIONS = {"none": 0, "relu": 1, "gelu": 2, "silu": 3, "sigmoid": 4, "tanh": 5}
# activations whose derivative needs the pre-activation z (saved by the forward);
# the others differentiate from the output y.
NEEDS_PREACT = ("gelu", "silu")
USES_OUTPUT = ("relu", "sigmoid", "tanh")


def activation_code(activation) -> str:
    """Normalise the ``activation`` argument to one of ``ACTIVATIONS``' names."""
    if activation is None:
        return "none"
    if not isinstance(activation, str) or activation.lower() not in ACTIVATIONS:
        raise ValueError(
            f"activation must be None or one of {sorted(k for k in ACTIVATIONS if k != 'none')}, "
            f"got {activation!r}"
        )
    return activation.lower()


def saved_activation(act: str, y, pre):
    """What the backward needs of its activation ``act`` (a normalised name): the
    pre-activation, the output, or nothing."""
    return pre if act in NEEDS_PREACT else (y if act in USES_OUTPUT else None)


def apply_activation(z: torch.Tensor, act: str) -> torch.Tensor:
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


def activation_grad(dy: torch.Tensor, aux: Optional[torch.Tensor], act: str) -> torch.Tensor:
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
