"""grouped_mm in Aten-IR backward graphs (optimus/rules/grouped_kernels.py, option
``backward_graphs``): the independent dX / dW matmuls of layers of different shapes become
one optimus::grouped_linear call; the gradients it returns are disjoint chunks of one buffer.
Structural (what the backward graph holds) and numeric (outputs and every gradient against
eager, two batch sizes) on the CPU, where the op runs its plain-torch path."""

import pytest
import torch

from optimus.rules import grouped_kernels as gk
from support import _run, check_level, run_level

from test_grouped_kernels import HeteroTowers, custom_calls, declines, params_as_inputs

OPT_IN = {"aten_ir": {"all": True, "grouped_mm": {"backward_graphs": True}}}


def _backward(run):
    (bw,) = [g for g in run.graphs if any(n.op == "placeholder" and n.name.startswith("tangents") for n in g.graph.nodes)]
    return bw


def _mms(gm):
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.mm.default)


@pytest.mark.parametrize("batch", [4, 9])
def test_backward_matmuls_of_different_shapes_become_one_grouped_gemm(batch):
    torch.manual_seed(11)
    f, ps = params_as_inputs(HeteroTowers(act=torch.relu))
    inputs = [torch.randn(batch, 25)] + ps
    plain = check_level(f, inputs, "aten_ir")  # the default: backward graphs left alone
    run = check_level(f, inputs, "aten_ir", passes=OPT_IN)  # outputs and all gradients == eager
    before, after = _backward(plain), _backward(run)
    assert not custom_calls(before, "grouped_linear")
    assert declines(plain, "grouped_mm").get(gk.BACKWARD_OPT_IN, 0) >= 1
    calls = custom_calls(after, "grouped_linear")
    assert calls, "no grouped GEMM in the backward graph"
    # 5 towers: a dX and a dW matmul each (x requires grad); every one is now in a grouped call
    assert _mms(before) == 10 and _mms(after) == 0, (_mms(before), _mms(after))
    assert sum(len(c[3]) for c in calls) == 10
    # the forward graph is unchanged (partitioned forward graphs still decline)
    assert declines(run, "grouped_mm").get(gk.TRAINING_GRAPH, 0) >= 5


def test_long_reductions_decline_and_the_rest_still_group():
    # dW_i = dY_i^T @ X_i reduces over the 4096 rows of the batch with tiny outputs: a long
    # reduction (one mm per member splits it); the dX_i reduce over a few columns and group.
    torch.manual_seed(12)
    f, ps = params_as_inputs(HeteroTowers(act=torch.relu))
    inputs = [torch.randn(4096, 25)] + ps
    _, expected = _run(f, inputs)
    run = run_level(f, inputs, "aten_ir", passes=OPT_IN)
    for got, want in zip(run.grads, expected):  # sums over 4096 rows: compared by norm
        assert (got - want).norm() <= 1e-5 * want.norm(), (got - want).norm() / want.norm()
    bw = _backward(run)
    reasons = declines(run, "grouped_mm")
    assert any(r.startswith("a member's reduction is long") for r in reasons), reasons
    (call,) = custom_calls(bw, "grouped_linear")
    assert call[3] == [4096] * 5  # the dX products: M = batch rows, reduction over N
    assert _mms(bw) == 5  # the dW products stay one mm each


def test_backward_gradients_are_not_aliased_with_inputs():
    # The grouped result is a fresh buffer: no gradient may alias a parameter or input.
    torch.manual_seed(13)
    f, ps = params_as_inputs(HeteroTowers())
    xs = [torch.randn(6, 25)] + ps
    args = [t.detach().clone().requires_grad_() for t in xs]
    run = check_level(f, xs, "aten_ir", passes=OPT_IN)
    assert custom_calls(_backward(run), "grouped_linear")
    storages = {a.untyped_storage().data_ptr() for a in args}
    for g in run.grads:
        assert g is not None and g.untyped_storage().data_ptr() not in storages
