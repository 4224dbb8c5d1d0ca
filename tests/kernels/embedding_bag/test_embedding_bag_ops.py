"""grouped_embedding_bag on the plain-torch path: semantics against F.embedding_bag / F.embedding
in float64, both input forms, gradients (dense, sparse, per-sample weights), bad input, the custom
ops (opcheck) and torch.compile(fullgraph=True) on the CPU."""

import pytest
import torch
import torch.nn.functional as F

from embedding_testutil import check_case, make_case, oracle, packed
from kernels_testutil import K, TOL

F64 = torch.float64
NS, DS = [7, 20, 33], [3, 16, 40]


@pytest.fixture(autouse=True)
def torch_backend():
    K.set_backend("torch")
    yield
    K.set_backend("auto")


# ------------------------------------------------------------------ semantics
@pytest.mark.parametrize("form", ["list", "packed"])
@pytest.mark.parametrize("modes", [["sum"] * 3, ["mean"] * 3, ["sum", "mean", "embedding"]])
def test_modes_jagged(form, modes):
    case = make_case(NS, DS, B=6, modes=modes, pads=[2, None, -3], dtype=F64, seed=1)
    check_case(case, TOL[F64], form=form)


@pytest.mark.parametrize("form", ["list", "packed"])
def test_per_sample_weights(form):
    case = make_case(NS, DS, B=5, modes=["sum"] * 3, pads=[None, 4, None], dtype=F64, psw=True, seed=2)
    check_case(case, TOL[F64], form=form)


def test_per_sample_weights_mixed_modes_list():
    case = make_case(NS, DS, B=5, modes=["sum", "mean", "sum"], dtype=F64, psw=True, seed=3)
    assert case.psw[1] is None
    check_case(case, TOL[F64])


@pytest.mark.parametrize("form", ["list", "packed"])
def test_fixed_bag_sizes(form):
    modes = ["sum", "mean", "sum"] if form == "list" else ["sum"] * 3  # packed psw: sum tables only
    case = make_case(NS, DS, B=4, modes=modes, pads=[1, None, 0], bag=[3, 1, 2], dtype=F64,
                     psw=True, seed=4)
    check_case(case, TOL[F64], form=form)


def test_fixed_and_jagged_tables_mixed():
    case = make_case(NS, DS, B=5, modes=["mean", "sum", "sum"], bag=[2, None, 1], dtype=F64, seed=5)
    check_case(case, TOL[F64])


def test_bag_size_one_is_embedding():
    """mode 'embedding' with [B, 1] indices is F.embedding, padding row included in the forward."""
    g = torch.Generator().manual_seed(6)
    ws = [torch.randn(10, 8, generator=g, dtype=F64, requires_grad=True),
          torch.randn(5, 4, generator=g, dtype=F64, requires_grad=True)]
    x = [torch.tensor([3, 0, 3, 9]), torch.tensor([1, 1, 4, 2])]
    out = K.grouped_embedding_bag(ws, [v[:, None] for v in x], mode="embedding", padding_idx=[3, None])
    ref = torch.cat([F.embedding(x[0], ws[0], padding_idx=3), F.embedding(x[1], ws[1])], 1)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert out[0, :8].abs().sum() > 0  # the padding row is returned, not zeroed
    gy = torch.randn_like(out)
    got = torch.autograd.grad(out, ws, gy)
    want = torch.autograd.grad(ref, ws, gy)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert got[0][3].abs().sum() == 0  # no gradient for the padding row
    # the same through the packed form with bag_size=1
    out2 = K.grouped_embedding_bag(ws, torch.cat(x), bag_size=1, mode="embedding", padding_idx=[3, None])
    torch.testing.assert_close(out2, ref, rtol=0, atol=0)


def test_output_layout_is_cat_of_tables():
    case = make_case(NS, DS, B=3, modes=["sum"] * 3, dtype=F64, seed=7)
    out = K.grouped_embedding_bag(case.weights, case.indices, case.offsets)  # mode "mean" by default
    parts = out.split(DS, dim=1)
    for t in range(3):
        torch.testing.assert_close(parts[t], F.embedding_bag(case.indices[t], case.weights[t], case.offsets[t]))


def test_include_last_offset_and_int32_mixed_dtypes():
    case = make_case(NS, DS, B=4, modes=["sum", "mean", "sum"], dtype=F64, seed=8)
    offs = [torch.cat([o, torch.tensor([x.numel()])]) for o, x in zip(case.offsets, case.indices)]
    idx = [case.indices[0].int(), case.indices[1], case.indices[2].int()]
    out = K.grouped_embedding_bag(case.weights, idx, [o.int() for o in offs], mode=case.modes,
                                  include_last_offset=True)
    ref, _, _ = oracle(case)
    torch.testing.assert_close(out, ref.detach())


def test_empty_bags_and_empty_tables():
    ws = [torch.randn(4, 3, dtype=F64), torch.randn(6, 5, dtype=F64)]
    idx = [torch.zeros(0, dtype=torch.long), torch.tensor([1, 2])]
    offs = [torch.zeros(3, dtype=torch.long), torch.tensor([0, 0, 0])]  # bags 0, 1 of table 1 empty
    out = K.grouped_embedding_bag(ws, idx, offs, mode=["mean", "sum"])
    assert out.shape == (3, 8)
    assert out[:, :3].abs().sum() == 0 and out[:2, 3:].abs().sum() == 0
    torch.testing.assert_close(out[2, 3:], ws[1][1] + ws[1][2])


@pytest.mark.parametrize("deterministic", [True, False])
def test_sparse_gradients(deterministic):
    case = make_case(NS, DS, B=6, modes=["sum", "mean", "sum"], pads=[None, 3, None], dtype=F64, psw=True,
                     seed=9)
    check_case(case, TOL[F64], sparse=[True, True, False], deterministic=deterministic)
    case = make_case(NS, DS, B=4, modes=["sum"] * 3, pads=[1, None, None], bag=[None, 2, None], dtype=F64,
                     psw=True, seed=13)
    check_case(case, TOL[F64], form="packed", sparse=True, deterministic=deterministic)


def test_sparse_packed_with_and_without_index_counts():
    case = make_case(NS, DS, B=5, modes=["sum"] * 3, pads=[None, 3, None], dtype=F64, seed=10)
    idx, off, _ = packed(case)
    counts = [x.numel() for x in case.indices]
    for ic in (counts, None):
        out = K.grouped_embedding_bag(case.weights, idx, off, mode="sum", padding_idx=case.pads, sparse=True,
                                      index_counts=ic)
        gy = torch.randn_like(out)
        got = torch.autograd.grad(out, case.weights, gy)
        ref, ws64, _ = oracle(case)
        want = torch.autograd.grad(ref, ws64, gy)
        for t, (a, b) in enumerate(zip(got, want)):
            assert a.is_sparse and a._nnz() == counts[t]
            torch.testing.assert_close(a.to_dense(), b)
    # padding entries are zero rows at padding_idx (the sum is unchanged)
    out = K.grouped_embedding_bag(case.weights, idx, off, mode="sum", padding_idx=case.pads, sparse=True)
    g1 = torch.autograd.grad(out.sum(), case.weights)[1]
    vals, rows = g1._values(), g1._indices()[0]
    is_pad = case.indices[1] == 3
    assert is_pad.any()
    assert (rows[is_pad] == 3).all() and vals[is_pad].abs().sum() == 0


def test_partial_requires_grad():
    case = make_case(NS, DS, B=4, modes=["sum"] * 3, dtype=F64, seed=11)
    case.weights[1].requires_grad_(False)
    out = K.grouped_embedding_bag(case.weights, case.indices, case.offsets, mode="sum")
    g0, g2 = torch.autograd.grad(out.sum(), [case.weights[0], case.weights[2]])
    ref, ws64, _ = oracle(case)
    r0, r2 = torch.autograd.grad(ref.sum(), [ws64[0], ws64[2]])
    torch.testing.assert_close(g0, r0)
    torch.testing.assert_close(g2, r2)


def test_bf16_matches_fp32_pooling():
    case = make_case(NS, DS, B=6, modes=["sum", "mean", "sum"], max_bag=8, dtype=torch.bfloat16, seed=12)
    check_case(case, TOL[torch.bfloat16])


# ------------------------------------------------------------------ bad input
def _good():
    ws = [torch.randn(5, 4), torch.randn(7, 8)]
    idx = [torch.tensor([0, 4, 2]), torch.tensor([6, 1])]
    offs = [torch.tensor([0, 1]), torch.tensor([0, 1])]
    return ws, idx, offs


@pytest.mark.parametrize("case,exc,words", [
    ("oob", IndexError, ["table 1", "value 9", "[0, 7)"]),
    ("negative_index", IndexError, ["table 0", "value -1"]),
    ("offsets_start", ValueError, ["table 1", "offsets[0]"]),
    ("offsets_unsorted", ValueError, ["table 0", "non-decreasing"]),
    ("offsets_past_end", ValueError, ["table 0", "offsets[-1]"]),
    ("dtype_mismatch", TypeError, ["weights[1]", "dtype"]),
    ("device_mismatch", ValueError, ["weights[1]", "meta"]),
    ("index_device", ValueError, ["indices[1]", "meta"]),
    ("index_dtype", TypeError, ["indices[0]", "int32 or int64"]),
    ("noncontig", ValueError, ["weights[0]", "contiguous"]),
    ("max_norm", ValueError, ["max_norm"]),
    ("scale_grad", ValueError, ["scale_grad_by_freq"]),
    ("mode_max", ValueError, ["'max'"]),
    ("mode_unknown", ValueError, ["mode[1]"]),
    ("psw_mean", ValueError, ["table 0", "mode 'sum'"]),
    ("psw_shape", ValueError, ["per_sample_weights[1]", "shape"]),
    ("batch_mismatch", ValueError, ["table 1", "bags"]),
    ("pad_range", ValueError, ["table 0", "padding_idx 5"]),
    ("n_tables", ValueError, ["2 tables", "1 index"]),
    ("empty", ValueError, ["empty"]),
    ("int_weights", TypeError, ["weights[0]", "dtype"]),
])
def test_bad_input(case, exc, words):
    ws, idx, offs = _good()
    kw = {}
    psw = None
    if case == "oob":
        idx[1] = torch.tensor([6, 9])
    elif case == "negative_index":
        idx[0] = torch.tensor([0, -1, 2])
    elif case == "offsets_start":
        offs[1] = torch.tensor([1, 1])
    elif case == "offsets_unsorted":
        idx[0] = torch.tensor([0, 4, 2])
        offs[0] = torch.tensor([0, 2, 1])
        offs[1] = torch.tensor([0, 1, 2])
        idx[1] = torch.tensor([6, 1])
    elif case == "offsets_past_end":
        offs[0] = torch.tensor([0, 5])
    elif case == "dtype_mismatch":
        ws[1] = ws[1].double()
    elif case == "device_mismatch":
        ws[1] = torch.empty(7, 8, device="meta")
    elif case == "index_device":
        idx[1] = torch.empty(2, dtype=torch.long, device="meta")
    elif case == "index_dtype":
        idx[0] = idx[0].float()
    elif case == "noncontig":
        ws[0] = torch.randn(4, 5).t()
    elif case == "max_norm":
        kw["max_norm"] = 1.0
    elif case == "scale_grad":
        kw["scale_grad_by_freq"] = True
    elif case == "mode_max":
        kw["mode"] = "max"
    elif case == "mode_unknown":
        kw["mode"] = ["sum", "avg"]
    elif case == "psw_mean":
        kw["mode"] = "mean"
        psw = [torch.ones(3), None]
    elif case == "psw_shape":
        psw = [None, torch.ones(3)]
    elif case == "batch_mismatch":
        offs[1] = torch.tensor([0, 1, 1])
    elif case == "pad_range":
        kw["padding_idx"] = 5
    elif case == "n_tables":
        idx, offs = idx[:1], offs[:1]
    elif case == "empty":
        ws = []
    elif case == "int_weights":
        ws = [w.long() for w in ws]
    with pytest.raises(exc) as ei:
        K.grouped_embedding_bag(ws, idx, offs, psw, **kw)
    for w in words:
        assert w in str(ei.value), str(ei.value)


def test_bad_packed_input():
    ws = [torch.randn(5, 4), torch.randn(7, 8)]
    idx = torch.tensor([0, 4, 2, 6, 1])
    with pytest.raises(ValueError, match="T \\* B \\+ 1"):
        K.grouped_embedding_bag(ws, idx, torch.tensor([0, 1, 3, 4]))
    with pytest.raises(IndexError, match="table 1.*value 7"):
        K.grouped_embedding_bag(ws, torch.tensor([0, 4, 2, 7, 1]), torch.tensor([0, 1, 3, 4, 5]))
    with pytest.raises(ValueError, match="offsets\\[-1\\]"):
        K.grouped_embedding_bag(ws, idx, torch.tensor([0, 1, 3, 4, 4]))
    with pytest.raises(ValueError, match="B \\* sum"):
        K.grouped_embedding_bag(ws, idx, bag_size=[1, 1])
    with pytest.raises(ValueError, match="offsets .* or bag_size"):
        K.grouped_embedding_bag(ws, idx)
    with pytest.raises(ValueError, match="index_counts\\[0\\] = 2 but the offsets give table 0 3"):
        K.grouped_embedding_bag(ws, idx, torch.tensor([0, 1, 3, 4, 5]), sparse=True, index_counts=[2, 3])


def test_op_rejects_bad_lists():
    ws = [torch.randn(5, 4)]
    with pytest.raises(ValueError, match="modes"):
        torch.ops.optimus.grouped_embedding_bag(ws, torch.tensor([1]), torch.tensor([0, 1]), None, [0, 0], [-1],
                                                [], [False], True, [])
    with pytest.raises(ValueError, match="index_counts"):
        torch.ops.optimus.grouped_embedding_bag(ws, torch.tensor([1]), torch.tensor([0, 1]), None, [0], [-1],
                                                [], [True], True, [])


# ------------------------------------------------------------------ custom ops
def _op_args(fixed=False, psw=True, sparse=(False, False)):
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(6, 3, generator=g, dtype=F64, requires_grad=True),
          torch.randn(4, 5, generator=g, dtype=F64, requires_grad=True)]
    if fixed:
        idx = torch.tensor([0, 5, 2, 2, 1, 3, 3, 0, 1])  # B = 3, bag sizes (2, 1)
        off, bag_sizes = None, [2, 1]
    else:
        idx = torch.tensor([0, 5, 2, 2, 1, 3, 3, 0])
        off, bag_sizes = torch.tensor([0, 2, 2, 4, 5, 8, 8]), []
    p = torch.rand(idx.numel(), generator=g, dtype=F64, requires_grad=True) if psw else None
    counts = [] if (fixed or not any(sparse)) else [4, 4]
    return (ws, idx, off, p, [0, 0], [-1, 3], bag_sizes, list(sparse), True, counts)


@pytest.mark.parametrize("fixed", [False, True])
def test_opcheck_forward(fixed):
    torch.library.opcheck(torch.ops.optimus.grouped_embedding_bag.default, _op_args(fixed=fixed))


def test_opcheck_mean_no_psw():
    args = list(_op_args(psw=False))
    args[4] = [1, 0]
    torch.library.opcheck(torch.ops.optimus.grouped_embedding_bag.default, tuple(args))


def test_opcheck_backward():
    ws, idx, off, p, modes, pads, bag_sizes, sparse, det, counts = _op_args()
    ws, p = [w.detach() for w in ws], p.detach()  # the backward op itself is not differentiable
    gy = torch.randn(3, 8, dtype=F64)
    args = (gy, ws, idx, off, p, modes, pads, bag_sizes, [False, True], det, [4, 4], [True, True], True)
    torch.library.opcheck(torch.ops.optimus.grouped_embedding_bag_backward.default, args)


def _model(ws, idx, off, psw):
    return K.grouped_embedding_bag(ws, idx, off, psw, mode=["sum", "mean"] if psw is None else "sum",
                                   padding_idx=[None, 1])


def _loss(out):
    return (out * out).sum() + out[:, :3].sum()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend):
    """The op inside a compiled function, forward and backward.  The function is the lookup alone
    (the loss is computed outside), so Inductor's graphs are the extern op calls plus views and no
    C++ kernel has to be compiled (that would take tens of seconds on the 2-core CI machine)."""
    g = torch.Generator().manual_seed(1)
    ws = [torch.randn(9, 3, generator=g, requires_grad=True), torch.randn(6, 4, generator=g, requires_grad=True)]
    idx = torch.tensor([0, 8, 2, 2, 1, 5, 3, 0, 1])
    off = torch.tensor([0, 2, 2, 4, 6, 9, 9])
    psw = torch.rand(9, generator=g, requires_grad=True)
    graphs = []

    def be(gm, example_inputs):
        graphs.append(gm)
        if backend == "inductor":
            from torch._inductor.compile_fx import compile_fx
            return compile_fx(gm, example_inputs)
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd
        return aot_autograd(fw_compiler=lambda g_, _: make_boxed_func(g_),
                            bw_compiler=lambda g_, _: make_boxed_func(g_))(gm, example_inputs)

    for p in (None, psw):
        leaves = ws + ([p] if p is not None else [])
        out0 = _model(ws, idx, off, p)
        g0 = torch.autograd.grad(_loss(out0), leaves)
        cf = torch.compile(_model, fullgraph=True, backend=be)
        out1 = cf(ws, idx, off, p)
        g1 = torch.autograd.grad(_loss(out1), leaves)
        torch.testing.assert_close(out1, out0, rtol=1e-5, atol=1e-5)
        for a, b in zip(g1, g0):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    targets = {str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert any("optimus.grouped_embedding_bag" in t for t in targets), targets


def test_torch_compile_list_form_and_sparse_error():
    g = torch.Generator().manual_seed(2)
    ws = [torch.randn(9, 3, generator=g, requires_grad=True), torch.randn(6, 4, generator=g, requires_grad=True)]
    idx = [torch.tensor([0, 8, 2]), torch.tensor([[1, 5], [3, 0]])]
    offs = [torch.tensor([0, 2]), None]

    def f(ws, idx, offs):
        return K.grouped_embedding_bag(ws, idx, offs, mode=["mean", "sum"]).square().sum()

    out0 = f(ws, idx, offs)
    out1 = torch.compile(f, fullgraph=True, backend="aot_eager")(ws, idx, offs)
    torch.testing.assert_close(out1, out0)

    def fs(ws, idx, offs):
        return K.grouped_embedding_bag(ws, idx, offs, mode="sum", sparse=True).sum()

    with pytest.raises(Exception, match="sparse gradients are not supported under torch.compile"):
        torch.compile(fs, fullgraph=True, backend="aot_eager")(ws, idx, offs)


class _SymbolicBags(torch.nn.Module):
    """The op called directly on two [B, L_t] index tensors with ``bag_sizes = [L_0, L_1]``
    (SymInts under dynamic=True); the tables are parameters (static shapes)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w0 = torch.nn.Parameter(torch.randn(6, 3, generator=g, dtype=F64))
        self.w1 = torch.nn.Parameter(torch.randn(4, 5, generator=g, dtype=F64))

    def forward(self, x0, x1):
        idx = torch.cat([x0.reshape(-1), x1.reshape(-1)])
        return torch.ops.optimus.grouped_embedding_bag([self.w0, self.w1], idx, None, None, [0, 1], [-1, 2],
                                                       [x0.shape[1], x1.shape[1]], [False, False], True, [])


def test_bag_sizes_are_symint_lists_in_both_schemas():
    """What lets the rule pass a symbolic bag length: both ops take ``SymInt[] bag_sizes``
    (custom_op infers it from ``List[int]``; a torch that inferred ``int[]`` would fail here)."""
    for op in (torch.ops.optimus.grouped_embedding_bag.default, torch.ops.optimus.grouped_embedding_bag_backward.default):
        assert "SymInt[] bag_sizes" in str(op._schema), op._schema


def test_symbolic_bag_sizes_compile_without_a_guard():
    """``bag_sizes`` is ``SymInt[]``: under dynamic=True the bag lengths reach the forward and
    the backward op as symbols, the fake implementations decide B = len(indices) // sum(L)
    without a guard (the old ``len % sum(L) == 0`` check guarded ``Eq(Mod(s0*s4 + s4*s40,
    s0 + s40), 0)`` for two lengths), and one compile serves other batch sizes and lengths."""
    from torch._dynamo.backends.registry import lookup_backend

    envs = []

    def backend(gm, example_inputs):
        fake = next(v for v in (n.meta.get("example_value") for n in gm.graph.nodes) if isinstance(v, torch.Tensor))
        envs.append(fake.fake_mode.shape_env)
        return lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    model = _SymbolicBags()
    compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
    for batch, l0, l1 in [(5, 3, 4), (8, 6, 2)]:
        g = torch.Generator().manual_seed(batch)
        x0, x1 = torch.randint(0, 6, (batch, l0), generator=g), torch.randint(0, 4, (batch, l1), generator=g)
        got = compiled(x0, x1)
        gw = torch.autograd.grad(got.square().sum(), [model.w0, model.w1])
        want = torch.cat([F.embedding_bag(x0, model.w0, mode="sum"),
                          F.embedding_bag(x1, model.w1, mode="mean", padding_idx=2)], 1)
        ew = torch.autograd.grad(want.square().sum(), [model.w0, model.w1])
        torch.testing.assert_close(got, want, rtol=TOL[F64], atol=TOL[F64])
        for a, b in zip(gw, ew):
            torch.testing.assert_close(a, b, rtol=TOL[F64], atol=TOL[F64])
    assert len(envs) == 1, "compiled again for other bag sizes"
    assert [str(g.expr) for g in envs[0].guards] == []
    assert all(not isinstance(v, int) and not getattr(v, "is_number", False) for v in envs[0].replacements.values())
