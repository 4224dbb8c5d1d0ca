"""Where gradients flow in a Torch-IR graph (optimus/core/gradflow.py): requires_grad
derived through grad-mode regions, cuts, rewrites that would change who gets a gradient,
and values no gradient reaches. End-to-end cases live in tests/core/test_regions.py and
tests/fuzz/test_fuzz_known_bugs.py; here the analysis is checked on Dynamo's graphs."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from optimus.core.gradflow import GradFlow
from optimus.torch_ir.view import TorchIRView


def _capture(fn, *inputs) -> fx.GraphModule:
    graphs: list[fx.GraphModule] = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*inputs)
    assert len(graphs) == 1
    return graphs[0]


def _flow(gm: fx.GraphModule) -> GradFlow:
    return TorchIRView(gm).grad_flow()


def _node(gm: fx.GraphModule, name: str) -> fx.Node:
    return next(n for n in gm.graph.nodes if n.name == name)


def _regions_and_detach(x, w):
    y = x @ w
    with torch.no_grad():
        z = y * 2
    d = y.detach()
    e = d + 1
    return y, z, e


def test_requires_grad_follows_the_regions_not_the_example_values():
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    gm = _capture(_regions_and_detach, x, w)
    flow = _flow(gm)
    assert flow  # a training graph
    y, z, d, e = (_node(gm, n) for n in ("y", "z", "d", "e"))
    built: set[fx.Node] = set()
    assert [flow.requires_grad(n, built) for n in (y, z, d, e)] == [True, False, False, False]
    assert flow.is_cut(z) and flow.is_cut(d) and not flow.is_cut(e) and not flow.is_cut(y)


def test_an_inference_graph_has_nothing_to_check():
    x, w = torch.randn(3, 4), torch.randn(4, 4)
    gm = _capture(_regions_and_detach, x, w)
    flow = _flow(gm)
    assert not flow and not flow.dropped()
    y, z = _node(gm, "y"), _node(gm, "z")
    assert flow.problem([(z, y)], []) is None
    # Aten-IR views: autograd already applied, every check free
    gm = _capture(_regions_and_detach, x.requires_grad_(), w)
    view = TorchIRView(gm)
    off = GradFlow(gm.graph, view.val, view.regions(), True, autograd=False)
    assert not off and off.problem([(_node(gm, "z"), _node(gm, "y"))], []) is None


def test_a_replacement_that_changes_requires_grad_is_a_problem():
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    gm = _capture(_regions_and_detach, x, w)
    flow = _flow(gm)
    y, z = _node(gm, "y"), _node(gm, "z")
    # an existing grad value in place of a no-grad one, and the reverse
    assert "would require grad where z does not" in flow.problem([(z, y)], [])
    assert "would not require grad where y does" in flow.problem([(y, z)], [])
    # a new node is judged by its inputs and the region it is built in
    with gm.graph.inserting_after(y):
        twice = gm.graph.call_function(torch.mul, (y, 2))
    twice.meta["example_value"] = z.meta["example_value"]  # Dynamo's says requires_grad=True too
    assert flow.requires_grad(twice, {twice})
    assert "would require grad" in flow.problem([(z, twice)], [twice])
    assert flow.problem([(y, twice)], [twice]) is None  # same flag, gradient reaches y from y


def _half_under_no_grad(x):
    with torch.no_grad():
        a = x[:, :2] * 1
    b = x[:, 2:] * 1
    c = torch.cat([a, b], 1)
    return c


def test_a_replacement_reaching_around_a_cut_is_a_problem():
    """cat([x[:, :2] under no_grad, x[:, 2:]]) has x's values, but only half of x gets a
    gradient in eager: a replacement reading x directly would give all of it one."""
    x = torch.randn(3, 4, requires_grad=True)
    gm = _capture(_half_under_no_grad, x)
    flow = _flow(gm)
    c = _node(gm, "c")
    x_node = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with gm.graph.inserting_before(c):
        whole = gm.graph.call_function(torch.mul, (x_node, 1))
    whole.meta["example_value"] = c.meta["example_value"]
    problem = flow.problem([(c, whole)], [whole])
    assert problem is not None and "through a no_grad region or a detach" in problem, problem
    # reading the grad-enabled half is fine: gradient reaches it from c without a cut
    b = _node(gm, "b")
    with gm.graph.inserting_before(c):
        half = gm.graph.call_function(torch.mul, (b, 1))
    half.meta["example_value"] = b.meta["example_value"]
    assert flow.problem([(c, half)], [half]) is None


def _one_tower_only_detached(x, w1, w2):
    a = x @ w1
    b = x @ w2
    return a.detach() * 2, b


def test_values_no_gradient_reaches_are_dropped():
    """``a`` requires grad but is only used detached: w1.grad stays None in eager, so a
    horizontal group must not batch it with ``b`` (core/group.py keeps them apart)."""
    inputs = [torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True), torch.randn(4, 5, requires_grad=True)]
    gm = _capture(_one_tower_only_detached, *inputs)
    flow = _flow(gm)
    a, b = _node(gm, "a"), _node(gm, "b")
    dropped = flow.dropped()
    assert a in dropped and b not in dropped


def test_committed_nodes_keep_their_facts():
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    gm = _capture(_regions_and_detach, x, w)
    flow = _flow(gm)
    y = _node(gm, "y")
    with gm.graph.inserting_after(y):
        t = gm.graph.call_function(torch.tanh, (y,))
    t.meta["example_value"] = y.meta["example_value"]
    assert not flow.requires_grad(t, set())  # unknown until committed
    flow.mark_built([t])
    assert flow.requires_grad(t, set())


def _towers(x, w1, w2, w3):
    lin = torch.nn.functional.linear
    return torch.cat([lin(x, w1), lin(x, w2), lin(x, w3)], 1).relu()


def test_a_horizontal_group_in_training_is_not_a_reach_around():
    """Each member's slice of the batched op reads every member's weight; the members
    count together, so the group's gradient reaches exactly what theirs did."""
    from support import check_level

    inputs = [torch.randn(6, 4)] + [torch.randn(5, 4) for _ in range(3)]
    run = check_level(_towers, inputs, "torch_ir", passes=["batch_linear_lhs"])
    declined = [r for rep in run.reports for g in rep.graphs for s in g.rules.values() for r in s.declined]
    assert run.matched("batch_linear_lhs") == 1, declined
    assert not [r for r in declined if "gradient" in r], declined


def _slice_of_cat_with_a_parameter(x, w):
    c = torch.cat([x, w.expand(3, 2)], 1)
    return c[:, :4] * 2


def test_a_rewrite_leaving_a_parameter_unused_is_a_problem_without_cuts_too():
    """No cut anywhere, yet ``slice(cat([x, w]))`` -> ``x`` would leave ``w`` unused: eager
    gives it a zero gradient, the rewritten graph ``None`` (an optimizer's weight decay and
    momentum treat the two differently). Replacing by a value that keeps every input used
    is no problem."""
    w = torch.nn.Parameter(torch.randn(2))
    gm = _capture(_slice_of_cat_with_a_parameter, torch.randn(3, 4, requires_grad=True), w)
    flow = _flow(gm)
    assert not flow.has_cuts
    x_node = next(n for n in gm.graph.nodes if n.op == "placeholder")
    s = next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is operator.getitem)
    problem = flow.problem([(s, x_node)], [])
    assert problem is not None and "would get no gradient" in problem, problem
    c = s.args[0]
    with gm.graph.inserting_before(s):
        keep = gm.graph.call_function(torch.narrow, (c, 1, 0, 4))
    keep.meta["example_value"] = s.meta["example_value"]
    assert flow.problem([(s, keep)], [keep]) is None
