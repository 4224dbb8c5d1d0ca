"""Pieces shared by the zoo models: the instance record, seeding and small layers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

SIZES = ("small", "realistic")


@dataclass
class ZooModel:
    """One built zoo model: the module, its inputs and its training loss.

    ``model(*inputs)`` returns logits; ``loss(output)`` turns them into a scalar using
    binary targets drawn from the same seed as the inputs, so a training step is
    ``zoo.loss(model(*zoo.inputs)).backward()``.
    """

    name: str
    size: str
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    batch_size: int
    targets: torch.Tensor
    config: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def loss(self, output: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(output.float(), self.targets)

    @property
    def device(self) -> torch.device:
        return self.targets.device


def seeded(seed: int, build: Callable[[], nn.Module]) -> nn.Module:
    """Build a module with a fixed RNG state, on the CPU, without touching global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def input_generator(seed: int) -> torch.Generator:
    """A CPU generator for inputs, independent of the one used for parameters."""
    return torch.Generator(device="cpu").manual_seed(seed * 7919 + 17)


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def randint(gen: torch.Generator, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=gen)


def binary_targets(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randint(0, 2, shape, generator=gen).float()


def finish(
    name: str,
    size: str,
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    targets: torch.Tensor,
    batch_size: int,
    device: str | torch.device,
    config: Any,
) -> ZooModel:
    """Move everything to ``device`` and wrap it up."""
    dev = torch.device(device)
    return ZooModel(
        name=name,
        size=size,
        model=model.to(dev),
        inputs=tuple(t.to(dev) for t in inputs),
        batch_size=batch_size,
        targets=targets.to(dev),
        config=config,
    )


class DenseSparseFeatures(nn.Module):
    """The front end the DCNv2, DHEN and Wukong models share: the dense
    features projected to ``dim`` and one embedding table per sparse feature.
    ``forward(dense, sparse)`` returns the ``1 + num_sparse`` features, each ``(B, dim)``."""

    def __init__(self, num_dense: int, num_sparse: int, rows: int, dim: int) -> None:
        super().__init__()
        self.dense_proj = nn.Linear(num_dense, dim)
        self.tables = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(num_sparse))
        for t in self.tables:
            nn.init.normal_(t.weight, std=0.1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> list[torch.Tensor]:
        return [self.dense_proj(dense)] + [t(sparse[:, i]) for i, t in enumerate(self.tables)]


def dense_sparse_inputs(gen: torch.Generator, cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dense, sparse)`` inputs for a ``DenseSparseFeatures`` model of config ``cfg``."""
    return randn(gen, cfg.batch, cfg.num_dense), randint(gen, cfg.rows, cfg.batch, cfg.num_sparse)


class StackedFeatureModel(nn.Module):
    """DHEN and Wukong: the features stacked to ``(B, 1 + num_sparse, dim)``, ``cfg.layers``
    interaction layers from ``make_layer(n_features)``, a top MLP on the flattened result."""

    def __init__(self, cfg: Any, make_layer: Callable[[int], nn.Module]) -> None:
        super().__init__()
        n = cfg.num_sparse + 1
        self.features = DenseSparseFeatures(cfg.num_dense, cfg.num_sparse, cfg.rows, cfg.dim)
        self.layers = nn.ModuleList(make_layer(n) for _ in range(cfg.layers))
        self.top = mlp((n * cfg.dim, *cfg.top, 1))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = torch.stack(self.features(dense, sparse), dim=1)
        for layer in self.layers:
            x = layer(x)
        return self.top(x.flatten(1)).squeeze(-1)


def build_dense_sparse(name: str, configs: dict[str, Any], make: Callable[[Any], nn.Module], size: str,
                       device: str | torch.device, seed: int) -> ZooModel:
    """``build`` of a model whose inputs are ``(dense, sparse)`` (DCNv2, DHEN, Wukong)."""
    cfg = pick(configs, name, size)
    model = seeded(seed, lambda: make(cfg))
    g = input_generator(seed)
    dense, sparse = dense_sparse_inputs(g, cfg)
    targets = binary_targets(g, cfg.batch)
    return finish(name, size, model, (dense, sparse), targets, cfg.batch, device, cfg)


def mlp(dims: Sequence[int], final_activation: bool = False) -> nn.Sequential:
    """Linear/ReLU stack over ``dims`` (``dims[0]`` in, ``dims[-1]`` out)."""
    layers: list[nn.Module] = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2 or final_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def pick(configs: dict[str, Any], name: str, size: str) -> Any:
    if size not in configs:
        raise ValueError(f"unknown size {size!r} for model {name!r}; choose from: {', '.join(configs)}")
    return configs[size]
