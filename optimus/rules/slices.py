"""Slices and selects of ranges: fold them into one op on the underlying tensor."""

from __future__ import annotations

from ..core.pattern import ANY, Op, Var
from ..core.rule import rule
from ..core.symbolic import known_eq
from ..core.view import is_int
from ..core.segments import segment_of
from ._facts import covers, dim_size


def _slices_a_range_on_same_dim(m):
    a = m.anchor.args
    seg = segment_of(m.view, a["input"])
    return seg is not None and seg.dim == a["dim"] and a["step"] == 1 and is_int(a["start"]) and is_int(a["end"])


@rule(Op("slice", Var("inner"), Var("dim"), Var("start"), Var("end"), Var("step")).such_that(_slices_a_range_on_same_dim), stage="fold")
def fold_slice_of_range(m, b):
    """A slice of a range of x (a slice or a split chunk) is one slice of x.

    x[:, 2:10][:, 1:4]              -> x[:, 3:6]
    split(x, [4, 6], 1)[1][:, 0:2]  -> x[:, 4:6]
    """
    seg = segment_of(m.view, m.inner)
    start, end = seg.start + m.start, seg.start + m.end
    if covers(m.view, seg.source, m.dim, start, end):
        return seg.source
    return b.slice(seg.source, m.dim, start, end)


def _selects_from_a_range_on_same_dim(m):
    a = m.anchor.args
    seg = segment_of(m.view, a["input"])
    return seg is not None and seg.dim == a["dim"] and is_int(a["index"]) and a["index"] >= 0


@rule(Op("select", Var("inner"), Var("dim"), Var("index")).such_that(_selects_from_a_range_on_same_dim), stage="fold")
def fold_select_of_range(m, b):
    """Selecting from a range of x selects from x.

    x[:, 2:10][:, 3] -> x[:, 5]
    """
    seg = segment_of(m.view, m.inner)
    return b.select(seg.source, m.dim, seg.start + m.index)


def _full_range(m):
    a = m.anchor.args
    return a.get("step", 1) == 1 and known_eq(a["start"], 0) and known_eq(a["end"], dim_size(m.view, a["input"], a["dim"]))


@rule(Op("slice", Var("x"), ANY, ANY, ANY, ANY).such_that(_full_range), stage="remove")
def remove_full_slice(m, b):
    """A slice over the whole dim is the tensor itself.

    x[:, 0:n] -> x      (n == x.shape[1])
    """
    return m.x
