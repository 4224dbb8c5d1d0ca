"""InterFormer-like: interaction, sequence and cross arches over many parallel sequences.

Written from the public description in Zeng et al., 2024, "InterFormer: Towards
Effective Heterogeneous Interaction Learning for Click-Through Rate Prediction". The
model keeps two kinds of state: non-sequence features ``X`` of shape ``(B, F, d)`` and
``S`` behaviour sequences, each ``(B, 1 + T, d)`` with a learned CLS token in front.
Every layer exchanges information both ways:

* cross arch, non-sequence -> sequence: a summary of ``X`` (Linear of the flattened
  features) personalises each sequence's FFN input through a sigmoid gate;
* sequence arch: per sequence (its own weights: ``S`` parallel, identical-shape
  modules) LayerNorm, a gated FFN and multi-head self-attention, with residuals;
* cross arch, sequence -> non-sequence: per sequence, the CLS token and the mean-pooled
  sequence are concatenated and compressed into one summary embedding with a sigmoid
  gate;
* interaction arch: ``X`` and the sequence summaries are stacked, all pairwise dot
  products are compressed by a Linear back into ``F`` embeddings, added to ``X`` and
  normalised.

A top MLP over the final ``X`` and summaries gives the logit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import _common as c


@dataclass(frozen=True)
class InterFormerConfig:
    batch: int
    num_dense: int
    num_sparse: int
    rows: int
    dim: int
    sequences: int
    seq_len: int
    heads: int
    layers: int
    top: tuple[int, ...]


CONFIGS = {
    "small": InterFormerConfig(
        batch=16, num_dense=8, num_sparse=3, rows=100, dim=16, sequences=3, seq_len=8, heads=2, layers=1, top=(32,)
    ),
    "realistic": InterFormerConfig(
        batch=1024, num_dense=13, num_sparse=15, rows=10_000, dim=64, sequences=8, seq_len=32, heads=4,
        layers=1, top=(512, 128),
    ),
}


class SequenceBlock(nn.Module):
    """Sequence arch for one sequence: gated FFN then multi-head self-attention."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d)
        self.gate = nn.Linear(d, d)
        self.ffn1 = nn.Linear(d, 2 * d)
        self.ffn2 = nn.Linear(2 * d, d)
        self.norm2 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, seq: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, t, d = seq.shape
        h = self.norm1(seq) * torch.sigmoid(self.gate(context)).unsqueeze(1)
        seq = seq + self.ffn2(F.gelu(self.ffn1(h)))
        q, k, v = self.qkv(self.norm2(seq)).split(d, dim=2)

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        att = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
        return seq + self.out(att.transpose(1, 2).reshape(b, t, d))


class SequenceSummary(nn.Module):
    """Cross arch, sequence -> non-sequence: CLS token + mean pooling, gated."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(2 * d, d)
        self.gate = nn.Linear(2 * d, d)

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        pooled = torch.cat([seq[:, 0], seq[:, 1:].mean(dim=1)], dim=1)
        return self.proj(pooled) * torch.sigmoid(self.gate(pooled))


class InterFormerLayer(nn.Module):
    def __init__(self, f: int, s: int, d: int, heads: int) -> None:
        super().__init__()
        self.f, self.d = f, d
        self.context = nn.Linear(f * d, d)
        self.seq_blocks = nn.ModuleList(SequenceBlock(d, heads) for _ in range(s))
        self.summaries = nn.ModuleList(SequenceSummary(d) for _ in range(s))
        n = f + s
        self.interact = nn.Linear(n * n, f * d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, seqs: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        context = self.context(x.flatten(1))
        seqs = [blk(s, context) for blk, s in zip(self.seq_blocks, seqs)]
        summ = torch.stack([m(s) for m, s in zip(self.summaries, seqs)], dim=1)  # (B, S, d)
        z = torch.cat([x, summ], dim=1)
        dots = torch.bmm(z, z.transpose(1, 2)).flatten(1)
        x = self.norm(x + self.interact(dots).view(-1, self.f, self.d))
        return x, seqs


class InterFormer(nn.Module):
    def __init__(self, cfg: InterFormerConfig) -> None:
        super().__init__()
        f = cfg.num_sparse + 1
        d = cfg.dim
        self.dense_proj = nn.Linear(cfg.num_dense, d)
        self.tables = nn.ModuleList(nn.Embedding(cfg.rows, d) for _ in range(cfg.num_sparse))
        self.seq_tables = nn.ModuleList(nn.Embedding(cfg.rows, d) for _ in range(cfg.sequences))
        for t in [*self.tables, *self.seq_tables]:
            nn.init.normal_(t.weight, std=0.1)
        self.cls = nn.Parameter(torch.randn(cfg.sequences, d) * 0.1)
        self.pos = nn.Parameter(torch.randn(cfg.seq_len + 1, d) * 0.1)
        self.layers = nn.ModuleList(InterFormerLayer(f, cfg.sequences, d, cfg.heads) for _ in range(cfg.layers))
        self.final_summaries = nn.ModuleList(SequenceSummary(d) for _ in range(cfg.sequences))
        self.top = c.mlp(((f + cfg.sequences) * d, *cfg.top, 1))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor, seq_ids: torch.Tensor) -> torch.Tensor:
        b = dense.shape[0]
        x = torch.stack([self.dense_proj(dense)] + [t(sparse[:, i]) for i, t in enumerate(self.tables)], dim=1)
        seqs = []
        for i, table in enumerate(self.seq_tables):
            cls = self.cls[i].expand(b, 1, -1)
            seqs.append(torch.cat([cls, table(seq_ids[:, i])], dim=1) + self.pos)
        for layer in self.layers:
            x, seqs = layer(x, seqs)
        summ = torch.cat([m(s) for m, s in zip(self.final_summaries, seqs)], dim=1)
        return self.top(torch.cat([x.flatten(1), summ], dim=1)).squeeze(-1)


def build(size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> c.ZooModel:
    cfg = c.pick(CONFIGS, "interformer", size)
    model = c.seeded(seed, lambda: InterFormer(cfg))
    g = c.input_generator(seed)
    dense = c.randn(g, cfg.batch, cfg.num_dense)
    sparse = c.randint(g, cfg.rows, cfg.batch, cfg.num_sparse)
    seq_ids = c.randint(g, cfg.rows, cfg.batch, cfg.sequences, cfg.seq_len)
    targets = c.binary_targets(g, cfg.batch)
    return c.finish("interformer", size, model, (dense, sparse, seq_ids), targets, cfg.batch, device, cfg)
