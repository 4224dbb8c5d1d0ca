"""optimus.kernels: hand-written Triton kernels for horizontally fused layers, one folder per family.

Public functions (lists in, list out)::

    grouped_linear(xs, weights, biases=None, activation=None) -> list[Tensor]
        [act(F.linear(x_g, W_g, b_g)) for each member g], G heterogeneous GEMMs in one launch
        (forward) and two (backward: dX and dW+db grouped GEMMs).               linear/
    batched_layer_norm(xs, weights=None, biases=None, eps=1e-5) -> list[Tensor]
        [F.layer_norm(x_g, (D_g,), w_g, b_g, eps) for each member g] in one launch (forward) and
        two (backward: dx + per-chunk dW/db partials, then a small reduction).  layer_norm/
    grouped_embedding_bag(weights, indices, offsets=None, ...) -> Tensor [B, sum D_t]
        T embedding-bag lookups over tables of different sizes and dims in one launch.
                                                                                embedding_bag/

with :func:`grouped_linear_packed`, :func:`batched_layer_norm_packed`, :func:`pack` and
:func:`unpack` for the ops' packed convention. Each family folder holds the Triton kernel
(``kernel.py``), the ops ``torch.ops.optimus.*`` (``op.py``: schema, implementation, fake,
autograd), the eager fast path (``eager.py``), the plain-torch reference (``reference.py``) and the
public function (``api.py``); ``packed_linear/`` holds ``torch.ops.optimus.packed_linear`` (packed
weights read in place) and ``runtime/`` what the families share (docs/kernels.md).

Backends: Triton on CUDA tensors (the Triton interpreter on CPU tensors when
``TRITON_INTERPRET=1``), plain torch otherwise (:func:`set_backend` overrides).  This package
imports without CUDA and without Triton: the Triton modules are imported on first use.
Importing it registers every ``optimus::`` op.
"""

from . import packed_linear  # noqa: F401  (registers optimus::packed_linear)
from .embedding_bag import grouped_embedding_bag
from .layer_norm import batched_layer_norm, batched_layer_norm_packed
from .linear import ACTIVATIONS, grouped_linear, grouped_linear_packed
from .runtime.backend import get_backend, set_backend, triton_available
from .runtime.layout import pack, unpack

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
