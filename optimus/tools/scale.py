"""Rewriter throughput on synthetic graphs: ``python -m optimus.tools.scale --nodes 1000 10000 20000``.

Each graph is a chain of blocks mixing what the rules rewrite (split -> cat identities,
splits of a split's chunk, single-section splits, non-canonical spellings) with what
they must leave alone (partial and shuffled cats, pointwise work). Shapes are
propagated with fake tensors first; only ``optimus.optimize`` is timed (snapshot for
rollback, alias analysis, the worklist to a fixpoint, dead-code removal, final lint).
"""

from __future__ import annotations

import argparse
import operator
import statistics
import time

import torch
import torch.fx as fx

from .cli_json import add_json_arguments, emit
from ..core.table import format_table


def synthetic_graph(target_nodes: int, width: int = 8, seed: int = 0) -> tuple[fx.GraphModule, torch.Tensor]:
    g = fx.Graph()
    x = g.placeholder("x")
    rng = torch.Generator().manual_seed(seed)
    while len(g.nodes) < target_nodes:
        k = int(torch.randint(0, 4, (1,), generator=rng))
        sp = g.call_method("split", (x, width // 2), {"dim": -1})
        parts = [g.call_function(_getitem, (sp, i)) for i in range(8)]
        if k == 0:  # identity
            y = g.call_function(torch.concat, (parts,), {"axis": -1})
        elif k == 1:  # split of a chunk, then all back
            inner = g.call_function(torch.split, (parts[3], [1, width // 2 - 1], 1))
            a, b = g.call_function(_getitem, (inner, 0)), g.call_function(_getitem, (inner, 1))
            y = g.call_function(torch.cat, (parts[:3] + [a, b] + parts[4:], 1))
        elif k == 2:  # shuffled: must stay
            y = g.call_function(torch.cat, (parts[::-1], 1))
        else:  # per-chunk work: must stay
            y = g.call_function(torch.cat, ([g.call_function(torch.tanh, (p,)) for p in parts], 1))
        x = g.call_function(torch.relu, (y,))
    g.output(x)
    return fx.GraphModule(torch.nn.Module(), g), torch.randn(4, 4 * width)


_getitem = operator.getitem


def tower_graph(target_nodes: int, candidates: int, features: int = 10, width: int = 8) -> tuple[fx.GraphModule, list[torch.Tensor]]:
    """Layers of per-feature linears (the horizontal candidates) between filler chains of
    elementwise ops, ``candidates`` linears in a graph of about ``target_nodes`` nodes."""
    layers = max(1, candidates // features)
    per_layer = max(0, (target_nodes - layers * (4 * features + 2)) // layers)
    g = fx.Graph()
    x = g.placeholder("x")
    inputs = [torch.randn(4, features * width)]
    weights = []
    for i in range(layers * features):
        weights.append(g.placeholder(f"w{i}"))
        inputs.append(torch.randn(width, width))
    for layer in range(layers):
        sp = g.call_function(torch.split, (x, width, 1))
        outs = []
        for f in range(features):
            chunk = g.call_function(_getitem, (sp, f))
            y = g.call_function(torch.nn.functional.linear, (chunk, weights[layer * features + f]))
            outs.append(g.call_function(torch.tanh, (y,)))
        x = g.call_function(torch.cat, (outs, 1))
        for _ in range(per_layer):  # filler: work the rules leave alone
            x = g.call_function(torch.sin, (x,))
    g.output(x)
    return fx.GraphModule(torch.nn.Module(), g), inputs


def measure_horizontal(nodes: int, candidates: int, repeats: int = 3) -> dict:
    import optimus
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    optimus.resolve("all")  # import the rules before timing
    times, results = [], None
    for _ in range(repeats):
        gm, inputs = tower_graph(nodes, candidates)
        FakeTensorProp(gm, FakeTensorMode()).propagate(*inputs)
        before = len(gm.graph.nodes)
        t0 = time.perf_counter()
        optimus.optimize(gm, passes="horizontal", level="torch_ir")
        times.append(time.perf_counter() - t0)
        report = optimus.last_report().graphs[0]
        groups = report.rules["batch_linear"].matched if "batch_linear" in report.rules else 0
        results = {"nodes_before": before, "nodes_after": len(gm.graph.nodes), "candidates": candidates, "linear_groups": groups}
    return {**results, "median_s": round(statistics.median(times), 3), "times_s": [round(t, 3) for t in times]}


def measure(nodes: int, repeats: int = 3) -> dict:
    import optimus
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    optimus.resolve("all")  # import the rules before timing
    times, results = [], None
    for r in range(repeats):
        gm, x = synthetic_graph(nodes)
        mode = FakeTensorMode()
        FakeTensorProp(gm, mode).propagate(x)
        before = len(gm.graph.nodes)
        t0 = time.perf_counter()
        optimus.optimize(gm, passes="vertical", level="torch_ir")
        times.append(time.perf_counter() - t0)
        report = optimus.last_report()
        results = {"nodes_before": before, "nodes_after": len(gm.graph.nodes), "rewrites": report.graphs[0].matched}
    return {"target_nodes": nodes, **results, "median_s": round(statistics.median(times), 3), "times_s": [round(t, 3) for t in times]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000, 20000])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--horizontal", type=int, metavar="CANDIDATES", default=None,
                   help="time horizontal grouping instead: per-feature linears (this many) in graphs of --nodes nodes")
    add_json_arguments(p, "the measurements")
    args = p.parse_args(argv)
    if args.horizontal is not None:
        rows = [measure_horizontal(n, args.horizontal, args.repeats) for n in args.nodes]
        count = "linear_groups"
    else:
        rows = [measure(n, args.repeats) for n in args.nodes]
        count = "rewrites"
    if not emit({"torch": torch.__version__, "rows": rows}, args):
        print(_table(rows, count))
    return 0


def _table(rows: list[dict], count: str) -> str:
    cells = [[r["nodes_before"], r["nodes_after"], r[count], f"{r['median_s']:.3f}", r["times_s"]] for r in rows]
    return f"torch {torch.__version__}\n" + format_table(["nodes before", "after", count, "median s", "all runs"], cells,
                                                         [True, True, True, True, False])


if __name__ == "__main__":
    raise SystemExit(main())
