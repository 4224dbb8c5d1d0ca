"""Grad-mode, inference-mode and autocast regions are part of every rewrite's meaning
(optimus/core/regions.py): against eager, over two calls, forward and backward, with the
default passes and "all"."""

import copy

import pytest
import torch
import torch.fx as fx

import optimus
from optimus.core.regions import AMBIENT, Regions, Unknown
from support import check_level

PASSES = ["auto", "all"]


def _compile(model, passes):
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        return optimus.compile(model, passes=passes)


class _Towers(torch.nn.Module):
    """Four linear towers, the first run under no_grad; over one shared input, or over the
    parts of a split."""

    def __init__(self, split: bool) -> None:
        super().__init__()
        self.split = split
        self.towers = torch.nn.ModuleList(torch.nn.Linear(8 if split else 16, 8) for _ in range(4))

    def forward(self, x):
        parts = torch.split(x, 8, 1) if self.split else [x] * 4
        outs = []
        for i, (tower, part) in enumerate(zip(self.towers, parts)):
            if i == 0:
                with torch.no_grad():
                    outs.append(tower(part))
            else:
                outs.append(tower(part))
        return torch.cat(outs, 1)


def _sgd_steps(model, x, steps=2):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    grads = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        xi = x.detach().clone().requires_grad_()
        out = model(xi)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads.append((out.detach(), xi.grad, [None if p.grad is None else p.grad.clone() for p in model.parameters()]))
        opt.step()
    return grads


@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("split", [False, True], ids=["shared_input", "split_parts"])
def test_a_no_grad_tower_is_not_merged_with_its_grad_enabled_siblings(passes, split):
    torch.manual_seed(0)
    eager = _Towers(split)
    model = copy.deepcopy(eager)
    compiled = _compile(model, passes)
    x = torch.randn(32, 32 if split else 16)
    want = _sgd_steps(eager, x)
    got = _sgd_steps(compiled, x)
    for (wo, wx, wp), (go, gx, gp) in zip(want, got):  # two calls, each a step of SGD
        torch.testing.assert_close(go, wo, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(gx, wx, rtol=1e-4, atol=1e-5)
        assert [p is None for p in gp] == [p is None for p in wp]  # the no-grad tower gets none
        for a, b in zip(gp, wp):
            if b is not None:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    report = compiled.optimus_report
    declined = [r for s in report.rule_totals().values() for r in s.declined if "grad-mode/autocast regions" in r]
    # said why the first tower stayed apart; the other three still form one group
    assert any(r.endswith("(no_grad)") for r in declined) and any(r.endswith("(grad enabled)") for r in declined), report.table()


def _split_cat_under_no_grad(x, w):
    y = x @ w
    with torch.no_grad():
        z = torch.cat(torch.split(y, 2, 1), 1)
    return y, z


@pytest.mark.parametrize("passes", PASSES + ["vertical"])
def test_a_rewrite_does_not_carry_a_value_across_a_no_grad_boundary(passes):
    compiled = _compile(_split_cat_under_no_grad, passes)
    for _ in range(2):
        x, w = torch.randn(4, 6, requires_grad=True), torch.randn(6, 6, requires_grad=True)
        y, z = compiled(x, w)
        ey, ez = _split_cat_under_no_grad(x, w)
        assert (y.requires_grad, z.requires_grad) == (ey.requires_grad, ez.requires_grad) == (True, False)
        assert y.untyped_storage().data_ptr() != z.untyped_storage().data_ptr()
        torch.testing.assert_close(z, ez)
        y.sum().backward()
        torch.testing.assert_close(w.grad, x.detach().t() @ torch.ones(4, 6))


def _grad_flips(x, w):
    """Enters and leaves grad mode many times; enable_grad inside no_grad."""
    outs = []
    for i in range(6):
        with torch.set_grad_enabled(i % 2 == 0):
            outs.append(torch.relu(x @ w[i]))
    with torch.no_grad():
        with torch.enable_grad():
            outs.append(torch.tanh(x @ w[6]))
        outs.append(torch.tanh(x @ w[7]))
    return torch.cat(outs, 1)


@pytest.mark.parametrize("passes", PASSES)
def test_many_grad_mode_regions_keep_every_gradient(passes):
    compiled = _compile(_grad_flips, passes)
    for _ in range(2):
        x = torch.randn(5, 4, requires_grad=True)
        w = torch.randn(8, 4, 3, requires_grad=True)
        ex, ew = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        out, want = compiled(x, w), _grad_flips(ex, ew)
        torch.testing.assert_close(out, want)
        assert out.requires_grad == want.requires_grad
        (out * torch.arange(out.numel()).view_as(out)).sum().backward()
        (want * torch.arange(want.numel()).view_as(want)).sum().backward()
        torch.testing.assert_close(x.grad, ex.grad)
        torch.testing.assert_close(w.grad, ew.grad)
        assert w.grad[1].abs().sum() == 0 and w.grad[7].abs().sum() == 0  # no_grad members


def _nested_autocast(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = x @ w
        b = x @ w.t()
        with torch.autocast("cpu", enabled=False):
            c = x.float() @ w.float()
            d = x.float() @ w.float().t()
    return torch.cat([a.float(), b.float(), c, d], 1), a.dtype, c.dtype


@pytest.mark.parametrize("passes", PASSES)
def test_nested_autocast_regions_keep_their_dtypes(passes):
    compiled = _compile(lambda x, w: _nested_autocast(x, w)[0], passes)
    for _ in range(2):
        x = torch.randn(8, 8, requires_grad=True)
        w = torch.randn(8, 8, requires_grad=True)
        out = compiled(x, w)
        want = _nested_autocast(x, w)[0]
        torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(out[:, 16:], want[:, 16:])  # the fp32 region stays fp32
        out.sum().backward()


def test_inference_mode_tensors_as_inputs_to_a_training_graph():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    with torch.inference_mode():
        data = torch.randn(16, 8)  # an inference tensor
    for passes in PASSES:
        compiled = _compile(copy.deepcopy(model), passes)
        eager = copy.deepcopy(model)
        x = data.clone()  # eager needs a normal tensor for autograd too
        out = compiled(x)
        out.sum().backward()
        eager(x).sum().backward()
        for a, b in zip(compiled.parameters(), eager.parameters()):
            torch.testing.assert_close(a.grad, b.grad)


def _inference_mode_region(x, w):
    with torch.inference_mode():
        a = torch.cat(torch.split(x * 2, 2, 1), 1)
    return x @ w, a


def test_an_inference_mode_region_stays_apart():
    """(Whether ``a`` comes back an inference tensor is Dynamo's business: plain
    ``torch.compile`` returns a normal one too.)"""
    for passes in PASSES:
        compiled = _compile(_inference_mode_region, passes)
        for _ in range(2):
            x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
            y, a = compiled(x, w)
            ey, ea = _inference_mode_region(x, w)
            assert (y.requires_grad, a.requires_grad) == (ey.requires_grad, ea.requires_grad)
            torch.testing.assert_close(a, ea)
            y.sum().backward()


# ---------------------------------------------------------------- both FX levels
def _linears_in_two_regions(x, w1, w2, w3):
    a = x @ w1
    with torch.no_grad():
        b = x @ w2
    c = x @ w3
    return torch.cat([a.relu(), b.relu(), c.relu()], 1)


@pytest.mark.parametrize("level", ["torch_ir", "aten_ir"])
def test_regions_at_both_fx_levels(level):
    """Outputs and gradients as eager's at each level (the Aten-IR graphs carry no markers:
    AOTAutograd applied grad mode already)."""
    inputs = [torch.randn(6, 4), torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5)]
    check_level(_linears_in_two_regions, inputs, level)


# ---------------------------------------------------------------- the analysis itself
def _marked_graph():
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.relu, (x,))
    g.call_function(torch._C._set_grad_enabled, (False,))
    b = g.call_function(torch.relu, (x,))
    enter = g.call_function(torch.amp.autocast_mode._enter_autocast, ("cpu", torch.bfloat16, True, None))
    c = g.call_function(torch.relu, (x,))
    g.call_function(torch.amp.autocast_mode._exit_autocast, (enter,))
    g.call_function(torch._C._set_grad_enabled, (x,))  # a traced flag
    d = g.call_function(torch.relu, (x,))
    g.output((a, b, c, d))
    return g, (a, b, c, d)


def test_regions_read_the_state_each_node_runs_in():
    g, (a, b, c, d) = _marked_graph()
    regions = Regions(g)
    sa, sb, sc, sd = map(regions.state_at, (a, b, c, d))
    assert sa[0] == AMBIENT and sb[0] is False and sc[0] is False and isinstance(sd[0], Unknown)
    assert sb[2] == () and sc[2] != () and sd[2] == ()
    assert regions.autocast_entries(c) == [("cpu", "torch.bfloat16", "True", "None")]
    assert regions.markers_between(a, b) is not None and regions.markers_between(b, b) is None
    # a node built later at c's place runs in c's state
    with g.inserting_before(c):
        e = g.call_function(torch.neg, (x := next(iter(g.nodes)),))
    assert regions.state_at(e) == sc
    assert regions.problem([(c, e)], [e]) is None
    assert "no_grad" in regions.problem([(b, a)], [])  # an existing node from another grad region
    assert regions.problem([(c, b)], []) is None  # only autocast differs: the dtype check decides
    assert not Regions(fx.symbolic_trace(lambda t: t + 1).graph)  # no markers: one region
    del x


class _NormTowers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.towers = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.ReLU()) for _ in range(6))

    def forward(self, x):
        return torch.cat([t(p) for t, p in zip(self.towers, torch.split(x, 8, 1))], 1)


def test_a_model_called_under_autocast_keeps_its_dtypes_and_no_rule_errs():
    """Dynamo traces a call inside torch.autocast without a marker: the graph runs under the
    caller's autocast, and new nodes' metadata is computed under it too (a rule's result
    dtype is the one the program gets)."""
    torch.manual_seed(3)
    model = _NormTowers()
    compiled = _compile(copy.deepcopy(model), "all")
    for _ in range(2):
        x = torch.randn(16, 48)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, want = compiled(x), model(x)
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        got.float().sum().backward()
    report = compiled.optimus_report
    assert not report.errors(), report.errors()
    assert report.rule_totals()["batch_linear"].matched >= 1
    # bf16 inputs, fp32 weights: batched in fp32, the result cast back once (as eager's layer_norm)
    assert report.rule_totals()["batch_layer_norm"].matched >= 1
