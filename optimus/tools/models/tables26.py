"""tables26: 26 embedding-bag tables of mixed sizes, a dense MLP and a concat MLP on top.

The plain form of the sparse side of a CTR model (Criteo's 13 dense and 26 categorical
features, as in DLRM and Wide & Deep), written with ``torch.nn.EmbeddingBag`` and no
sparse library: every categorical feature has its own table, sized for its cardinality
and importance, so the tables differ in rows and in embedding width (16, 32, 64 and 128
columns) and pool their bag by ``sum`` or by ``mean``. Feature ``i`` is the fixed-length
bag ``sparse[:, i, :]`` (a view), pooled by table ``i`` to ``(B, dim_i)``. The 13 dense
features go through a bottom MLP; its output and the 26 pooled embeddings are
concatenated (the "concat interaction" of Wide & Deep style models) and a top MLP gives
the logit.

Unlike ``dlrm`` (26 tables of one shape, a keyed split/cat round trip and a dot
interaction), no two neighbouring tables have the same shape here, so the stacked
horizontal rules find little to merge: what reduces its 26 lookups (and their 26
backward scatters) is a grouped embedding-bag kernel over tables of mixed widths, rows
and pooling modes. Graph shapes: many independent embedding bags of mixed shapes feeding
one wide ``cat``, and an MLP on each side of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import _common as c


@dataclass(frozen=True)
class Tables26Config:
    batch: int
    num_dense: int
    rows: tuple[int, ...]
    dims: tuple[int, ...]
    modes: tuple[str, ...]
    bag: int
    bottom: tuple[int, ...]
    top: tuple[int, ...]


def _cycle(values: tuple, n: int, stride: int = 1) -> tuple:
    """``n`` entries taken from ``values`` in steps of ``stride`` (wrapping)."""
    return tuple(values[(k * stride) % len(values)] for k in range(n))


TABLES = 26
DIMS = (16, 32, 64, 128)
MODES = ("sum", "mean", "sum")  # period 3 against the widths' 4: every width pools both ways

CONFIGS = {
    "small": Tables26Config(
        batch=32, num_dense=13, rows=_cycle((20, 50, 100), TABLES), dims=_cycle(DIMS, TABLES, 3),
        modes=_cycle(MODES, TABLES), bag=3, bottom=(32,), top=(32,),
    ),
    "realistic": Tables26Config(
        batch=2048, num_dense=13, rows=_cycle((1_000, 5_000, 20_000, 50_000, 10_000), TABLES),
        dims=_cycle(DIMS, TABLES, 3), modes=_cycle(MODES, TABLES), bag=8,
        bottom=(512, 256, 64), top=(1024, 512, 256),
    ),
}


class Tables26(nn.Module):
    def __init__(self, cfg: Tables26Config) -> None:
        super().__init__()
        if not len(cfg.rows) == len(cfg.dims) == len(cfg.modes):
            raise ValueError("rows, dims and modes need one entry per table")
        self.bottom = c.mlp((cfg.num_dense, *cfg.bottom), final_activation=True)
        self.tables = nn.ModuleList(
            nn.EmbeddingBag(r, d, mode=m) for r, d, m in zip(cfg.rows, cfg.dims, cfg.modes)
        )
        for t in self.tables:
            nn.init.uniform_(t.weight, -0.05, 0.05)
        self.top = c.mlp((cfg.bottom[-1] + sum(cfg.dims), *cfg.top, 1))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        pooled = [table(sparse[:, i, :]) for i, table in enumerate(self.tables)]
        return self.top(torch.cat([self.bottom(dense)] + pooled, dim=1)).squeeze(-1)


def build(size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> c.ZooModel:
    cfg = c.pick(CONFIGS, "tables26", size)
    model = c.seeded(seed, lambda: Tables26(cfg))
    g = c.input_generator(seed)
    dense = c.randn(g, cfg.batch, cfg.num_dense)
    # every table draws ids below its own row count; bag ``i`` is ``sparse[:, i, :]``
    sparse = torch.stack([c.randint(g, r, cfg.batch, cfg.bag) for r in cfg.rows], dim=1)
    targets = c.binary_targets(g, cfg.batch)
    return c.finish("tables26", size, model, (dense, sparse), targets, cfg.batch, device, cfg)
