"""DHEN-like: stacked layers of a heterogeneous ensemble of interaction modules.

Written from the public description in Zhang et al., 2022, "DHEN: A Deep and
Hierarchical Ensemble Network for Large-Scale Click-Through Rate Prediction". Each
layer runs several interaction modules side by side on the same ``(B, n, d)`` feature
matrix:

* dot/compression: all pairwise dot products ``X X^T`` flattened and compressed by a
  Linear back to ``n x d``;
* self-attention: multi-head attention over the ``n`` features;
* convolution: a 1-D convolution across the features;
* DCN: a low-rank cross ``X * U(V X) + X`` per feature;
* MLP: a per-feature two-layer MLP.

Each module's output is normalised by its own LayerNorm (many same-shape LayerNorms),
the outputs are concatenated and projected back to ``d``; the concatenation is also
split back per module and averaged as an ensemble skip (a cat/split round trip). The
sum is normalised and added to the layer input (residual). A top MLP on the flattened
last layer gives the logit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import _common as c


@dataclass(frozen=True)
class DHENConfig:
    batch: int
    num_dense: int
    num_sparse: int
    rows: int
    dim: int
    heads: int
    layers: int
    rank: int
    top: tuple[int, ...]


CONFIGS = {
    "small": DHENConfig(batch=16, num_dense=8, num_sparse=7, rows=100, dim=16, heads=2, layers=2, rank=8, top=(32,)),
    "realistic": DHENConfig(
        batch=1024, num_dense=13, num_sparse=31, rows=10_000, dim=128, heads=4, layers=3, rank=64,
        top=(1024, 256),
    ),
}


class DotCompress(nn.Module):
    def __init__(self, n: int, d: int) -> None:
        super().__init__()
        self.n, self.d = n, d
        self.compress = nn.Linear(n * n, n * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dots = torch.bmm(x, x.transpose(1, 2)).flatten(1)
        return self.compress(dots).view(-1, self.n, self.d)


class SelfAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.heads

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, h, d // h).transpose(1, 2)

        att = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)))
        return self.out(att.transpose(1, 2).reshape(b, n, d))


class FeatureConv(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(d, d, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)


class LowRankCross(nn.Module):
    def __init__(self, d: int, rank: int) -> None:
        super().__init__()
        self.v = nn.Linear(d, rank, bias=False)
        self.u = nn.Linear(rank, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.u(self.v(x)) + x


class FeatureMLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


class DHENLayer(nn.Module):
    def __init__(self, n: int, d: int, heads: int, rank: int) -> None:
        super().__init__()
        self.d = d
        self.modules_ = nn.ModuleList(
            [DotCompress(n, d), SelfAttention(d, heads), FeatureConv(d), LowRankCross(d, rank), FeatureMLP(d)]
        )
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in self.modules_)
        self.proj = nn.Linear(d * len(self.modules_), d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [norm(m(x)) for m, norm in zip(self.modules_, self.norms)]
        ensemble = torch.cat(outs, dim=2)
        skip = torch.stack(ensemble.split(self.d, dim=2), dim=0).mean(dim=0)
        return self.norm(self.proj(ensemble) + skip) + x


class DHEN(c.StackedFeatureModel):
    def __init__(self, cfg: DHENConfig) -> None:
        super().__init__(cfg, lambda n: DHENLayer(n, cfg.dim, cfg.heads, cfg.rank))


def build(size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> c.ZooModel:
    return c.build_dense_sparse("dhen", CONFIGS, DHEN, size, device, seed)
