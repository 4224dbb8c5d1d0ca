"""Liveness and the memory effect of a horizontal fusion (optimus/planner/memory.py)."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from optimus.planner.memory import Liveness, MemoryBudget


def _sequences(xs, ws):
    # each sequence: a wide projection that dies at once (its sum is tiny)
    return [torch.relu(x @ w).sum(1) for x, w in zip(xs, ws)]


def _graph(n=4, rows=64, k=16, wide=256):
    xs = [torch.randn(rows, k) for _ in range(n)]
    ws = [torch.randn(k, wide) for _ in range(n)]
    return make_fx(_sequences)(xs, ws), rows * wide * 4


def test_curve_counts_inputs_throughout_and_temporaries_while_live():
    gm, wide_bytes = _graph()
    live = Liveness(gm.graph)
    inputs = sum(t for k, t in live.size.items() if live.start[k] == 0 and live.end[k] == len(live.curve) - 1)
    assert live.curve.min() >= inputs > 0
    # one wide temporary at a time (plus its relu) in the unfused graph
    assert live.peak - inputs <= 2 * wide_bytes + 4096


def test_batching_the_projections_raises_the_peak_and_the_budget_refuses():
    gm, wide_bytes = _graph()
    live = Liveness(gm.graph)
    mms = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == torch.ops.aten.mm.default]
    assert len(mms) == 4
    delta = live.group_delta(mms)
    budget = MemoryBudget(live, allowed_increase=0.02)
    rise = budget.increase(delta)
    # all four wide outputs at once instead of one at a time
    assert rise >= 2.5 * wide_bytes
    assert not budget.fits(delta)
    # two at a time fits a looser budget and rises about half as much
    half = live.group_delta(mms[:2])
    assert budget.increase(half) < rise
    loose = MemoryBudget(live, allowed_increase=10.0)
    assert loose.fits(delta)
    loose.accept(delta)
    assert loose.increase(live.group_delta(mms[:1])) >= rise  # accepted changes accumulate


def test_a_group_whose_outputs_live_long_anyway_costs_nothing():
    def keep(xs, ws):
        return [x @ w for x, w in zip(xs, ws)]  # every output is a graph output

    xs = [torch.randn(8, 4) for _ in range(3)]
    ws = [torch.randn(4, 8) for _ in range(3)]
    gm = make_fx(keep)(xs, ws)
    live = Liveness(gm.graph)
    mms = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == torch.ops.aten.mm.default]
    budget = MemoryBudget(live, allowed_increase=0.0)
    assert budget.increase(live.group_delta(mms)) == 0.0
