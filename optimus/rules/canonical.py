"""Canonicalization: one spelling per op, so later rules and upstream passes see one form.

Split sizes are read as explicit lists, dims become non-negative, and every spelling
(``x.split(8, -1)``, ``torch.concat(..., axis=1)``, ``aten.split.Tensor``) becomes the
level's canonical call: at Aten-IR ``aten.split_with_sizes``; at Torch-IR ``torch.split``
with one size where the chunks are equal (the last no larger), else the list, because the
one-size spelling traces to ``aten.split.Tensor``, which AOTAutograd's partitioner
recomputes as a view, and a list would not be (``torch_ir.view._split_size_arg``).
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx

from ..core.pattern import Op
from ..core.rule import Match, rule
from ..core.view import is_int, num_outputs
from ..core.vocab import Call


def _needs_canonical_form(m: Match) -> bool:
    call, view = m.anchor, m.view
    if not _resolved(call, view):
        return False  # sizes or dims unknown (no shapes, or symbolic): nothing to gain
    if isinstance(call.args.get("tensors"), fx.Node):
        return True  # cat/stack of a whole tuple
    return not view.is_canonical_form(call.node, call)


def _resolved(call: Call, view: Any) -> bool:
    if not is_int(call.args.get("dim")):
        return False
    if call.op == "split":
        sizes = call.args["sizes"]
        return isinstance(sizes, list) and all(is_int(s) for s in sizes)
    if call.op in ("cat", "stack"):
        tensors = call.args["tensors"]
        return isinstance(tensors, list) or (isinstance(tensors, fx.Node) and num_outputs(view, tensors) is not None)
    return True


@rule(Op(("split", "cat", "stack", "unbind")).such_that(_needs_canonical_form), kind="canonicalize", stage="canonicalize")
def canonicalize_split_cat_args(m, b):
    """Spell split/cat/stack/unbind canonically: dims >= 0, Aten-IR split sizes as lists.

    x.split(8, dim=-1)            -> torch.split(x, 8, 1)     (equal chunks: one size, a view to the partitioner)
    x.split([2, 6], -1)           -> torch.split(x, [2, 6], 1)
    torch.concat([a, b], axis=-1) -> torch.cat([a, b], 1)
    aten.split.Tensor(x, 8, -1)   -> aten.split_with_sizes.default(x, [8, 8, 8], 1)
    torch.cat(x.split(4), 1)      -> torch.cat([chunk0, chunk1, ...], 1)   (symbolic_trace form)
    """
    tensors = m.anchor.args.get("tensors")
    if isinstance(tensors, fx.Node):  # cat/stack of a whole tuple: name its elements
        items = [b.emit("getitem", tensors, i) for i in range(num_outputs(m.view, tensors))]
        return b.respell(m.anchor, tensors=items)
    return b.respell(m.anchor)
