"""Facts rules share: adjacent runs of segments, small shape helpers, stacks in every
spelling, and where the project's custom ops pay. (Which range or index of which tensor a
node is, ``segment_of`` / ``part_of``, and whether a stack is free are the core's,
``core.segments``: the planner prices stacks with them too.)
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch.fx as fx

from ..core.segments import Segment
from ..core.symbolic import known_eq
from ..core.view import GraphView, is_int


def dim_size(view: GraphView, node: Any, dim: int) -> Any:
    shape = view.shape(node)
    return None if shape is None or dim >= len(shape) else shape[dim]


def covers(view: GraphView, source: fx.Node, dim: int, start: Any, end: Any) -> bool:
    """Does ``[start, end)`` span the whole of ``source`` along ``dim``?"""
    return known_eq(start, 0) and known_eq(end, dim_size(view, source, dim))


def adjacent_runs(items: Sequence[Segment | None], dim: int) -> list[tuple[int, int]]:
    """Maximal ``[i, j)`` index ranges of items that are adjacent segments along ``dim``."""
    runs: list[tuple[int, int]] = []
    i = 0
    while i < len(items):
        j = i + 1
        first = items[i]
        if first is not None and first.dim == dim:
            while j < len(items):
                prev, cur = items[j - 1], items[j]
                if cur is None or cur.source is not first.source or cur.dim != dim or not known_eq(cur.start, prev.end):
                    break
                j += 1
        runs.append((i, j))
        i = j
    return runs


def same_shape_except(shapes: Sequence[Sequence[Any] | None], dim: int | None) -> bool:
    """All shapes known, equal rank, and provably equal in every dim but ``dim``."""
    if not shapes or any(s is None for s in shapes):
        return False
    rank = len(shapes[0])
    for s in shapes[1:]:
        if len(s) != rank:
            return False
        for k in range(rank):
            if k != dim and not known_eq(s[k], shapes[0][k]):
                return False
    return True


def emittable_shape(shape: Sequence[Any] | None) -> list[int] | None:
    """A shape usable as a view/reshape argument: ints, with at most one symbolic size
    written as ``-1``; ``None`` if that is impossible (two symbolic sizes, or a ``-1``
    next to a size 0, which torch cannot resolve: 0 elements fit any size there)."""
    if shape is None:
        return None
    out: list[int] = []
    for s in shape:
        out.append(s if is_int(s) else -1)
    return out if resolvable(out) else None


def resolvable(shape: Sequence[int]) -> bool:
    """Can view/reshape infer this shape's ``-1`` (at most one, and no size 0 beside it)?"""
    n = list(shape).count(-1)
    return n == 0 or (n == 1 and 0 not in shape)


STACK_SPELLINGS = ("stack", "cat", "view", "reshape")


def stack_of(view: GraphView, call: Any) -> tuple[list[Any], int] | None:
    """``(tensors, dim)`` when the node stacks ``tensors`` along ``dim``, in any spelling.

    ``stack(ts, e)`` (Torch-IR); ``cat([unsqueeze(t, e), ...], e)`` and
    ``view(cat(ts, e), ts.shape[:e] + [n] + ts.shape[e:])`` (what ``stack`` decomposes
    into at Aten-IR).
    """
    if call is None:
        return None
    if call.op == "stack":
        tensors = call.args.get("tensors")
        return (list(tensors), call.args["dim"]) if isinstance(tensors, list) and tensors else None
    if call.op == "cat":
        tensors, dim = call.args.get("tensors"), call.args["dim"]
        if not isinstance(tensors, list) or not tensors:
            return None
        out = []
        for t in tensors:
            u = view.classify(t) if isinstance(t, fx.Node) else None
            if u is None or u.op != "unsqueeze" or u.args["dim"] != dim:
                return None
            out.append(u.args["input"])
        return out, dim
    if call.op in ("view", "reshape"):
        inner = view.classify(call.args["input"]) if isinstance(call.args["input"], fx.Node) else None
        if inner is None or inner.op != "cat" or not isinstance(inner.args["tensors"], list) or not is_int(inner.args["dim"]):
            return None
        tensors, e = inner.args["tensors"], inner.args["dim"]
        shapes = [view.shape(t) for t in tensors]
        if not same_shape_except(shapes, None):
            return None
        expected = list(shapes[0][:e]) + [len(tensors)] + list(shapes[0][e:])
        out_shape = view.shape(call.node)
        if out_shape is None or len(out_shape) != len(expected) or not all(known_eq(a, b) for a, b in zip(out_shape, expected)):
            return None
        return list(tensors), e
    return None


def permute_for_movedim(rank: int, src: int, dst: int) -> list[int]:
    """The permutation equal to ``movedim(src, dst)`` on a tensor of ``rank`` dims."""
    order = [d for d in range(rank) if d != src]
    order.insert(dst, src)
    return order


# The rules that emit our Triton custom ops (grouped_kernels, embedding) pay on the GPU. On
# CPU tensors the ops run their plain-torch reference path, a Python loop over the members:
# measured on a 2-core CPU machine (realistic sizes, median of 15 steps; docs/horizontal.md)
# dlrm inference took 173 ms with those rules against 75 ms without them, and
# hetero_towers training 92 ms against 19 ms. So on CPU they decline, unless this variable is
# "1" (the test suite sets it: the rewrites are checked on the CPU).
KERNEL_RULES_ON_CPU_ENV = "OPTIMUS_KERNEL_RULES_ON_CPU"
CPU_REFERENCE_PATH = (
    "CPU tensors: the custom op's CPU path is a plain-torch reference, slower than Inductor's "
    f"own CPU code ({KERNEL_RULES_ON_CPU_ENV}=1 rewrites anyway: tests, debugging)"
)


def kernel_op_device_problem(view: GraphView, value: Any) -> str | None:
    """Why a rule should not emit a custom op for operands on ``value``'s device, if it should not."""
    v = view.tensor_val(value) if isinstance(value, fx.Node) else None
    if v is None or v.device.type != "cpu" or os.environ.get(KERNEL_RULES_ON_CPU_ENV) == "1":
        return None
    return CPU_REFERENCE_PATH
