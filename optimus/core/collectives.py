"""Collectives traced into a graph are barriers for every rewrite.

Under tensor parallelism (DTensor), FSDP traced with compiled autograd, or a model that
calls ``torch.distributed._functional_collectives`` itself, a Torch-IR or Aten-IR graph
holds ops that talk to other ranks: ``all_reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor``, ... and the ``wait_tensor`` that completes each. Their place in
the program is the overlap of communication and compute that the user (or FSDP) chose,
and every rank must issue them in the same order. So:

* no rewrite may **move a computed value across** one: a value computed before a
  collective is not recomputed after it (a horizontal group merging ops from both sides
  would do that at its anchor), nor hoisted before it (``AliasAnalysis.barrier_problem``);
* horizontal groups form **within one segment** (the ops between two collectives,
  ``segments``), so identical ops on both sides of a collective batch on each side;
* a collective is **never removed**, even when nothing reads its result
  (``GraphView.has_side_effects``): another rank is waiting for it.

Rules never match a collective (it is outside the canonical vocabulary), so no pattern
can rewrite one.
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx

# Namespaces of the ops that communicate with other ranks when traced into a graph.
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "c10d", "_dtensor", "fsdp"})


def op_namespace(target: Any) -> str | None:
    """The ``torch.ops`` namespace of an ``OpOverload`` / ``OpOverloadPacket`` target."""
    ns = getattr(target, "namespace", None)
    if isinstance(ns, str):
        return ns
    qualified = getattr(target, "_qualified_op_name", None)  # OpOverloadPacket: "ns::name"
    if isinstance(qualified, str) and "::" in qualified:
        return qualified.split("::", 1)[0]
    return None


def is_collective(target: Any) -> bool:
    """Is ``target`` (an FX node's target) a collective, a wait on one, or an FSDP op?

    Covers functional collectives and ``wait_tensor`` (``_c10d_functional``), the in-place
    c10d ops (``c10d``), DTensor's and FSDP2's own ops, at Torch-IR (``OpOverloadPacket``s,
    or the Python functions of ``torch.distributed._functional_collectives`` left by
    ``symbolic_trace``) and at Aten-IR (``OpOverload``s)."""
    ns = op_namespace(target)
    if ns is not None:
        return ns in COLLECTIVE_NAMESPACES
    module = getattr(target, "__module__", None) or ""
    return module.startswith("torch.distributed._functional_collectives")


def is_barrier(node: fx.Node) -> bool:
    return node.op == "call_function" and is_collective(node.target)


def barriers(graph: fx.Graph) -> list[fx.Node]:
    """The graph's collective nodes, in graph order."""
    return [n for n in graph.nodes if is_barrier(n)]


def segments(graph: fx.Graph) -> dict[fx.Node, int] | None:
    """Node -> number of collectives before it in graph order; ``None`` when the graph
    has none (the common case: nothing to separate)."""
    out: dict[fx.Node, int] = {}
    seg = 0
    found = False
    for n in graph.nodes:
        if is_barrier(n):
            seg += 1
            found = True
        out[n] = seg
    return out if found else None


def between(a: fx.Node, b: fx.Node, barrier_nodes: list[fx.Node]) -> fx.Node | None:
    """A collective strictly between ``a`` and ``b`` in graph order (either way round)."""
    lo, hi = (a, b) if a._sort_key < b._sort_key else (b, a)
    for c in barrier_nodes:
        if c._erased:
            continue
        if lo._sort_key < c._sort_key < hi._sort_key:
            return c
    return None


def split_buckets(buckets: dict[Any, list[Any]], segment: dict[fx.Node, int], decline: Any) -> dict[Any, list[Any]]:
    """Cut each ``(key, region, flag)`` bucket of horizontal-group candidates (``Call``s) at
    the collectives: one ``(key, region, (flag, segment))`` bucket per segment. Members of a cut
    bucket are declined with the reason (they may still group with the others on their
    side)."""
    out: dict[Any, list[Any]] = {}
    for key, calls in buckets.items():
        by_segment: dict[int, list[Any]] = {}
        for c in calls:
            by_segment.setdefault(segment.get(c.node, -1), []).append(c)
        if len(by_segment) > 1:
            reason = f"identical ops on {len(by_segment)} sides of a collective: grouped only with the ones on their side (collectives are barriers)"
            for c in calls:
                decline(c.node, reason)
        group_key, region, flag = key
        for seg, members in by_segment.items():
            out[(group_key, region, (flag, seg))] = members
    return out
