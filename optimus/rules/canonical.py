"""Canonicalization: one spelling per op, so later rules and upstream passes see one form.

Split sizes become explicit lists, dims become non-negative, and every spelling
(``x.split(8, -1)``, ``torch.concat(..., axis=1)``, ``aten.split.Tensor``) becomes the
level's canonical call (``torch.split(x, [8, 8, 8], 2)`` / ``aten.split_with_sizes``).
"""

from __future__ import annotations

from typing import Any

from ..core.pattern import Op
from ..core.rule import rule
from ..core.view import is_int
from ..core.vocab import Call


def _needs_canonical_form(call: Call, view: Any) -> bool:
    if not _resolved(call):
        return False  # sizes or dims unknown (no shapes, or symbolic): nothing to gain
    return not view.is_canonical_form(call.node, call)


def _resolved(call: Call) -> bool:
    if not is_int(call.args.get("dim")):
        return False
    if call.op == "split":
        sizes = call.args["sizes"]
        return isinstance(sizes, list) and all(is_int(s) for s in sizes)
    if call.op in ("cat", "stack"):
        return isinstance(call.args["tensors"], list)
    return True


@rule(Op(("split", "cat", "stack", "unbind")).such_that(_needs_canonical_form), kind="canonicalize", priority=0)
def canonicalize_split_cat_args(m, b):
    """Spell split/cat/stack/unbind canonically: sizes as lists, dims >= 0.

    x.split(8, dim=-1)            -> torch.split(x, [8, 8, 8], 1)
    torch.concat([a, b], axis=-1) -> torch.cat([a, b], 1)
    aten.split.Tensor(x, 8, -1)   -> aten.split_with_sizes.default(x, [8, 8, 8], 1)
    """
    return b.emit(m.anchor.op, **m.anchor.args)
