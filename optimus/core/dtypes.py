"""Facts about dtypes that rules moving or folding casts rely on.

A conversion ``cast(x, b)`` rounds each value of ``x`` to the nearest value of ``b``; two
conversions in a row are one only when the first loses nothing
(``cast(cast(x, a), b) == cast(x, b)`` iff every value of ``x``'s dtype is a value of
``a``). A narrowing then widening pair (fp32 -> bf16 -> fp32) is not an identity: it
rounds away 16 bits of every mantissa.
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: Floating dtypes of fewer than 32 bits: autocast's lower-precision dtypes, whose
#: reductions and normalizations eager computes in fp32.
REDUCED_FLOATS: frozenset[torch.dtype] = frozenset({torch.float16, torch.bfloat16})


def holds(wide: Any, narrow: Any) -> bool:
    """Is every value of dtype ``narrow`` exactly a value of dtype ``wide``?"""
    if not isinstance(wide, torch.dtype) or not isinstance(narrow, torch.dtype):
        return False
    if wide == narrow or narrow == torch.bool:
        return True
    if wide.is_complex or narrow.is_complex:
        return wide.is_complex and holds(_real(wide), _real(narrow))
    if wide == torch.bool:
        return False
    if wide.is_floating_point:
        f = torch.finfo(wide)
        if narrow.is_floating_point:
            n = torch.finfo(narrow)
            return f.eps <= n.eps and f.max >= n.max and f.smallest_normal <= n.smallest_normal
        i = torch.iinfo(narrow)
        limit = 2.0 ** (1 - round(math.log2(f.eps)))  # integers up to 2^(mantissa bits + 1) are exact
        return max(abs(i.min), i.max) <= limit
    if narrow.is_floating_point:
        return False
    w, n = torch.iinfo(wide), torch.iinfo(narrow)
    return w.min <= n.min and w.max >= n.max


def _real(dtype: torch.dtype) -> torch.dtype:
    return {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)


def compute_dtype(*dtypes: Any) -> torch.dtype | None:
    """The dtype eager's mixed-precision normalization computes in: fp32 for reduced floats
    (``layer_norm`` on bf16 input with fp32 weights accumulates and applies the affine in
    fp32, then rounds once), else the widest of ``dtypes``."""
    known = [d for d in dtypes if isinstance(d, torch.dtype)]
    if not known:
        return None
    out = known[0]
    for d in known[1:]:
        out = torch.promote_types(out, d)
    return torch.float32 if out in REDUCED_FLOATS else out
