"""hetero_towers: DHEN-like per-feature towers whose input and output widths all differ.

Recommendation models built from per-feature modules (DHEN's ensemble layers, Wukong's
blocks, InterFormer's arches) rarely give every feature the same width: dense feature
groups arrive with their own sizes, and each tower is sized for its feature. This model
is that case in its plainest form. The input ``(B, sum(d_in))`` holds the ``T`` dense
feature groups side by side; it is split into ``T`` features of distinct widths
``d_in[i]`` (views, no copies); feature ``i`` goes through its own
``Linear(d_in[i], d_out[i])``, ``LayerNorm(d_out[i])`` and ``ReLU``, where every
``d_in`` and every ``d_out`` is distinct; the tower outputs are concatenated and a
``Linear`` head gives the logit.

No two towers have the same shapes, so the stack-and-bmm horizontal rules (which need
identical members) find nothing to merge: only heterogeneous grouping (one grouped-linear
kernel, one batched-layer-norm kernel for all ``T`` towers) reduces the ``T`` launches per
layer kind: the zoo's measure of the grouped kernels (training kernels per step and step
time against Inductor, docs/kernels.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import _common as c
from .towers import Tower  # the same Linear -> LayerNorm -> ReLU tower, widths per tower here


@dataclass(frozen=True)
class HeteroTowersConfig:
    batch: int
    d_in: tuple[int, ...]
    d_out: tuple[int, ...]


def _widths(towers: int, start: int, step: int, stride: int) -> tuple[int, ...]:
    """``towers`` distinct widths ``start + step * k`` in a scrambled order (``stride`` is
    coprime with ``towers``), so input and output widths are not sorted alike."""
    return tuple(start + step * ((k * stride) % towers) for k in range(towers))


CONFIGS = {
    "small": HeteroTowersConfig(batch=16, d_in=_widths(24, 4, 1, 1), d_out=_widths(24, 5, 1, 7)),
    "realistic": HeteroTowersConfig(batch=512, d_in=_widths(24, 16, 8, 1), d_out=_widths(24, 24, 8, 7)),
}


class HeteroTowers(nn.Module):
    def __init__(self, cfg: HeteroTowersConfig) -> None:
        super().__init__()
        if len(set(cfg.d_in)) != len(cfg.d_in) or len(set(cfg.d_out)) != len(cfg.d_out):
            raise ValueError("every tower's input width and output width must be distinct")
        self.d_in = list(cfg.d_in)
        self.towers = nn.ModuleList(Tower(i, o) for i, o in zip(cfg.d_in, cfg.d_out))
        self.head = nn.Linear(sum(cfg.d_out), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = x.split(self.d_in, dim=1)
        merged = torch.cat([tower(f) for tower, f in zip(self.towers, features)], dim=1)
        return self.head(merged).squeeze(-1)


def build(size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> c.ZooModel:
    cfg = c.pick(CONFIGS, "hetero_towers", size)
    model = c.seeded(seed, lambda: HeteroTowers(cfg))
    g = c.input_generator(seed)
    x = c.randn(g, cfg.batch, sum(cfg.d_in))
    targets = c.binary_targets(g, cfg.batch)
    return c.finish("hetero_towers", size, model, (x,), targets, cfg.batch, device, cfg)
