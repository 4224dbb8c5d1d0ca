"""Which range or index of which tensor a node is, and whether stacking nodes is free.

A **segment** is a contiguous range ``[start, end)`` of ``source`` along ``dim``:
``getitem(split(x, sizes, d), i)`` and ``slice(x, d, a, b, 1)`` are both segments. Many
vertical rules reduce to "these inputs are adjacent segments of one tensor".
A **part** is one index of ``source`` along ``dim`` with that dim removed:
``getitem(unbind(x, d), i)`` and ``select(x, d, i)``.

``stack_is_free`` is what both sides of a horizontal rewrite need to know: the rules copy
only the operands whose stack is not free, and the planner prices a stack of consecutive
parts of one tensor as the view the vertical rules turn it into.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.fx as fx

from .symbolic import known_eq
from .view import GraphView, is_int


@dataclasses.dataclass(frozen=True)
class Segment:
    source: fx.Node
    dim: int
    start: int
    end: int


@dataclasses.dataclass(frozen=True)
class Part:
    source: fx.Node
    dim: int
    index: int


def segment_of(view: GraphView, value: Any) -> Segment | None:
    """``value`` as a range of another tensor along one dim, if it is one."""
    if not isinstance(value, fx.Node):
        return None
    call = view.classify(value)
    if call is None:
        return None
    if call.op == "getitem":
        src = view.classify(call.args["input"]) if isinstance(call.args["input"], fx.Node) else None
        if src is None or src.op != "split" or not is_int(src.args["dim"]):
            return None
        sizes, i = src.args["sizes"], call.args["index"]
        if not isinstance(sizes, list) or not all(is_int(s) for s in sizes) or not (0 <= i < len(sizes)):
            return None
        start = sum(sizes[:i])
        return Segment(src.args["input"], src.args["dim"], start, start + sizes[i])
    if call.op == "slice":
        a = call.args
        if a.get("step", 1) == 1 and all(is_int(a[k]) for k in ("dim", "start", "end")) and isinstance(a["input"], fx.Node):
            return Segment(a["input"], a["dim"], a["start"], max(a["start"], a["end"]))
    return None


def part_of(view: GraphView, value: Any) -> Part | None:
    """``value`` as one index of another tensor along a removed dim, if it is one."""
    if not isinstance(value, fx.Node):
        return None
    call = view.classify(value)
    if call is None:
        return None
    if call.op == "getitem":
        src = view.classify(call.args["input"]) if isinstance(call.args["input"], fx.Node) else None
        if src is not None and src.op == "unbind" and is_int(src.args["dim"]):
            return Part(src.args["input"], src.args["dim"], call.args["index"])
        return None
    if call.op == "select" and is_int(call.args["dim"]) and is_int(call.args["index"]) and call.args["index"] >= 0:
        return Part(call.args["input"], call.args["dim"], call.args["index"])
    return None


def stack_is_free(view: GraphView, items: list[Any]) -> bool:
    """Stacking ``items`` along a new dim 0 costs no copy once vertical rules run: they
    are the same node, or consecutive parts / equal adjacent ranges of one tensor."""
    if all(i is items[0] for i in items):
        return True
    parts = [part_of(view, i) for i in items]
    if all(p is not None for p in parts) and len({id(p.source) for p in parts}) == 1:
        return [p.index for p in parts] == list(range(parts[0].index, parts[0].index + len(parts)))
    segs = [segment_of(view, i) for i in items]
    if all(s is not None for s in segs) and len({(id(s.source), s.dim) for s in segs}) == 1:
        # bounds may be symbolic: equal sizes and adjacency must be provable, not hinted
        width = segs[0].end - segs[0].start
        return all(known_eq(s.end - s.start, width) for s in segs) and all(known_eq(a.end, b.start) for a, b in zip(segs, segs[1:]))
    return False
