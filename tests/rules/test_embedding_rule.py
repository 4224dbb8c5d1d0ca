"""group_embedding_lookups: independent embedding / embedding_bag lookups -> one grouped op.

Structural (which ops remain, how many lookups one op took, the cat after it removed) and
numeric (outputs, table gradients and per-sample-weight gradients equal eager, float64) at
Torch-IR (training: the op's autograd gives the grouped backward) and Aten-IR (inference
graphs, and plain embeddings in training forward graphs), plus every decline with its reason.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from support import LEVELS, check_level, run_level

RULE = "group_embedding_lookups"
F64 = torch.float64


def grouped_ops(run, which: int = 0) -> list[fx.Node]:
    return [n for n in run.graphs[which].graph.nodes if n.op == "call_function" and n.target is torch.ops.optimus.grouped_embedding_bag.default]


def tables_per_op(run, which: int = 0) -> list[int]:
    return [len(n.args[0]) for n in grouped_ops(run, which)]


def declines(run) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in run.reports:
        for g in r.graphs:
            st = g.rules.get(RULE)
            if st is not None:
                for reason, n in st.declined.items():
                    out[reason] = out.get(reason, 0) + n
    return out


def as_function(model: nn.Module):
    """The model as a function of (*inputs, *params), so check_level compares table gradients."""
    names = [n for n, _ in model.named_parameters()]

    def f(*args):
        k = len(args) - len(names)
        return torch.func.functional_call(model, dict(zip(names, args[k:])), args[:k])

    return f, [p.detach() for _, p in model.named_parameters()]


# ----------------------------------------------------------------------------- models
class BagList(nn.Module):
    """DLRM's sparse arch: one EmbeddingBag per feature of a [B, T, L] index tensor, cat."""

    def __init__(self, tables: int, rows: int, dim: int, mode: str = "sum") -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode=mode) for _ in range(tables))

    def forward(self, sparse):
        return torch.cat([t(sparse[:, i, :]) for i, t in enumerate(self.tables)], 1)


class FeatureDict(nn.Module):
    """Per-feature dict of bags of different dims, modes and padding rows, plus plain embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.bags = nn.ModuleDict(
            {
                "user": nn.EmbeddingBag(20, 4, mode="sum"),
                "item": nn.EmbeddingBag(30, 8, mode="mean", padding_idx=2),
                "geo": nn.EmbeddingBag(11, 3, mode="sum", padding_idx=-1),
            }
        )
        self.ids = nn.ModuleDict({"day": nn.Embedding(7, 5, padding_idx=0), "hour": nn.Embedding(24, 6)})

    def forward(self, feats: dict[str, torch.Tensor]):
        pooled = {k: m(feats[k]) for k, m in self.bags.items()}
        pooled.update({k: m(feats[k]) for k, m in self.ids.items()})
        return torch.cat([pooled[k] for k in ("user", "item", "geo", "day", "hour")], 1)


def feature_inputs(batch: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "user": torch.randint(0, 20, (batch, 3), generator=gen),
        "item": torch.randint(0, 30, (batch, 5), generator=gen),
        "geo": torch.randint(0, 11, (batch, 2), generator=gen),
        "day": torch.randint(0, 7, (batch,), generator=gen),
        "hour": torch.randint(0, 24, (batch,), generator=gen),
    }


def f64(model: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    for p in model.parameters():
        nn.init.normal_(p)
    return model.to(F64)


# ----------------------------------------------------------------------- Torch-IR training
@pytest.mark.parametrize("tables,batch,bag,dim", [(4, 3, 5, 4), (7, 8, 1, 16), (3, 1, 3, 2)])
def test_module_list_of_bags_is_one_lookup_and_the_cat_goes(tables, batch, bag, dim):
    f, ps = as_function(f64(BagList(tables, 13, dim)))
    sparse = torch.randint(0, 13, (batch, tables, bag), generator=torch.Generator().manual_seed(tables))
    run = check_level(f, [sparse] + ps, "torch_ir")
    ops = run.ops(0)
    assert tables_per_op(run) == [tables], run.graphs[0].graph
    assert ops["embedding_bag"] == 0 and ops["cat"] == 1, ops  # only the index packing cat is left
    assert run.matched(RULE) == 1


@pytest.mark.parametrize("batch", [1, 4, 9])
def test_feature_dict_of_bags_and_embeddings_different_dims_modes_padding(batch):
    f, ps = as_function(f64(FeatureDict()))
    feats = feature_inputs(batch, torch.Generator().manual_seed(batch))
    names = list(feats)

    def g(*args):
        return f(dict(zip(names, args[: len(names)])), *args[len(names) :])

    run = check_level(g, list(feats.values()) + ps, "torch_ir")
    assert tables_per_op(run) == [5], run.graphs[0].graph
    op = grouped_ops(run)[0]
    modes, pads, bag_sizes = op.args[4], op.args[5], op.args[6]
    assert modes == [0, 1, 0, 2, 2] and pads == [-1, 2, 10, 0, -1] and bag_sizes == [3, 5, 2, 1, 1]
    assert run.ops(0)["embedding"] == 0 and run.ops(0)["embedding_bag"] == 0


def test_embedding_of_2d_indices_keeps_its_shape():
    ws = [torch.randn(9, d, dtype=F64) for d in (3, 4, 5)]

    def f(x, w0, w1, w2):
        return [F.embedding(x[:, 0], w0), F.embedding(x[:, 1], w1, padding_idx=4), F.embedding(x[:, 2], w2)]

    x = torch.randint(0, 9, (4, 3, 2))  # each lookup takes [4, 2] indices -> [4, 2, D]
    run = check_level(f, [x] + ws, "torch_ir")
    assert tables_per_op(run) == [3]
    assert [tuple(o.shape) for o in run.outputs] == [(4, 2, 3), (4, 2, 4), (4, 2, 5)]


def test_per_sample_weights_and_their_gradient():
    ws = [torch.randn(10, d, dtype=F64) for d in (4, 2, 3)]

    def f(x, p, w0, w1, w2):
        return torch.cat([F.embedding_bag(x[:, i], w, per_sample_weights=p[:, i], mode="sum") for i, w in enumerate((w0, w1, w2))], 1)

    x = torch.randint(0, 10, (5, 3, 4))
    p = torch.rand(5, 3, 4, dtype=F64)
    run = check_level(f, [x, p] + ws, "torch_ir")  # p's gradient compared too
    assert tables_per_op(run) == [3]
    assert grouped_ops(run)[0].args[3] is not None


@pytest.mark.parametrize("include_last_offset", [False, True])
def test_offsets_form_jagged_bags_mixed_index_dtypes(include_last_offset):
    ws = [torch.randn(12, d, dtype=F64) for d in (3, 5, 2)]
    counts = [7, 4, 9]
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randint(0, 12, (n,), generator=gen).to(dt) for n, dt in zip(counts, (torch.int64, torch.int32, torch.int64))]
    offs = [torch.tensor([0, 2, 2, 5]), torch.tensor([0, 1, 3, 3], dtype=torch.int32), torch.tensor([0, 0, 4, 8])]
    if include_last_offset:
        offs = [torch.cat([o, torch.tensor([n], dtype=o.dtype)]) for o, n in zip(offs, counts)]

    def f(x0, x1, x2, o0, o1, o2, w0, w1, w2):
        modes = ("sum", "mean", "sum")
        return torch.cat(
            [F.embedding_bag(x, w, o, mode=m, include_last_offset=include_last_offset) for x, o, w, m in zip((x0, x1, x2), (o0, o1, o2), (w0, w1, w2), modes)],
            1,
        )

    run = check_level(f, xs + offs + ws, "torch_ir")
    assert tables_per_op(run) == [3]
    op = grouped_ops(run)[0]
    assert op.args[2] is not None and op.args[6] == []  # global offsets, no fixed bag sizes


def test_a_table_shared_by_two_lookups_gets_both_gradients():
    shared, other = torch.randn(10, 4, dtype=F64), torch.randn(10, 4, dtype=F64)

    def f(x, w, v):
        return torch.cat([F.embedding_bag(x[:, 0], w, mode="sum"), F.embedding_bag(x[:, 1], w, mode="mean"), F.embedding_bag(x[:, 2], v, mode="sum")], 1)

    run = check_level(f, [torch.randint(0, 10, (3, 3, 4)), shared, other], "torch_ir")
    op = grouped_ops(run)[0]
    assert len(op.args[0]) == 3 and op.args[0][0] is op.args[0][1]


def test_backward_graph_has_one_grouped_backward():
    """Under AOTAutograd the Torch-IR rewrite gives one grouped forward and one grouped backward."""
    f, ps = as_function(f64(BagList(5, 11, 4)))
    sparse = torch.randint(0, 11, (4, 5, 3))
    seen: list[fx.GraphModule] = []
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    import optimus

    def inner(gm, _):
        seen.append(gm)
        return make_boxed_func(gm.forward)

    def backend(gm, example_inputs):
        optimus.optimize(gm, passes="all", level="torch_ir")
        return aot_autograd(fw_compiler=inner, bw_compiler=inner)(gm, example_inputs)

    torch._dynamo.reset()
    args = [sparse] + [p.clone().requires_grad_() for p in ps]
    torch.compile(f, backend=backend, fullgraph=True)(*args).sum().backward()
    targets = [[str(n.target) for n in gm.graph.nodes if n.op == "call_function"] for gm in seen]
    fwd, bwd = targets
    assert fwd.count("optimus.grouped_embedding_bag.default") == 1 and not any("embedding_bag.default" in t and "optimus" not in t for t in fwd)
    assert bwd.count("optimus.grouped_embedding_bag_backward.default") == 1
    assert not any("embedding" in t and "optimus" not in t for t in bwd), bwd


# ------------------------------------------------------------------------------ Aten-IR
@pytest.mark.parametrize("batch,bag", [(3, 4), (6, 1)])
def test_aten_ir_inference_groups_bags(batch, bag):
    f, ps = as_function(f64(BagList(4, 10, 3, mode="mean")))
    run = check_level(f, [torch.randint(0, 10, (batch, 4, bag))] + ps, "aten_ir", grad=False)
    assert tables_per_op(run) == [4], run.graphs[0].graph
    assert run.ops(0)["embedding_bag"] == 0


def test_aten_ir_training_groups_embeddings_forward_and_keeps_their_backward():
    ws = [torch.randn(10, d, dtype=F64) for d in (3, 4, 2, 5)]

    def f(x, *w):
        return torch.cat([F.embedding(x[:, i], wi, padding_idx=1 if i == 1 else None) for i, wi in enumerate(w)], 1)

    run = check_level(f, [torch.randint(0, 10, (6, 4))] + ws, "aten_ir")  # table gradients compared
    assert tables_per_op(run, 0) == [4]
    assert run.ops(0)["embedding"] == 0


def test_aten_ir_training_bags_are_declined_with_the_reason():
    f, ps = as_function(f64(BagList(4, 10, 3)))
    run = check_level(f, [torch.randint(0, 10, (3, 4, 2))] + ps, "aten_ir")
    assert grouped_ops(run) == []
    assert any("offset2bag" in r for r in declines(run)), declines(run)


@pytest.mark.parametrize("level", LEVELS)
def test_two_lookups_in_inference_are_not_profitable(level):
    ws = [torch.randn(10, 3, dtype=F64) for _ in range(2)]

    def f(x, w0, w1):
        return F.embedding(x[:, 0], w0), F.embedding(x[:, 1], w1)

    run = check_level(f, [torch.randint(0, 10, (4, 2))] + [w.requires_grad_(False) for w in ws], level, grad=False)
    assert grouped_ops(run) == []
    assert any(r.startswith("not profitable") for r in declines(run)), declines(run)


# ----------------------------------------------------------------------------- declines
def _three_bags(**kw):
    def f(x, w0, w1, w2):
        return torch.cat([F.embedding_bag(x[:, i], w, **kw) for i, w in enumerate((w0, w1, w2))], 1)

    return f


def _tables(n=3, dtype=F64):
    return [torch.randn(10, 4, dtype=dtype) for _ in range(n)]


def test_max_norm_declines():
    run = check_level(_three_bags(max_norm=1.0, mode="sum"), [torch.randint(0, 10, (3, 3, 2))] + _tables(), "torch_ir", grad=False)
    assert grouped_ops(run) == []
    # max_norm renormalises the table in place: the view reports the write, the driver refuses it
    assert set(declines(run)) == {f"touches l_w{i}_, which aliases a tensor mutated in place" for i in range(3)}, declines(run)


@pytest.mark.parametrize("flag,text", [("sparse", "sparse=True"), ("scale_grad_by_freq", "scale_grad_by_freq")])
def test_gradient_only_options_decline_where_a_gradient_flows(flag, text):
    x = torch.randint(0, 10, (3, 3, 2))
    f = _three_bags(mode="sum", **{flag: True})
    if flag == "sparse":  # eager's sparse gradients: compare outputs only, check the decline
        run = run_level(f, [x] + _tables(), "torch_ir")
    else:
        run = check_level(f, [x] + _tables(), "torch_ir")
    assert grouped_ops(run) == []
    assert any(text in r for r in declines(run)), declines(run)
    # no gradient, no difference: grouped (forward semantics are the same)
    run = check_level(f, [x] + _tables(), "torch_ir", grad=False)
    assert tables_per_op(run) == [3]


def test_mode_max_declines():
    run = check_level(_three_bags(mode="max"), [torch.randint(0, 10, (3, 3, 2))] + _tables(), "torch_ir")
    assert grouped_ops(run) == []
    assert any("'max'" in r for r in declines(run)), declines(run)


def test_tables_of_different_dtypes_never_share_an_op():
    def f(x, a0, a1, a2, b0, b1, b2):
        outs = [F.embedding_bag(x[:, i], w, mode="sum") for i, w in enumerate((a0, b0, a1, b1, a2, b2))]
        return outs

    run = check_level(f, [torch.randint(0, 10, (3, 6, 2))] + _tables(3, F64) + _tables(3, torch.float32), "torch_ir")
    ops = grouped_ops(run)
    assert sorted(tables_per_op(run)) == [3, 3]
    for op in ops:
        assert len({w.meta["example_value"].dtype for w in op.args[0]}) == 1


def test_key_separates_devices():
    """Two devices cannot meet in a CPU test's compiled graph: check the key on a hand-built one."""
    from optimus.core.levels import make_view
    from optimus.rules.embedding import _lookup_key

    g = fx.Graph()
    x = g.placeholder("x")
    nodes = []
    for dev in ("cpu", "cpu", "meta"):
        w = g.placeholder(f"w_{dev}_{len(nodes)}")
        w.meta["val"] = torch.empty(10, 4, device=dev)
        nodes.append(g.call_function(F.embedding, (x, w)))
        nodes[-1].meta["val"] = torch.empty(5, 4, device=dev)
    x.meta["val"] = torch.zeros(5, dtype=torch.int64)
    g.output(tuple(nodes))
    view = make_view("torch_ir", fx.GraphModule({}, g))
    keys = [_lookup_key(view.classify(n), view) for n in nodes]
    assert keys[0] == keys[1] and keys[0] != keys[2]


def test_data_dependent_index_count_declines():
    ws = _tables()

    def f(x, m, w0, w1, w2):
        outs = []
        for i, w in enumerate((w0, w1, w2)):
            idx = torch.masked_select(x[i], m[i])  # unbacked length
            outs.append(F.embedding_bag(idx, w, torch.tensor([0]), mode="sum"))
        return torch.cat(outs, 1)

    x = torch.randint(0, 10, (3, 8))
    m = torch.rand(3, 8, generator=torch.Generator().manual_seed(0)) > 0.4
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        run = check_level(f, [x, m] + ws, "torch_ir")
    assert grouped_ops(run) == []
    assert any("data-dependent" in r for r in declines(run)), declines(run)


@pytest.mark.parametrize("level", LEVELS)
def test_dynamic_batch_groups_fixed_bags(level):
    f, ps = as_function(f64(BagList(4, 10, 3)))
    run = check_level(f, [torch.randint(0, 10, (5, 4, 2))] + ps, level, dynamic="batch", grad=level == "torch_ir")
    assert tables_per_op(run) == [4]


def test_user_mutation_of_a_table_is_respected():
    """A table written in place before its lookup is left alone (the driver's alias check)."""

    def f(x, w0, w1, w2, w3):
        w1 = w1.clone()
        w1.mul_(2)
        return torch.cat([F.embedding_bag(x[:, i], w, mode="sum") for i, w in enumerate((w0, w1, w2, w3))], 1)

    run = check_level(f, [torch.randint(0, 10, (3, 4, 2))] + _tables(4), "torch_ir")
    assert tables_per_op(run) == [3]
    assert run.ops(0)["embedding_bag"] == 1


def test_out_of_range_index_still_raises_naming_the_table():
    f = _three_bags(mode="sum")
    x = torch.randint(0, 10, (3, 3, 2))
    x[1, 2, 0] = 10  # table 2 has 10 rows
    with pytest.raises(Exception, match="table 2"):
        run_level(f, [x] + _tables(), "torch_ir", grad=False)


@pytest.mark.parametrize("name,tables", [("dlrm", 6), ("wukong", 7)])
def test_zoo_models_group_every_table(name, tables):
    """The zoo's dlrm (EmbeddingBags in a ModuleList, cat + split after) and wukong (the
    shared DenseSparseFeatures front end of wukong, dhen, dcnv2): one grouped op each."""
    from optimus.tools.models import get_model

    zoo = get_model(name, "small")
    f, ps = as_function(zoo.model.double())
    inputs = [t.double() if t.is_floating_point() else t for t in zoo.inputs]
    run = check_level(f, inputs + ps, "torch_ir")
    assert tables_per_op(run) == [tables]
    assert run.ops(0)["embedding"] + run.ops(0)["embedding_bag"] == 0


@pytest.mark.slow  # an Inductor CPU compile: 10-80 s on the shared machine
def test_inductor_compiles_the_aten_ir_rewrite_of_jagged_bags():
    """End to end through Inductor (CPU), Aten-IR only: the packed offsets (a constant total
    as a graph buffer) and the custom op as an extern kernel."""
    import optimus

    gen = torch.Generator().manual_seed(5)
    ws = [torch.randn(12, d, generator=gen) for d in (3, 5, 2, 4)]
    xs = [torch.randint(0, 12, (n,), generator=gen) for n in (7, 4, 9, 5)]
    offs = [torch.tensor([0, 2, 2, 5]), torch.tensor([0, 1, 3, 3], dtype=torch.int32), torch.tensor([0, 0, 4, 8]), torch.tensor([0, 1, 2, 3])]

    def f(xs, offs, ws):
        return torch.cat([F.embedding_bag(x, w, o, mode="sum") for x, o, w in zip(xs, offs, ws)], 1) * 2

    torch._dynamo.reset()
    compiled = optimus.compile(f, passes={"torch_ir": "none", "aten_ir": "all", "inductor_ir": "none"})
    with torch.no_grad():
        torch.testing.assert_close(compiled(xs, offs, ws), f(xs, offs, ws))
    matched = [g.rules[RULE].matched for g in compiled.optimus_report.graphs if RULE in g.rules]
    assert matched == [1]


def test_cpu_tensors_decline_by_default(monkeypatch):
    # the suite sets OPTIMUS_KERNEL_RULES_ON_CPU=1 (tests/conftest.py); without it CPU lookups
    # keep Inductor's code (the op's CPU path is a plain-torch reference)
    from optimus.rules import _facts

    monkeypatch.setenv(_facts.KERNEL_RULES_ON_CPU_ENV, "0")
    run = check_level(_three_bags(mode="sum"), [torch.randint(0, 10, (3, 3, 2))] + _tables(), "torch_ir")
    assert grouped_ops(run) == []
    assert _facts.CPU_REFERENCE_PATH in declines(run), declines(run)


# ------------------------------------------------------------------ what the planner is told
@pytest.mark.parametrize("cat", [True, False])
@pytest.mark.parametrize("deterministic", [True, False])
def test_what_the_grouped_backward_holds(cat, deterministic):
    """``backward_held``: the deterministic backward's key and sort buffers for its largest piece
    (44 bytes an entry; the atomic one holds nothing more for fp32 tables), plus the output
    gradient less one member's unless a cat takes the outputs in order (the op then reads the
    slice of the cat's gradient the lookups' gradients were)."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from optimus.core.group import find_groups
    from optimus.core.levels import make_view
    from optimus.core.registry import REGISTRY
    from optimus.rules import embedding

    def f(x, w0, w1, w2):
        outs = [F.embedding_bag(x[:, i], w, mode="sum") for i, w in enumerate((w0, w1, w2))]
        return torch.cat([x[:, 0].float()] + outs, 1) if cat else tuple(o * 2 for o in outs)

    batch, bag, dims = 8, 5, (4, 6, 8)
    x = torch.randint(0, 10, (batch, 3, bag))
    for grad in (True, False):
        ws = [torch.randn(10, d, requires_grad=grad) for d in dims]
        gm = fx.symbolic_trace(f)
        FakeTensorProp(gm).propagate(x, *ws)
        for n in gm.graph.find_nodes(op="placeholder"):  # tables as Dynamo records parameters
            if n.name.startswith("w"):
                n.meta["val"] = n.meta["val"].detach().requires_grad_(grad)
        view = make_view("torch_ir", gm)
        rule = REGISTRY.get(RULE)
        options = {**rule.option_defaults(), "deterministic": deterministic}
        (group,) = find_groups(view, rule, options, lambda n: None, lambda n, r: None)
        outputs = [batch * d * 4 for d in dims]
        want = (3 * batch * bag * 44 if deterministic else 0) + (0 if cat else sum(outputs) - max(outputs))
        assert embedding._backward_held(group, 3) == (want if grad else 0), (cat, deterministic, grad)
        assert embedding._backward_held(group, 2) == ((2 * batch * bag * 44 if deterministic else 0) + (0 if cat else outputs[0]) if grad else 0)
