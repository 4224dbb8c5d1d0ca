"""A zoo of recommendation models with the graph shapes Optimus rewrites.

Every model has a ``small`` config (CPU tests, seconds) and a ``realistic`` config (a
GPU benchmark), builds deterministically from a seed, and compiles with
``torch.compile(fullgraph=True)``::

    from optimus.tools.models import get_model
    zoo = get_model("dlrm", size="small", device="cpu", seed=0)
    out = zoo.model(*zoo.inputs)
    zoo.loss(out).backward()

See docs/models.md for what each model exercises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import dcn_cross, dcnv2, dhen, dlrm, hetero_towers, hstu, interformer, mmoe, splitcat, tables26, towers, wukong
from ._common import SIZES, ZooModel


@dataclass(frozen=True)
class ModelSpec:
    name: str
    summary: str
    build: Callable[..., ZooModel]
    configs: dict


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec("dlrm", "embedding bags, split/cat of per-feature dict, dot interaction", dlrm.build, dlrm.CONFIGS),
        ModelSpec("dcnv2", "mixture of low-rank cross experts (K identical chains)", dcnv2.build, dcnv2.CONFIGS),
        ModelSpec("dhen", "ensemble of interaction modules per layer, cat/proj/norm", dhen.build, dhen.CONFIGS),
        ModelSpec("wukong", "factorization-machine + linear-compression blocks on one input", wukong.build,
                  wukong.CONFIGS),
        ModelSpec("interformer", "interaction, sequence and cross arches over parallel sequences",
                  interformer.build, interformer.CONFIGS),
        ModelSpec("hstu", "layer_norm, wide addmm, split u/v/q/k, pointwise attention", hstu.build, hstu.CONFIGS),
        ModelSpec("splitcat", "illustrative split/cat/stack/unbind-heavy model", splitcat.build, splitcat.CONFIGS),
        ModelSpec("towers32", "32 parallel Linear->LayerNorm->ReLU towers, cat", towers.build, towers.CONFIGS),
        ModelSpec("hetero_towers", "24 Linear->LayerNorm->ReLU towers, every in/out width distinct, cat",
                  hetero_towers.build, hetero_towers.CONFIGS),
        ModelSpec("mmoe", "multi-gate mixture of 8 expert MLPs on one input, per-task gates and towers",
                  mmoe.build, mmoe.CONFIGS),
        ModelSpec("tables26", "26 embedding bags of mixed widths, rows and pooling, concat MLP", tables26.build,
                  tables26.CONFIGS),
        ModelSpec("dcn_cross", "DCN-v2 full-rank cross layers and a parallel deep tower, concat head",
                  dcn_cross.build, dcn_cross.CONFIGS),
    ]
}

__all__ = ["MODELS", "SIZES", "ModelSpec", "ZooModel", "get_model", "model_names"]


def model_names() -> list[str]:
    return list(MODELS)


def get_model(name: str, size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> ZooModel:
    """Build zoo model ``name`` at ``size`` on ``device``; inputs come from ``seed``."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from: {', '.join(MODELS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose from: {', '.join(SIZES)}")
    return MODELS[name].build(size=size, device=device, seed=seed)
