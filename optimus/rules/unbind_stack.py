"""Vertical rules for unbind/select -> stack/cat round trips.

A *part* is one index of a tensor along a removed dim: ``unbind(x, d)[i]`` at Torch-IR,
or ``select(x, d, i)`` (what unbind and indexing become at Aten-IR).
"""

from __future__ import annotations

import torch.fx as fx

from ..core.pattern import ANY, Op, Var
from ..core.rule import rule
from ..core.symbolic import known_eq
from ..core.view import getitem_users
from ..core.segments import part_of
from ._facts import STACK_SPELLINGS, dim_size, emittable_shape, permute_for_movedim, stack_of


def _consecutive_parts(view, items):
    """(source, dim, first index, count) when ``items`` are consecutive parts of one tensor."""
    if not items:
        return None
    parts = [part_of(view, t) for t in items]
    first = parts[0]
    if first is None or any(p is None or p.source is not first.source or p.dim != first.dim for p in parts):
        return None
    if [p.index for p in parts] != list(range(first.index, first.index + len(parts))):
        return None
    return first.source, first.dim, first.index, len(parts)


def _range_of(b, m, source, dim, start, count):
    """``source`` narrowed to ``[start, start + count)`` along ``dim`` (itself if whole)."""
    if known_eq(start, 0) and known_eq(count, dim_size(m.view, source, dim)):
        return source
    return b.slice(source, dim, start, start + count)


def _stacks_consecutive_parts(m):
    stacked = stack_of(m.view, m.anchor)
    return stacked is not None and _consecutive_parts(m.view, stacked[0]) is not None


@rule(Op(STACK_SPELLINGS).such_that(_stacks_consecutive_parts), stage="fold")
def unbind_stack_to_view(m, b):
    """Stacking consecutive parts of a tensor is the tensor (a view), its dim moved.

    stack(unbind(x, d), d)              -> x
    stack(unbind(x, d), e)              -> x.movedim(d, e)
    stack([x[:, 2], x[:, 3]], 1)        -> x[:, 2:4]
    (stack also spelled cat of unsqueezes, or view of a cat, at Aten-IR)
    """
    items, e = stack_of(m.view, m.anchor)
    x, d, start, count = _consecutive_parts(m.view, items)
    y = _range_of(b, m, x, d, start, count)
    return y if d == e else b.permute(y, permute_for_movedim(m.rank(x), d, e))


def _cats_consecutive_parts(m):
    return stack_of(m.view, m.anchor) is None and _consecutive_parts(m.view, m.anchor.args["tensors"]) is not None


@rule(Op("cat", Var("tensors"), Var("cat_dim")).such_that(_cats_consecutive_parts), stage="fold")
def unbind_cat_to_view(m, b):
    """Concatenating consecutive parts of a tensor is one reshape of it.

    cat(unbind(x, d), e) -> x.movedim(d, e).flatten(e, e + 1)
    """
    x, d, start, count = _consecutive_parts(m.view, m.tensors)
    shape = emittable_shape(m.shape(m.anchor.node))
    if shape is None:
        m.decline("the result shape has more than one symbolic size, or one next to a size 0")
    y = _range_of(b, m, x, d, start, count)
    e = m.cat_dim
    if d != e:
        y = b.permute(y, permute_for_movedim(m.rank(x), d, e))
    return b.reshape(y, shape)


def _unbinds_a_stack_on_its_dim(m):
    src = m.anchor.args["input"]
    stacked = stack_of(m.view, m.call(src)) if isinstance(src, fx.Node) else None
    return stacked is not None and stacked[1] == m.anchor.args["dim"] and getitem_users(m.unbind) is not None


def _stack_keeps_dtypes(m):
    """the stack promotes some input to another dtype"""
    want = m.dtype(m.stacked)
    items, _ = stack_of(m.view, m.call(m.stacked))
    return want is not None and all(m.dtype(t) == want for t in items)


@rule(Op("unbind", Var("stacked"), ANY).bind("unbind").such_that(_unbinds_a_stack_on_its_dim), where=[_stack_keeps_dtypes], stage="fold")
def stack_unbind_to_inputs(m, b):
    """Unbinding a stack along its stack dim gives back the stacked tensors.

    unbind(stack(xs, d), d)[i] -> xs[i]
    """
    items, _ = stack_of(m.view, m.call(m.stacked))
    return {g: items[i] for i, users in m.getitems(m.unbind).items() for g in users}


def _selects_from_a_stack_on_its_dim(m):
    src = m.anchor.args["input"]
    stacked = stack_of(m.view, m.call(src)) if isinstance(src, fx.Node) else None
    i = m.anchor.args["index"]
    return stacked is not None and stacked[1] == m.anchor.args["dim"] and isinstance(i, int) and 0 <= i < len(stacked[0])


@rule(Op("select", Var("stacked"), ANY, Var("index")).such_that(_selects_from_a_stack_on_its_dim), where=[_stack_keeps_dtypes], stage="fold")
def select_of_stack_to_input(m, b):
    """Selecting index i of a stack along its stack dim is the i-th stacked tensor.

    select(stack(xs, d), d, i) -> xs[i]
    """
    return stack_of(m.view, m.call(m.stacked))[0][m.index]
