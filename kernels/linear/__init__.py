"""Grouped linear: G heterogeneous ``act(F.linear(x_g, W_g, b_g))`` in one launch, with backward.

kernel.py     the Triton kernels (forward, dX, dW+db) and their host side; imported on first use
reference.py  plain torch: the activations, the CPU / no-Triton path, the tests' oracle
op.py         ``torch.ops.optimus.grouped_linear`` and ``grouped_linear_params`` (and their
              backward ops): schemas, checks, implementations, fake implementations, autograd
eager.py      the eager fast path: per-signature plans, device tables, an ``autograd.Function``
vendor.py     ``torch.bmm`` / ``torch._grouped_mm`` routes for uniform groups, by a measured table
api.py        the public functions: which path a call takes
"""

from .api import grouped_linear, grouped_linear_packed
from .reference import ACTIVATIONS

__all__ = ["grouped_linear", "grouped_linear_packed", "ACTIVATIONS"]
