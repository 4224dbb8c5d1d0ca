"""Batched layer norm: G inputs of widths D_g normalised over their last dim in one launch.

kernel.py     the Triton kernels (forward, backward, dW/db reduction) and their host side;
              imported on first use
reference.py  plain torch: the CPU / no-Triton path, the tests' oracle
op.py         ``torch.ops.optimus.batched_layer_norm`` and ``batched_layer_norm_params`` (and
              their backward ops): schemas, checks, implementations, fake implementations, autograd
eager.py      the eager fast path: per-signature plans, device tables, an ``autograd.Function``
api.py        the public functions: which path a call takes
"""

from .api import batched_layer_norm, batched_layer_norm_packed

__all__ = ["batched_layer_norm", "batched_layer_norm_packed"]
