"""Rewriter throughput on synthetic graphs: ``python -m optimus.scale --nodes 1000 10000 20000``.

Each graph is a chain of blocks mixing what the rules rewrite (split -> cat identities,
splits of a split's chunk, single-section splits, non-canonical spellings) with what
they must leave alone (partial and shuffled cats, pointwise work). Shapes are
propagated with fake tensors first; only ``optimus.optimize`` is timed (snapshot for
rollback, alias analysis, the worklist to a fixpoint, dead-code removal, final lint).
"""

from __future__ import annotations

import argparse
import json
import operator
import statistics
import time

import torch
import torch.fx as fx

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


def measure(nodes: int, repeats: int = 3) -> dict:
    import optimus
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

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
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = [measure(n, args.repeats) for n in args.nodes]
    if args.json:
        print(json.dumps({"torch": torch.__version__, "rows": rows}, indent=2))
    else:
        print(f"torch {torch.__version__}")
        print(f"{'nodes before':>13}{'after':>8}{'rewrites':>10}{'median s':>10}  all runs")
        for r in rows:
            print(f"{r['nodes_before']:>13}{r['nodes_after']:>8}{r['rewrites']:>10}{r['median_s']:>10.3f}  {r['times_s']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
