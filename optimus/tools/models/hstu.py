"""HSTU-like: the Hierarchical Sequential Transduction Unit of generative recommenders.

Written from the public description in Zhai et al., 2024, "Actions Speak Louder than
Words: Trillion-Parameter Sequential Transducers for Generative Recommendations". One
HSTU layer on a sequence ``x`` of shape ``(B, N, d)``:

    u, v, q, k = split(silu(addmm(b, layer_norm(x), W)))      # one wide projection
    a          = silu(q k^T) / N  masked causally               # pointwise attention
    y          = x + Linear(layer_norm(a v) * u)                # gated by u, residual

(``layer_norm -> wide addmm -> split into u, v, q, k -> silu -> attention -> norm * u ->
linear``). Items are embedded from ids with a learned position embedding; a final
LayerNorm and a Linear give one logit per position (next-action prediction).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import _common as c


@dataclass(frozen=True)
class HSTUConfig:
    batch: int
    seq_len: int
    rows: int
    dim: int
    heads: int
    head_dim: int
    layers: int


CONFIGS = {
    "small": HSTUConfig(batch=8, seq_len=16, rows=200, dim=32, heads=2, head_dim=16, layers=2),
    "realistic": HSTUConfig(batch=512, seq_len=128, rows=50_000, dim=256, heads=4, head_dim=64, layers=4),
}


class HSTULayer(nn.Module):
    def __init__(self, d: int, heads: int, head_dim: int, seq_len: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        width = heads * head_dim
        self.norm_in = nn.LayerNorm(d)
        self.uvqk = nn.Parameter(torch.randn(d, 4 * width) * d**-0.5)
        self.uvqk_bias = nn.Parameter(torch.zeros(4 * width))
        self.norm_attn = nn.LayerNorm(width)
        self.out = nn.Linear(width, d)
        mask = torch.tril(torch.ones(seq_len, seq_len))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h, hd = self.heads, self.head_dim
        width = h * hd
        normed = self.norm_in(x).view(b * n, d)
        proj = F.silu(torch.addmm(self.uvqk_bias, normed, self.uvqk))
        u, v, q, k = proj.split([width, width, width, width], dim=1)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, h, hd).transpose(1, 2)

        scores = torch.matmul(heads(q), heads(k).transpose(2, 3))
        weights = F.silu(scores) * self.mask[:n, :n] / n
        attn = torch.matmul(weights, heads(v)).transpose(1, 2).reshape(b * n, width)
        y = self.out(self.norm_attn(attn) * u)
        return x + y.view(b, n, d)


class HSTU(nn.Module):
    def __init__(self, cfg: HSTUConfig) -> None:
        super().__init__()
        self.items = nn.Embedding(cfg.rows, cfg.dim)
        nn.init.normal_(self.items.weight, std=0.1)
        self.pos = nn.Parameter(torch.randn(cfg.seq_len, cfg.dim) * 0.1)
        self.layers = nn.ModuleList(
            HSTULayer(cfg.dim, cfg.heads, cfg.head_dim, cfg.seq_len) for _ in range(cfg.layers)
        )
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.items(ids) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)).squeeze(-1)


def build(size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> c.ZooModel:
    cfg = c.pick(CONFIGS, "hstu", size)
    model = c.seeded(seed, lambda: HSTU(cfg))
    g = c.input_generator(seed)
    ids = c.randint(g, cfg.rows, cfg.batch, cfg.seq_len)
    targets = c.binary_targets(g, cfg.batch, cfg.seq_len)
    return c.finish("hstu", size, model, (ids,), targets, cfg.batch, device, cfg)
