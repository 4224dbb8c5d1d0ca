"""Aliasing, mutation and layout facts the driver checks before any rewrite.

Torch-IR graphs are not functional: ``a, b = x.split(2); a.add_(1)`` changes ``x``.
A rewrite that touches any tensor in the alias class of a mutated tensor is declined
(rules never need to think about it). So is one that replaces a value written in place,
or whose replacement reads such a tensor: a rewrite that turns a fresh copy (a ``cat``, a
``stack``, an elementwise result) into a view of something else must not let a write to
either side show through the other.

Graph outputs are protected too: a rewrite may not make an output alias a graph input,
a parameter or another output when it did not before (callers may mutate outputs, and at
Aten-IR AOTAutograd writes input mutations back after the graph runs). Outputs that are
views of a replaced node (``squeeze``, ``view``, ``contiguous``, ... of it) count: they
follow the replacement.

Two relations are used, each approximated in its safe direction:

* **may alias** (union-find classes, over-approximated): two nodes in different classes
  never share storage. Edges come from the vocabulary's view ops (always linked, even
  ``reshape``/``contiguous``, which may copy; its other ops always return new tensors)
  and, for ops outside the vocabulary, from storage identity of the example values (or
  every tensor input, when that is unknown or stale). Rewrites only add edges (a
  replaced node's users join the replacement's class), so classes only grow.
* **must alias** (``base``, under-approximated): two nodes with the same base certainly
  share storage. It follows only ops that are always views, plus ``reshape``/
  ``flatten``/``contiguous`` when the metadata says they were views and the node's inputs
  were never rewired by a rewrite (then its metadata may no longer describe its input).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.fx as fx

from . import collectives
from .symbolic import known_eq, known_lt, known_ne
from .view import GraphView, is_int
from .vocab import VIEW_OPS

# Ops whose result may share storage with a tensor argument: the view ops, plus the ones
# that sometimes return their input itself (dropout when inactive, einsum when it only
# permutes one operand).
MAY_ALIAS_OPS = VIEW_OPS | {"dropout", "einsum"}
# View ops that always return a view of their input (reshape, flatten and contiguous
# copy when the strides do not allow a view).
ALWAYS_VIEW_OPS = VIEW_OPS - {"reshape", "flatten", "contiguous"}
# Views whose elements all lie among their input's (a reshape that copies holds none of them).
_WITHIN_INPUT_VIEWS = VIEW_OPS - {"split", "unbind", "getitem"}
MAYBE_VIEW_OPS = VIEW_OPS - ALWAYS_VIEW_OPS
# Targets (by name) that read their input's raw layout: storage offset and strides.
LAYOUT_READERS = ("as_strided", "set_", "storage_offset", "data_ptr", "untyped_storage", "_reshape_alias", "stride", "is_contiguous", "non_overlapping")


class AliasAnalysis:
    """Union-find of nodes whose values may share storage, and which classes are written.

    Built lazily: most graphs mutate nothing, and then only a rewrite whose replaced node
    reaches a graph output needs alias classes at all.
    """

    def __init__(self, view: GraphView) -> None:
        self.view = view
        self.parent: dict[fx.Node, fx.Node] = {}
        self.mutated_roots: set[fx.Node] = set()
        self.external_roots: set[fx.Node] = set()  # classes holding inputs / parameters
        self.output_node: fx.Node | None = None
        self.mutated: list[fx.Node] = []
        # Users rewired by rewrites: their metadata was computed from another input, so it
        # says nothing about whether they alias their current one.
        self.rewired: set[fx.Node] = set()
        for node in view.graph.nodes:
            self.mutated.extend(view.mutated_inputs(node))
            if node.op == "output":
                self.output_node = node
        self.built = False
        self._barriers: list[fx.Node] | None = None  # collectives, found at the first rewrite
        if self.mutated:
            self._build()

    def _build(self) -> None:
        self.built = True
        nodes = list(self.view.graph.nodes)
        for node in nodes:
            self._register(node)
        for node in nodes:
            self._link(node)
        for node in self.mutated:
            self.mutated_roots.add(self.find(node))

    # union-find ------------------------------------------------------------------
    def find(self, node: fx.Node) -> fx.Node:
        if not self.built:
            self._build()
        if node not in self.parent:
            self.add(node)
        root = node
        while self.parent[root] is not root:
            root = self.parent[root]
        while self.parent[node] is not root:
            self.parent[node], node = root, self.parent[node]
        return root

    def union(self, a: fx.Node, b: fx.Node) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is rb:
            return
        self.parent[ra] = rb
        if ra in self.mutated_roots:
            self.mutated_roots.add(rb)
        if ra in self.external_roots:
            self.external_roots.add(rb)

    def _register(self, node: fx.Node) -> None:
        if node not in self.parent:
            self.parent[node] = node
            if node.op in ("placeholder", "get_attr"):
                self.external_roots.add(node)

    def _link(self, node: fx.Node) -> None:
        for src in self.may_alias_inputs(node):
            self.union(node, src)

    def add(self, node: fx.Node) -> None:
        """Register a node (also nodes created by rewrites) with its aliasing edges."""
        if node in self.parent or not self.built:
            return
        self._register(node)
        self._link(node)

    def rewire(self, users: Iterable[fx.Node]) -> None:
        """``users`` got new inputs (a replaced node's users) or new metadata (their layout
        changed): link them again; their old metadata no longer tells what they alias."""
        for user in users:
            self.rewired.add(user)
            if self.built and user in self.parent:
                self._link(user)

    # edges -------------------------------------------------------------------------
    def may_alias_inputs(self, node: fx.Node) -> list[fx.Node]:
        """The inputs whose storage ``node``'s value may share."""
        if node.op not in ("call_function", "call_method", "call_module"):
            return []
        call = self.view.classify(node)
        if call is not None:
            if call.op not in MAY_ALIAS_OPS:
                return []  # the vocabulary's other ops always return new tensors
            found: list[fx.Node] = []
            for name in ("input", "operands"):
                fx.node.map_arg(call.args.get(name), found.append)
            return found
        val = self.view.val(node)
        if _holds_no_storage(val):
            return []
        inputs = [i for i in node.all_input_nodes if not _holds_no_storage(self.view.val(i))]
        mine = _storage_keys(val)
        if mine is None or node in self.rewired:
            return inputs  # an op we cannot read, with no trustworthy metadata: assume a view
        if not mine:
            return []
        return [i for i in inputs if mine & (_storage_keys(self.view.val(i)) or set())]

    def view_closure(self, node: fx.Node) -> list[fx.Node]:
        """``node`` and every node that may be a view of it (transitively)."""
        seen = {node}
        order = [node]
        stack = [node]
        while stack:
            n = stack.pop()
            for user in n.users:
                if user not in seen and n in self.may_alias_inputs(user):
                    seen.add(user)
                    order.append(user)
                    stack.append(user)
        return order

    def base(self, node: fx.Node) -> fx.Node:
        """A node whose storage ``node`` certainly shares (itself when nothing is known)."""
        seen: set[fx.Node] = set()
        while node not in seen:
            seen.add(node)
            call = self.view.classify(node)
            src = call.args.get("input") if call is not None else None
            if not isinstance(src, fx.Node):
                return node
            if call.op == "getitem":
                producer = self.view.classify(src)
                if producer is None or producer.op not in ("split", "unbind"):
                    return node
                node = src
            elif call.op in ALWAYS_VIEW_OPS:
                node = src
            elif call.op in MAYBE_VIEW_OPS and node not in self.rewired:
                mine, theirs = _storage_keys(self.view.val(node)), _storage_keys(self.view.val(src))
                if not mine or mine != theirs:
                    return node  # it copied (or nothing is known)
                node = src
            else:
                return node
        return node

    # queries ---------------------------------------------------------------------
    def is_mutated(self, node: fx.Node) -> bool:
        return bool(self.mutated) and self.find(node) in self.mutated_roots

    def visible_outputs(self) -> list[fx.Node]:
        """Graph outputs callers see (all, unless the view says only the first k)."""
        outputs: list[fx.Node] = []
        args = self.output_node.args[0] if self.output_node is not None and self.output_node.args else ()
        items = list(args) if isinstance(args, (list, tuple)) else [args]
        k = self.view.protected_outputs()
        for item in items if k is None else items[:k]:
            fx.node.map_arg(item, outputs.append)
        return outputs

    def output_alias_problem(self, old: fx.Node, new: fx.Node) -> str | None:
        """Why replacing ``old`` by ``new`` would create new aliasing of graph outputs."""
        return self.outputs_problem([(old, new)])

    def outputs_problem(self, pairs: list[tuple[fx.Node, fx.Node]], disjoint_chunks_ok: bool = False) -> str | None:
        """Why replacing each ``old`` by its ``new`` (all at once) would make a graph output
        alias a graph input, a parameter or another output when it did not before.

        An output is affected when it is a replaced node or a view of one (through any
        chain of views); afterwards it aliases the replacement. A pair whose ``old`` and
        ``new`` certainly share storage changes nothing. Outputs that end up in different
        chunks of one split/unbind share a buffer but no element: that is accepted for
        gradients (backward graphs) and, with ``disjoint_chunks_ok``, for horizontal
        batching, whose members' results are by design chunks of the batched result.
        """
        out = self.output_node
        if out is None:
            return None
        reached_by: list[list[fx.Node]] = []
        for old, _ in pairs:
            reached_by.append([n for n in self.view_closure(old) if out in n.users])
        if not any(reached_by):
            return None  # the common case, found without looking at the outputs
        visible_set = set(self.visible_outputs())
        moved: dict[fx.Node, int] = {}  # affected output -> index of the pair it follows
        for i, (old, new) in enumerate(pairs):
            reached = [n for n in reached_by[i] if n in visible_set]
            if reached and self.base(old) is not self.base(new):
                for o in reached:
                    moved.setdefault(o, i)
        if not moved:
            return None
        # What each affected output certainly shared storage with before the rewrite.
        before = {o: self.base(o) for o in moved}
        for o, i in moved.items():
            old, new = pairs[i]
            root = self.find(new)
            what = o.name if o is old else f"{o.name} (a view of the replaced {old.name})"
            if root in self.external_roots:
                return f"graph output {what} would alias a graph input or parameter"
            for other in visible_set:
                if other is o:
                    continue
                j = moved.get(other)
                other_root = self.find(pairs[j][1]) if j is not None else self.find(other)
                if other_root is not root:
                    continue
                other_before = before[other] if j is not None else self.base(other)
                if other_before is before[o]:
                    if j is not None and j != i and pairs[j][1] is new:
                        # two replaced nodes become one tensor: outputs from them may have
                        # been disjoint views of one buffer (unbind(stack([v, v])), the two
                        # halves of split(cat([v, v]))) and would overlap now; views of one
                        # replaced node keep the layout they had relative to each other
                        return f"graph outputs {what} and {other.name} would become one tensor"
                    continue  # they certainly shared storage before
                if j is not None and (disjoint_chunks_ok or self.view.outputs_are_gradients()) and self._distinct_chunks(new, pairs[j][1]):
                    continue  # disjoint chunks of one buffer
                return f"graph outputs {what} and {other.name} would alias each other"
        return None

    # collectives (core/collectives.py) ---------------------------------------------
    def barrier_problem(self, pairs: list[tuple[fx.Node, fx.Node]], new_nodes: Iterable[fx.Node]) -> str | None:
        """Why the rewrite would move a computed value across a collective, if it would:
        a replaced node whose new value is computed (a node the rewrite made) on the other
        side of a collective than the old one was."""
        if self._barriers is None:
            self._barriers = collectives.barriers(self.view.graph)
        if not self._barriers:
            return None
        made = set(new_nodes)
        for old, new in pairs:
            if new in made:
                c = collectives.between(old, new, self._barriers)
                if c is not None:
                    return f"would move the computation of {old.name} across the collective {c.name} (collectives are barriers)"
        return None

    def _chunk(self, node: fx.Node) -> fx.Node:
        """The node ``node`` is a view of through ops that only re-index or narrow their
        input's elements (a reshaped or sliced chunk stays inside the chunk)."""
        while True:
            call = self.view.classify(node)
            if call is None or call.op not in _WITHIN_INPUT_VIEWS or not isinstance(call.args.get("input"), fx.Node):
                return node
            node = call.args["input"]

    def _distinct_chunks(self, a: fx.Node, b: fx.Node) -> bool:
        """``a`` and ``b`` are (views inside) different chunks of one split/unbind: disjoint memory."""
        a, b = self._chunk(a), self._chunk(b)
        ca, cb = self.view.classify(a), self.view.classify(b)
        if ca is None or cb is None or ca.op != "getitem" or cb.op != "getitem":
            return False
        src = ca.args["input"]
        producer = self.view.classify(src) if isinstance(src, fx.Node) else None
        return (
            producer is not None
            and producer.op in ("split", "unbind")
            and cb.args["input"] is src
            and ca.args["index"] != cb.args["index"]
        )


def layout_difference(a: Any, b: Any) -> str | None:
    """How the memory layout of value ``b`` differs from ``a``'s: ``"strides"``,
    ``"offset"`` (only the storage offset), or ``None`` (same, or nothing to compare).

    Strides of size-1 dims do not count, and neither does anything about a tensor with no
    elements. Symbolic strides count as different unless provably equal.
    """
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        worst = None
        for x, y in zip(a, b):
            d = layout_difference(x, y)
            if d == "strides":
                return d
            worst = worst or d
        return worst
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return None
    if a.dim() != b.dim():
        return "strides"
    try:
        if any(known_eq(s, 0) for s in a.shape):
            return None
        for size, sa, sb in zip(a.shape, a.stride(), b.stride()):
            if not known_eq(size, 1) and not known_eq(sa, sb):
                return "strides"
        if not known_eq(a.storage_offset(), b.storage_offset()):
            return "offset"
    except Exception:  # sparse or otherwise stride-less tensors: nothing to compare
        return None
    return None


def viewable(src: Any, shape: Any) -> bool:
    """Can a tensor laid out like ``src`` be viewed (no copy) with ``shape``?

    ``view`` needs each run of new dims to cover whole runs of old dims that are
    contiguous with each other; fake tensors do not check this, so the driver asks here.
    Walks the old dims from the innermost, cutting them into such runs, and matches the
    new dims to the runs by element count. Sizes and strides may be symbolic: every
    comparison must be provable (``core.symbolic``, no guard); two dims not provably
    contiguous count as a cut (stricter, so still safe); an undecidable count: ``False``.
    """
    if not isinstance(src, torch.Tensor):
        return False
    try:
        sizes, strides, new = list(src.shape), list(src.stride()), list(shape)
    except Exception:
        return False
    if not all(isinstance(s, (int, torch.SymInt)) for s in sizes + strides + new):
        return False
    numel: Any = 1
    for s in sizes:
        numel = numel * s
    if not sizes or known_eq(numel, 0):
        return True
    if not known_ne(numel, 0):
        return False
    holes = [i for i, s in enumerate(new) if is_int(s) and s == -1]
    if holes:
        known: Any = 1
        for i, s in enumerate(new):
            if i not in holes:
                known = known * s
        if len(holes) > 1 or not known_ne(known, 0):
            return False
        new[holes[0]] = numel // known
    v = len(new) - 1
    base = strides[-1]  # stride of the innermost dim of the current run
    run_numel: Any = 1
    view_numel: Any = 1
    for d in range(len(sizes) - 1, -1, -1):
        run_numel = run_numel * sizes[d]
        contiguous_with_next = d > 0 and (known_eq(sizes[d - 1], 1) or known_eq(strides[d - 1], run_numel * base))
        if not contiguous_with_next:
            # dims d.. form one contiguous run: the next new dims must cover it exactly
            while v >= 0 and not known_eq(view_numel, run_numel):
                if not known_lt(view_numel, run_numel):
                    return False  # more elements, or not provably fewer
                view_numel = view_numel * new[v]
                v -= 1
            if not known_eq(view_numel, run_numel):
                return False
            while v >= 0 and known_eq(new[v], 1):  # size-1 new dims fit anywhere
                v -= 1
            if d > 0:
                base = strides[d - 1]
                run_numel = view_numel = 1
    return v == -1


def reads_layout(node: fx.Node) -> bool:
    """Does ``node`` read its input's raw layout (``as_strided`` and friends)?"""
    target = node.target
    name = target if isinstance(target, str) else getattr(target, "__name__", None) or str(target)
    return any(r in str(name) for r in LAYOUT_READERS)


def _holds_no_storage(value: Any) -> bool:
    """A SymInt, a number, a bool: a value no storage can hide in."""
    return isinstance(value, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))


def _storage_keys(value: Any) -> set[Any] | None:
    """The storages a value (a tensor, or a tuple of them) holds; ``None`` if unknown."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        keys: set[Any] = set()
        for v in value:
            k = _storage_keys(v)
            if k:
                keys |= k
        return keys
    if not isinstance(value, torch.Tensor):
        return set()
    key = _storage_key(value)
    return None if key is None else {key}


def _storage_key(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return None
    try:
        storage = value.untyped_storage()
    except Exception:
        return None
    try:
        from torch.multiprocessing.reductions import StorageWeakRef

        return StorageWeakRef(storage)
    except Exception:  # pragma: no cover
        return id(storage)
