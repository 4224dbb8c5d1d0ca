"""splitcat: an illustrative split/cat-heavy model, written the way users write it.

The Optimus paper evaluates an illustrative model that is not public; this one follows
its published shape. The state is a dense ``(B, F * d)`` tensor holding ``F`` feature
chunks of width ``d``. Each of ``R`` rounds:

1. ``x.split(d, dim=1)`` into the ``F`` feature chunks;
2. per chunk, with that feature's own parameters (``ModuleList`` of small LayerNorms and
   Linears, ``ParameterList`` of scales and shifts): ``layer_norm``, an elementwise
   affine and ReLU, a small ``Linear``, a swish (``y * sigmoid(y)``) and a residual add
   of the chunk;
3. the chunks are put back together: ``torch.cat`` on even rounds; on odd rounds
   ``torch.stack`` into ``(B, F, d)``, a per-feature bias, and ``unbind`` + ``cat``
   back to ``(B, F * d)`` (an unbind/stack round trip);
4. a re-split with other sections: groups of ``G`` features, each gated by the sigmoid
   of its own mean, concatenated again.

In eager mode every chunk op is its own kernel (forward and backward), so the
realistic config launches thousands of kernels per training step while the maths is
a handful of batched ops: the gap vertical and horizontal rewrites close.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import _common as c


@dataclass(frozen=True)
class SplitCatConfig:
    batch: int
    features: int
    dim: int
    rounds: int
    group: int


CONFIGS = {
    "small": SplitCatConfig(batch=16, features=8, dim=8, rounds=2, group=4),
    "realistic": SplitCatConfig(batch=512, features=32, dim=64, rounds=3, group=4),
}


class FeatureRound(nn.Module):
    def __init__(self, features: int, dim: int, group: int, use_stack: bool) -> None:
        super().__init__()
        self.features, self.dim, self.group, self.use_stack = features, dim, group, use_stack
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(features))
        self.scales = nn.ParameterList(nn.Parameter(torch.ones(dim)) for _ in range(features))
        self.shifts = nn.ParameterList(nn.Parameter(torch.zeros(dim)) for _ in range(features))
        self.linears = nn.ModuleList(nn.Linear(dim, dim) for _ in range(features))
        if use_stack:
            self.feature_bias = nn.Parameter(torch.zeros(features, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = x.split(self.dim, dim=1)
        outs = []
        for i, chunk in enumerate(chunks):
            y = self.norms[i](chunk)
            y = torch.relu(y * self.scales[i] + self.shifts[i])
            y = self.linears[i](y)
            outs.append(y * torch.sigmoid(y) + chunk)
        if self.use_stack:
            stacked = torch.stack(outs, dim=1) + self.feature_bias
            x = torch.cat(stacked.unbind(1), dim=1)
        else:
            x = torch.cat(outs, dim=1)
        groups = x.split(self.group * self.dim, dim=1)
        return torch.cat([g * torch.sigmoid(g.mean(dim=1, keepdim=True)) for g in groups], dim=1)


class SplitCat(nn.Module):
    def __init__(self, cfg: SplitCatConfig) -> None:
        super().__init__()
        self.rounds = nn.ModuleList(
            FeatureRound(cfg.features, cfg.dim, cfg.group, use_stack=r % 2 == 1) for r in range(cfg.rounds)
        )
        self.head = nn.Linear(cfg.features * cfg.dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for r in self.rounds:
            x = r(x)
        return self.head(x).squeeze(-1)


def build(size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> c.ZooModel:
    cfg = c.pick(CONFIGS, "splitcat", size)
    model = c.seeded(seed, lambda: SplitCat(cfg))
    g = c.input_generator(seed)
    x = c.randn(g, cfg.batch, cfg.features * cfg.dim)
    targets = c.binary_targets(g, cfg.batch)
    return c.finish("splitcat", size, model, (x,), targets, cfg.batch, device, cfg)
