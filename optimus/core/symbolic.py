"""Facts about sizes that may be symbolic (dynamic shapes).

Rules compare sizes with these helpers, which answer ``True`` only when equality is
provable without adding a guard: with ``SymInt`` sizes a rule that cannot prove what it
needs declines instead of specializing the graph.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


def known_true(value: Any) -> bool:
    """``value`` is a bool, or a ``SymBool`` provably true for every shape."""
    if isinstance(value, bool):
        return value
    if isinstance(value, torch.SymBool):
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        return bool(statically_known_true(value))
    try:
        return bool(value)
    except Exception:
        return False


def known_eq(a: Any, b: Any) -> bool:
    """``a == b`` provably (ints, floats, strings, ``SymInt``s, ``None``)."""
    if a is b:
        return True
    if a is None or b is None:
        return False
    try:
        return known_true(a == b)
    except Exception:
        return False


def known_sizes_eq(a: Sequence[Any] | None, b: Sequence[Any] | None) -> bool:
    """Two shapes provably equal."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(known_eq(x, y) for x, y in zip(a, b))


def size_hint(value: Any) -> int:
    """An int for a size without adding a guard: the value, or a SymInt's example hint
    (for cost estimates only; never for decisions that change results)."""
    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt):
        hint = getattr(value.node, "hint", None)
        return int(hint) if hint is not None else 0
    return 0
