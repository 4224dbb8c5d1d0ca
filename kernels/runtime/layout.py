"""The operand layouts of the grouped ops: packed buffers and side-by-side columns.

*Packed*: every member's tensor flattened and the members concatenated into one contiguous
1-D buffer per operand, in member order; the shapes travel as int lists, so an op has static
output sizes and traces under FakeTensor / torch.compile. *Columns* (``layout="columns"``):
every member has the same rows R and x, y are one (R, sum widths) matrix, member g in columns
[sum_<g, sum_<=g): what ``torch.cat(..., dim=1)`` of the members is, and what
``split(x, widths, -1)`` reads from.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch
from torch import Tensor

__all__ = ["pack", "unpack", "fill_missing", "columns_to_packed", "packed_to_columns", "dense", "member_blocks", "empty_like_layout",
           "unit_stride_rows"]


def pack(tensors: Sequence[Tensor]) -> Tensor:
    """Concatenate the flattened tensors into one 1-D buffer (the ops' packed convention)."""
    return torch.cat([t.reshape(-1) for t in tensors])


def unpack(packed: Tensor, shapes: Sequence[Sequence[int]]) -> List[Tensor]:
    """Split a packed 1-D buffer back into views of the given shapes."""
    sizes = [math.prod(s) for s in shapes]
    return [p.view(tuple(s)) for p, s in zip(torch.split(packed, sizes), shapes)]


def fill_missing(params, sizes, like: Tensor, value: float):
    """List of params with None members replaced (ones / zeros); None if all are None."""
    if params is None or all(p is None for p in params):
        return None
    return [p if p is not None else torch.full((n,), value, dtype=like.dtype, device=like.device)
            for p, n in zip(params, sizes)]


def columns_to_packed(t: Tensor, widths: Sequence[int]) -> Tensor:
    """(R, sum widths) -> the packed 1-D buffer of its column blocks (an empty t stays empty)."""
    if t.numel() == 0:
        return t.reshape(-1)
    return torch.cat([c.reshape(-1) for c in t.split(list(widths), 1)])


def packed_to_columns(t: Tensor, rows: int, widths: Sequence[int]) -> Tensor:
    """The packed 1-D buffer of R-row members -> their (R, sum widths) side-by-side matrix."""
    if t.numel() == 0:
        return t
    return torch.cat([p.view(rows, w) for p, w in zip(t.split([rows * w for w in widths]), widths)], 1)


def dense(t: Optional[Tensor], layout: str) -> Optional[Tensor]:
    """A column-layout operand as the kernels read it: row-major (a copy only where it is not)."""
    return t.contiguous() if (t is not None and layout == "columns") else t


def unit_stride_rows(t: Tensor) -> Tensor:
    """A matrix whose rows a kernel reads at their row stride: ``t`` itself when it is 2-D, its
    columns adjacent and its rows apart (a slice of a wider matrix, such as the gradient a ``cat``
    hands each of its inputs), so nothing is copied; else a contiguous copy."""
    if t.dim() == 2 and t.stride(1) == 1 and t.stride(0) >= t.shape[1]:
        return t
    return t.contiguous()


def _starts(sizes: Sequence[int]) -> List[int]:
    out, o = [], 0
    for n in sizes:
        out.append(o)
        o += n
    return out


def member_blocks(t: Tensor, rows: Sequence[int], widths: Sequence[int], layout: str) -> List[Tensor]:
    """Member g's (rows[g], widths[g]) block of ``t`` as a view, in either layout: a range of
    the packed buffer, or a column block of the (R, sum widths) matrix. The plain-torch
    references read their operands and write their results through these views, so, like the
    kernels, they copy no operand into another layout and build no result out of per-member
    pieces: their whole-group buffers are the op's outputs, their temporaries one member's."""
    if layout == "columns":
        return [t[:, c: c + d] for c, d in zip(_starts(widths), widths)]
    sizes = [r * d for r, d in zip(rows, widths)]
    return [t[o: o + n].view(r, d) for o, n, r, d in zip(_starts(sizes), sizes, rows, widths)]


def empty_like_layout(x: Tensor, rows: Sequence[int], widths: Sequence[int], layout: str,
                      dtype: Optional[torch.dtype] = None) -> Tensor:
    """An uninitialized whole-group buffer of ``(rows, widths)`` members in ``layout``."""
    shape = (rows[0], sum(widths)) if layout == "columns" else (sum(r * d for r, d in zip(rows, widths)),)
    return x.new_empty(shape, dtype=dtype if dtype is not None else x.dtype)
