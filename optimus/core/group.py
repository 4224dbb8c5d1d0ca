"""Group rules: horizontal rewrites that merge N independent, identical ops into one.

A group rule names its anchor ops, a ``key`` (nodes with equal keys may merge: same op,
shapes, dtypes, devices, arguments), conditions on the group (profitability), and a
replacement that receives the whole group::

    @group_rule(("relu", "tanh"), key=same_shape_key)
    def batch_unary(g, b):
        stacked = b.stack([c.input for c in g.members], 0)
        out = b.unbind(b.emit(g.op, stacked), 0)
        return {c.node: o for c, o in zip(g.members, out)}

The driver finds groups over the whole graph (not within a hop radius):

1. depth[n] = length of the longest path from a graph input to n (one pass);
2. candidates are bucketed by (key, depth). Two nodes at the same depth cannot depend on
   each other (a path strictly increases depth), so every bucket is a set of mutually
   independent nodes, found in O(nodes);
3. candidates touching a tensor mutated in place are dropped (reported);
4. buckets are cut into groups of at most ``max_group`` in graph order; groups smaller
   than ``min_group`` are left alone (reported).

Independent ops at different depths do not merge (a deliberate trade: no reachability
queries, so grouping stays linear in the graph size).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Hashable, Mapping, Protocol

import torch.fx as fx

from . import collectives
from .rule import Match, Rule, rule_decorator
from .symbolic import size_hint
from .view import GraphView
from .vocab import Call


class Group(Match):
    """The members of one group, plus read-only helpers: the match of a group rule (what its
    conditions and replacement receive, like ``Match`` for pattern rules).

    ``planned``: a planner judges this group once it is built (``passes="auto"``), so a
    rule's own rough profitability heuristics (launch counts, byte caps) step aside."""

    planned: bool = False

    def __init__(self, rule: "GroupRule", members: list[Call], key: Any, view: GraphView, options: dict[str, Any]) -> None:
        self.rule = rule
        self.members = members
        self.key = key
        self.view = view
        self.options = options

    @property
    def op(self) -> str:
        return self.members[0].op

    @property
    def nodes(self) -> list[fx.Node]:  # type: ignore[override]
        return [c.node for c in self.members]

    def nbytes(self, value: Any) -> int:
        v = self.view.tensor_val(value)
        if v is None:
            return 0
        return size_hint(v.numel()) * v.element_size()  # no guard on symbolic sizes


@dataclasses.dataclass(kw_only=True)
class GroupRule(Rule):
    """A horizontal rule: ``anchors`` and ``key`` select and bucket candidates over the whole
    graph; conditions and the replacement receive a ``Group``; the replacement returns
    ``{member node: its replacement}``.

    Driver options (read by ``find_groups``): ``min_group`` (smaller groups are left alone)
    and ``max_group`` (buckets are cut into groups of at most this many, in graph order).
    """

    anchors: tuple[str, ...]  # type: ignore[assignment]
    key: Callable[[Call, GraphView], Hashable | None]
    kind: str = "horizontal"

    KNOBS: ClassVar[Mapping[str, Any]] = {"min_group": 2, "max_group": 256}

    def __post_init__(self) -> None:
        self.anchors = (self.anchors,) if isinstance(self.anchors, str) else tuple(self.anchors)
        super().__post_init__()

    def code(self) -> tuple[Callable[..., Any], ...]:
        return (*super().code(), self.key)


class GroupPlanner(Protocol):
    """What the FX driver asks about horizontal groups when a planner is attached
    (``passes="auto"``; the implementation is ``optimus.planner.plan.Planner``)."""

    def round_started(self, view: GraphView, report: Any) -> None:
        """A round of group rules starts on ``view``'s graph as it is now."""

    def chunk(self, view: GraphView, members: list[fx.Node], min_group: int) -> tuple[int, str] | None:
        """``None`` if the group may run whole; else the members per chunk (0: none) and why."""

    def judge(self, view: GraphView, rule: str, anchor: fx.Node, members: list[fx.Node], new_nodes: list[fx.Node]) -> str | None:
        """Why the built replacement should not be committed, if it should not."""

    def accepted(self, members: list[fx.Node]) -> None:
        """The group was committed."""


group_rule = rule_decorator(
    GroupRule,
    "anchors",
    fixed={"kind": "horizontal"},
    name="group_rule",
    doc="""``@group_rule(anchor_ops, key=..., where=[...], levels=..., priority=..., options=...,
    knobs={"min_group": ..., "max_group": ...})``: the group replacement
    ``fn(g, b)`` becomes a registered horizontal ``GroupRule`` (see ``rule.rule_decorator``).""",
)


def depths(graph: fx.Graph) -> dict[fx.Node, int]:
    """Longest-path depth of every node from the graph's inputs (one pass, graph order)."""
    depth: dict[fx.Node, int] = {}
    for n in graph.nodes:
        depth[n] = 1 + max((depth[i] for i in n.all_input_nodes), default=-1)
    return depth


def classify_all(view: GraphView) -> list[Call]:
    """Every classifiable node as a ``Call``, in graph order (shared by a round's rules)."""
    return [c for c in (view.classify(n) for n in view.graph.nodes) if c is not None]


def find_groups(
    view: GraphView,
    rule: GroupRule,
    options: dict[str, Any],
    is_excluded: Callable[[fx.Node], str | None],
    decline: Callable[[fx.Node, str], None],
    calls: list[Call] | None = None,
    depth: dict[fx.Node, int] | None = None,
) -> list[Group]:
    """Candidate groups for ``rule`` over the whole graph (see module docstring)."""
    depth = depth if depth is not None else depths(view.graph)
    segment = collectives.segments(view.graph)  # groups never span a collective
    buckets: dict[tuple[Any, int], list[Call]] = {}
    for call in calls if calls is not None else classify_all(view):
        node = call.node
        if call.op not in rule.anchors:
            continue
        key = rule.key(call, view)
        if key is None:
            continue
        reason = is_excluded(node)
        if reason:
            decline(node, reason)
            continue
        buckets.setdefault((key, depth[node]), []).append(call)
    if segment is not None:
        buckets = collectives.split_buckets(buckets, segment, decline)
    groups: list[Group] = []
    lo, hi = options["min_group"], options["max_group"]
    for (key, _), calls in buckets.items():
        for start in range(0, len(calls), hi):
            chunk = calls[start : start + hi]
            if len(chunk) < lo:
                if len(chunk) > 1:  # a lone candidate is not a decline, just no group
                    for c in chunk:
                        decline(c.node, f"group of {len(chunk)} is below min_group={lo}")
                continue
            groups.append(Group(rule, chunk, key, view, options))
    return groups
