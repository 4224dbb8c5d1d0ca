"""The greedy, anchor-driven rewrite driver. It owns all graph surgery.

For one graph at one level:

1. A worklist holds every node (in graph order). For a node, the rules anchored at its
   canonical op are tried in priority order; the first that rewrites wins.
2. A rewrite is a transaction: the rule's pattern matches, the driver refuses regions
   that touch tensors mutated in place, the rule's conditions run, the replacement emits
   new nodes through a ``Builder``; then the driver validates (shapes and dtypes equal,
   definitions before uses, no new aliasing of graph outputs) and only then redirects
   uses and removes what became dead. Any exception or failed check erases the new
   nodes and leaves the graph as it was; the error is reported and the driver goes on.
3. The neighbours of what changed (new nodes, their users, the surviving producers of
   removed nodes and their users) are re-queued, so rules interplay to a fixpoint.
   A rewrite budget (default ``4 * nodes + 1000``) bounds rule cycles.

``optimize_graph`` wraps that with a whole-graph snapshot: if the final lint fails, the
level is rolled back entirely. With ``numeric_check`` it also runs the original and the
optimized graph on random inputs and, on a mismatch, replays the rewrites to find and
disable the rule responsible (see ``numeric.py``).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import heapq
import logging
import time
import warnings
from typing import Any, Iterable, Iterator

import torch
import torch.fx as fx

from . import logs
from .registry import PassConfig
from .report import GraphReport, Report, RuleStats
from .rule import Builder, Decline, Rule, condition_reason
from .safety import MAY_ALIAS_OPS, AliasAnalysis, layout_difference, reads_layout, viewable
from .symbolic import known_eq, known_sizes_eq
from .view import GraphView

log = logging.getLogger("optimus")

DEAD_CODE = "dead_code_elimination"
_MAX_RELAYOUT = 256  # users evaluated again for one rewrite that changes memory layout


class Driver:
    def __init__(
        self,
        view: GraphView,
        rules: list[tuple[Rule, dict[str, Any]]],
        report: GraphReport,
        max_rewrites: int | None = None,
        lint_each: bool = False,
    ) -> None:
        self.view = view
        self.graph = view.graph
        self.report = report
        from .group import GroupRule

        self.by_anchor: dict[str, list[tuple[Rule, dict[str, Any]]]] = collections.defaultdict(list)
        self.group_rules: list[tuple[GroupRule, dict[str, Any]]] = []
        for rule, options in rules:
            if isinstance(rule, GroupRule):
                self.group_rules.append((rule, options))
                continue
            for anchor in rule.anchors:
                self.by_anchor[anchor].append((rule, options))
        n = len(self.graph.nodes)
        self.max_rewrites = max_rewrites if max_rewrites is not None else 4 * n + 1000
        self.lint_each = lint_each
        self.rewrites = 0
        self.applied: list[str] = []  # rule name of each rewrite, in order (for bisection)
        self.failed: set[tuple[str, fx.Node]] = set()
        self.alias = AliasAnalysis(view)
        self._queue: collections.deque[fx.Node] = collections.deque()
        self._queued: set[fx.Node] = set()

    # ------------------------------------------------------------------ main loop
    def run(self) -> None:
        """Local rules to a fixpoint; then group (horizontal) rules over the whole graph,
        each round followed by local rules again, which remove the glue they add."""
        self._remove_dead_code_upfront()
        self._enqueue(self.graph.nodes)
        self._fixpoint()
        for _round in range(8):
            if not self.group_rules or self.rewrites >= self.max_rewrites:
                break
            fused = 0
            for rule, options in self.group_rules:
                fused += self._run_group_rule(rule, options)
            if not fused:
                break
            self._fixpoint()

    def _run_group_rule(self, rule: Any, options: dict[str, Any]) -> int:
        from .group import classify_all, depths, find_groups

        stats = self.report.stats(rule.name)

        def excluded(node: fx.Node) -> str | None:
            for n in [node, *node.all_input_nodes]:
                if self.alias.is_mutated(n):
                    return f"touches {n.name}, which aliases a tensor mutated in place"
            return None

        fused = 0
        calls = [c for c in classify_all(self.view) if c.op in rule.anchors]
        if not calls:
            return 0
        depth = depths(self.graph)
        for group in find_groups(self.view, rule, options, excluded, lambda n, r: stats.decline(n.name, r), calls, depth):
            if self.rewrites >= self.max_rewrites:
                break
            fused += self._try_group(rule, group, stats)
        return fused

    def _try_group(self, rule: Any, group: Any, stats: RuleStats) -> bool:
        if any(n._erased for n in group.nodes):
            return False
        # Earlier fusions this round may have rewired the members' inputs: read them again.
        fresh = [self.view.classify(n) for n in group.nodes]
        if any(c is None or rule.key(c, self.view) != group.key for c in fresh):
            return False
        group.members = fresh
        anchor = max(group.nodes, key=lambda n: n._sort_key)
        t0 = time.perf_counter()
        builder: Builder | None = None
        try:
            reason = rule.conditions_fail(group)
            if reason:
                raise Decline(reason)
            builder = Builder(self.view, anchor)
            pairs = self._pairs(rule.group_replace(group, builder), anchor)
            checked = self._validate(pairs, builder, group=True)
            self._commit(rule, anchor, pairs, builder, stats, checked)
            return True
        except Decline as d:
            self._discard(builder)
            for n in group.nodes:
                stats.decline(n.name, d.reason)
            return False
        except Exception as e:  # a broken rule never takes the compile down
            self._discard(builder)
            stats.errors.append(f"group of {len(group.nodes)} at {anchor.name}: {type(e).__name__}: {e}")
            log.warning("optimus: rule %s failed on a group at %s and was rolled back: %s", rule.name, anchor.name, e)
            return False
        finally:
            stats.time_s += time.perf_counter() - t0

    def _fixpoint(self) -> None:
        while self._queue:
            node = self._queue.popleft()
            self._queued.discard(node)
            if node._erased:
                continue
            call = self.view.classify(node)
            if call is None:
                continue
            for rule, options in self.by_anchor.get(call.op, ()):
                if (rule.name, node) in self.failed:
                    continue
                if self._try(rule, options, call):
                    break
            if self.rewrites >= self.max_rewrites:
                if self._queue:
                    self.report.notes.append(f"stopped at the rewrite budget ({self.max_rewrites}); {len(self._queue)} nodes not revisited")
                break

    def _enqueue(self, nodes: Iterable[fx.Node]) -> None:
        for n in nodes:
            if n not in self._queued and not n._erased:
                self._queued.add(n)
                self._queue.append(n)

    # ------------------------------------------------------------- one rewrite
    def _try(self, rule: Rule, options: dict[str, Any], call: Any) -> bool:
        match = rule.match(call, self.view, options)
        if match is None:
            return False
        stats = self.report.stats(rule.name)
        anchor = call.node
        t0 = time.perf_counter()
        builder: Builder | None = None
        try:
            self._check_region(match)
            for cond in rule.where:
                if not cond(match):
                    raise Decline(condition_reason(cond))
            builder = Builder(self.view, anchor)
            result = rule.replace(match, builder)
            pairs = self._pairs(result, anchor)
            checked = self._validate(pairs, builder)
            self._commit(rule, anchor, pairs, builder, stats, checked)
            return True
        except Decline as d:
            self._discard(builder)
            stats.decline(anchor.name, d.reason)
            return False
        except Exception as e:  # a broken rule never takes the compile down
            self._discard(builder)
            self.failed.add((rule.name, anchor))
            msg = f"{anchor.name}: {type(e).__name__}: {e}"
            stats.errors.append(msg)
            log.warning("optimus: rule %s failed on %s and was rolled back: %s", rule.name, anchor.name, e)
            return False
        finally:
            stats.time_s += time.perf_counter() - t0

    def _check_region(self, match: Any) -> None:
        region: list[fx.Node] = list(match.nodes)
        for v in match.bindings.values():
            if isinstance(v, (list, tuple, fx.Node)):
                fx.node.map_arg(v, region.append)
        for n in region:
            if self.alias.is_mutated(n):
                raise Decline(f"touches {n.name}, which aliases a tensor mutated in place")

    @staticmethod
    def _pairs(result: Any, anchor: fx.Node) -> list[tuple[fx.Node, fx.Node]]:
        if result is None:
            raise Decline("the replacement declined")
        if isinstance(result, fx.Node):
            pairs = [(anchor, result)]
        elif isinstance(result, dict):
            pairs = list(result.items())
        else:
            raise TypeError(f"a replacement must return a Node or a {{old: new}} dict, got {type(result).__name__}")
        pairs = [(old, new) for old, new in pairs if old is not new]
        if not pairs:
            raise Decline("the replacement is the node itself")
        for old, new in pairs:
            if not isinstance(old, fx.Node) or not isinstance(new, fx.Node):
                raise TypeError("replacements map nodes to nodes")
        return pairs

    def _validate(self, pairs: list[tuple[fx.Node, fx.Node]], builder: Builder, group: bool = False) -> tuple[fx.Node | None, dict[fx.Node, Any]]:
        """Check the rewrite. Return the earliest user that must move after the new nodes,
        and the new metadata of users whose layout the replacement changes."""
        new_set = set(builder.new_nodes)
        early: fx.Node | None = None
        for old, new in pairs:
            if old._erased or new._erased:
                raise RuntimeError("replacement refers to an erased node")
            _check_same_value(self.view, old, new)
        problem = self._mutation_problem(pairs, builder) or self.alias.outputs_problem(pairs, disjoint_chunks_ok=group)
        if problem:
            raise Decline(problem)
        relaid = self._layout_changes(pairs, new_set)
        for old, new in pairs:
            for user in old.users:
                if user not in new_set and not new._sort_key < user._sort_key:
                    if user.op == "output":
                        raise Decline(f"{new.name} would be defined after the graph output")
                    if early is None or user._sort_key < early._sort_key:
                        early = user
        for node in builder.new_nodes:  # local lint: inputs defined before use
            for inp in node.all_input_nodes:
                if inp._erased or not inp._sort_key < node._sort_key:
                    raise RuntimeError(f"new node {node.name} uses {inp.name} before it is defined")
        return early, relaid

    def _mutation_problem(self, pairs: list[tuple[fx.Node, fx.Node]], builder: Builder) -> str | None:
        """Why the rewrite could let an in-place write show through where it did not (or
        hide it where it showed), if it could.

        A replaced node that aliases a written tensor changes what sees the write. A
        replacement that reads a written tensor (directly, or through the nodes it builds)
        may turn a copy into a view of it, or read it at another point of the program.
        Rules capture only what their pattern names; this covers what they find with
        helpers and the users they rewrite (all at once, for every rule).
        """
        if not self.alias.mutated:
            return None
        new_set = set(builder.new_nodes)
        for old, _ in pairs:
            if self.alias.is_mutated(old):
                return f"{old.name} would be replaced, but it aliases a tensor mutated in place"
        reads: list[fx.Node] = [new for _, new in pairs if new not in new_set]
        for node in builder.new_nodes:
            reads.extend(i for i in node.all_input_nodes if i not in new_set)
        for node in dict.fromkeys(reads):
            if self.alias.is_mutated(node):
                return f"the replacement reads {node.name}, which aliases a tensor mutated in place"
        return None

    def _layout_changes(self, pairs: list[tuple[fx.Node, fx.Node]], new_set: set[fx.Node]) -> dict[fx.Node, Any]:
        """The users whose values change memory layout when each ``old`` becomes its
        ``new``, with their new metadata; ``Decline`` if any of them cannot take it.

        A rewrite may replace a fresh contiguous tensor (a ``cat``, a ``stack``) by an
        existing one with other strides or another storage offset (a transpose, a slice).
        The users of ``old`` are evaluated again on ``new``'s metadata, and so on
        downstream while results still change layout (an elementwise op keeps its input's
        strides; a ``view`` of a changed tensor is changed too). The rewrite declines when
        an op rejects the new layout (``view`` needs compatible strides), reads the raw
        layout (``as_strided``), writes a changed tensor in place, or cannot be evaluated.
        A difference in storage offset alone only matters to views and unknown ops.
        The driver stores the new metadata on commit, so later rewrites see real strides.
        """
        replace: dict[fx.Node, Any] = {}
        incoming: dict[fx.Node, str] = {}  # queued user -> how its inputs changed ("strides" wins over "offset")
        heap: list[tuple[Any, fx.Node]] = []  # in graph order: a node's changed inputs come first

        def push_users(node: fx.Node, kind: str) -> None:
            for user in node.users:
                if user in new_set:
                    continue
                if user not in incoming:
                    heapq.heappush(heap, (user._sort_key, user))
                if incoming.get(user) != "strides":
                    incoming[user] = kind

        for old, new in pairs:
            a, b = self.view.val(old), self.view.val(new)
            if a is None or b is None:
                continue  # graphs without metadata: nothing to compare (as for shapes)
            replace[old] = b
            diff = layout_difference(a, b)
            if diff is not None:
                push_users(old, diff)
        relaid: dict[fx.Node, Any] = {}
        evaluated = 0
        while heap:
            _, user = heapq.heappop(heap)
            kind = incoming[user]
            if user.op == "output":
                continue  # outputs may come back with other strides (as before)
            source = next((i.name for i in user.all_input_nodes if i in replace), "?")
            if reads_layout(user):
                raise Decline(f"{user.name} reads the memory layout of {source}, which the rewrite changes")
            if self.view.mutated_inputs(user):
                raise Decline(f"{user.name} writes in place into {source}, whose memory layout the rewrite changes")
            call = self.view.classify(user)
            if call is not None and call.op == "view" and kind == "strides":
                # fake tensors do not check that a view is possible: check it here
                src = call.get("input")
                shape = getattr(self.view.val(user), "shape", None)
                value = replace.get(src) if isinstance(src, fx.Node) else None
                if value is not None and (shape is None or not viewable(value, shape)):
                    raise Decline(f"{user.name} does not accept the memory layout the rewrite gives {source}: a view of those strides with shape {tuple(shape) if shape is not None else '?'} is impossible")
            if kind != "strides" and call is not None and call.op not in MAY_ALIAS_OPS:
                continue  # the result is fresh and laid out as before: only the offset moved
            evaluated += 1
            if evaluated > _MAX_RELAYOUT:
                raise Decline(f"the rewrite changes the memory layout of more than {_MAX_RELAYOUT} nodes")
            try:
                result = self.view.evaluate(user, replace)
            except Exception as e:
                why = (str(e).strip().splitlines() or [""])[0][:160]
                raise Decline(f"{user.name} does not accept the memory layout the rewrite gives {source}: {type(e).__name__}: {why}") from None
            diff = layout_difference(self.view.val(user), result)
            if diff is None and not _shares_storage_with(result, [relaid[i] for i in user.all_input_nodes if i in relaid]):
                continue
            relaid[user] = replace[user] = result
            push_users(user, diff or "offset")
        return relaid

    def _commit(
        self,
        rule: Rule,
        anchor: fx.Node,
        pairs: list[tuple[fx.Node, fx.Node]],
        builder: Builder,
        stats: RuleStats,
        checked: tuple[fx.Node | None, dict[fx.Node, Any]],
    ) -> None:
        early, relaid = checked
        new_set = set(builder.new_nodes)
        changed: list[tuple[fx.Node, fx.Node, list[fx.Node]]] = []
        for old, new in pairs:
            changed.append((old, new, old.replace_all_uses_with(new, delete_user_cb=lambda u: u not in new_set)))
        if early is not None and not _reorder_span(early, max(builder.new_nodes, key=lambda n: n._sort_key)):
            for old, new, users in changed:  # the replacement depends on a user it replaces
                for u in users:
                    u.replace_input_with(new, old)
            raise Decline("the replacement depends on a user of what it replaces (a cycle)")
        for node, value in relaid.items():
            _set_meta(self.view, node, value)
        for node in builder.new_nodes:
            self.alias.add(node)
        for _, _, users in changed:
            self.alias.rewire(users)
        self.alias.rewire(relaid)
        erased = self._dead_code([old for old, _ in pairs] + builder.new_nodes)
        erased_new = sum(1 for n in erased if n in new_set)
        stats.matched += 1
        stats.added += len(builder.new_nodes) - erased_new
        stats.removed += len(erased) - erased_new
        stats.log_rewrite(anchor.name, len(erased) - erased_new, len(builder.new_nodes) - erased_new)
        self.rewrites += 1
        self.applied.append(rule.name)
        if self.lint_each:
            self.graph.lint()
        touched: list[fx.Node] = [anchor]  # a surviving anchor may match again (dropped if erased)
        for node in builder.new_nodes:
            if not node._erased:
                touched.append(node)
                touched.extend(node.users)
        for _, new in pairs:
            touched.extend(new.all_input_nodes)
        survivors = {inp for n in erased for inp in n.all_input_nodes if not inp._erased}
        for node in survivors:
            touched.append(node)
            touched.extend(node.users)
        self._enqueue(touched)

    def _discard(self, builder: Builder | None) -> None:
        if builder is None:
            return
        for node in reversed(builder.new_nodes):
            if not node._erased and not node.users:
                self.graph.erase_node(node)

    def _dead_code(self, candidates: Iterable[fx.Node]) -> list[fx.Node]:
        erased: list[fx.Node] = []
        stack = list(candidates)
        while stack:
            node = stack.pop()
            if node._erased or node.users or self.view.has_side_effects(node):
                continue
            inputs = node.all_input_nodes
            self.graph.erase_node(node)
            erased.append(node)
            stack.extend(inputs)
        return erased

    def _remove_dead_code_upfront(self) -> None:
        erased = self._dead_code(reversed(list(self.graph.nodes)))
        if erased:
            self.report.stats(DEAD_CODE).removed += len(erased)
            self.report.stats(DEAD_CODE).matched += len(erased)


def _shares_storage_with(value: Any, others: list[Any]) -> bool:
    """Does ``value`` (a tensor or tuple of them) share storage with any of ``others``?"""
    if not others:
        return False
    from .safety import _storage_keys

    mine = _storage_keys(value) or set()
    return any(mine & (_storage_keys(o) or set()) for o in others)


def _set_meta(view: GraphView, node: fx.Node, value: Any) -> None:
    """Store a node's re-evaluated value (and its tensor_meta, where the graph has one)."""
    node.meta[view.meta_key] = value
    if "tensor_meta" in node.meta and isinstance(value, torch.Tensor):
        try:
            from torch.fx.passes.shape_prop import _extract_tensor_metadata

            node.meta["tensor_meta"] = _extract_tensor_metadata(value)
        except Exception:  # pragma: no cover - best effort across torch versions
            node.meta.pop("tensor_meta", None)


def _check_same_value(view: GraphView, old: fx.Node, new: fx.Node) -> None:
    a, b = view.val(old), view.val(new)
    if a is None:
        return  # nothing known to compare (graphs without metadata)
    if b is None:
        raise RuntimeError(f"replacement {new.name} has no shape metadata")
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        raise RuntimeError(f"{new.name} is not the same kind of value as {old.name}")
    if isinstance(a, torch.Tensor):
        if not known_sizes_eq(tuple(a.shape), tuple(b.shape)):
            raise RuntimeError(f"shape changed: {old.name} {tuple(a.shape)} -> {new.name} {tuple(b.shape)}")
        if a.dtype != b.dtype:
            raise RuntimeError(f"dtype changed: {old.name} {a.dtype} -> {new.name} {b.dtype}")
        if a.device != b.device:
            raise RuntimeError(f"device changed: {old.name} {a.device} -> {new.name} {b.device}")
    elif isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            raise RuntimeError(f"{new.name} returns a different number of values than {old.name}")
        for x, y in zip(a, b):
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
                if not known_sizes_eq(tuple(x.shape), tuple(y.shape)) or x.dtype != y.dtype:
                    raise RuntimeError(f"an output of {old.name} changed shape or dtype")
    elif not known_eq(a, b):
        raise RuntimeError(f"value changed: {old.name} -> {new.name}")


# ------------------------------------------------------------------ graph-level API
_FX_NODE_FIELDS = frozenset(vars(fx.Graph().placeholder("x")))


class GraphRecord:
    """What a graph was, cheaply: each node's op, target, args, kwargs, name, metadata
    and any attribute others set on it (Dynamo's ``_dynamo_source`` on placeholders).

    Recording is O(nodes) with no node creation (FX replaces, never mutates, a node's
    args tuple and kwargs dict, so keeping references is enough). Only a rollback or the
    numeric check pays for rebuilding a graph from the record.
    """

    def __init__(self, graph: fx.Graph) -> None:
        self.owning_module = graph.owning_module
        self.entries = [(n, n.op, n.target, n.args, n.kwargs, n.name, n.type, n.meta) for n in graph.nodes]
        self.extras = {n: {k: v for k, v in vars(n).items() if k not in _FX_NODE_FIELDS} for n in graph.nodes}
        # attributes the graph object had; others are caches a compiler added later (e.g.
        # Inductor's node -> index map for kernel metadata), stale once nodes are rebuilt
        self.graph_attrs = frozenset(vars(graph))

    def rebuild_into(self, graph: fx.Graph, keep: dict[fx.Node, fx.Node] | None = None) -> None:
        """Append the recorded nodes to ``graph``; nodes in ``keep`` (recorded node ->
        live node already in ``graph``) are reused instead of created."""
        new: dict[fx.Node, fx.Node] = dict(keep or {})
        for old, op, target, args, kwargs, name, type_, meta in self.entries:
            if old in new:
                continue
            remap = lambda a: new[a]  # noqa: E731
            node = graph.create_node(op, target, fx.node.map_arg(args, remap), fx.node.map_arg(kwargs, remap), name, type_)
            node.meta = dict(meta)
            for k, v in self.extras.get(old, {}).items():
                setattr(node, k, v)
            new[old] = node

    def materialize(self) -> fx.Graph:
        graph = fx.Graph(owning_module=self.owning_module)
        self.rebuild_into(graph)
        return graph


def snapshot(graph: fx.Graph) -> GraphRecord:
    """A record of the graph for whole-level rollback (see ``GraphRecord``)."""
    return GraphRecord(graph)


def restore(graph: fx.Graph, record: GraphRecord) -> None:
    """Make ``graph`` (the same object, which callers hold) what ``record`` recorded.

    The leading placeholders stay the same node objects when they are still the graph's
    (rules never replace inputs): whoever holds them, Dynamo and AOTAutograd included,
    keeps valid references. Everything else is rebuilt from the record.
    """
    lead = []
    for entry in record.entries:
        if entry[1] != "placeholder":
            break
        lead.append(entry[0])
    live = [n for n in graph.nodes if n.op == "placeholder"]
    keep: dict[fx.Node, fx.Node] = {}
    if live == lead:
        keep = {n: n for n in lead}
        for n, (_, _, target, _, _, name, _, meta) in zip(lead, record.entries):
            n.meta = meta
    for node in reversed(list(graph.nodes)):
        if node in keep:
            continue
        node.users.clear()  # every user is being erased too
        graph.erase_node(node)
    for n in keep:
        n.users.clear()
    for attr in [a for a in vars(graph) if a not in record.graph_attrs]:
        delattr(graph, attr)
    record.rebuild_into(graph, keep)


def _reorder_span(first: fx.Node, last: fx.Node) -> bool:
    """Stably reorder the nodes from ``first`` to ``last`` so inputs precede users.

    Used when a rewrite places new nodes after some users of what they replace (their
    inputs are defined late). Only that span moves. False (nothing moved) on a cycle.
    """
    span: list[fx.Node] = []
    node = first
    while True:
        span.append(node)
        if node is last:
            break
        node = node.next
        if node.op == "root":
            return False
    members = set(span)
    index = {n: i for i, n in enumerate(span)}
    pending = {n: sum(1 for i in n.all_input_nodes if i in members) for n in span}
    ready = [(index[n], n) for n in span if pending[n] == 0]
    heapq.heapify(ready)
    order: list[fx.Node] = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for user in n.users:
            if user in members:
                pending[user] -= 1
                if pending[user] == 0:
                    heapq.heappush(ready, (index[user], user))
    if len(order) != len(span):
        return False
    cursor = first.prev
    for n in order:
        cursor.append(n)
        cursor = n
    return True


def stable_topological_sort(graph: fx.Graph) -> None:
    """Reorder nodes so every input precedes its users, keeping the order otherwise."""
    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    pending = {n: sum(1 for i in n.all_input_nodes) for n in nodes}
    ready = [(index[n], n) for n in nodes if pending[n] == 0]
    heapq.heapify(ready)
    order: list[fx.Node] = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for user in n.users:
            pending[user] -= 1
            if pending[user] == 0:
                heapq.heappush(ready, (index[user], user))
    if len(order) != len(nodes):
        raise RuntimeError("the graph has a cycle")
    cursor = graph._root
    for n in order:
        cursor.append(n)
        cursor = n


def make_view(level: str, gm: fx.GraphModule) -> GraphView:
    if level == "torch_ir":
        from ..torch_ir.view import TorchIRView

        return TorchIRView(gm)
    if level == "aten_ir":
        from ..aten_ir.view import AtenIRView

        return AtenIRView(gm)
    raise ValueError(f"no FX graph view for level {level!r}")


def optimize_graph(  # the caller recompiles gm if it runs it as Python (Inductor does not)
    gm: fx.GraphModule,
    level: str,
    config: PassConfig,
    report: Report,
    graph_name: str,
    view: GraphView | None = None,
    example_inputs: list[Any] | None = None,
) -> GraphReport | None:
    """Run the level's selected rules on ``gm`` in place; record what happened."""
    rules = [(r, config.options_for(level, r)) for r in config.rules_for(level)]
    if not rules:
        return None
    view = view or make_view(level, gm)
    graph = gm.graph
    gr = report.new_graph(level, graph_name)
    gr.nodes_before = len(graph.nodes)
    watch = logs.level_started(level, graph_name, gm)  # TORCH_LOGS / TORCH_TRACE / graph pictures
    t0 = time.perf_counter()
    with _gc_paused():
        _run_with_rollback(gm, view, rules, config, gr, example_inputs)
    gr.nodes_after = len(graph.nodes)
    gr.time_s = time.perf_counter() - t0
    logs.level_finished(watch, gr, gm)
    return gr


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Rewriting allocates many short-lived objects (nodes, fake tensors); Python's cyclic
    collector would rescan the whole graph repeatedly. Pause it, then restore its state."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _run_with_rollback(gm: fx.GraphModule, view: GraphView, rules: list[tuple[Rule, dict[str, Any]]], config: PassConfig, gr: GraphReport, example_inputs: list[Any] | None) -> None:
    graph = gm.graph
    level, graph_name = gr.level, gr.graph
    backup = snapshot(graph)
    disabled: set[str] = set()
    for _attempt in range(4):
        active = [(r, o) for r, o in rules if r.name not in disabled]
        driver = Driver(view, active, gr, config.driver.max_rewrites, config.driver.lint == "each")
        try:
            driver.run()
            graph.lint()
        except Exception as e:  # the driver itself failed: leave the level untouched
            restore(graph, backup)
            gr.notes.append(f"level rolled back: {type(e).__name__}: {e}")
            log.warning("optimus: %s pass on %s rolled back: %s", level, graph_name, e)
            break
        if not config.driver.numeric_check or driver.rewrites == 0:
            break
        gm.recompile()
        from .numeric import NUMERIC_SKIPPED, find_culprit

        differs, culprit, note = find_culprit(gm, backup, view, active, example_inputs, config.driver.max_rewrites)
        if not differs:
            gr.notes.append(note)
            if note.startswith(NUMERIC_SKIPPED):
                # asked for, but could not run: the rewrites went through unchecked
                msg = f"optimus: numeric_check=True could not run on {level} {graph_name} ({note}); its {driver.rewrites} rewrite(s) were NOT verified. Pass example_inputs (optimus.optimize(gm, example_inputs=...)) or shape metadata."
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
                log.warning(msg)
            break
        if culprit is None:
            restore(graph, backup)
            gr.notes.append(f"{note}; the level was rolled back")
            break
        gr.notes.append(f"numeric check: rule {culprit!r} changed results; rolled back and disabled for this graph")
        gr.stats(culprit).errors.append("changed numeric results (numeric check)")
        log.warning("optimus: rule %s changed numeric results on %s; disabled", culprit, graph_name)
        restore(graph, backup)
        gr.rules = {name: RuleStats(errors=list(s.errors)) for name, s in gr.rules.items()}  # recount on retry
        disabled.add(culprit)
