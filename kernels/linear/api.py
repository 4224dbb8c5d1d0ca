"""The public function of the grouped linear, and which of three paths a call takes.

``grouped_linear(xs, weights, biases, activation)`` takes lists and returns a list:

* in eager mode with Triton available: the eager fast path (``eager.py``), an
  ``autograd.Function`` launching the kernels on the members' own storage;
* under tracing (dynamo, make_fx, fake tensors): pack, call ``torch.ops.optimus.grouped_linear``
  (``op.py``) and split: the graph the horizontal rules produce;
* otherwise (CPU, no Triton, float64): a loop of ``F.linear`` (``reference.py``).

:func:`grouped_linear_packed` calls the op on the packed convention directly.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
from torch import Tensor

from ..runtime.checks import is_tracing, rows_of, triton_ok
from ..runtime.layout import fill_missing, pack
from . import op  # noqa: F401  (importing registers the optimus:: ops)
from . import reference as ref
from .eager import run as _eager_run, validate
from .reference import activation_code


def grouped_linear_packed(x: Tensor, w: Tensor, b: Optional[Tensor], ms: Sequence[int], ks: Sequence[int],
                          ns: Sequence[int], activation: Optional[str] = None) -> Tensor:
    """``optimus::grouped_linear`` on packed buffers; returns the packed output only."""
    return torch.ops.optimus.grouped_linear(x, w, b, list(ms), list(ks), list(ns), activation_code(activation))[0]


def _via_op(xs, weights, biases, act):
    ks = [x.shape[-1] for x in xs]
    ns = [w.shape[0] for w in weights]
    ms = [rows_of(x) for x in xs]
    xp = pack(xs)
    wp = pack(weights)
    bl = fill_missing(biases, ns, xs[0], 0.0) if biases is not None else None
    bp = torch.cat(list(bl)) if bl is not None else None
    y, _ = torch.ops.optimus.grouped_linear(xp, wp, bp, ms, ks, ns, act)
    outs = torch.split(y, [m * n for m, n in zip(ms, ns)])
    return [o.view(tuple(x.shape[:-1]) + (n,)) for o, x, n in zip(outs, xs, ns)]


def grouped_linear(xs: Sequence[Tensor], weights: Sequence[Tensor],
                   biases: Optional[Sequence[Optional[Tensor]]] = None,
                   activation: Optional[str] = None) -> List[Tensor]:
    """``[act(F.linear(x, w, b)) for x, w, b in zip(xs, weights, biases)]`` as one grouped kernel.

    xs[g]: (..., K_g); weights[g]: (N_g, K_g) (``nn.Linear.weight`` layout); biases: None or a list
    whose entries are (N_g,) tensors or None; activation: None, "relu", "gelu", "silu", "sigmoid",
    "tanh" (fused into the kernel epilogue).  All members share one dtype (float16, bfloat16,
    float32; float64 on the plain-torch path) and one device, and must be contiguous.  Returns the
    list of (..., N_g) outputs; differentiable with respect to xs, weights and biases.
    """
    act = activation_code(activation)
    out = _eager_run(xs, weights, biases, act)  # eager Triton path (validation cached per call signature)
    if out is not None:
        return out
    validate(xs, weights, biases)
    tensors = list(xs) + list(weights) + (list(biases) if biases is not None else [])
    if is_tracing(tensors) or triton_ok(xs[0]):
        # traced, or Triton tensors that the eager path declined (tensor subclasses): the custom op
        return _via_op(xs, weights, biases, act)
    return ref.grouped_linear_list(xs, weights, biases, act)
