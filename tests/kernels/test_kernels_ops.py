"""optimus.kernels on the plain-torch path: API, bad inputs, custom ops, torch.compile tracing."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from kernels_testutil import K, REPO, TOL, check_gl, check_ln, make_gl, make_ln


@pytest.fixture(autouse=True)
def torch_backend():
    K.set_backend("torch")
    yield
    K.set_backend("auto")


# ------------------------------------------------------------------ public functions, CPU path
def test_grouped_linear_matches_loop():
    dims = [(9, 8, 5), (0, 4, 3), (3, 6, 7)]
    xs, ws, bs = make_gl(dims, torch.float64, seed=1)
    check_gl(xs, ws, bs, "gelu", TOL[torch.float64])


def test_batched_layer_norm_matches_loop():
    xs, ws, bs = make_ln([(5, 7), (0, 3), (4, 16)], torch.float64, seed=2)
    check_ln(xs, ws, bs, TOL[torch.float64])


# ------------------------------------------------------------------ bad input
def _xwb():
    xs = [torch.randn(4, 8), torch.randn(3, 16), torch.randn(2, 8)]
    ws = [torch.randn(5, 8), torch.randn(6, 16), torch.randn(7, 8)]
    bs = [torch.randn(5), torch.randn(6), torch.randn(7)]
    return xs, ws, bs


@pytest.mark.parametrize("case,exc,words", [
    ("k_mismatch", ValueError, ["member 1", "xs[1]", "weights[1]"]),
    ("dtype", TypeError, ["weights[2]", "float16"]),
    ("device", ValueError, ["xs[1]", "meta"]),
    ("noncontig_x", ValueError, ["xs[2]", "contiguous"]),
    ("noncontig_w", ValueError, ["weights[0]", "contiguous"]),
    ("bias_shape", ValueError, ["biases[2]", "member 2"]),
    ("empty", ValueError, ["empty"]),
    ("len_mismatch", ValueError, ["3 inputs", "2 weights"]),
    ("not_tensor", TypeError, ["xs[1]"]),
    ("activation", ValueError, ["activation"]),
    ("int_dtype", TypeError, ["xs[0]", "dtype"]),
])
def test_grouped_linear_bad_input(case, exc, words):
    xs, ws, bs = _xwb()
    act = None
    if case == "k_mismatch":
        ws[1] = torch.randn(6, 15)
    elif case == "dtype":
        ws[2] = ws[2].half()
    elif case == "device":
        xs[1] = torch.empty(3, 16, device="meta")
    elif case == "noncontig_x":
        xs[2] = torch.randn(8, 2).t()
    elif case == "noncontig_w":
        ws[0] = torch.randn(8, 5).t()
    elif case == "bias_shape":
        bs[2] = torch.randn(6)
    elif case == "empty":
        xs, ws, bs = [], [], None
    elif case == "len_mismatch":
        ws = ws[:2]
    elif case == "not_tensor":
        xs[1] = [1.0, 2.0]
    elif case == "activation":
        act = "swish"
    elif case == "int_dtype":
        xs = [x.long() for x in xs]
    with pytest.raises(exc) as ei:
        K.grouped_linear(xs, ws, bs, act)
    for w in words:
        assert w in str(ei.value), str(ei.value)


@pytest.mark.parametrize("case,exc,words", [
    ("width", ValueError, ["member 1", "weights[1]"]),
    ("dtype", TypeError, ["xs[2]"]),
    ("noncontig", ValueError, ["xs[0]", "contiguous"]),
    ("empty", ValueError, ["empty"]),
    ("bias_len", ValueError, ["biases"]),
])
def test_batched_layer_norm_bad_input(case, exc, words):
    xs = [torch.randn(4, 8), torch.randn(3, 16), torch.randn(2, 5)]
    ws = [torch.randn(8), torch.randn(16), torch.randn(5)]
    bs = [torch.randn(8), torch.randn(16), torch.randn(5)]
    if case == "width":
        ws[1] = torch.randn(15)
    elif case == "dtype":
        xs[2] = xs[2].double()
    elif case == "noncontig":
        xs[0] = torch.randn(8, 4).t()
    elif case == "empty":
        xs, ws, bs = [], None, None
    elif case == "bias_len":
        bs = bs[:1]
    with pytest.raises(exc) as ei:
        K.batched_layer_norm(xs, ws, bs)
    for w in words:
        assert w in str(ei.value), str(ei.value)


def test_packed_op_bad_sizes():
    x = torch.randn(10)
    w = torch.randn(12)
    with pytest.raises(Exception, match="packed x"):
        torch.ops.optimus.grouped_linear(x, w, None, [2], [4], [3], "none")


# ------------------------------------------------------------------ custom ops
def test_packed_ops_cpu_match_loop():
    dims = [(6, 5, 4), (0, 3, 2), (2, 7, 3)]
    xs, ws, bs = make_gl(dims, torch.float64, seed=3)
    ms, ks, ns = zip(*dims)
    xp = K.pack([x.detach() for x in xs]).requires_grad_()
    wp = K.pack([w.detach() for w in ws]).requires_grad_()
    bp = K.pack([b.detach() for b in bs]).requires_grad_()
    y = K.grouped_linear_packed(xp, wp, bp, ms, ks, ns, "tanh")
    ys = [torch.tanh(F.linear(x, w, b)) for x, w, b in zip(xs, ws, bs)]
    torch.testing.assert_close(y, K.pack(ys))
    gy = torch.randn_like(y)
    got = torch.autograd.grad(y, (xp, wp, bp), gy)
    ref = torch.autograd.grad(ys, xs + ws + bs, K.unpack(gy, [(m, n) for m, k, n in dims]), allow_unused=True)
    ref = [r if r is not None else torch.zeros_like(p) for r, p in zip(ref, xs + ws + bs)]
    for g, r in zip(got, (K.pack(ref[:3]), K.pack(ref[3:6]), K.pack(ref[6:]))):
        torch.testing.assert_close(g, r)


def _opcheck_args():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6 * 5 + 2 * 7, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4 * 5 + 3 * 7, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    return x, w, b


@pytest.mark.parametrize("act", ["none", "silu"])
def test_opcheck_grouped_linear(act):
    x, w, b = _opcheck_args()
    torch.library.opcheck(torch.ops.optimus.grouped_linear.default, (x, w, b, [6, 2], [5, 7], [4, 3], act))


def test_opcheck_batched_layer_norm():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3 * 4 + 5 * 6, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(10, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(10, generator=g, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.optimus.batched_layer_norm.default, (x, w, b, [3, 5], [4, 6], 1e-5))


def _model_fn(xs, ws, bs, lws, lbs):
    ys = K.grouped_linear(xs, ws, bs, "relu")
    zs = K.batched_layer_norm(ys, lws, lbs)
    return sum((z * z).sum() for z in zs)


def _model_inputs():
    dims = [(9, 8, 6), (4, 5, 3), (7, 8, 10)]
    xs, ws, bs = make_gl(dims, torch.float32, seed=5)
    g = torch.Generator().manual_seed(6)
    lws = [torch.randn(n, generator=g).requires_grad_() for m, k, n in dims]
    lbs = [torch.randn(n, generator=g).requires_grad_() for m, k, n in dims]
    return xs, ws, bs, lws, lbs


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend):
    args = _model_inputs()
    params = [p for seq in args for p in seq]
    out0 = _model_fn(*args)
    g0 = torch.autograd.grad(out0, params)
    graphs = []

    if backend == "aot_eager":
        def be(gm, example_inputs):
            graphs.append(gm)
            from torch._dynamo.backends.common import aot_autograd
            from functorch.compile import make_boxed_func
            return aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g), bw_compiler=lambda g, _: make_boxed_func(g))(
                gm, example_inputs)
    else:
        be = backend
    cf = torch.compile(_model_fn, fullgraph=True, backend=be)
    out1 = cf(*args)
    g1 = torch.autograd.grad(out1, params)
    torch.testing.assert_close(out1, out0, rtol=1e-4, atol=1e-4)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    if graphs:
        targets = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
        assert any("optimus.grouped_linear" in t for t in targets), targets
        assert any("optimus.batched_layer_norm" in t for t in targets), targets


def test_import_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "import torch, kernels as K\n"
        "assert not K.triton_available()\n"
        "y = K.grouped_linear([torch.randn(3, 4)], [torch.randn(2, 4)], None, 'relu')\n"
        "z = K.batched_layer_norm([torch.randn(3, 4)])\n"
        "assert 'triton' not in sys.modules or sys.modules['triton'] is None\n"
        "print('ok', y[0].shape, z[0].shape)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]
