"""Wukong-like: stacked factorization-machine and linear-compression blocks.

Written from the public description in Zhang et al., 2024, "Wukong: Towards a Scaling
Law for Large-Scale Recommendation". Each layer takes the ``(B, n, d)`` embeddings
and runs two blocks on one shared, permuted input ``X^T`` of shape ``(B, d, n)``:

* factorization-machine block (FMB), the optimized form: ``X (X^T Y)`` with a learned
  projection ``Y`` of shape ``(n, k)`` (permute, matmul, bmm), flattened, LayerNorm,
  an MLP, and a view back to ``n_f`` embeddings;
* linear-compression block (LCB): ``X^T W`` with ``W`` of shape ``(n, n_l)``, permuted
  back to ``n_l`` embeddings.

The two projections of the same permuted input are the "linear LHS" pattern (two
Linears sharing one input). Their outputs are concatenated along the embedding axis,
added to the layer input (residual) and normalised with LayerNorm. A top MLP on the
flattened last layer gives the logit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import _common as c


@dataclass(frozen=True)
class WukongConfig:
    batch: int
    num_dense: int
    num_sparse: int
    rows: int
    dim: int
    layers: int
    fm_rank: int
    n_fm: int
    fm_mlp: tuple[int, ...]
    top: tuple[int, ...]


CONFIGS = {
    "small": WukongConfig(
        batch=32, num_dense=8, num_sparse=7, rows=100, dim=16, layers=2, fm_rank=4, n_fm=4, fm_mlp=(32,), top=(32,)
    ),
    "realistic": WukongConfig(
        batch=2048, num_dense=13, num_sparse=31, rows=10_000, dim=128, layers=4, fm_rank=16, n_fm=16,
        fm_mlp=(1024,), top=(1024, 256),
    ),
}


class WukongLayer(nn.Module):
    def __init__(self, n: int, d: int, rank: int, n_fm: int, fm_mlp: tuple[int, ...]) -> None:
        super().__init__()
        self.n, self.d, self.n_fm = n, d, n_fm
        n_lcb = n - n_fm
        self.fm_proj = nn.Linear(n, rank, bias=False)  # Y
        self.lcb = nn.Linear(n, n_lcb, bias=False)  # W
        self.fm_norm = nn.LayerNorm(n * rank)
        self.fm_mlp = c.mlp((n * rank, *fm_mlp, n_fm * d))
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        xt = x.permute(0, 2, 1)  # (B, d, n), shared by both blocks
        # Factorization machine block: X (X^T Y)
        xty = self.fm_proj(xt)  # (B, d, k)
        fm = torch.bmm(x, xty).view(b, -1)  # (B, n * k)
        fm = self.fm_mlp(self.fm_norm(fm)).view(b, self.n_fm, self.d)
        # Linear compression block: X^T W, back to (B, n_l, d)
        lcb = self.lcb(xt).permute(0, 2, 1)
        return self.norm(torch.cat([fm, lcb], dim=1) + x)


class Wukong(c.StackedFeatureModel):
    def __init__(self, cfg: WukongConfig) -> None:
        super().__init__(cfg, lambda n: WukongLayer(n, cfg.dim, cfg.fm_rank, cfg.n_fm, cfg.fm_mlp))


def build(size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> c.ZooModel:
    return c.build_dense_sparse("wukong", CONFIGS, Wukong, size, device, seed)
