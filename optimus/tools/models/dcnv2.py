"""DCNv2 with a mixture of low-rank cross experts.

Written from the public description in Wang et al., 2021, "DCN V2: Improved Deep &
Cross Network and Practical Lessons for Web-scale Learning to Rank Systems" (section
"Cost-Effective Mixture of Low-Rank DCN"):

    E_i(x_l)  = x_0 * (U_i g(C_i g(V_i^T x_l)) + b_i)       (one low-rank expert)
    x_{l+1}   = sum_i G_i(x_l) E_i(x_l) + x_l                (gated mixture, residual)

Each cross layer holds K identical expert chains (Linear V, act, Linear C, act,
Linear U) and K gates ``Linear(d, 1)``; the expert outputs and gate logits are stacked
and combined with a softmax-weighted sum. Those K same-shape chains are the
horizontal-fusion work this model exercises. The input is the concatenation of a
dense projection and per-feature embeddings; a deep MLP on the cross output gives the
logit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import _common as c


@dataclass(frozen=True)
class DCNv2Config:
    batch: int
    num_dense: int
    num_sparse: int
    rows: int
    dim: int
    layers: int
    experts: int
    rank: int
    deep: tuple[int, ...]


CONFIGS = {
    "small": DCNv2Config(batch=32, num_dense=8, num_sparse=4, rows=100, dim=8, layers=2, experts=4, rank=8, deep=(32,)),
    "realistic": DCNv2Config(
        batch=2048, num_dense=13, num_sparse=16, rows=10_000, dim=64, layers=2, experts=8, rank=128,
        deep=(1024, 512),
    ),
}


class LowRankExpert(nn.Module):
    def __init__(self, width: int, rank: int) -> None:
        super().__init__()
        self.v = nn.Linear(width, rank, bias=False)
        self.c = nn.Linear(rank, rank, bias=False)
        self.u = nn.Linear(rank, width)

    def forward(self, x0: torch.Tensor, xl: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.v(xl))
        h = torch.tanh(self.c(h))
        return x0 * self.u(h)


class MixtureCrossLayer(nn.Module):
    def __init__(self, width: int, rank: int, experts: int) -> None:
        super().__init__()
        self.experts = nn.ModuleList(LowRankExpert(width, rank) for _ in range(experts))
        self.gates = nn.ModuleList(nn.Linear(width, 1, bias=False) for _ in range(experts))

    def forward(self, x0: torch.Tensor, xl: torch.Tensor) -> torch.Tensor:
        outs = torch.stack([e(x0, xl) for e in self.experts], dim=2)  # (B, d, K)
        gates = torch.stack([g(xl).squeeze(1) for g in self.gates], dim=1)  # (B, K)
        weights = torch.softmax(gates, dim=1).unsqueeze(1)  # (B, 1, K)
        return (outs * weights).sum(dim=2) + xl


class DCNv2(nn.Module):
    def __init__(self, cfg: DCNv2Config) -> None:
        super().__init__()
        width = cfg.dim * (cfg.num_sparse + 1)
        self.features = c.DenseSparseFeatures(cfg.num_dense, cfg.num_sparse, cfg.rows, cfg.dim)
        self.cross = nn.ModuleList(MixtureCrossLayer(width, cfg.rank, cfg.experts) for _ in range(cfg.layers))
        self.deep = c.mlp((width, *cfg.deep, 1))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat(self.features(dense, sparse), dim=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return self.deep(x).squeeze(-1)


def build(size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> c.ZooModel:
    return c.build_dense_sparse("dcnv2", CONFIGS, DCNv2, size, device, seed)
