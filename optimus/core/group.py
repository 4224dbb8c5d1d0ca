"""Group rules: horizontal rewrites that merge N independent, identical ops into one.

A group rule names its anchor ops, a ``key`` (nodes with equal keys may merge: same op,
shapes, dtypes, devices, arguments), named group conditions (profitability), and a
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
import hashlib
import inspect
from typing import Any, Callable, Hashable, Iterable, Sequence

import torch.fx as fx

from .levels import LEVELS
from .registry import KINDS, REGISTRY
from .rule import Builder, Decline, Rule, _code_fingerprint, condition_reason
from .symbolic import size_hint
from .view import GraphView
from .vocab import Call


class Group:
    """The members of one group, plus read-only helpers (like ``Match`` for local rules)."""

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
    def nodes(self) -> list[fx.Node]:
        return [c.node for c in self.members]

    def decline(self, reason: str) -> None:
        raise Decline(reason)

    def shape(self, value: Any) -> Any:
        return self.view.shape(value)

    def dtype(self, value: Any) -> Any:
        return self.view.dtype(value)

    def nbytes(self, value: Any) -> int:
        v = self.view.tensor_val(value)
        if v is None:
            return 0
        return size_hint(v.numel()) * v.element_size()  # no guard on symbolic sizes


GroupCondition = Callable[[Group], bool]


@dataclasses.dataclass
class GroupRule(Rule):
    """A horizontal rule. ``pattern``-less: ``key`` selects and buckets candidates."""

    key: Callable[[Call, GraphView], Hashable | None] = None  # type: ignore[assignment]
    group_where: tuple[GroupCondition, ...] = ()
    group_replace: Callable[[Group, Builder], dict[fx.Node, fx.Node]] = None  # type: ignore[assignment]
    anchor_ops: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # A GroupRule has no tree pattern; reuse Rule's checks for kind and levels only.
        if self.kind not in KINDS:
            raise ValueError(f"rule {self.name!r}: kind must be one of {KINDS}")
        bad = [lv for lv in self.levels if lv not in LEVELS]
        if bad:
            raise ValueError(f"rule {self.name!r}: unknown levels {bad}")
        self.options = {"min_group": 2, "max_group": 256, **self.options}

    @property
    def anchors(self) -> tuple[str, ...]:
        return self.anchor_ops

    def fingerprint(self) -> str:
        h = hashlib.sha256(self.name.encode())
        h.update(repr(self.anchor_ops).encode())
        h.update(repr(sorted(self.options.items())).encode())
        for fn in (self.key, self.group_replace, *self.group_where):
            h.update(_code_fingerprint(fn).encode())
        return h.hexdigest()[:16]

    def conditions_fail(self, group: Group) -> str | None:
        for cond in self.group_where:
            if not cond(group):
                return condition_reason(cond)
        return None


def group_rule(
    anchors: Sequence[str] | str,
    *,
    key: Callable[[Call, GraphView], Hashable | None],
    where: Iterable[GroupCondition] = (),
    levels: Sequence[str] = ("torch_ir", "aten_ir"),
    priority: int = 100,
    options: dict[str, Any] | None = None,
    name: str | None = None,
    register: bool = True,
    default: bool = True,
) -> Callable[[Callable[[Group, Builder], dict[fx.Node, fx.Node]]], GroupRule]:
    """Decorator turning a group replacement into a registered horizontal ``GroupRule``."""

    def wrap(fn: Callable[[Group, Builder], dict[fx.Node, fx.Node]]) -> GroupRule:
        r = GroupRule(
            name=name or fn.__name__,
            pattern=None,  # type: ignore[arg-type]
            replace=None,  # type: ignore[arg-type]
            kind="horizontal",
            levels=tuple(levels),
            priority=priority,
            options=dict(options or {}),
            doc=inspect.getdoc(fn) or "",
            default=default,
            key=key,
            group_where=tuple(where),
            group_replace=fn,
            anchor_ops=(anchors,) if isinstance(anchors, str) else tuple(anchors),
        )
        if register:
            REGISTRY.add(r)
        return r

    return wrap


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
    buckets: dict[tuple[Any, int], list[Call]] = {}
    for call in calls if calls is not None else classify_all(view):
        node = call.node
        if call.op not in rule.anchor_ops:
            continue
        key = rule.key(call, view)
        if key is None:
            continue
        reason = is_excluded(node)
        if reason:
            decline(node, reason)
            continue
        buckets.setdefault((key, depth[node]), []).append(call)
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
