"""mmoe: a multi-gate mixture of experts (MMoE) for multi-task ranking.

Written from the public description in Ma et al., 2018, "Modeling Task Relationships in
Multi-task Learning with Multi-gate Mixture-of-Experts" (KDD), as recommendation systems
run it to predict several engagement signals (click, like, share, ...) from one example:

    f_i(x)   = MLP_i(x)                               i = 1..E   (expert MLPs)
    g_t(x)   = softmax(W_t x + b_t)                   t = 1..T   (one gate per task)
    h_t      = sum_i g_t(x)_i f_i(x)                             (per-task mixture)
    y_t      = tower_t(h_t)                                      (task tower, one logit)

The ``E`` experts are identical Linear/ReLU stacks that all read the same input; the
``T`` gates are narrow Linears (``E`` outputs) on that input too. The expert outputs are
stacked to ``(B, E, d)`` and each task mixes them with its own softmax weights (a
broadcast multiply and a sum over experts); each task's mixture goes through its own
tower MLP, and the ``T`` logits are concatenated to ``(B, T)``, one binary target per task.

Graph shapes: many Linears of one shape on one input (the experts' first layers, and the
gates: the shared-input horizontal case), identical chains after them (the experts'
deeper layers, the task towers), a ``stack`` whose result several consumers read, and
pointwise/reduction work per task.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import _common as c


@dataclass(frozen=True)
class MMoEConfig:
    batch: int
    d_in: int
    experts: int
    expert: tuple[int, ...]
    tasks: int
    tower: tuple[int, ...]


CONFIGS = {
    "small": MMoEConfig(batch=32, d_in=16, experts=8, expert=(16, 8), tasks=3, tower=(8,)),
    "realistic": MMoEConfig(batch=2048, d_in=512, experts=8, expert=(512, 256), tasks=4, tower=(128,)),
}


class MMoE(nn.Module):
    def __init__(self, cfg: MMoEConfig) -> None:
        super().__init__()
        self.experts = nn.ModuleList(
            c.mlp((cfg.d_in, *cfg.expert), final_activation=True) for _ in range(cfg.experts)
        )
        self.gates = nn.ModuleList(nn.Linear(cfg.d_in, cfg.experts) for _ in range(cfg.tasks))
        self.towers = nn.ModuleList(c.mlp((cfg.expert[-1], *cfg.tower, 1)) for _ in range(cfg.tasks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts = torch.stack([e(x) for e in self.experts], dim=1)  # (B, E, d)
        logits = []
        for gate, tower in zip(self.gates, self.towers):
            weights = torch.softmax(gate(x), dim=-1).unsqueeze(-1)  # (B, E, 1)
            logits.append(tower((experts * weights).sum(dim=1)))  # (B, 1)
        return torch.cat(logits, dim=1)  # (B, T)


def build(size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> c.ZooModel:
    cfg = c.pick(CONFIGS, "mmoe", size)
    model = c.seeded(seed, lambda: MMoE(cfg))
    g = c.input_generator(seed)
    x = c.randn(g, cfg.batch, cfg.d_in)
    targets = c.binary_targets(g, cfg.batch, cfg.tasks)
    return c.finish("mmoe", size, model, (x,), targets, cfg.batch, device, cfg)
