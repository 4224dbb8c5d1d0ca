"""Whole-graph snapshots: what a level restores when it rolls back.

``snapshot(graph)`` records a graph in O(nodes) without creating any node;
``restore(graph, record)`` makes the same ``fx.Graph`` object what it recorded, keeping
its leading placeholders as the same node objects (Dynamo and AOTAutograd hold them).
Used by the level runner (rollback, the numeric check's fresh copies) and by the safety
net (a graph compiled again without Optimus's rewrites).
"""

from __future__ import annotations

import torch.fx as fx

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
