"""towers32: parallel per-feature towers (Linear -> LayerNorm -> ReLU), concatenated.

A pattern common in recommendation models where every dense feature group gets its
own small tower before the groups are merged. The input ``(B, T, d_in)`` is unbound
into ``T`` features (views, no copies); each goes through its own ``Linear(d_in,
d_out)``, ``LayerNorm(d_out)`` and ``ReLU``; the tower outputs are concatenated and a
Linear head gives the logit. The ``T`` identical, independent towers are the
horizontal-fusion case: upstream's ``batch_linear``/``batch_layernorm``/``batch_relu``
and Optimus's horizontal rules each turn ``T`` small ops into one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import _common as c


@dataclass(frozen=True)
class TowersConfig:
    batch: int
    towers: int
    d_in: int
    d_out: int


CONFIGS = {
    "small": TowersConfig(batch=16, towers=32, d_in=8, d_out=8),
    "realistic": TowersConfig(batch=512, towers=32, d_in=64, d_out=64),
}


class Tower(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d_in, d_out)
        self.norm = nn.LayerNorm(d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.linear(x)))


class Towers(nn.Module):
    def __init__(self, cfg: TowersConfig) -> None:
        super().__init__()
        self.towers = nn.ModuleList(Tower(cfg.d_in, cfg.d_out) for _ in range(cfg.towers))
        self.head = nn.Linear(cfg.towers * cfg.d_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = x.unbind(1)
        merged = torch.cat([tower(f) for tower, f in zip(self.towers, features)], dim=1)
        return self.head(merged).squeeze(-1)


def build(size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> c.ZooModel:
    cfg = c.pick(CONFIGS, "towers32", size)
    model = c.seeded(seed, lambda: Towers(cfg))
    g = c.input_generator(seed)
    x = c.randn(g, cfg.batch, cfg.towers, cfg.d_in)
    targets = c.binary_targets(g, cfg.batch)
    return c.finish("towers32", size, model, (x,), targets, cfg.batch, device, cfg)
