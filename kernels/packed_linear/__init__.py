"""Packed linear: a batched linear over G identical linears whose weights lie packed in one
storage, read through a view instead of a stack (``optimus.pack_parameters``).

op.py         ``torch.ops.optimus.packed_linear`` (and its backward op), ``packed_slot``: schemas,
              checks, implementation (``torch.bmm`` / ``torch.baddbmm``, which is also the
              reference), fake implementations, autograd

No Triton kernel: the vendor batched GEMM is the kernel; what the op adds is reading the
weights in place.
"""

from .op import packed_slot

__all__ = ["packed_slot"]
