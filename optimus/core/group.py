"""Group rules: horizontal rewrites that merge N independent ops into one.

A group rule names its anchor ops, a ``key`` (nodes with equal keys may merge: same op,
shapes, dtypes, devices, arguments), conditions on the group (profitability), and a
replacement that receives the whole group::

    @group_rule(("relu", "tanh"), key=same_shape_key)
    def batch_unary(g, b):
        stacked = b.stack([c.input for c in g.members], 0)
        out = b.unbind(b.emit(g.op, stacked), 0)
        return {c.node: o for c, o in zip(g.members, out)}

The driver finds groups over the whole graph (not within a hop radius), by independence:

1. candidates are bucketed by key (candidates touching a tensor mutated in place are
   dropped, reported);
2. one pass in graph order gives every candidate the set of other candidates it depends
   on, as a bitset (a Python int; ``candidate_ancestors``). Sets are freed once their
   node's last user has read them, so memory follows the live values, and the pass is
   O(edges x candidates / word size) in the worst case, O(edges) when few candidates are
   ancestors of each other (towers, heads, experts);
3. each bucket's candidates, in graph order, go first-fit into open groups: a candidate
   joins the first open group holding none of its ancestors (members earlier in graph
   order cannot be its descendants), so every group is a set of mutually independent
   nodes, whatever their depths. A group closes when it reaches ``max_group`` members or
   when a candidate lies more than ``max_span`` nodes (graph order) after its first
   member: the fused op runs at the last member, so the span bounds how long the earlier
   members' inputs stay alive and how far their consumers move;
4. groups smaller than ``min_group`` are left alone (reported).

Fusing one group can join paths between the members of another group of the same round
(A -> B and C -> D with groups {A, D} and {B, C}): before each fusion the rule checks
again that its members do not depend on each other (``depend_on_each_other``, a search
bounded by the group's span) and declines with that reason if they now do.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Hashable, Mapping, Protocol

import torch.fx as fx

from . import collectives
from .regions import describe as regions_describe
from .rule import Match, Rule, rule_decorator
from .symbolic import size_hint
from .view import GraphView
from .vocab import Call

MAX_SPAN = 4096  # default max_span: graph-order distance from a group's first member to its last
MAX_OPEN_GROUPS = 8  # per bucket: candidates that fit none of them open a new one, closing the oldest
DEPENDENT = "members depend on each other (an earlier fusion joined their paths)"


class Group(Match):
    """The members of one group, plus read-only helpers: the match of a group rule (what its
    conditions and replacement receive, like ``Match`` for pattern rules)."""

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

    The options every group rule has, read by ``find_groups`` (``CLASS_OPTIONS``):
    ``min_group`` (smaller groups are left alone), ``max_group`` (groups hold at most this
    many) and ``max_span`` (a group's members lie within this many nodes of its first
    member, in graph order).
    """

    anchors: tuple[str, ...]  # type: ignore[assignment]
    key: Callable[[Call, GraphView], Hashable | None]
    kind: str = "horizontal"
    stage: str = "batch_elementwise"
    #: ``copies(group)``: the member operands the replacement copies into new buffers each
    #: step (stacks, packs, concatenations), one list per operand with a value per member;
    #: the planner's memory estimate counts their bytes. Without it the planner assumes
    #: the members' first inputs are stacked (unless they stack for free).
    copies: Callable[["Group"], list[list[Any]]] | None = None
    #: the replacement is one of our custom ops (``torch.ops.optimus.*``): Inductor does not
    #: plan the buffers its backward allocates, so in training the planner charges the
    #: group's backward over everything saved (``Liveness.with_group``'s ``opaque_backward``)
    custom_op: bool = False
    #: ``backward_held(group, n)``: the bytes the replacement's backward holds at once beyond
    #: what the first ``n`` members' backwards held, where the rule knows it better than the
    #: planner's default (every output gradient at once, less one member's): buffers its
    #: backward allocates, an output gradient it reads in place. ``None``: the default.
    backward_held: Callable[["Group", int], int | None] | None = None

    CLASS_OPTIONS: ClassVar[Mapping[str, Any]] = {"min_group": 2, "max_group": 256, "max_span": MAX_SPAN}

    def __post_init__(self) -> None:
        self.anchors = (self.anchors,) if isinstance(self.anchors, str) else tuple(self.anchors)
        super().__post_init__()

    def code(self) -> tuple[Callable[..., Any], ...]:
        own = tuple(f for f in (self.copies, self.backward_held) if f is not None)
        return (*super().code(), self.key) + own

    def copied_operands(self, group: "Group") -> list[list[Any]] | None:
        """What the replacement of ``group`` copies (``copies``); ``None`` if the rule does not say."""
        return self.copies(group) if self.copies is not None else None

    def held_in_backward(self, group: "Group") -> Callable[[int], int | None] | None:
        """``backward_held`` for ``group``'s first ``n`` members; ``None`` if the rule does not say."""
        if self.backward_held is None:
            return None
        held = self.backward_held
        return lambda n: held(group, n)

    def decline_reason(self, match: Any) -> str | None:
        """The members must still be independent (see the module docstring), then the
        rule's own conditions."""
        if depend_on_each_other(match.nodes):
            return DEPENDENT
        return super().decline_reason(match)


@dataclasses.dataclass(frozen=True)
class Cut:
    """A group a planner cut: the chunks to try, each a group of its own (positions in the
    group's members), and the note saying why; or, when no chunk fits, ``declined``: the
    reason every member is declined with."""

    parts: tuple[tuple[int, ...], ...] = ()
    note: str = ""
    declined: str = ""


class GroupPlanner(Protocol):
    """What the FX driver asks about horizontal groups when a planner is attached
    (``passes="auto"``; the implementation is ``optimus.planner.plan.Planner``)."""

    def round_started(self, view: GraphView, report: Any) -> None:
        """A round of group rules starts on ``view``'s graph as it is now."""

    def order(self, view: GraphView, members: list[fx.Node]) -> list[int]:
        """The order the group's members are stacked (and cut) in, as positions."""

    def chunk(self, view: GraphView, members: list[fx.Node], min_group: int, copies: list[list[Any]] | None = None, custom_op: bool = False,
              held: Callable[[int], int | None] | None = None) -> Cut | None:
        """``None`` if the group may run whole; else how it is cut (``Cut``).
        ``copies``: what the replacement copies (``GroupRule.copied_operands``);
        ``custom_op``: ``GroupRule.custom_op``; ``held``: ``GroupRule.held_in_backward``."""

    def judge(self, view: GraphView, rule: str, anchor: fx.Node, members: list[fx.Node], new_nodes: list[fx.Node]) -> str | None:
        """Why the built replacement should not be committed, if it should not."""

    def accepted(self, view: GraphView, members: list[fx.Node]) -> None:
        """The group was committed."""


group_rule = rule_decorator(
    GroupRule,
    "anchors",
    fixed={"kind": "horizontal"},
    name="group_rule",
    doc="""``@group_rule(anchor_ops, key=..., where=[...], levels=..., stage=...,
    options={"min_group": ..., "max_group": ..., ...})``: the group replacement
    ``fn(g, b)`` becomes a registered horizontal ``GroupRule`` (see ``rule.rule_decorator``).""",
)


def classify_all(view: GraphView) -> list[Call]:
    """Every classifiable node as a ``Call``, in graph order (shared by a round's rules)."""
    return [c for c in (view.classify(n) for n in view.graph.nodes) if c is not None]


def candidate_ancestors(graph: fx.Graph, bit_of: Mapping[fx.Node, int]) -> dict[fx.Node, int]:
    """For every node of ``bit_of``, the bitset (a Python int) of the *other* nodes of
    ``bit_of`` it depends on: bit ``bit_of[a]`` is set when there is a path a -> node.

    One pass in graph order (a topological order): a node's set is the union of its inputs'
    sets plus the inputs that are themselves candidates. A set is dropped once the last
    user of its node has read it, so at most the sets of live values are held at a time.
    """
    live: dict[fx.Node, int] = {}
    waiting: dict[fx.Node, int] = {}  # node -> users that have not read its set yet
    found: dict[fx.Node, int] = {}
    for n in graph.nodes:
        acc = 0
        for i in n.all_input_nodes:
            acc |= live.get(i, 0)
            left = waiting.get(i)
            if left is not None:
                if left <= 1:
                    live.pop(i, None)
                    del waiting[i]
                else:
                    waiting[i] = left - 1
        bit = bit_of.get(n)
        if bit is not None:
            found[n] = acc
            acc |= 1 << bit
        if acc and n.users:
            live[n] = acc
            waiting[n] = len(n.users)
    return found


def find_groups(
    view: GraphView,
    rule: GroupRule,
    options: dict[str, Any],
    is_excluded: Callable[[fx.Node], str | None],
    decline: Callable[[fx.Node, str], None],
    calls: list[Call] | None = None,
) -> list[Group]:
    """Candidate groups for ``rule`` over the whole graph (see module docstring)."""
    segment = collectives.segments(view.graph)  # groups never span a collective
    regions = view.regions()  # nor a grad-mode / autocast boundary (core/regions.py)
    dropped = view.grad_flow().dropped()  # nor mix results no gradient reaches with used ones (core/gradflow.py)
    keyed: dict[Any, list[Call]] = {}
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
        keyed.setdefault((key, regions.state_at(node), node in dropped), []).append(call)
    if regions or dropped:
        _decline_split_by_region(keyed, decline)
    if segment is not None:  # one bucket per (key, side of every collective)
        keyed = collectives.split_buckets(keyed, segment, decline)
    buckets = {k: cs for k, cs in keyed.items() if len(cs) > 1}  # a lone candidate has nothing to merge with
    if not buckets:
        return []
    position = {n: i for i, n in enumerate(view.graph.nodes)}
    bit_of: dict[fx.Node, int] = {}
    for cs in buckets.values():
        for c in cs:
            bit_of[c.node] = len(bit_of)
    ancestors = candidate_ancestors(view.graph, bit_of)
    lo, hi, span = options["min_group"], options["max_group"], options.get("max_span", MAX_SPAN)
    formed: list[tuple[int, list[Call], Any]] = []  # (position of the first member, members, key)

    def close(members: list[Call], key: Any) -> None:
        if len(members) >= lo:
            formed.append((position[members[0].node], members, key))
        elif len(members) > 1:
            for c in members:
                decline(c.node, f"group of {len(members)} is below min_group={lo}")

    for (key, _, _), cs in buckets.items():
        cs = sorted(cs, key=lambda c: position[c.node])
        open_groups: list[list[Any]] = []  # [members, bitset of the members, position of the first]
        for c in cs:
            pos, anc = position[c.node], ancestors[c.node]
            still_open = []
            for g in open_groups:
                if pos - g[2] > span:  # results consumed too far apart: the group is complete
                    close(g[0], key)
                else:
                    still_open.append(g)
            open_groups = still_open
            home = next((g for g in open_groups if not (anc & g[1]) and len(g[0]) < hi), None)
            if home is None:
                if len(open_groups) >= MAX_OPEN_GROUPS:
                    oldest = open_groups.pop(0)
                    close(oldest[0], key)
                home = [[], 0, pos]
                open_groups.append(home)
            home[0].append(c)
            home[1] |= 1 << bit_of[c.node]
            if len(home[0]) == hi:
                open_groups.remove(home)
                close(home[0], key)
        for g in open_groups:
            close(g[0], key)
    formed.sort(key=lambda f: f[0])
    return [Group(rule, members, key, view, options) for _, members, key in formed]


def _decline_split_by_region(keyed: dict[Any, list[Call]], decline: Callable[[fx.Node, str], None]) -> None:
    """Candidates of one key in several regions, or with and without a gradient that
    reaches them, group only within theirs: say so."""
    states: dict[Any, list[Any]] = {}
    for key, state, dropped in keyed:
        states.setdefault(key, []).append((state, dropped))
    for key, seen in states.items():
        if len(seen) < 2:
            continue
        regions = {state for state, _ in seen}
        for state, dropped in seen:
            for c in keyed[(key, state, dropped)]:
                if len(regions) > 1:
                    decline(c.node, f"identical ops in {len(regions)} grad-mode/autocast regions: grouped only with the ones in their own ({regions_describe(state)})")
                else:
                    why = "no gradient reaches its result (only used detached or under no_grad)" if dropped else "its result's gradient is used"
                    decline(c.node, f"grouped only with ops like it: {why}; merged, the inputs eager leaves without gradient (.grad None) would get zeros")


def depend_on_each_other(nodes: list[fx.Node]) -> bool:
    """Is any of ``nodes`` an ancestor of another, in the graph as it is now?

    A search backwards from the later members' inputs that never goes above the earliest
    member (nothing before it in graph order can lie on a path from it), so its cost is
    bounded by the stretch of graph the group spans, not by the graph.
    """
    members = set(nodes)
    first = min(nodes, key=lambda n: n._sort_key)._sort_key
    seen: set[fx.Node] = set()
    stack = [i for n in nodes for i in n.all_input_nodes]
    while stack:
        n = stack.pop()
        if n in seen or n._sort_key < first:
            continue
        if n in members:
            return True
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return False
