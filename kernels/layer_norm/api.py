"""The public function of the batched layer norm, and which of three paths a call takes.

``batched_layer_norm(xs, weights, biases, eps)`` takes lists and returns a list: the eager fast
path (``eager.py``) in eager mode with Triton available; pack, ``torch.ops.optimus.batched_layer_norm``
(``op.py``) and split under tracing; a loop of ``F.layer_norm`` (``reference.py``) otherwise.

:func:`batched_layer_norm_packed` calls the op on the packed convention directly.
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


def batched_layer_norm_packed(x: Tensor, w: Optional[Tensor], b: Optional[Tensor], rows: Sequence[int],
                              widths: Sequence[int], eps: float = 1e-5) -> Tensor:
    """``optimus::batched_layer_norm`` on packed buffers; returns the packed output only."""
    return torch.ops.optimus.batched_layer_norm(x, w, b, list(rows), list(widths), float(eps))[0]


def _via_op(xs, weights, biases, eps):
    widths = [x.shape[-1] for x in xs]
    rows = [rows_of(x) for x in xs]
    xp = pack(xs)
    wl = fill_missing(weights, widths, xs[0], 1.0) if weights is not None else None
    bl = fill_missing(biases, widths, xs[0], 0.0) if biases is not None else None
    wp = torch.cat(list(wl)) if wl is not None else None
    bp = torch.cat(list(bl)) if bl is not None else None
    y, _ = torch.ops.optimus.batched_layer_norm(xp, wp, bp, rows, widths, float(eps))
    outs = torch.split(y, [r * d for r, d in zip(rows, widths)])
    return [o.view(x.shape) for o, x in zip(outs, xs)]


def batched_layer_norm(xs: Sequence[Tensor], weights: Optional[Sequence[Optional[Tensor]]] = None,
                       biases: Optional[Sequence[Optional[Tensor]]] = None, eps: float = 1e-5) -> List[Tensor]:
    """``[F.layer_norm(x, (x.shape[-1],), w, b, eps) for ...]`` as one batched kernel.

    Each xs[g] (..., D_g) is normalised over its last dim; weights / biases: None or lists of
    (D_g,) tensors (entries may be None).  Statistics in fp32.  Same dtype / device / contiguity
    rules as :func:`grouped_linear`.  Returns the list of outputs, differentiable.
    """
    out = _eager_run(xs, weights, biases, eps)
    if out is not None:
        return out
    validate(xs, weights, biases, eps)
    tensors = list(xs) + (list(weights) if weights is not None else []) + \
        (list(biases) if biases is not None else [])
    if is_tracing(tensors) or triton_ok(xs[0]):
        return _via_op(xs, weights, biases, eps)
    return ref.batched_layer_norm_list(xs, weights, biases, eps)
