"""The driver's transactions: check a rewrite before it touches the graph, then commit it.

A rule's replacement has built new nodes (through a ``Builder``) and says which old node
each replaces. Before any use is redirected, ``Surgery.validate`` checks

* equal values: shapes (provably, also symbolic), dtypes, devices;
* definitions before uses (the new nodes' inputs; users that must move after them);
* mutation: no replaced node, and nothing the replacement reads, aliases a tensor
  written in place (``safety.AliasAnalysis``);
* graph outputs: none newly aliases an input or another output;
* gradients: no result gains or loses ``requires_grad``, and no gradient reaches a value
  around a ``no_grad`` region or a ``detach`` (``core/gradflow.py``);
* memory layout: users of a replaced node whose input gets other strides or another
  storage offset are evaluated again on the new metadata, and must accept it.

``commit`` then redirects the uses, reorders the few users that must follow the new
nodes (``_reorder_span``), updates metadata and alias classes and removes dead code.
A failed check raises ``Decline`` (or an error): the driver ``discard``s the new nodes
and the graph is exactly as before.
"""

from __future__ import annotations

import heapq
from typing import Any, Iterable

import torch
import torch.fx as fx

from .collectives import is_barrier
from .regions import is_marker
from .rule import Builder, Decline
from .safety import MAY_ALIAS_OPS, AliasAnalysis, layout_difference, reads_layout, viewable
from .symbolic import known_eq, known_sizes_eq
from .view import GraphView

_MAX_RELAYOUT = 256  # users evaluated again for one rewrite that changes memory layout

# (the earliest user that must move after the new nodes, re-evaluated metadata of users
# whose memory layout the rewrite changes)
Checked = tuple["fx.Node | None", "dict[fx.Node, Any]"]


class Surgery:
    """Checks and applies rewrites on one graph, keeping its alias classes up to date."""

    def __init__(self, view: GraphView, alias: AliasAnalysis) -> None:
        self.view = view
        self.graph = view.graph
        self.alias = alias

    def check_region(self, match: Any) -> None:
        """``Decline`` when the match touches a tensor aliasing one mutated in place."""
        region: list[fx.Node] = list(match.nodes)
        for v in match.bindings.values():
            if isinstance(v, (list, tuple, fx.Node)):
                fx.node.map_arg(v, region.append)
        for n in region:
            if self.alias.is_mutated(n):
                raise Decline(f"touches {n.name}, which aliases a tensor mutated in place")

    @staticmethod
    def pairs(result: Any, anchor: fx.Node) -> list[tuple[fx.Node, fx.Node]]:
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

    def validate(self, pairs: list[tuple[fx.Node, fx.Node]], builder: Builder, group: bool = False) -> Checked:
        """Check the rewrite. Return the earliest user that must move after the new nodes,
        and the new metadata of users whose layout the replacement changes."""
        new_set = set(builder.new_nodes)
        early: fx.Node | None = None
        for old, new in pairs:
            if old._erased or new._erased:
                raise RuntimeError("replacement refers to an erased node")
            _check_same_value(self.view, old, new)
        problem = self.mutation_problem(pairs, builder) or self.alias.outputs_problem(pairs, disjoint_chunks_ok=group)
        problem = problem or self.alias.barrier_problem(pairs, builder.new_nodes)  # collectives: core/collectives.py
        problem = problem or self.view.regions().problem(pairs, builder.new_nodes)  # grad mode, autocast: core/regions.py
        problem = problem or self.view.grad_flow().problem(pairs, builder.new_nodes)  # who gets gradients: core/gradflow.py
        if problem:
            raise Decline(problem)
        relaid = self.layout_changes(pairs, new_set)
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

    def mutation_problem(self, pairs: list[tuple[fx.Node, fx.Node]], builder: Builder) -> str | None:
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

    def layout_changes(self, pairs: list[tuple[fx.Node, fx.Node]], new_set: set[fx.Node]) -> dict[fx.Node, Any]:
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

    def discard(self, builder: Builder | None) -> None:
        """Erase what a declined or failed replacement built: the graph is as before."""
        if builder is None:
            return
        for node in reversed(builder.new_nodes):
            if not node._erased and not node.users:
                self.graph.erase_node(node)

    def dead_code(self, candidates: Iterable[fx.Node], producers: set[fx.Node] | None = None) -> list[fx.Node]:
        """Erase the candidates that have no users and no side effects, and what only they
        used. ``producers`` (if given) receives the inputs of every erased node, read
        before FX clears them: the survivors among them lost a user."""
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
            if producers is not None:
                producers.update(inputs)
        return erased

    def commit(self, pairs: list[tuple[fx.Node, fx.Node]], builder: Builder, checked: Checked, producers: set[fx.Node] | None = None) -> list[fx.Node]:
        """Redirect the uses of each ``old`` to its ``new``, move the users that would now come
        before their inputs, store re-evaluated metadata, update the alias classes and
        remove what became dead. Returns the erased nodes; ``producers`` receives their
        inputs (see ``dead_code``). ``Decline`` (with every use redirected back) when the
        replacement depends on a user of what it replaces."""
        early, relaid = checked
        new_set = set(builder.new_nodes)
        changed: list[tuple[fx.Node, fx.Node, list[fx.Node]]] = []
        for old, new in pairs:
            changed.append((old, new, old.replace_all_uses_with(new, delete_user_cb=lambda u: u not in new_set)))
        refused = None if early is None else _reorder_span(early, max(builder.new_nodes, key=lambda n: n._sort_key))
        if refused is not None:
            for old, new, users in changed:
                for u in users:
                    u.replace_input_with(new, old)
            raise Decline(refused)
        for node, value in relaid.items():
            _set_meta(self.view, node, value)
        self.view.grad_flow().mark_built(builder.new_nodes)
        for node in builder.new_nodes:
            self.alias.add(node)
        for _, _, users in changed:
            self.alias.rewire(users)
        self.alias.rewire(relaid)
        return self.dead_code([old for old, _ in pairs] + builder.new_nodes, producers)


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


def _reorder_span(first: fx.Node, last: fx.Node) -> str | None:
    """Stably reorder the nodes from ``first`` to ``last`` so inputs precede users.

    Used when a rewrite places new nodes after some users of what they replace (their
    inputs are defined late). Only that span moves. Returns why nothing moved: a cycle,
    or a grad-mode / autocast marker or a collective inside the span, which no node may
    cross (``core/regions.py``, ``core/collectives.py``); ``None`` once reordered.

    torch has stable topological sorts, but none serves here: ``torch.fx.passes.
    tools_common.stable_topological_sort`` copies every node into a new ``Graph`` (callers
    hold these nodes: Dynamo and AOTAutograd their placeholders, the driver its worklist
    and alias classes), and ``torch._inductor.pattern_matcher.stable_topological_sort``
    walks the whole graph each time (per rewrite that needs it: up to quadratic on the
    20k-node graphs of docs/rewriter-scale.md) and breaks ties differently (a changed node order changes
    which nodes the group rules bucket together). This one is O(span), with the same
    tie-break as FX's: the earliest ready node first.
    """
    span: list[fx.Node] = []
    node = first
    while True:
        if node is not first and node is not last and (is_marker(node) or is_barrier(node)):
            return f"the replacement would move nodes across {node.name} (a grad-mode/autocast boundary or a collective)"
        span.append(node)
        if node is last:
            break
        node = node.next
        if node.op == "root":
            return "the replacement depends on a user of what it replaces (a cycle)"
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
        return "the replacement depends on a user of what it replaces (a cycle)"
    cursor = first.prev
    for n in order:
        cursor.append(n)
        cursor = n
    return None
