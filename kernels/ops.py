"""Public functions of the grouped kernels, and what routes a call to one of three paths.

The user-facing ``grouped_linear`` / ``batched_layer_norm`` take lists and return lists:

* in eager mode with Triton available, the eager fast path (``eager.py``): an
  ``autograd.Function`` launches the kernels with offsets taken from the members' own
  storage; validation and shape work are cached per call signature and the offset tables on
  the device per (signature, pointers), so a steady-state step does O(1) Python work plus one
  C++-level call per member tensor and uploads nothing;
* under tracing (dynamo, make_fx, fake tensors) they pack, call the custom op
  (``custom_ops.py``: ``torch.ops.optimus.*``), and split: that is the graph the horizontal
  rules produce;
* otherwise (CPU, no Triton, float64) a loop of ``F.linear`` / ``F.layer_norm``
  (``reference.py``).

``pack`` / ``unpack`` / ``*_packed`` work on the custom ops' packed convention directly.
"""

import math
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from . import custom_ops as _custom_ops  # noqa: F401  (registers the optimus:: ops)
from . import reference as ref
from ._common import activation_code
from ._routing import _rows, _tracing, _triton_ok, _validate_gl, _validate_ln
from .eager import _gl_eager, _ln_eager, clear_eager_caches, eager_cache_info, set_gl_route, set_table_cache  # noqa: F401


# ------------------------------------------------------------------------------------------------
# packed helpers (what the horizontal rules emit)
# ------------------------------------------------------------------------------------------------
def pack(tensors: Sequence[Tensor]) -> Tensor:
    """Concatenate the flattened tensors into one 1-D buffer (the ops' packed convention)."""
    return torch.cat([t.reshape(-1) for t in tensors])


def unpack(packed: Tensor, shapes: Sequence[Sequence[int]]) -> List[Tensor]:
    """Split a packed 1-D buffer back into views of the given shapes."""
    sizes = [math.prod(s) for s in shapes]
    return [p.view(tuple(s)) for p, s in zip(torch.split(packed, sizes), shapes)]


def grouped_linear_packed(x: Tensor, w: Tensor, b: Optional[Tensor], ms: Sequence[int], ks: Sequence[int],
                          ns: Sequence[int], activation: Optional[str] = None) -> Tensor:
    """``optimus::grouped_linear`` on packed buffers; returns the packed output only."""
    return torch.ops.optimus.grouped_linear(x, w, b, list(ms), list(ks), list(ns), activation_code(activation))[0]


def batched_layer_norm_packed(x: Tensor, w: Optional[Tensor], b: Optional[Tensor], rows: Sequence[int],
                              widths: Sequence[int], eps: float = 1e-5) -> Tensor:
    """``optimus::batched_layer_norm`` on packed buffers; returns the packed output only."""
    return torch.ops.optimus.batched_layer_norm(x, w, b, list(rows), list(widths), float(eps))[0]


def _fill_missing(params, sizes, like: Tensor, value: float):
    """List of params with None members replaced (ones / zeros); None if all are None."""
    if params is None or all(p is None for p in params):
        return None
    return [p if p is not None else torch.full((n,), value, dtype=like.dtype, device=like.device)
            for p, n in zip(params, sizes)]


# ------------------------------------------------------------------------------------------------
# public functions
# ------------------------------------------------------------------------------------------------
def _gl_via_op(xs, weights, biases, act):
    ks = [x.shape[-1] for x in xs]
    ns = [w.shape[0] for w in weights]
    ms = [_rows(x) for x in xs]
    xp = pack(xs)
    wp = pack(weights)
    bl = _fill_missing(biases, ns, xs[0], 0.0) if biases is not None else None
    bp = torch.cat(list(bl)) if bl is not None else None
    y, _ = torch.ops.optimus.grouped_linear(xp, wp, bp, ms, ks, ns, act)
    outs = torch.split(y, [m * n for m, n in zip(ms, ns)])
    return [o.view(tuple(x.shape[:-1]) + (n,)) for o, x, n in zip(outs, xs, ns)]


def _ln_via_op(xs, weights, biases, eps):
    widths = [x.shape[-1] for x in xs]
    rows = [_rows(x) for x in xs]
    xp = pack(xs)
    wl = _fill_missing(weights, widths, xs[0], 1.0) if weights is not None else None
    bl = _fill_missing(biases, widths, xs[0], 0.0) if biases is not None else None
    wp = torch.cat(list(wl)) if wl is not None else None
    bp = torch.cat(list(bl)) if bl is not None else None
    y, _ = torch.ops.optimus.batched_layer_norm(xp, wp, bp, rows, widths, float(eps))
    outs = torch.split(y, [r * d for r, d in zip(rows, widths)])
    return [o.view(x.shape) for o, x in zip(outs, xs)]


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
    out = _gl_eager(xs, weights, biases, act)  # eager Triton path (validation cached per call signature)
    if out is not None:
        return out
    _validate_gl(xs, weights, biases)
    tensors = list(xs) + list(weights) + (list(biases) if biases is not None else [])
    if _tracing(tensors) or _triton_ok(xs[0]):
        # traced, or Triton tensors that the eager path declined (tensor subclasses): the custom op
        return _gl_via_op(xs, weights, biases, act)
    return ref.grouped_linear_list(xs, weights, biases, act)


def batched_layer_norm(xs: Sequence[Tensor], weights: Optional[Sequence[Optional[Tensor]]] = None,
                       biases: Optional[Sequence[Optional[Tensor]]] = None, eps: float = 1e-5) -> List[Tensor]:
    """``[F.layer_norm(x, (x.shape[-1],), w, b, eps) for ...]`` as one batched kernel.

    Each xs[g] (..., D_g) is normalised over its last dim; weights / biases: None or lists of
    (D_g,) tensors (entries may be None).  Statistics in fp32.  Same dtype / device / contiguity
    rules as :func:`grouped_linear`.  Returns the list of outputs, differentiable.
    """
    out = _ln_eager(xs, weights, biases, eps)
    if out is not None:
        return out
    _validate_ln(xs, weights, biases, eps)
    tensors = list(xs) + (list(weights) if weights is not None else []) + \
        (list(biases) if biases is not None else [])
    if _tracing(tensors) or _triton_ok(xs[0]):
        return _ln_via_op(xs, weights, biases, eps)
    return ref.batched_layer_norm_list(xs, weights, biases, eps)

