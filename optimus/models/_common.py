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
