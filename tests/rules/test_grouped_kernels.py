"""Heterogeneous horizontal rules (optimus/rules/grouped_kernels.py): linears of different
(K, N) become one optimus::grouped_linear, LayerNorms of different widths one
optimus::batched_layer_norm. Structural (which ops remain, what the op was called with)
and numeric (outputs and gradients equal eager, several shapes, both levels) on the CPU,
where the custom ops run their plain-torch path; plus bad inputs."""

import copy
import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import optimus
from optimus.rules import grouped_kernels as gk
from support import LEVELS, _run, assert_close_tree, check_level, run_level

class HeteroTowers(nn.Module):
    """Per-feature towers of distinct widths: Linear -> LayerNorm -> ReLU on each chunk."""

    def __init__(self, ins=(3, 5, 7, 4, 6), outs=(4, 6, 3, 8, 5), bias=True, act=None):
        super().__init__()
        self.ins = list(ins)
        self.act = act
        self.lin = nn.ModuleList([nn.Linear(i, o, bias=bias) for i, o in zip(ins, outs)])
        self.ln = nn.ModuleList([nn.LayerNorm(o) for o in outs])

    def forward(self, x):
        xs = x.split(self.ins, -1)
        outs = []
        for c, lin, ln in zip(xs, self.lin, self.ln):
            h = lin(c)
            if self.act is not None:
                h = self.act(h)
            outs.append(torch.relu(ln(h)))
        return torch.cat(outs, -1)


def params_as_inputs(model):
    names = [n for n, _ in model.named_parameters()]

    def f(x, *ps):
        return torch.func.functional_call(model, dict(zip(names, ps)), (x,))

    return f, [p.detach() for _, p in model.named_parameters()]


def custom_calls(gm, name):
    """The optimus::<name> nodes of a graph (and of its parameter-list variant <name>_params,
    whose arguments sit in the same places), as (args) tuples."""
    targets = {getattr(torch.ops.optimus, name).default, getattr(torch.ops.optimus, name + "_params").default}
    return [n.args for n in gm.graph.nodes if n.op == "call_function" and n.target in targets]


def declines(run, rule):
    out = {}
    for r in run.reports:
        for g in r.graphs:
            if rule in g.rules:
                for reason, k in g.rules[rule].declined.items():
                    out[reason] = out.get(reason, 0) + k
    return out


SHAPES = [
    ((3, 5, 7, 4, 6), (4, 6, 3, 8, 5), (4,)),
    ((8, 16, 2, 5, 3), (3, 12, 9, 16, 6), (2, 3)),  # 3-D input: rows = 2 * 3
    ((1, 9, 4, 4, 11, 6), (7, 2, 5, 13, 1, 3), (1,)),
]


@pytest.mark.parametrize("ins,outs,lead", SHAPES)
def test_torch_ir_towers_become_one_grouped_linear_and_one_batched_layer_norm(ins, outs, lead):
    torch.manual_seed(0)
    f, ps = params_as_inputs(HeteroTowers(ins, outs))
    run = check_level(f, [torch.randn(*lead, sum(ins))] + ps, "torch_ir")
    ops = run.ops(0)
    assert ops["linear"] == 0 and ops["layer_norm"] == 0, ops
    (gl,) = custom_calls(run.graphs[0], "grouped_linear")
    rows = 1
    for s in lead:
        rows *= s
    assert gl[3:] == ([rows] * len(ins), list(ins), list(outs), "none", "columns")
    (ln,) = custom_calls(run.graphs[0], "batched_layer_norm")
    assert ln[3:] == ([rows] * len(ins), list(outs), 1e-5, "columns", "relu")
    assert run.matched("grouped_linear") == 1 and run.matched("batched_layer_norm") == 1
    # the column layout: the op reads the input where it lies, the LayerNorm reads the grouped
    # linear's result in place, the towers' ReLUs are the norm's epilogue and its result is the
    # towers' cat (the four cats left pack the parameters: W, b and the norms' w, b; packed
    # parameters go to the parameter-list ops instead, tests/test_packing.py)
    assert ops["cat"] == 4 and ops.get("relu", 0) == 0 and ops.get("split", 0) == 0, ops
    x = gl[0] if gl[0].op == "placeholder" else gl[0].args[0]
    assert x.op == "placeholder", gl[0]
    src = ln[0] if ln[0].target is not torch.ops.aten.reshape.default and ln[0].op != "call_method" else ln[0].args[0]
    assert "getitem" in str(src.target) and src.args[0].target is torch.ops.optimus.grouped_linear.default, ln[0]


@pytest.mark.parametrize("ins,outs,lead", SHAPES[:2])
def test_torch_ir_inference(ins, outs, lead):
    torch.manual_seed(1)
    f, ps = params_as_inputs(HeteroTowers(ins, outs))
    run = check_level(f, [torch.randn(*lead, sum(ins))] + ps, "torch_ir", grad=False)
    assert run.matched("grouped_linear") == 1 and run.matched("batched_layer_norm") == 1


@pytest.mark.parametrize("act,name", [(torch.relu, "relu"), (torch.sigmoid, "sigmoid"), (torch.tanh, "tanh"), (F.silu, "silu"), (F.gelu, "gelu")])
def test_shared_activation_is_fused_into_the_epilogue(act, name):
    torch.manual_seed(2)
    f, ps = params_as_inputs(HeteroTowers(act=act))
    inputs = [torch.randn(5, 25)] + ps
    expected = _run(f, inputs)
    run = run_level(f, inputs, "torch_ir")
    assert_close_tree((run.outputs, run.grads), expected, rtol=1e-4, atol=1e-5)  # another order of fp32 sums
    (gl,) = custom_calls(run.graphs[0], "grouped_linear")
    assert gl[6] == name
    # the towers' final relus (after the LayerNorm) are the norm's epilogue
    (ln,) = custom_calls(run.graphs[0], "batched_layer_norm")
    assert ln[7] == "relu" and run.ops(0).get(name, 0) == 0, run.ops(0)


def test_tanh_approximate_gelu_and_mixed_activations_are_not_fused():
    torch.manual_seed(3)
    acts = [torch.relu, torch.relu, torch.tanh, torch.relu, torch.relu, lambda h: F.gelu(h, approximate="tanh")]

    class Mixed(HeteroTowers):
        def forward(self, x):
            xs = x.split(self.ins, -1)
            return torch.cat([a(lin(c)) for a, c, lin in zip(acts, xs, self.lin)], -1)

    f, ps = params_as_inputs(Mixed((3, 5, 7, 4, 6, 2), (4, 6, 3, 8, 5, 9)))
    run = check_level(f, [torch.randn(4, 27)] + ps, "torch_ir")
    calls = custom_calls(run.graphs[0], "grouped_linear")
    assert calls and all(c[6] == "none" for c in calls)
    assert run.ops(0)["relu"] == 4 and run.ops(0)["tanh"] == 1 and run.ops(0)["gelu"] == 1


def test_aten_ir_inference_graph_gets_grouped_linear():
    torch.manual_seed(4)
    f, ps = params_as_inputs(HeteroTowers(act=torch.relu))
    run = check_level(f, [torch.randn(4, 25)] + ps, "aten_ir", grad=False)
    ops = run.ops(0)
    assert ops["addmm"] == 0 and ops["mm"] == 0, ops
    (gl,) = custom_calls(run.graphs[0], "grouped_linear")
    assert gl[3:] == ([4] * 5, [3, 5, 7, 4, 6], [4, 6, 3, 8, 5], "relu", "columns")
    assert run.matched("grouped_mm") == 1
    # the weights are packed as they lie: the permute of each linear's weight was folded away
    assert ops["permute"] == 0, ops


@pytest.mark.parametrize("bias,lead", [(False, (3,)), (True, (7,))])
def test_aten_ir_inference_more_shapes(bias, lead):
    """(3-D inputs of a split along the last dim decompose to expand + bmm at Aten-IR:
    not candidates.)"""
    torch.manual_seed(5)
    f, ps = params_as_inputs(HeteroTowers(bias=bias))
    run = check_level(f, [torch.randn(*lead, 25)] + ps, "aten_ir", grad=False)
    assert run.matched("grouped_mm") == 1
    assert len(custom_calls(run.graphs[0], "grouped_linear")) == 1


def test_aten_ir_training_graphs_are_declined_with_the_reason():
    torch.manual_seed(6)
    f, ps = params_as_inputs(HeteroTowers())
    run = check_level(f, [torch.randn(4, 25)] + ps, "aten_ir")
    assert run.matched("grouped_mm") == 0
    assert declines(run, "grouped_mm").get(gk.TRAINING_GRAPH, 0) >= 5
    assert not any(custom_calls(g, "grouped_linear") for g in run.graphs)
    assert run.ops(0)["addmm"] == 5


@pytest.mark.parametrize("level", LEVELS)
def test_uniform_groups_are_left_to_bmm(level):
    torch.manual_seed(7)
    f, ps = params_as_inputs(HeteroTowers((6,) * 5, (4,) * 5))
    rule = "grouped_linear" if level == "torch_ir" else "grouped_mm"
    run = check_level(f, [torch.randn(4, 30)] + ps, level, passes=[rule], grad=level == "torch_ir")
    if level == "torch_ir":
        # chunks of one split: without batch_linear, the column layout reads them in place
        assert run.matched(rule) == 1 and custom_calls(run.graphs[0], "grouped_linear")[0][-1] == "columns"
    else:
        assert run.matched(rule) == 0 and declines(run, rule).get(gk.UNIFORM_MM, 0) == 5
    # with every rule on, the bmm rules (first in order) take them
    run = check_level(f, [torch.randn(4, 30)] + ps, level, grad=level == "torch_ir")
    assert run.matched(rule) == 0 and (run.matched("batch_linear") + run.matched("batch_mm")) >= 1


def test_uniform_layer_norms_are_left_to_the_stack_rule():
    xs = [torch.randn(3, 8) for _ in range(4)]
    run = check_level(lambda *a: torch.cat([F.layer_norm(x, (8,)) for x in a], 1), xs, "torch_ir", passes=["batched_layer_norm"])
    assert run.matched("batched_layer_norm") == 0
    assert declines(run, "batched_layer_norm") == {gk.UNIFORM_LAYER_NORM: 4}


def test_two_members_are_not_profitable():
    torch.manual_seed(8)
    f, ps = params_as_inputs(HeteroTowers((3, 5), (4, 6)))
    run = check_level(f, [torch.randn(4, 8)] + ps, "torch_ir")
    assert run.matched("grouped_linear") == 0
    assert any("not profitable" in r for r in declines(run, "grouped_linear"))


def test_shared_weight_and_weight_used_elsewhere_get_summed_gradients():
    torch.manual_seed(9)
    ws = [torch.randn(n, k) for k, n in ((3, 4), (5, 6), (7, 3), (4, 8))]
    bs = [torch.randn(w.shape[0]) for w in ws]

    def f(x, y, *wb):
        w, b = wb[:4], wb[4:]
        xs = x.split([3, 5, 7, 4], 1)
        outs = [F.linear(c, wi, bi) for c, wi, bi in zip(xs, w, b)]
        outs.append(F.linear(y, w[0], b[1][:4]))  # w[0] shared by two members
        return torch.cat(outs + [w[2].sum(0, keepdim=True).expand(2, -1)], 1)  # w[2] also read elsewhere

    run = check_level(f, [torch.randn(2, 19), torch.randn(2, 3)] + ws + bs, "torch_ir")
    assert run.matched("grouped_linear") == 1


def test_frozen_parameters_mixed_with_trainable_ones():
    torch.manual_seed(10)
    model = HeteroTowers()
    for lin in model.lin[::2]:
        lin.weight.requires_grad_(False)
    model.ln[1].bias.requires_grad_(False)
    ref = copy.deepcopy(model)
    x = torch.randn(4, 25)
    run_x = x.clone().requires_grad_()
    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        optimus.optimize(gm, level="torch_ir")
        seen.append(gm)
        return gm.forward

    out = torch.compile(model, backend=backend, fullgraph=True)(run_x)
    ref_x = x.clone().requires_grad_()
    expected = ref(ref_x)
    torch.testing.assert_close(out, expected)
    g = torch.randn(out.shape)
    (out * g).sum().backward()
    (expected * g).sum().backward()
    torch.testing.assert_close(run_x.grad, ref_x.grad)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert custom_calls(seen[0], "grouped_linear") and custom_calls(seen[0], "batched_layer_norm")


def test_mixed_dtypes_never_share_a_call():
    torch.manual_seed(11)
    dts = [torch.float32, torch.float32, torch.bfloat16, torch.float32, torch.bfloat16, torch.float32]
    ks, ns = [3, 5, 7, 4, 6, 2], [4, 6, 3, 8, 5, 7]
    ws = [torch.randn(n, k, dtype=d) for k, n, d in zip(ks, ns, dts)]
    xs = [torch.randn(2, k, dtype=d) for k, d in zip(ks, dts)]

    def f(*a):
        x, w = a[:6], a[6:]
        return torch.cat([F.linear(xi, wi).float() for xi, wi in zip(x, w)], 1)

    expected = f(*xs, *ws)
    run = run_level(f, xs + ws, "torch_ir", grad=False)
    torch.testing.assert_close(run.outputs, expected, rtol=1e-2, atol=1e-2)
    (gl,) = custom_calls(run.graphs[0], "grouped_linear")  # the 4 float32 ones (2 bf16 alone: no group)
    assert gl[4] == [3, 5, 4, 2]


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("lead", [(4,), (2, 3)])
def test_layer_norms_of_different_widths(affine, lead):
    torch.manual_seed(12)
    widths = [3, 8, 5, 16, 2]
    xs = [torch.randn(*lead, d) for d in widths]
    params = [torch.randn(d) for d in widths] * 2 if affine else []

    def f(*a):
        x = a[:5]
        if affine:
            w, b = a[5:10], a[10:]
            return torch.cat([F.layer_norm(xi, (xi.shape[-1],), wi, bi, eps=1e-3) for xi, wi, bi in zip(x, w, b)], -1)
        return torch.cat([F.layer_norm(xi, (xi.shape[-1],), eps=1e-3) for xi in x], -1)

    run = check_level(f, xs + params, "torch_ir")
    (ln,) = custom_calls(run.graphs[0], "batched_layer_norm")
    assert ln[4] == widths and ln[5] == 1e-3 and (ln[1] is None) == (not affine)
    assert run.ops(0)["layer_norm"] == 0


def test_layer_norm_over_two_dims_is_not_a_candidate():
    xs = [torch.randn(2, 3, d) for d in (4, 5, 6, 7)]
    run = check_level(lambda *a: [F.layer_norm(x, x.shape[-2:]).sum() for x in a], xs, "torch_ir")
    assert run.matched("batched_layer_norm") == 0 and run.ops(0)["layer_norm"] == 4


def test_a_symbolic_batch_groups_towers_over_one_split():
    """Towers over the chunks of one split share one row count: the column layout takes it
    symbolic (a sym_size node feeds the op's SymInt[] rows), with no guard on the batch.
    (``dynamic=True`` on a real module: the next test.)"""
    torch.manual_seed(13)
    f, ps = params_as_inputs(HeteroTowers())
    run = check_level(f, [torch.randn(4, 25)] + ps, "torch_ir", dynamic="batch")
    (gl,) = custom_calls(run.graphs[0], "grouped_linear")
    (ln,) = custom_calls(run.graphs[0], "batched_layer_norm")
    assert gl[-1] == ln[6] == "columns"
    rows = gl[3]
    assert len({id(r) for r in rows}) == 1 and isinstance(rows[0], torch.fx.Node) and rows[0].target is torch.ops.aten.sym_size.int


def test_a_symbolic_batch_groups_across_batch_sizes_without_recompiling():
    torch.manual_seed(17)
    model = HeteroTowers()
    compiled = optimus.compile(copy.deepcopy(model), passes="all", dynamic=True)
    for batch in (5, 9):
        x = torch.randn(batch, 25)
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        want, got = model(xe), compiled(xc)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        want.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-4, atol=1e-5)
    totals = compiled.optimus_report.rule_totals()
    assert totals["grouped_linear"].matched == 1 and totals["batched_layer_norm"].matched == 1
    assert sum(1 for g in compiled.optimus_report.graphs if g.level == "torch_ir" and not g.discarded) == 1  # no recompile


def test_symbolic_rows_in_the_packed_layout_decline_with_the_reason():
    torch.manual_seed(18)
    ks, ns = [3, 5, 7, 4, 6], [4, 6, 3, 8, 5]
    ws = [torch.randn(n, k) for k, n in zip(ks, ns)]

    def f(*a):  # separate inputs: the packed layout, whose member row counts must be constants
        return torch.cat([torch.relu(F.linear(x, w)).sum(0) for x, w in zip(a[:5], a[5:])])

    run = check_level(f, [torch.randn(6, k) for k in ks] + ws, "torch_ir", dynamic="batch")
    assert not custom_calls(run.graphs[0], "grouped_linear")
    assert any("row count is symbolic" in r for r in declines(run, "grouped_linear")), declines(run, "grouped_linear")



@pytest.mark.parametrize("level", LEVELS)
def test_non_contiguous_inputs_are_packed_by_copy(level):
    torch.manual_seed(14)
    ks, ns = [3, 5, 7, 4, 6], [4, 6, 3, 8, 5]
    xs = [torch.randn(k, 6) for k in ks]  # used transposed: (6, k) with strides (1, 6)
    ws = [torch.randn(n, k) for k, n in zip(ks, ns)]

    def f(*a):
        x, w = a[:5], a[5:]
        return torch.cat([torch.relu(F.linear(xi.t(), wi)) for xi, wi in zip(x, w)], 1)

    run = check_level(f, xs + ws, level, grad=level == "torch_ir")
    assert run.matched("grouped_linear" if level == "torch_ir" else "grouped_mm") == 1


# ------------------------------------------------------------------ the column layout
def _layouts(run, name):
    return [c[-1] for c in custom_calls(run.graphs[0], name)]


@pytest.mark.parametrize("level", LEVELS)
def test_towers_reading_the_chunks_out_of_order_still_read_the_input_in_place(level):
    """Tower i reads chunk (i * 2) % 5: the members are put in chunk order for the call and
    each result goes back to its own tower."""
    torch.manual_seed(15)
    ins, outs = (3, 5, 7, 4, 6), (4, 6, 3, 8, 5)
    order = [0, 2, 4, 1, 3]
    ws = [torch.randn(outs[j], ins[j]) for j in order]

    def f(x, *w):
        chunks = x.split(list(ins), -1)
        return torch.cat([torch.relu(F.linear(chunks[j], wi)) for j, wi in zip(order, w)], -1)

    run = check_level(f, [torch.randn(6, sum(ins))] + ws, level, grad=level == "torch_ir")
    name = "grouped_linear" if level == "torch_ir" else "grouped_mm"
    assert run.matched(name) == 1
    (gl,) = custom_calls(run.graphs[0], "grouped_linear")
    assert gl[4:6] == (list(ins), list(outs)) and gl[-1] == "columns", gl[3:]


def test_results_that_are_graph_outputs_keep_the_packed_layout():
    """A column-layout result is a strided view; a graph output keeps eager's strides, so such
    a group packs (and returns contiguous chunks) instead."""
    torch.manual_seed(16)
    ins, outs = (3, 5, 7, 4, 6), (4, 6, 3, 8, 5)
    ws = [torch.randn(n, k) for k, n in zip(ins, outs)]

    def f(x, *w):
        return tuple(F.linear(c, wi) for c, wi in zip(x.split(list(ins), -1), w))

    run = check_level(f, [torch.randn(4, sum(ins))] + ws, "torch_ir")
    assert run.matched("grouped_linear") == 1
    assert _layouts(run, "grouped_linear") == ["packed"]
    assert all(o.is_contiguous() for o in run.outputs)


def test_results_read_by_a_view_keep_the_packed_layout():
    """``y.view(-1)`` of a linear's result works on eager's contiguous result; a column block
    could not be viewed so, so the group packs."""
    torch.manual_seed(18)
    ins, outs = (3, 5, 7, 4, 6), (4, 6, 3, 8, 5)
    ws = [torch.randn(n, k) for k, n in zip(ins, outs)]

    def f(x, *w):
        ys = [F.linear(c, wi) for c, wi in zip(x.split(list(ins), -1), w)]
        return torch.cat([y.view(-1) for y in ys]) * 2

    run = check_level(f, [torch.randn(4, sum(ins))] + ws, "torch_ir")
    assert run.matched("grouped_linear") == 1
    assert _layouts(run, "grouped_linear") == ["packed"]


def test_chunks_not_all_read_by_the_group_are_packed():
    """One chunk of the split feeds something else: the group does not cover the input, so its
    members' inputs are packed."""
    torch.manual_seed(17)
    ins, outs = (3, 5, 7, 4, 6, 2), (4, 6, 3, 8, 5)
    ws = [torch.randn(n, k) for k, n in zip(ins, outs)]

    def f(x, *w):
        chunks = x.split(list(ins), -1)
        ys = [torch.relu(F.linear(c, wi)) for c, wi in zip(chunks, w)]
        return torch.cat(ys + [chunks[-1] * 2], -1)

    run = check_level(f, [torch.randn(4, sum(ins))] + ws, "torch_ir")
    assert _layouts(run, "grouped_linear") == ["packed"]


def _interpreter_problem():
    """Why the kernels cannot run in Triton's CPU interpreter here (None if they can): the
    probe of the kernel tests (tests/kernels/kernels_testutil.py)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "kernels" / "kernels_testutil.py"
    spec = importlib.util.spec_from_file_location("_kernels_testutil_for_rules", path)
    util = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(util)
    if not util.HAS_TRITON:
        return "triton not installed"
    return util.INTERPRETER_PROBLEM


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU + Triton interpreter test")
def test_rewritten_graph_runs_the_triton_kernels_in_the_interpreter(monkeypatch):
    """The packed operands the rules build are what the Triton kernels take: the same
    numerics through the kernels (Triton's CPU interpreter) as through eager."""
    from optimus import kernels as K
    import sys

    problem = _interpreter_problem()
    if problem:
        pytest.skip(problem)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    K.set_backend("triton")
    try:
        torch.manual_seed(15)
        f, ps = params_as_inputs(HeteroTowers(act=torch.relu))
        run = check_level(f, [torch.randn(3, 25)] + ps, "torch_ir")
        assert run.matched("grouped_linear") == 1 and run.matched("batched_layer_norm") == 1
        # the Triton modules were loaded (they are imported on the first launch only)
        assert {f"{K.__name__}.linear.kernel", f"{K.__name__}.layer_norm.kernel"} <= set(sys.modules)
    finally:
        K.set_backend("auto")


@pytest.mark.parametrize("level", LEVELS)
def test_kernel_rules_decline_on_cpu_tensors_by_default(level, monkeypatch):
    # Outside the test suite's setting, CPU tensors keep Inductor's own code: the custom ops'
    # CPU path is a slow plain-torch reference.
    from optimus.rules import _facts

    monkeypatch.setenv(_facts.KERNEL_RULES_ON_CPU_ENV, "0")
    torch.manual_seed(14)
    f, ps = params_as_inputs(HeteroTowers())
    rule = "grouped_linear" if level == "torch_ir" else "grouped_mm"
    run = check_level(f, [torch.randn(4, 25)] + ps, level, grad=level == "torch_ir")
    assert run.matched(rule) == 0 and not any(custom_calls(g, "grouped_linear") for g in run.graphs)
    assert declines(run, rule).get(_facts.CPU_REFERENCE_PATH, 0) >= 1, declines(run, rule)
    if level == "torch_ir":
        assert declines(run, "batched_layer_norm").get(_facts.CPU_REFERENCE_PATH, 0) >= 1


RANDOM_ACTS = [None, torch.relu, torch.tanh, torch.sigmoid, F.gelu]


@pytest.mark.parametrize("seed", range(16))
def test_random_towers_match_eager_in_either_layout(seed):
    """Random towers over one input's features: widths, lead dims, the order the towers read
    the chunks in, bias, activation, LayerNorm and its affine, and what reads the results (a
    cat of ReLUs, a sum, the graph's outputs, flattening reshapes) vary, so the rules take the
    column layout, the packed one, or both; outputs and gradients equal eager's at both levels."""
    rng = random.Random(seed)
    t = rng.randint(2, 7)
    ins, outs = [rng.randint(1, 12) for _ in range(t)], [rng.randint(1, 12) for _ in range(t)]
    lead = rng.choice([(5,), (3,), (2, 3), (1,)])
    order = list(range(t))
    if rng.random() < 0.4:
        rng.shuffle(order)
    bias, act, use_ln = rng.random() < 0.7, rng.choice(RANDOM_ACTS), rng.random() < 0.7
    affine = use_ln and rng.random() < 0.6
    tail = rng.choice(["cat", "sum", "outputs", "reshape"])
    params = [[torch.randn(outs[j], ins[j]) for j in order]]
    params += [[torch.randn(outs[j]) for j in order] for _ in range(int(bias) + 2 * int(affine))]

    def f(x, *p):
        lists = [list(p[i * t:(i + 1) * t]) for i in range(len(p) // t)]
        w, b = lists[0], lists[1] if bias else [None] * t
        lw, lb = (lists[-2], lists[-1]) if affine else ([None] * t, [None] * t)
        chunks = x.split(ins, -1)
        ys = []
        for i, j in enumerate(order):
            h = F.linear(chunks[j], w[i], b[i])
            h = act(h) if act is not None else h
            ys.append(F.layer_norm(h, (outs[j],), lw[i], lb[i]) if use_ln else h)
        if tail == "cat":
            return torch.cat([torch.relu(y) for y in ys], -1)
        if tail == "sum":
            return sum(y.sum() for y in ys)
        if tail == "reshape":
            return torch.cat([y.reshape(-1) for y in ys]) * 2
        return tuple(ys)

    inputs = [torch.randn(*lead, sum(ins))] + [p for ps in params for p in ps]
    for level in LEVELS:
        check_level(f, inputs, level, grad=level == "torch_ir")


@pytest.mark.parametrize("level", LEVELS)
def test_towers_over_the_features_of_an_unbind_read_them_in_place(level):
    """``unbind(x, 1)`` of a (rows, T, d) tensor gives features that are the column blocks of
    ``x.reshape(rows, T * d)``: the column layout reads them there (no pack of the inputs)."""
    torch.manual_seed(19)
    outs = (4, 6, 3, 8, 5)
    ws = [torch.randn(n, 7) for n in outs]

    def f(x, *w):
        return torch.cat([torch.relu(F.linear(feature, wi)) for feature, wi in zip(x.unbind(1), w)], -1)

    run = check_level(f, [torch.randn(6, len(outs), 7)] + ws, level, grad=level == "torch_ir")
    assert run.matched("grouped_linear" if level == "torch_ir" else "grouped_mm") == 1
    (gl,) = custom_calls(run.graphs[0], "grouped_linear")
    assert gl[-1] == "columns" and gl[4:6] == ([7] * len(outs), list(outs)), gl[3:]


def test_uniform_towers_over_one_split_take_the_grouped_op_when_the_bmm_is_declined():
    """batch_linear runs first and takes a uniform group; where it declines (here: its stack
    of the chunks, too large for max_stack_bytes), the column layout reads the chunks in place."""
    torch.manual_seed(20)
    ws = [torch.randn(5, 4) for _ in range(6)]

    def f(x, *w):
        return torch.cat([torch.relu(F.linear(c, wi)) for c, wi in zip(x.split(4, -1), w)], -1)

    passes = {"torch_ir": {"batch_linear": {"max_stack_bytes": 0}, "grouped_linear": True, "canonicalize_split_cat_args": True}}
    run = check_level(f, [torch.randn(8, 24)] + ws, "torch_ir", passes=passes)
    (gl,) = custom_calls(run.graphs[0], "grouped_linear")
    assert gl[-1] == "columns"
    assert run.matched("batch_linear") == 0


def _norm_towers(widths, acts, extra_use=False):
    """LayerNorms of distinct widths over the chunks of one input, each followed by its
    activation; ``extra_use``: the first norm's result is also returned (so its activation
    cannot be fused into the kernel)."""
    n = len(widths)

    def f(x, *p):
        ws, bs = p[:n], p[n:]
        hs = [F.layer_norm(c, (c.shape[-1],), w, b) for c, w, b in zip(x.split(widths, -1), ws, bs)]
        ys = [act(h) for act, h in zip(acts, hs)]
        return [torch.cat(ys, -1)] + ([hs[0]] if extra_use else [])

    def inputs(lead, dtype=torch.float32):
        g = torch.Generator().manual_seed(sum(widths) + len(lead))
        return [torch.randn(*lead, sum(widths), generator=g).to(dtype)] + \
            [torch.randn(d, generator=g) * 0.5 + 1 for d in widths] + [torch.randn(d, generator=g) for d in widths]

    return f, inputs


WIDTHS = [3, 8, 5, 16, 4, 6, 7, 2]  # enough members to group without the epilogue too


@pytest.mark.parametrize("lead", [(6,), (2, 3)])
@pytest.mark.parametrize("name", ["relu", "gelu", "silu", "sigmoid", "tanh"])
def test_the_activation_after_every_norm_is_the_kernel_epilogue(name, lead):
    act = {"relu": torch.relu, "gelu": F.gelu, "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}[name]
    f, inputs = _norm_towers(WIDTHS, [act] * len(WIDTHS))
    run = check_level(f, inputs(lead), "torch_ir")  # outputs and gradients against eager
    (ln,) = custom_calls(run.graphs[0], "batched_layer_norm")
    assert ln[7] == name and run.ops(0).get(name, 0) == 0 and run.ops(0)["layer_norm"] == 0, run.ops(0)


@pytest.mark.parametrize("acts,why", [
    ([torch.relu, torch.relu, torch.sigmoid] + [torch.relu] * 5, "the members' activations differ"),
    ([lambda h: F.gelu(h, approximate="tanh")] * 8, "the kernel's gelu is the erf one"),
])
def test_norms_keep_activations_the_epilogue_does_not_take(acts, why):
    f, inputs = _norm_towers(WIDTHS, acts)
    run = check_level(f, inputs((6,)), "torch_ir")
    (ln,) = custom_calls(run.graphs[0], "batched_layer_norm")
    assert ln[7] == "none", why


def test_a_norm_whose_result_is_used_elsewhere_keeps_its_activation():
    f, inputs = _norm_towers(WIDTHS, [torch.relu] * len(WIDTHS), extra_use=True)
    run = check_level(f, inputs((6,)), "torch_ir")
    (ln,) = custom_calls(run.graphs[0], "batched_layer_norm")
    assert ln[7] == "none" and run.ops(0)["relu"] >= 1


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
@pytest.mark.parametrize("name", ["relu", "sigmoid"])
def test_mixed_dtype_norms_fuse_what_commutes_with_their_rounding(name, autocast):
    """bf16 inputs with fp32 affines compute in fp32, and eager rounds the norm to bf16 (also
    under CPU autocast) before the activation: relu commutes with that rounding and is fused,
    sigmoid does not and stays outside the kernel."""
    act = {"relu": torch.relu, "sigmoid": torch.sigmoid}[name]
    f, inputs = _norm_towers(WIDTHS, [act] * len(WIDTHS))
    run = check_level(f, inputs((6,), torch.bfloat16), "torch_ir", autocast=autocast)
    (ln,) = custom_calls(run.graphs[0], "batched_layer_norm")
    assert ln[7] == (name if name == "relu" else "none")
    assert (run.ops(0).get(name, 0) == 0) == (name == "relu"), run.ops(0)
