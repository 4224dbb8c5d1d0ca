"""Scale: ``y[i] = x[i] * s[g]`` for every element i of member g, one launch for all members.

Memory plan: a grid of (member, block) programs; program (g, b) reads member g's first element
from an int64 table of starts (uploaded once per call, ``runtime.tables.upload``), then one
``BLOCK``-element slice of it; x is read once and y written once.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from ..runtime import tables
from ..runtime.backend import cdiv, device_guard
from ..runtime.launch import launch

BLOCK = 128


@triton.jit
def _scale_kernel(x_ptr, s_ptr, y_ptr, start_ptr, size_ptr, BLOCK: tl.constexpr):
    g = tl.program_id(0)
    b = tl.program_id(1)
    start = tl.load(start_ptr + g)
    size = tl.load(size_ptr + g)
    offs = b * BLOCK + tl.arange(0, BLOCK)
    mask = offs < size
    x = tl.load(x_ptr + start + offs, mask=mask)
    s = tl.load(s_ptr + g)
    tl.store(y_ptr + start + offs, x * s, mask=mask)


def forward_packed(x: torch.Tensor, s: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    y = torch.empty_like(x)
    if not sizes or max(sizes) == 0:
        return y
    starts = np.cumsum([0, *sizes[:-1]]).astype(np.int64)
    start_t = tables.upload(starts, x.device)
    size_t = tables.upload(np.asarray(sizes, dtype=np.int64), x.device)
    grid = (len(sizes), cdiv(max(sizes), BLOCK))
    with device_guard(x.device):
        launch(_scale_kernel, grid, (x, s, y, start_t, size_t), {}, {"BLOCK": BLOCK})
    return y
