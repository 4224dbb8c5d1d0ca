"""Scale in plain torch, on the packed convention (every member flattened, concatenated)."""

from __future__ import annotations

from typing import Sequence

import torch


def scale_packed(x: torch.Tensor, s: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """``cat_g(x_g * s[g])``: ``x`` packed, ``s`` one scale per member."""
    return x * torch.repeat_interleave(s, torch.tensor(list(sizes), dtype=torch.long, device=x.device))


def member_sums(t: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """The sum of every member of the packed ``t`` (one value per member)."""
    return torch.stack([p.sum() for p in t.split(list(sizes))]) if sizes else t.new_zeros(0)
