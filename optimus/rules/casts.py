"""Dtype conversions (``cast``) across the glue the other rules remove.

Autocast puts casts between the ops the patterns look for: at Aten-IR a split's chunks
each go through ``convert_element_type`` before their linears, and a layer norm kept in
fp32 sits between two conversions. A cast is elementwise, so it commutes with every
rearrangement of elements: ``hoist_pointwise_through_split`` already moves the chunks'
casts above their split (one cast of the whole tensor), and the rules here fold chains of
casts where that is exact and move a cast after a concatenation of adjacent ranges, which
then becomes a view. What a cast computes never changes: its result dtype stays, and two
casts fold only when the first loses nothing (``core.dtypes.holds``).
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx

from ..core.dtypes import holds
from ..core.pattern import ANY, Op, Var
from ..core.rule import rule
from ..core.segments import part_of, segment_of
from ._facts import STACK_SPELLINGS, adjacent_runs, stack_of


def _first_cast_exact(m):
    """the first cast rounds (a narrowing then widening pair is not an identity)"""
    return holds(m.call(m.inner).args["dtype"], m.dtype(m.x))


@rule(Op("cast", Op("cast", Var("x"), ANY).bind("inner"), Var("target")), where=[_first_cast_exact], stage="fold")
def fold_cast_chain(m, b):
    """Two casts in a row are one when the first is exact.

    cast(cast(x, a), b) -> cast(x, b)     (every value of x's dtype is a value of a)
    cast(cast(x, a), dtype(x)) -> x       (bf16 -> fp32 -> bf16)

    fp32 -> bf16 -> fp32 is not folded: it rounds every value to bf16.
    """
    return b.cast(m.x, m.target)


def _cast_sources(view: Any, items: list[Any]) -> tuple[list[fx.Node], Any] | None:
    """(the tensors cast, the dtype) when every item is a cast of one dtype to one dtype."""
    calls = [view.classify(t) if isinstance(t, fx.Node) else None for t in items]
    if not calls or any(c is None or c.op != "cast" for c in calls):
        return None
    sources = [c.input for c in calls]
    if len({c.args["dtype"] for c in calls}) != 1 or len({view.dtype(s) for s in sources}) != 1:
        return None
    return sources, calls[0].args["dtype"]


def _lie_together(view: Any, sources: list[fx.Node], dim: int, stacked: bool) -> bool:
    """The cast tensors are consecutive parts (a stack) or adjacent ranges along the cat
    dim (a cat) of one tensor: concatenating them is a view once the other rules run."""
    if stacked:
        parts = [part_of(view, s) for s in sources]
        if any(p is None for p in parts) or len({id(p.source) for p in parts}) != 1 or parts[0].dim != dim:
            return False
        return [p.index for p in parts] == list(range(parts[0].index, parts[0].index + len(parts)))
    segs = [segment_of(view, s) for s in sources]
    return segs[0] is not None and adjacent_runs(segs, dim) == [(0, len(segs))]


def _concatenates_casts(m):
    call, view = m.anchor, m.view
    stacked = stack_of(view, call)
    if stacked is not None:
        found = _cast_sources(view, stacked[0])
        return found is not None and len(found[0]) > 1 and _lie_together(view, found[0], stacked[1], True)
    if call.op != "cat" or not isinstance(call.args.get("tensors"), list):
        return False
    found = _cast_sources(view, call.args["tensors"])
    return found is not None and len(found[0]) > 1 and _lie_together(view, found[0], call.args["dim"], False)


@rule(Op(STACK_SPELLINGS).such_that(_concatenates_casts), stage="move")
def cast_after_concatenation(m, b):
    """A concatenation of casts of adjacent pieces of one tensor is a cast of the pieces'
    concatenation, which the split/unbind rules turn into a view.

    cat([cast(x[:, 0:4], d), cast(x[:, 4:8], d)], 1) -> cast(cat([x[:, 0:4], x[:, 4:8]], 1), d)
    stack([cast(unbind(x)[i], d) ...], 0)            -> cast(stack([unbind(x)[i] ...], 0), d)

    (one cast of the whole instead of one per piece; the stacks horizontal rules build over
    autocast's per-member casts take this form)
    """
    stacked = stack_of(m.view, m.anchor)
    if stacked is not None:
        sources, dtype = _cast_sources(m.view, stacked[0])
        return b.cast(b.stack(sources, stacked[1]), dtype)
    sources, dtype = _cast_sources(m.view, m.anchor.args["tensors"])
    return b.cast(b.cat(sources, m.anchor.args["dim"]), dtype)
