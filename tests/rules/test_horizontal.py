"""Horizontal rules: structural (which ops remain, what merged) and numeric (outputs and
gradients equal eager), including the bad cases: mixed dtypes, bias on some members,
in-place mutation of outputs, dynamic shapes, keyword/positional forms."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from support import LEVELS, check_level


class Towers(nn.Module):
    """Per-feature towers: Linear -> LayerNorm -> ReLU on each chunk, then cat."""

    def __init__(self, n=6, d=8, bias=True):
        super().__init__()
        self.d = d
        self.lin = nn.ModuleList([nn.Linear(d, d, bias=bias) for _ in range(n)])
        self.ln = nn.ModuleList([nn.LayerNorm(d) for _ in range(n)])

    def forward(self, x):
        xs = x.split(self.d, 1)
        return torch.cat([torch.relu(ln(lin(c))) for c, lin, ln in zip(xs, self.lin, self.ln)], 1)


def params_as_inputs(model):
    """The model as a function of (x, *params) so check_level compares parameter grads too."""
    names = [n for n, _ in model.named_parameters()]

    def f(x, *ps):
        return torch.func.functional_call(model, dict(zip(names, ps)), (x,))

    return f, [p.detach() for _, p in model.named_parameters()]


def test_towers_torch_ir_batches_every_stage():
    torch.manual_seed(0)
    model = Towers()
    f, ps = params_as_inputs(model)
    run = check_level(f, [torch.randn(4, 48)] + ps, "torch_ir")
    ops = run.ops(0)
    assert ops["linear"] == 0 and ops["baddbmm"] == 1, ops
    assert ops["layer_norm"] == 1 and ops["relu"] == 1, ops
    assert ops["split"] == 0 and ops["cat"] == 0 and ops["unbind"] == 0, ops
    for name in ("batch_linear", "batch_layer_norm", "batch_pointwise"):
        assert run.matched(name) == 1, name


def test_towers_aten_ir_batches_matmuls_forward_and_backward():
    torch.manual_seed(0)
    f, ps = params_as_inputs(Towers())
    run = check_level(f, [torch.randn(4, 48)] + ps, "aten_ir")
    fwd, bwd = run.ops(0), run.ops(1)
    assert fwd["addmm"] == 0 and fwd["baddbmm"] == 1, fwd
    assert bwd["mm"] == 0 and bwd["bmm"] >= 1, bwd
    assert run.matched("batch_mm") >= 2


@pytest.mark.parametrize("level", LEVELS)
def test_towers_without_bias(level):
    f, ps = params_as_inputs(Towers(bias=False))
    check_level(f, [torch.randn(3, 48)] + ps, level)


@pytest.mark.parametrize("level", LEVELS)
def test_linear_lhs_shared_input(level):
    ws = [torch.randn(n, 8) for n in (3, 5, 7, 4)]
    bs = [torch.randn(n) for n in (3, 5, 7, 4)]

    def f(x, *wb):
        w, b = wb[:4], wb[4:]
        return [F.linear(x, w[0], b[0]), F.linear(input=x, weight=w[1], bias=b[1]), torch._C._nn.linear(x, w[2], b[2]), F.linear(x, w[3], bias=b[3])]

    run = check_level(f, [torch.randn(6, 8)] + ws + bs, level)
    if level == "torch_ir":
        assert run.matched("batch_linear_lhs") == 1 and run.ops(0)["linear"] == 1


def test_bias_on_some_members_only_never_mixes():
    w = [torch.randn(4, 4) for _ in range(12)]
    b = [torch.randn(4) for _ in range(6)]

    def f(x, *p):
        xs = x.split(4, 1)
        outs = [F.linear(xs[i], p[i], p[12 + i]) for i in range(6)] + [F.linear(xs[i], p[i]) for i in range(6, 12)]
        return torch.cat(outs, 1)

    run = check_level(f, [torch.randn(5, 48)] + w + b, "torch_ir")
    assert run.matched("batch_linear") == 2  # one group with bias, one without
    assert run.ops(0)["baddbmm"] == 1 and run.ops(0)["bmm"] == 1


def test_mixed_dtypes_are_not_grouped():
    def f(a, b, c, d, w1, w2, w3, w4):
        return F.linear(a, w1), F.linear(b, w2), F.linear(c.double(), w3.double()), F.linear(d.double(), w4.double())

    run = check_level(f, [torch.randn(3, 4) for _ in range(4)] + [torch.randn(4, 4) for _ in range(4)], "torch_ir")
    assert run.ops(0)["linear"] == 4  # two groups of two: declined as not profitable


def test_profitability_decline_is_reported():
    def f(a, b, w1, w2, b1, b2):
        return F.linear(a, w1, b1), F.linear(b, w2, b2)

    run = check_level(f, [torch.randn(3, 4), torch.randn(3, 4), torch.randn(4, 4), torch.randn(4, 4), torch.randn(4), torch.randn(4)], "torch_ir")
    reasons = [r for rep in run.reports for g in rep.graphs for s in g.rules.values() for r in s.declined]
    assert any("not profitable" in r for r in reasons), reasons
    assert run.ops(0)["linear"] == 2


def test_outputs_mutated_in_place_decline():
    def f(x, *ws):
        xs = x.split(4, 1)
        ys = [F.linear(c, w) for c, w in zip(xs, ws)]
        ys[0].add_(1)  # an output of a member is written in place
        return torch.cat(ys, 1)

    run = check_level(f, [torch.randn(3, 16)] + [torch.randn(4, 4) for _ in range(4)], "torch_ir", grad=False)
    assert run.ops(0)["linear"] >= 1
    reasons = [r for rep in run.reports for g in rep.graphs for s in g.rules.values() for r in s.declined]
    assert any("mutated in place" in r for r in reasons), reasons


@pytest.mark.parametrize("level", LEVELS)
def test_dynamic_batch_dim(level):
    f, ps = params_as_inputs(Towers(n=4))
    run = check_level(f, [torch.randn(5, 32)] + ps, level, dynamic="batch")
    check_level(f, [torch.randn(7, 32)] + ps, level, dynamic="batch")
    if level == "torch_ir":
        assert run.matched("batch_linear") == 1


@pytest.mark.parametrize(
    "op",
    [
        lambda c, y: torch.add(c, y, alpha=2),
        lambda c, y: torch.sub(c, 0.5, alpha=3),
        lambda c, y: torch.div(c, y, rounding_mode="floor"),
        lambda c, y: torch.clamp(c, min=-0.2, max=0.3),
        lambda c, y: torch.nan_to_num(c, nan=1.0, posinf=2.0, neginf=-2.0),
        lambda c, y: F.gelu(c, approximate="tanh"),
        lambda c, y: F.leaky_relu(c, 0.3),
        lambda c, y: F.dropout(c, 0.3, training=False) * 2,
    ],
)
@pytest.mark.parametrize("level", LEVELS)
def test_batch_pointwise_keeps_every_argument(level, op):
    def f(x, y):
        # elementwise work on each of several chunks that later feed separate consumers
        outs = [op(c, y) for c in x.unbind(1)]
        return [o.sum(0) for o in outs]

    check_level(f, [torch.randn(3, 5, 4), torch.rand(4) + 0.5], level)


def test_batch_pointwise_merges_parts_of_one_tensor():
    def f(x):
        return [torch.sigmoid(c).sum(0) for c in x.unbind(1)]

    run = check_level(f, [torch.randn(3, 5, 4)], "torch_ir")
    assert run.matched("batch_pointwise") == 1 and run.ops(0)["sigmoid"] == 1


def test_training_dropout_is_not_batched():
    def f(x):
        return [F.dropout(c, 0.5, training=True) for c in x.unbind(0)]

    from support import run_level

    run = run_level(f, [torch.randn(4, 3)], "torch_ir")
    assert run.matched("batch_pointwise") == 0 and run.ops(0)["dropout"] == 4


@pytest.mark.parametrize("level", LEVELS)
def test_batch_pointwise_broadcasts_a_tensor_every_member_shares(level):
    # dcnv2's x0 * expert_i: x0 is not stacked G times (a copy, and a (G, ...) gradient
    # buffer in the backward); it broadcasts against the stacked other operand
    def f(x0, y):
        return [(x0 * c).sum(0) for c in y.unbind(1)]

    run = check_level(f, [torch.randn(3, 4), torch.randn(3, 5, 4)], level)
    assert run.matched("batch_pointwise") == 1
    ops = run.ops(0)
    assert ops.get("mul") == 1 and ops.get("stack", 0) == 0 and ops.get("cat", 0) == 0, ops
