"""A TorchRec-style ranking model through Optimus, built from plain torch modules.

The model is laid out the way TorchRec's ``EmbeddingBagCollection`` + DLRM lay it out:
one ``nn.EmbeddingBag`` table per sparse feature, each pooling a jagged bag of ids
(``values`` + ``offsets``, as in a ``KeyedJaggedTensor``); the pooled embeddings are
concatenated into one keyed tensor and split back per feature (``KeyedTensor.to_dict``),
a dense bottom MLP, a pairwise dot interaction and an over arch. Those are the patterns
Optimus targets: the concat/split round trip goes (a vertical rewrite), and the
per-feature lookups and towers are batched (horizontal rewrites; the embedding lookups
become one grouped kernel on CUDA).

Run it:                python examples/torchrec_style.py [--train] [--passes auto]
Explain it:            optimus explain examples/torchrec_style.py:build
Benchmark it:          optimus bench --model examples/torchrec_style.py:build --mode infer
A real TorchRec model: optimus bench --model torchrec_dlrm (needs torchrec, see docs/models.md)
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

FEATURES = 8  # sparse features, one table each
ROWS, DIM = 1000, 16  # rows per table, embedding dimension
DENSE = 13  # dense features
BATCH, MAX_BAG = 64, 4  # examples per batch, ids per bag (1..MAX_BAG)


class EmbeddingBagCollection(nn.Module):
    """One sum-pooled ``EmbeddingBag`` per feature over jagged ids; returns the pooled
    embeddings concatenated, ``(batch, features * dim)``, as TorchRec's ``KeyedTensor``."""

    def __init__(self, features: int, rows: int, dim: int) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(features))

    def forward(self, values: list[torch.Tensor], offsets: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t(v, o) for t, v, o in zip(self.tables, values, offsets)], dim=1)


class Ranker(nn.Module):
    """EmbeddingBagCollection -> per-feature dict -> DLRM-style dot interaction -> logit."""

    def __init__(self) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(FEATURES, ROWS, DIM)
        self.bottom = nn.Sequential(nn.Linear(DENSE, 32), nn.ReLU(), nn.Linear(32, DIM), nn.ReLU())
        # a small tower per feature, as feature-wise "arches" often are
        self.towers = nn.ModuleList(nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU()) for _ in range(FEATURES))
        pairs = (FEATURES + 1) * FEATURES // 2
        self.over = nn.Sequential(nn.Linear(DIM + pairs, 64), nn.ReLU(), nn.Linear(64, 1))
        li, lj = torch.triu_indices(FEATURES + 1, FEATURES + 1, offset=1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)

    def forward(self, dense: torch.Tensor, *jagged: torch.Tensor) -> torch.Tensor:
        values, offsets = list(jagged[:FEATURES]), list(jagged[FEATURES:])
        pooled = self.ebc(values, offsets)  # the keyed tensor ...
        per_feature = pooled.split(DIM, dim=1)  # ... and its per-feature dict
        embedded = [tower(e) for tower, e in zip(self.towers, per_feature)]
        x = self.bottom(dense)
        stacked = torch.stack([x, *embedded], dim=1)  # (batch, features + 1, dim)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))[:, self.li, self.lj]
        return self.over(torch.cat([x, dots], dim=1))


def example_inputs(generator: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:
    """Dense features, then per feature its ids (values) and bag offsets."""
    g = generator or torch.Generator().manual_seed(0)
    dense = torch.randn(BATCH, DENSE, generator=g)
    values, offsets = [], []
    for _ in range(FEATURES):
        lengths = torch.randint(1, MAX_BAG + 1, (BATCH,), generator=g)
        values.append(torch.randint(0, ROWS, (int(lengths.sum()),), generator=g))
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]]))
    return (dense, *values, *offsets)


def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The factory ``optimus explain`` / ``optimus bench`` call: the model and its inputs."""
    return Ranker(), example_inputs()


def main(argv: list[str] | None = None) -> int:
    import optimus

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", action="store_true", help="also run a training step (compiles the backward too)")
    p.add_argument("--passes", default="auto", help="Optimus passes (default auto)")
    args = p.parse_args(argv)

    torch.manual_seed(0)
    model, inputs = build()
    compiled = optimus.compile(model, passes=args.passes)
    with torch.no_grad():
        expected, got = model(*inputs), compiled(*inputs)
    ok = torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
    print(f"inference: outputs match eager: {ok}")
    if args.train:
        loss = nn.functional.binary_cross_entropy_with_logits(compiled(*inputs), torch.ones(BATCH, 1))
        loss.backward()
        grads = sum(p.grad is not None for p in model.parameters())
        print(f"training step: loss {loss.item():.4f}, {grads} parameters got gradients")
    report = compiled.optimus_report
    done = {name: s.matched for name, s in report.rule_totals().items() if s.matched}
    print("rewrites:", ", ".join(f"{k} x{v}" for k, v in sorted(done.items(), key=lambda kv: -kv[1])) or "none")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
