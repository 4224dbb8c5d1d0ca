"""Grouped embedding bag: T lookups over tables of different sizes and dims in one launch.

kernel.py     the Triton kernels (forward, backward walk, sorted-segment reduction) and their host
              side; imported on first use
reference.py  plain torch: the CPU / no-Triton path, the host-side index checks, the tests' oracle
op.py         ``torch.ops.optimus.grouped_embedding_bag`` (and its backward op): schemas, checks,
              implementations, fake implementations, autograd
eager.py      the eager fast path: per-signature plans, an ``autograd.Function``
api.py        the public function: validation, normalisation of the input forms, which path
"""

from .api import MODES, grouped_embedding_bag, key_piece, table_pieces

__all__ = ["grouped_embedding_bag", "MODES", "key_piece", "table_pieces"]
