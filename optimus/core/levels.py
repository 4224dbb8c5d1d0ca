"""The IR levels, and the graph view each FX level registers with the core.

The core names the levels (so rules, presets and reports agree on them) but knows no
level's code: ``optimus.torch_ir`` and ``optimus.aten_ir`` register their ``GraphView``
subclass here when they are imported (``optimus/__init__.py`` imports both), and the
driver asks ``make_view(level, gm)`` for the view of a graph. Inductor-IR works on
scheduler nodes, not FX graphs, and drives its own view (``optimus.inductor_ir``).
"""

from __future__ import annotations

from typing import Callable

import torch.fx as fx

from .view import GraphView

LEVELS: tuple[str, ...] = ("torch_ir", "aten_ir", "inductor_ir")

_VIEWS: dict[str, Callable[[fx.GraphModule], GraphView]] = {}


def register_view(level: str, factory: Callable[[fx.GraphModule], GraphView]) -> None:
    """Make ``factory(gm)`` the view of ``level``'s FX graphs (one per level)."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; valid: {LEVELS}")
    known = _VIEWS.get(level)
    if known is not None and known is not factory:
        raise ValueError(f"level {level!r} already has a graph view ({known.__qualname__})")
    _VIEWS[level] = factory


def make_view(level: str, gm: fx.GraphModule) -> GraphView:
    """The registered view of ``gm`` at ``level``."""
    factory = _VIEWS.get(level)
    if factory is None:
        raise ValueError(f"no FX graph view for level {level!r} (views: {sorted(_VIEWS) or 'none registered'})")
    return factory(gm)
