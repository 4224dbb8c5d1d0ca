"""dcn_cross: a DCN-v2 model with full-rank cross layers and a parallel deep tower.

Written from the public description in Wang et al., 2021, "DCN V2: Improved Deep & Cross
Network and Practical Lessons for Web-scale Learning to Rank Systems" (the "parallel"
structure with full-rank cross layers):

    x_0      = [dense, e_1, ..., e_n]                  (raw dense features, embeddings)
    x_{l+1}  = x_0 * (W_l x_l + b_l) + x_l             (cross layer, W_l is d x d)
    h        = DNN(x_0)                                (deep tower, in parallel)
    logit    = w^T [x_L, h] + b                        (concat, head)

Every sparse feature has its own ``nn.Embedding`` (one id per example); the embeddings
and the raw dense features are concatenated into ``x_0`` of width ``num_dense + n * dim``
(429 in the realistic config: not a multiple of 8, as such widths come out). The cross
stack and the deep tower both read ``x_0``; their outputs are concatenated for the head.

Unlike ``dcnv2`` (a mixture of low-rank experts: many same-shape chains), each cross layer
here is one square matmul followed by a multiply-add with ``x_0`` and the residual, a
chain of pointwise work around a GEMM that vertical fusion and the epilogue handle, and
the two branches read one ``cat`` (two Linears on one input: the cross layer's first and
the deep tower's first). Graph shapes: a many-input ``cat`` of embeddings, square
addmm plus pointwise epilogues, a deep MLP, and a concatenation of two branches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import _common as c


@dataclass(frozen=True)
class DCNCrossConfig:
    batch: int
    num_dense: int
    num_sparse: int
    rows: int
    dim: int
    layers: int
    deep: tuple[int, ...]


CONFIGS = {
    "small": DCNCrossConfig(batch=32, num_dense=5, num_sparse=4, rows=100, dim=4, layers=2, deep=(32, 16)),
    "realistic": DCNCrossConfig(
        batch=2048, num_dense=13, num_sparse=26, rows=10_000, dim=16, layers=3, deep=(1024, 1024, 512),
    ),
}


class CrossLayer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x0: torch.Tensor, xl: torch.Tensor) -> torch.Tensor:
        return x0 * self.linear(xl) + xl


class DCNCross(nn.Module):
    def __init__(self, cfg: DCNCrossConfig) -> None:
        super().__init__()
        width = cfg.num_dense + cfg.num_sparse * cfg.dim
        self.tables = nn.ModuleList(nn.Embedding(cfg.rows, cfg.dim) for _ in range(cfg.num_sparse))
        for t in self.tables:
            nn.init.normal_(t.weight, std=0.1)
        self.cross = nn.ModuleList(CrossLayer(width) for _ in range(cfg.layers))
        self.deep = c.mlp((width, *cfg.deep), final_activation=True)
        self.head = nn.Linear(width + cfg.deep[-1], 1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([dense] + [t(sparse[:, i]) for i, t in enumerate(self.tables)], dim=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return self.head(torch.cat([x, self.deep(x0)], dim=1)).squeeze(-1)


def build(size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> c.ZooModel:
    cfg = c.pick(CONFIGS, "dcn_cross", size)
    model = c.seeded(seed, lambda: DCNCross(cfg))
    g = c.input_generator(seed)
    dense, sparse = c.dense_sparse_inputs(g, cfg)
    targets = c.binary_targets(g, cfg.batch)
    return c.finish("dcn_cross", size, model, (dense, sparse), targets, cfg.batch, device, cfg)
