"""Tiny models for the distributed tests (built in each rank from the seed, like the zoo).

Each ``build`` returns a ``ZooModel`` so the training worker of
``optimus.tools.bench.distributed`` runs it by name (``"dist_models:tiny"``). Small enough that
a 2-rank compile takes seconds, with the junk Optimus removes: a ``cat`` of a ``split``'s
chunks in order (the identity) in every block, and identical Linears on the chunks.
"""

from __future__ import annotations

import torch
from torch import nn

from optimus.tools.models._common import ZooModel, binary_targets, finish, input_generator, randn, seeded

DIM, HEADS, BATCH, IN = 8, 4, 8, 6


class Block(nn.Module):
    """proj -> split into HEADS chunks -> one Linear + relu per chunk -> cat, then a
    cat(split(y)) round trip (the identity) and a residual."""

    def __init__(self, d: int = DIM, k: int = HEADS) -> None:
        super().__init__()
        self.d = d
        self.proj = nn.Linear(d, d * k)
        self.heads = nn.ModuleList(nn.Linear(d, d) for _ in range(k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(self.proj(x), self.d, dim=1)
        y = torch.cat([torch.relu(h(p)) for h, p in zip(self.heads, parts)], dim=1)
        y = torch.cat(torch.split(y, self.d, dim=1), dim=1)
        return x + y.view(x.shape[0], -1, self.d).sum(1)


class Tiny(nn.Module):
    def __init__(self, blocks: int = 2, graph_break: bool = False, unused: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(IN, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = nn.Linear(DIM, 1)
        self.graph_break = graph_break
        self.unused = nn.Linear(DIM, DIM) if unused else None  # never called: no gradient

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks[0](self.inp(x))
        if self.graph_break:
            # two Dynamo graphs (not in a loop: Dynamo resumes after a break only outside one)
            torch._dynamo.graph_break()
        for b in self.blocks[1:]:
            h = b(h)
        return self.head(h).squeeze(-1)


class WithCollective(nn.Module):
    """Identical Linears on both sides of an all-reduce traced into the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.ModuleList(nn.Linear(IN, DIM) for _ in range(3))
        self.b = nn.ModuleList(nn.Linear(IN, DIM) for _ in range(3))
        self.head = nn.Linear(6 * DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol

        before = [torch.relu(m(x)) for m in self.a]
        s = funcol.all_reduce(x.sum(0, keepdim=True), "sum", dist.group.WORLD)
        after = [torch.relu(m(x)) for m in self.b]
        y = torch.cat(before + after, dim=1)
        y = torch.cat(torch.split(y, DIM, dim=1), dim=1) * s.mean()
        return self.head(y).squeeze(-1)


def _finish(name: str, size: str, device: str, seed: int, make) -> ZooModel:
    model = seeded(seed, make)
    g = input_generator(seed)
    x = randn(g, BATCH, IN)
    return finish(name, size, model, (x,), binary_targets(g, BATCH), BATCH, device, None)


def tiny(size: str = "small", device: str = "cpu", seed: int = 0) -> ZooModel:
    """One block: the fast tests' model (each rank compiles a few graphs in seconds)."""
    return _finish("tiny", size, device, seed, lambda: Tiny(blocks=1))


def tiny2(size: str = "small", device: str = "cpu", seed: int = 0) -> ZooModel:
    return _finish("tiny2", size, device, seed, Tiny)


def tiny_graph_break(size: str = "small", device: str = "cpu", seed: int = 0) -> ZooModel:
    return _finish("tiny_graph_break", size, device, seed, lambda: Tiny(graph_break=True))


def tiny_unused(size: str = "small", device: str = "cpu", seed: int = 0) -> ZooModel:
    return _finish("tiny_unused", size, device, seed, lambda: Tiny(unused=True))


def with_collective(size: str = "small", device: str = "cpu", seed: int = 0) -> ZooModel:
    return _finish("with_collective", size, device, seed, WithCollective)
