"""Gradients in the parameters' layout: after the batched rewrite of
identical linears (stack + bmm), each weight gradient arrives with its parameter's strides,
so AccumulateGrad takes it as it is instead of launching a copy per parameter."""

import copy

import pytest
import torch
import torch.nn as nn

import optimus
from optimus.core.levels import make_view


class Towers(nn.Module):
    def __init__(self, n=6, d=8, out=None, bias=True):
        super().__init__()
        self.d = d
        self.lin = nn.ModuleList([nn.Linear(d, out or d, bias=bias) for _ in range(n)])
        self.ln = nn.ModuleList([nn.LayerNorm(out or d) for _ in range(n)])

    def forward(self, x):
        return torch.cat([torch.relu(ln(lin(c))) for c, lin, ln in zip(x.split(self.d, 1), self.lin, self.ln)], 1)


def both_levels_backend(graphs):
    """Torch-IR rewrite, then AOTAutograd (Inductor's decompositions and partitioner) with the
    Aten-IR rewrite of the forward and backward graphs; the graphs run eagerly."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    def aten(gm, example_inputs):
        optimus.optimize(gm, level="aten_ir")
        graphs.append((gm, optimus.last_report()))
        return make_boxed_func(gm.forward)

    inner = aot_autograd(fw_compiler=aten, bw_compiler=aten, decompositions=select_decomp_table(),
                         partition_fn=min_cut_rematerialization_partition)

    def backend(gm, example_inputs):
        optimus.optimize(gm, level="torch_ir")
        graphs.append((gm, optimus.last_report()))
        return inner(gm, example_inputs)

    return backend


def matched(graphs, name):
    return sum(g.rules[name].matched for _, r in graphs for g in r.graphs if name in g.rules)


@pytest.mark.parametrize("n,d,out,batch", [(6, 8, None, 4), (5, 6, 10, 3), (4, 16, 4, 7)])
def test_batched_weight_gradients_have_the_parameters_strides(n, d, out, batch):
    torch.manual_seed(0)
    model = Towers(n, d, out)
    ref = copy.deepcopy(model)
    graphs = []
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=both_levels_backend(graphs), fullgraph=True)
    incoming = {}  # the gradient autograd hands to AccumulateGrad (which copies it when its strides differ)
    for name, p in model.named_parameters():
        p.register_hook(lambda grad, name=name: incoming.update({name: grad.stride()}))
    x = torch.randn(batch, n * d)
    y, y_ref = compiled(x), ref(x)
    torch.testing.assert_close(y, y_ref)
    g = torch.randn(y.shape)
    (y * g).sum().backward()
    (y_ref * g).sum().backward()
    assert matched(graphs, "batch_linear") == 1 and matched(graphs, "transpose_bmm_for_gradient_layout") == 1
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=name)
        assert incoming[name] == p.stride(), (name, incoming[name], p.stride())


def test_backward_graph_returns_row_major_weight_gradients():
    torch.manual_seed(1)
    graphs = []
    torch._dynamo.reset()
    model = Towers(bias=False)
    torch.compile(model, backend=both_levels_backend(graphs), fullgraph=True)(torch.randn(3, 48)).sum().backward()
    bw = graphs[-1][0]
    view = make_view("aten_ir", bw)
    assert view.outputs_are_gradients()
    out = next(n for n in bw.graph.nodes if n.op == "output")
    grads = [a for a in out.args[0] if a is not None and tuple(view.shape(a)) == (8, 8)]
    assert len(grads) == 6
    assert all(view.tensor_val(a).stride() == (8, 1) for a in grads)


def test_forward_graphs_are_left_alone():
    """The rule is about gradients: in a forward graph a transposed product stays a view."""
    from support import check_level

    def f(a, b):
        return torch.bmm(a, b).permute(0, 2, 1)

    run = check_level(f, [torch.randn(2, 3, 4), torch.randn(2, 4, 5)], "aten_ir", grad=False)
    assert run.matched("transpose_bmm_for_gradient_layout") == 0


def test_inductor_hands_the_row_major_gradients_back_as_computed():
    """Through Inductor (optimus.compile): Inductor records the backward's output strides
    before the post-grad passes and would copy each row-major weight gradient back to the
    traced (1, N) strides; Optimus updates that record, so the gradients reach
    AccumulateGrad in the parameters' strides as slices of one batched buffer."""
    from torch.multiprocessing.reductions import StorageWeakRef

    torch.manual_seed(2)
    model = Towers(6, 8, 10)
    ref = copy.deepcopy(model)
    torch._dynamo.reset()
    # the two rules involved (every rule would cost the test 20 s of compiling, not more checking)
    compiled = optimus.compile(model, passes={"torch_ir": ["batch_linear"], "aten_ir": ["transpose_bmm_for_gradient_layout"], "inductor_ir": "none"})
    incoming = {}
    for name, p in model.named_parameters():
        p.register_hook(lambda grad, name=name: incoming.update({name: (grad.stride(), StorageWeakRef(grad.untyped_storage()))}))
    x = torch.randn(5, 48)
    compiled(x).square().sum().backward()
    ref(x).square().sum().backward()
    report = compiled.optimus_report
    assert any("gradient(s) returned row-major as computed" in n for g in report.graphs for n in g.notes), str(report)
    weights = [n for n, _ in model.named_parameters() if n.startswith("lin.") and n.endswith(".weight")]
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert all(incoming[n][0] == (8, 1) for n in weights), {n: incoming[n][0] for n in weights}
    assert len({incoming[n][1] for n in weights}) == 1  # one batched buffer, no per-weight copy


def _output_graph(val, recorded):
    g = torch.fx.Graph()
    x = g.placeholder("tangents_1")
    x.meta["val"] = val
    out = g.output((x,))
    out.meta["original_output_strides"] = [recorded]
    return g, out


@pytest.mark.parametrize("val,recorded,adopted", [
    (torch.empty(8, 4), (1, 8), True),  # row-major computed, transposed recorded: adopted
    (torch.empty(4, 8).t(), (4, 1), False),  # computed transposed: the record stands
    (torch.empty(8, 4), (4, 1), False),  # already the same
    (torch.empty(8, 1), (1, 1), False),  # a size-1 dimension: the record is row-major already
])
def test_adopt_gradient_layouts_only_replaces_non_row_major_records(val, recorded, adopted):
    from optimus import torch_api

    g, out = _output_graph(val, recorded)
    assert torch_api.adopt_gradient_layouts(g) == (["tangents_1"] if adopted else [])
    assert out.meta["original_output_strides"][0] == (val.stride() if adopted else recorded)


def test_adopt_gradient_layouts_leaves_symbolic_strides_and_graphs_without_a_record():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from optimus import torch_api

    env = ShapeEnv()
    with FakeTensorMode(shape_env=env):
        sym = torch.empty(env.create_unbacked_symint(), 4)  # rows of a symbolic count
    g, out = _output_graph(sym, (1, 8))
    assert torch_api.adopt_gradient_layouts(g) == [] and out.meta["original_output_strides"][0] == (1, 8)
    g, out = _output_graph(torch.empty(8, 4), (1, 8))
    del out.meta["original_output_strides"]
    assert torch_api.adopt_gradient_layouts(g) == []
