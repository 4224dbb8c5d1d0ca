"""optimus.kernels: hand-written Triton kernels for horizontally fused layers.

Public functions (lists in, list out)::

    grouped_linear(xs, weights, biases=None, activation=None) -> list[Tensor]
        [act(F.linear(x_g, W_g, b_g)) for each member g], G heterogeneous GEMMs in one launch
        (forward) and two (backward: dX and dW+db grouped GEMMs).
    batched_layer_norm(xs, weights=None, biases=None, eps=1e-5) -> list[Tensor]
        [F.layer_norm(x_g, (D_g,), w_g, b_g, eps) for each member g] in one launch (forward) and
        two (backward: dx + per-chunk dW/db partials, then a small reduction).

Custom ops for graph rewrites (packed convention, see :mod:`optimus.kernels.ops`)::

    torch.ops.optimus.grouped_linear(x, w, b, ms, ks, ns, activation) -> (y, preact)
    torch.ops.optimus.grouped_linear_backward(dy, x, w, aux, ms, ks, ns, activation,
                                              has_bias, need_dx, need_dw, need_db) -> (dx, dw, db)
    torch.ops.optimus.batched_layer_norm(x, w, b, rows, widths, eps) -> (y, stats)
    torch.ops.optimus.batched_layer_norm_backward(dy, x, w, stats, rows, widths,
                                                  has_bias, need_dx, need_dw, need_db) -> (dx, dw, db)

    torch.ops.optimus.packed_linear(x, weights, biases) -> y    (packed_ops.py: a batched linear
        reading packed parameters through a view of their buffer; see optimus.pack_parameters)
    torch.ops.optimus.grouped_linear_params(x, weights, biases, ms, ks, ns, activation, layout)
    torch.ops.optimus.batched_layer_norm_params(x, weights, biases, rows, widths, eps, layout)
        (param_ops.py: the grouped ops with the parameters as lists, read in place when they
        lie concatenated in one buffer)

with helpers :func:`pack`, :func:`unpack`, :func:`grouped_linear_packed` and
:func:`batched_layer_norm_packed`.  The forward ops carry fake implementations and registered
autograd, so ``torch.compile(fullgraph=True)`` traces graphs that contain them.

Backends: Triton on CUDA tensors (the Triton interpreter on CPU tensors when
``TRITON_INTERPRET=1``), plain torch otherwise (:func:`set_backend` overrides).  This package
imports without CUDA and without Triton: the Triton modules are imported on first use.
"""

from . import packed_ops  # noqa: F401  (registers optimus::packed_linear)
from . import param_ops  # noqa: F401  (registers optimus::grouped_linear_params, batched_layer_norm_params)
from ._common import ACTIVATIONS, get_backend, set_backend, triton_available
from .embedding_ops import grouped_embedding_bag
from .ops import (
    batched_layer_norm,
    batched_layer_norm_packed,
    grouped_linear,
    grouped_linear_packed,
    pack,
    unpack,
)

__all__ = [
    "grouped_linear",
    "batched_layer_norm",
    "grouped_embedding_bag",
    "grouped_linear_packed",
    "batched_layer_norm_packed",
    "pack",
    "unpack",
    "set_backend",
    "get_backend",
    "triton_available",
    "ACTIVATIONS",
]
