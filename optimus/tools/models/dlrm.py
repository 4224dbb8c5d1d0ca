"""DLRM: embedding bags, a dense MLP and a pairwise dot interaction.

Written from the public description of DLRM (Naumov et al., 2019, "Deep Learning
Recommendation Model for Personalization and Recommendation Systems") and of the way
torchrec runs it:

* every sparse feature is pooled by its own ``EmbeddingBag`` (sum over a fixed-length
  bag); the per-table results are concatenated into one keyed tensor and then split
  back into a per-feature dict (torchrec's ``KeyedTensor.to_dict``): a split/cat round
  trip that a vertical rewrite removes;
* the dense features go through the bottom MLP to the embedding dimension;
* the dot interaction stacks the dense vector and the feature embeddings (``cat``),
  takes all pairwise dot products (``bmm``), keeps the strictly upper triangle (index
  with ``triu`` indices) and concatenates it with the dense vector;
* the top ("over") MLP maps that to one logit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import _common as c


@dataclass(frozen=True)
class DLRMConfig:
    batch: int
    num_dense: int
    num_sparse: int
    rows: int
    dim: int
    bag: int
    bottom: tuple[int, ...]
    top: tuple[int, ...]


CONFIGS = {
    "small": DLRMConfig(batch=32, num_dense=13, num_sparse=6, rows=100, dim=16, bag=4, bottom=(32,), top=(32,)),
    "realistic": DLRMConfig(
        batch=2048, num_dense=13, num_sparse=26, rows=20_000, dim=128, bag=8,
        bottom=(512, 256), top=(1024, 512, 256),
    ),
}


class DLRM(nn.Module):
    def __init__(self, cfg: DLRMConfig) -> None:
        super().__init__()
        self.dim = cfg.dim
        self.keys = [f"f{i}" for i in range(cfg.num_sparse)]
        self.bottom = c.mlp((cfg.num_dense, *cfg.bottom, cfg.dim), final_activation=True)
        self.tables = nn.ModuleList(nn.EmbeddingBag(cfg.rows, cfg.dim, mode="sum") for _ in range(cfg.num_sparse))
        for t in self.tables:
            nn.init.uniform_(t.weight, -0.05, 0.05)
        n = cfg.num_sparse + 1
        li, lj = torch.triu_indices(n, n, offset=1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        self.top = c.mlp((cfg.dim + n * (n - 1) // 2, *cfg.top, 1))

    def sparse_arch(self, sparse: torch.Tensor) -> dict[str, torch.Tensor]:
        pooled = [table(sparse[:, i, :]) for i, table in enumerate(self.tables)]
        keyed_values = torch.cat(pooled, dim=1)  # KeyedTensor.values()
        per_key = keyed_values.split(self.dim, dim=1)  # KeyedTensor.to_dict()
        return dict(zip(self.keys, per_key))

    def interaction(self, dense: torch.Tensor, features: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = dense.shape[0]
        combined = torch.cat([dense] + [features[k] for k in self.keys], dim=1).view(batch, -1, self.dim)
        dots = torch.bmm(combined, combined.transpose(1, 2))
        pairs = dots[:, self.li, self.lj]
        return torch.cat([dense, pairs], dim=1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        d = self.bottom(dense)
        feats = self.sparse_arch(sparse)
        return self.top(self.interaction(d, feats)).squeeze(-1)


def build(size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> c.ZooModel:
    cfg = c.pick(CONFIGS, "dlrm", size)
    model = c.seeded(seed, lambda: DLRM(cfg))
    g = c.input_generator(seed)
    dense = c.randn(g, cfg.batch, cfg.num_dense)
    sparse = c.randint(g, cfg.rows, cfg.batch, cfg.num_sparse, cfg.bag)
    targets = c.binary_targets(g, cfg.batch)
    return c.finish("dlrm", size, model, (dense, sparse), targets, cfg.batch, device, cfg)
