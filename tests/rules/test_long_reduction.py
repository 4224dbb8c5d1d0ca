"""unbatch_long_reduction_bmm: a batched matmul whose reduction is long and whose outputs
are small runs as one mm per batch entry (the weight gradient of batch_linear over many
tokens); batch_mm does not batch such mm's back."""

import copy

import pytest
import torch
import torch.nn as nn
from support import check_level
from test_gradient_layout import both_levels_backend, matched

from optimus.core.levels import make_view
from optimus.rules.horizontal import LONG_REDUCTION, long_reduction


def test_the_threshold_keeps_short_reductions_batched():
    assert long_reduction(8, 64, 33792, 192)  # interformer's weight gradients
    assert not long_reduction(32, 64, 512, 64)  # towers32 / splitcat: the batched kernel is fast there
    assert not long_reduction(1024, 24, 2 * LONG_REDUCTION, 24)  # too many entries to unbatch
    assert not long_reduction(8, 128, LONG_REDUCTION, 128)  # long, but not long against its outputs


@pytest.mark.parametrize("g,p,k,q", [(3, 4, 4096, 5), (2, 8, 6000, 8)])
def test_a_long_reduction_bmm_becomes_one_mm_per_entry(g, p, k, q):
    def f(a, b):
        return torch.bmm(a, b) * 2

    # float64: the per-entry mm's sum the long reduction in another order than bmm
    a = torch.randn(g, p, k, dtype=torch.float64, requires_grad=True)
    b = torch.randn(g, k, q, dtype=torch.float64, requires_grad=True)
    run = check_level(f, [a, b], "aten_ir")  # outputs and gradients against eager
    assert run.matched("unbatch_long_reduction_bmm") >= 1
    fwd = run.ops(0)
    assert fwd["bmm"] == 0 and fwd["mm"] == g


def test_a_short_reduction_bmm_stays_batched():
    def f(a, b):
        return torch.bmm(a, b)

    run = check_level(f, [torch.randn(4, 8, 64), torch.randn(4, 64, 8)], "aten_ir", grad=False)
    assert run.matched("unbatch_long_reduction_bmm") == 0 and run.ops(0)["bmm"] == 1


def test_batch_mm_leaves_long_reductions_unbatched():
    def f(a0, b0, a1, b1, a2, b2):
        return torch.mm(a0, b0) + torch.mm(a1, b1) + torch.mm(a2, b2)

    xs = [t for _ in range(3) for t in (torch.randn(4, 4096), torch.randn(4096, 4))]
    run = check_level(f, xs, "aten_ir", grad=False)
    assert run.matched("batch_mm") == 0 and run.ops(0)["mm"] == 3


class Towers(nn.Module):
    def __init__(self, n=4, d=8):
        super().__init__()
        self.d = d
        self.lin = nn.ModuleList([nn.Linear(d, d) for _ in range(n)])

    def forward(self, x):
        return torch.cat([torch.relu(lin(c)) for c, lin in zip(x.split(self.d, 1), self.lin)], 1)


@pytest.mark.parametrize("tokens", [4096, 4608])
def test_batched_linears_over_many_tokens_get_per_member_weight_gradients(tokens):
    """batch_linear batches the forward; the backward's weight-gradient bmm (4, 8, tokens)
    @ (4, tokens, 8) is unbatched, each gradient in its parameter's layout."""
    torch.manual_seed(0)
    model = Towers()
    ref = copy.deepcopy(model)
    graphs = []
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=both_levels_backend(graphs), fullgraph=True)
    incoming = {}
    for name, p in model.named_parameters():
        p.register_hook(lambda grad, name=name: incoming.update({name: grad.stride()}))
    x = torch.randn(tokens, 32)
    y, y_ref = compiled(x), ref(x)
    torch.testing.assert_close(y, y_ref)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    assert matched(graphs, "batch_linear") == 1 and matched(graphs, "unbatch_long_reduction_bmm") == 1
    bw = graphs[-1][0]
    view = make_view("aten_ir", bw)
    ops = [view.classify(n).op for n in bw.graph.nodes if view.classify(n) is not None]
    assert ops.count("mm") >= 4 and "stack" not in ops
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
        assert incoming[name] == p.stride(), (name, incoming[name], p.stride())
