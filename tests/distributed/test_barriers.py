"""Collectives traced into a graph are barriers: no rewrite moves work across one, groups
form on each side, and none is ever removed (optimus/core/collectives.py).

These run in this process with a gloo process group of one rank (the functional
collectives need a group name to run): fast, no Inductor compile. The 2-rank,
end-to-end run of a model with an all-reduce in its graph is in test_ddp.py (slow).
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.distributed as dist
import torch.fx as fx
from torch import nn

import optimus
from optimus.core import collectives

c10d = torch.ops._c10d_functional


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """A one-rank gloo group in this process; its name is what functional collectives take."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    path = tmp_path_factory.mktemp("pg") / "rendezvous"
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD.group_name
    finally:
        dist.destroy_process_group()


class HeadsAroundAllReduce(nn.Module):
    """8 identical Linears on the chunks of one split: 4 before an all-reduce, 4 after it,
    then a cat(split(y)) round trip."""

    def __init__(self, group_name: str) -> None:
        super().__init__()
        self.group_name = group_name
        self.proj = nn.Linear(8, 64)
        self.heads = nn.ModuleList(nn.Linear(8, 8) for _ in range(8))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        parts = torch.split(self.proj(x), 8, 1)
        before = [self.heads[i](parts[i]) for i in range(4)]
        r = c10d.wait_tensor(c10d.all_reduce(z, "sum", self.group_name))
        after = [self.heads[i](parts[i]) for i in range(4, 8)]
        unused = c10d.wait_tensor(c10d.all_reduce(z * 2, "sum", self.group_name))  # noqa: F841
        y = torch.cat(before + after, 1)
        y = torch.cat(torch.split(y, 8, 1), 1)
        return y.sum(1) + r.sum()


def _collective_names(gm: fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if collectives.is_barrier(n)]


def _side(gm: fx.GraphModule, node: fx.Node) -> int:
    """How many collectives come before ``node`` in graph order."""
    seen = 0
    for n in gm.graph.nodes:
        if n is node:
            return seen
        seen += collectives.is_barrier(n)
    raise AssertionError(f"{node.name} is not in the graph")


def test_recognises_collectives_at_both_levels() -> None:
    assert collectives.is_collective(c10d.all_reduce)  # Torch-IR: the packet
    assert collectives.is_collective(c10d.all_reduce.default)  # Aten-IR: the overload
    assert collectives.is_collective(c10d.wait_tensor.default)
    assert collectives.is_collective(torch.ops.c10d.allreduce_)
    import torch.distributed._functional_collectives as funcol

    assert collectives.is_collective(funcol.all_reduce)  # symbolic_trace keeps the Python function
    for not_one in (torch.relu, torch.ops.aten.relu.default, torch.ops.aten.cat, operator.getitem, "sum"):
        assert not collectives.is_collective(not_one)


def test_groups_form_on_each_side_and_nothing_moves_across(group: str) -> None:
    torch.manual_seed(0)
    model = HeadsAroundAllReduce(group)
    x, z = torch.randn(4, 8), torch.randn(3)
    want = model(x, z)
    gm = torch.fx.symbolic_trace(model)
    before = _collective_names(gm)
    gm = optimus.optimize(gm, passes="all", example_inputs=[x, z])
    report = optimus.last_report()
    stats = report.rule_totals()

    assert _collective_names(gm) == before  # both kept (one's result is unused), in order
    assert stats["batch_linear"].matched == 2  # one batched Linear on each side, not one of 8
    reasons = " | ".join(stats["batch_linear"].declined)
    assert "sides of a collective" in reasons
    # every batched matmul sits on the side of the heads it replaced
    batched = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in (torch.baddbmm, torch.bmm)]
    assert sorted(_side(gm, n) for n in batched) == [0, 2]  # all_reduce and wait_tensor: two barriers
    # the cat(split(y)) round trip after the collective is still removed
    assert sum(s.matched for name, s in stats.items() if name in ("cat_split_to_inputs", "split_cat_to_identity")) >= 1
    torch.testing.assert_close(gm(x, z), want, rtol=1e-5, atol=1e-5)


def test_a_value_is_not_hoisted_before_a_collective(group: str) -> None:
    """relu of every chunk of a split made before an all-reduce: hoisting the relu above
    the split would compute it before the collective; declined, with the reason."""

    def f(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        parts = torch.split(x, 4, 1)
        r = c10d.wait_tensor(c10d.all_reduce(z, "sum", group))
        ys = [torch.relu(parts[i]) for i in range(4)]
        return torch.cat(ys, 1) * 2 + r.sum()

    x, z = torch.randn(4, 16), torch.randn(3)
    gm = optimus.optimize(torch.fx.symbolic_trace(f), example_inputs=[x, z])
    hoist = optimus.last_report().rule_totals()["hoist_pointwise_through_split"]
    assert hoist.matched == 0
    assert any("across the collective all_reduce" in r for r in hoist.declined)
    relus = [n for n in gm.graph.nodes if n.target is torch.relu]
    assert relus and all(_side(gm, n) == 2 for n in relus)  # still after the all-reduce and its wait
    torch.testing.assert_close(gm(x, z), f(x, z))

    # the same function without the collective is rewritten (the barrier is the reason)
    def g(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        parts = torch.split(x, 4, 1)
        ys = [torch.relu(parts[i]) for i in range(4)]
        return torch.cat(ys, 1) * 2 + z.sum()

    optimus.optimize(torch.fx.symbolic_trace(g), example_inputs=[x, z])
    assert optimus.last_report().rule_totals()["hoist_pointwise_through_split"].matched == 1


def test_aten_ir_graph_with_collectives(group: str) -> None:
    """The same at Aten-IR (a make_fx graph: OpOverloads, decomposed ops)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        a = [torch.mm(x, w[i]) for i in range(3)]
        r = c10d.wait_tensor(c10d.all_reduce(z, "sum", group))
        b = [torch.mm(x, w[i]) for i in range(3, 6)]
        return torch.cat(a + b, 1).sum(1) + r.sum()

    x, w, z = torch.randn(4, 8), torch.randn(6, 8, 8), torch.randn(3)
    gm = make_fx(f, tracing_mode="fake")(x, w, z)
    before = _collective_names(gm)
    assert before, "make_fx should keep the functional collectives"
    gm = optimus.optimize(gm, passes="horizontal", level="aten_ir")
    stats = optimus.last_report().rule_totals()
    assert _collective_names(gm) == before
    mm = stats["batch_mm"]
    assert mm.matched == 2 and any("sides of a collective" in r for r in mm.declined)
    bmm = [n for n in gm.graph.nodes if n.target is torch.ops.aten.bmm.default]
    assert sorted(_side(gm, n) for n in bmm) == [0, 2]  # all_reduce and wait_tensor are two barriers
    torch.testing.assert_close(gm(x, w, z), f(x, w, z), rtol=1e-5, atol=1e-5)


def test_unused_collective_is_never_removed(group: str) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        c10d.all_reduce(x * 3, "sum", group)  # result unused: still a message another rank waits for
        return torch.cat(torch.split(x * 2, 2, 1), 1)

    x = torch.randn(4, 8)
    gm = optimus.optimize(torch.fx.symbolic_trace(f), example_inputs=[x])
    assert _collective_names(gm) == ["all_reduce"]
    assert optimus.last_report().rule_totals()["split_cat_to_identity"].matched == 1
