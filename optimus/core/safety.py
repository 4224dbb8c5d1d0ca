"""Aliasing and mutation facts the driver checks before any rewrite.

Torch-IR graphs are not functional: ``a, b = x.split(2); a.add_(1)`` changes ``x``.
A rewrite that touches any tensor in the alias class of a mutated tensor is declined
(rules never need to think about it). Alias classes are built from storage identity of
the example values when they exist, and from the vocabulary's view ops otherwise.

Graph outputs are protected too: a rewrite may not make an output alias a graph input,
a parameter or another output when it did not before (callers may mutate outputs).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from .view import GraphView
from .vocab import VIEW_OPS


class AliasAnalysis:
    """Union-find of nodes whose values may share storage, and which classes are written.

    Built lazily: most graphs mutate nothing, and then only a rewrite that touches a
    graph output needs alias classes at all.
    """

    def __init__(self, view: GraphView) -> None:
        self.view = view
        self.parent: dict[fx.Node, fx.Node] = {}
        self.mutated_roots: set[fx.Node] = set()
        self.external_roots: set[fx.Node] = set()  # classes holding inputs / parameters
        self.output_node: fx.Node | None = None
        self.mutated: list[fx.Node] = []
        for node in view.graph.nodes:
            self.mutated.extend(view.mutated_inputs(node))
            if node.op == "output":
                self.output_node = node
        self.built = False
        if self.mutated:
            self._build()

    def _build(self) -> None:
        self.built = True
        by_storage: dict[Any, fx.Node] = {}
        for node in self.view.graph.nodes:
            self.add(node)
            key = _storage_key(self.view.val(node))
            if key is not None:
                if key in by_storage:
                    self.union(node, by_storage[key])
                else:
                    by_storage[key] = node
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

    def add(self, node: fx.Node) -> None:
        """Register a node (also nodes created by rewrites) with its aliasing edges."""
        if node in self.parent or not self.built:
            return
        self.parent[node] = node
        if node.op in ("placeholder", "get_attr"):
            self.external_roots.add(node)
            return
        call = self.view.classify(node)
        if call is not None and call.op in VIEW_OPS:
            src = call.args.get("input")
            if isinstance(src, fx.Node):
                mine, theirs = _storage_key(self.view.val(node)), _storage_key(self.view.val(src))
                if mine is None or theirs is None or mine == theirs:
                    self.union(node, src)  # a view (or unknown: assume it aliases)

    # queries ---------------------------------------------------------------------
    def is_mutated(self, node: fx.Node) -> bool:
        return bool(self.mutated) and self.find(node) in self.mutated_roots

    def same_class(self, a: fx.Node, b: fx.Node) -> bool:
        return self.find(a) is self.find(b)

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
        """Why replacing graph output ``old`` by ``new`` would create new aliasing, if it would."""
        if self.output_node is None or self.output_node not in old.users or self.same_class(old, new):
            return None
        visible = self.visible_outputs()
        if old not in visible:
            return None  # only saved activations: they may alias
        root = self.find(new)
        if root in self.external_roots:
            return "a graph output would alias a graph input or parameter"
        others = [o for o in visible if o is not old and self.find(o) is root]
        if others:
            return "two graph outputs would alias each other"
        return None


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
