"""The parameter-list ops (``*_params`` in kernels/linear/op.py and kernels/layer_norm/op.py): the same results and gradients as the packed
ops, the parameters read through a view of their buffer when they lie concatenated (and
copied otherwise), and weight gradients handed back in the parameters' own shapes."""

import pytest
import torch
import torch.nn.functional as F

from kernels_testutil import ACT, K, kmod

param_ops = kmod("runtime.params")  # where the parameter-list ops count their reads (STATS)

KS, NS = [5, 16, 3, 9], [7, 2, 16, 4]


@pytest.fixture(autouse=True)
def torch_backend():
    K.set_backend("torch")
    yield
    K.set_backend("auto")


def _concatenated_leaves(shapes, dtype, seed):
    """Parameters laid out one after another in one buffer (what pack_parameters does)."""
    g = torch.Generator().manual_seed(seed)
    buf = torch.randn(sum(torch.Size(s).numel() for s in shapes), generator=g, dtype=dtype)
    out, o = [], 0
    for s in shapes:
        n = torch.Size(s).numel()
        out.append(torch.nn.Parameter(buf[o:o + n].view(s)))
        o += n
    return out


def _separate_leaves(shapes, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g, dtype=dtype)) for s in shapes]


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("layout", ["packed", "columns"])
@pytest.mark.parametrize("act", ["none", "relu", "gelu"])
def test_grouped_linear_params_match_the_loop(packed, layout, act):
    leaves = _concatenated_leaves if packed else _separate_leaves
    ws = leaves([(n, k) for k, n in zip(KS, NS)], torch.float64, 1)
    bs = leaves([(n,) for n in NS], torch.float64, 2)
    m = 6
    xs = [torch.randn(m, k, dtype=torch.float64, requires_grad=True) for k in KS]
    x = torch.cat(xs, 1) if layout == "columns" else torch.cat([t.reshape(-1) for t in xs])
    param_ops.STATS.clear()
    y, _ = torch.ops.optimus.grouped_linear_params(x, ws, bs, [m] * 4, KS, NS, act, layout)
    assert param_ops.STATS[f"weight_{'view' if packed else 'cat'}"] == 1, param_ops.STATS
    want = [ACT[act](F.linear(xi, w, b)) for xi, w, b in zip(xs, ws, bs)]
    want = torch.cat(want, 1) if layout == "columns" else torch.cat([t.reshape(-1) for t in want])
    gy = torch.randn_like(y)
    got = torch.autograd.grad(y, xs + ws + bs, gy)
    exp = torch.autograd.grad(want, xs + ws + bs, gy)
    for a, b in zip([y, *got], [want, *exp]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    # the weight gradients come back in the parameters' shapes, contiguous (no AccumulateGrad copy)
    assert all(gw.shape == w.shape and gw.is_contiguous() for gw, w in zip(got[4:8], ws))


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_batched_layer_norm_params_match_the_loop(packed, affine):
    leaves = _concatenated_leaves if packed else _separate_leaves
    ws = leaves([(n,) for n in NS], torch.float64, 3) if affine != "none" else []
    bs = leaves([(n,) for n in NS], torch.float64, 4) if affine == "both" else []
    x = torch.randn(5, sum(NS), dtype=torch.float64, requires_grad=True)
    y, _ = torch.ops.optimus.batched_layer_norm_params(x, ws, bs, [5] * 4, NS, 1e-5, "columns")
    want = torch.cat([F.layer_norm(c, (n,), ws[i] if ws else None, bs[i] if bs else None, 1e-5)
                      for i, (c, n) in enumerate(zip(x.split(NS, 1), NS))], 1)
    gy = torch.randn_like(y)
    leaves_ = [x] + ws + bs
    for a, b in zip([y, *torch.autograd.grad(y, leaves_, gy)], [want, *torch.autograd.grad(want, leaves_, gy)]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # the saved mean / rstd are fp32


def test_frozen_weights_mixed_with_trainable_ones_get_the_trainable_gradients():
    ws = _separate_leaves([(n, k) for k, n in zip(KS, NS)], torch.float64, 5)
    ws[1].requires_grad_(False)
    x = torch.randn(3, sum(KS), dtype=torch.float64)
    y, _ = torch.ops.optimus.grouped_linear_params(x, ws, [], [3] * 4, KS, NS, "none", "columns")
    y.sum().backward()
    assert ws[1].grad is None
    for i in (0, 2, 3):
        want = torch.ones(3, NS[i], dtype=torch.float64).t() @ x.split(KS, 1)[i]
        torch.testing.assert_close(ws[i].grad, want)


def test_opcheck_param_ops():
    ws = _separate_leaves([(n, k) for k, n in zip(KS, NS)], torch.float64, 6)
    bs = _separate_leaves([(n,) for n in NS], torch.float64, 7)
    x = torch.randn(3, sum(KS), dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.optimus.grouped_linear_params.default, (x, ws, bs, [3] * 4, KS, NS, "silu", "columns"))
    z = torch.randn(3, sum(NS), dtype=torch.float64, requires_grad=True)
    lws = _separate_leaves([(n,) for n in NS], torch.float64, 8)
    torch.library.opcheck(torch.ops.optimus.batched_layer_norm_params.default, (z, lws, [], [3] * 4, NS, 1e-5, "columns"))


def test_param_ops_bad_input():
    ws = _separate_leaves([(n, k) for k, n in zip(KS, NS)], torch.float64, 9)
    x = torch.randn(3, sum(KS), dtype=torch.float64)
    with torch._subclasses.FakeTensorMode() as mode:
        fx_, fws = mode.from_tensor(x), [mode.from_tensor(w) for w in ws]
        with pytest.raises(ValueError, match="weights\\[1\\] is"):
            torch.ops.optimus.grouped_linear_params(fx_, fws, [], [3] * 4, KS, [NS[0], 9, *NS[2:]], "none", "columns")
        with pytest.raises(ValueError, match="3 weights for 4 members"):
            torch.ops.optimus.grouped_linear_params(fx_, fws[:3], [], [3] * 4, KS, NS, "none", "columns")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_param_ops_read_packed_parameters_in_place_on_the_gpu():
    K.set_backend("auto")
    torch.backends.cuda.matmul.allow_tf32 = False
    ks, ns = [16, 64, 40, 24], [32, 8, 48, 16]
    ws = [p.cuda() for p in _concatenated_leaves([(n, k) for k, n in zip(ks, ns)], torch.float32, 10)]
    ws = [torch.nn.Parameter(w.detach()) for w in ws]  # .cuda() of a view copies: pack again on the device
    buf = torch.cat([w.detach().reshape(-1) for w in ws])
    o = 0
    for w in ws:
        w.data = buf[o:o + w.numel()].view(w.shape)
        o += w.numel()
    x = torch.randn(300, sum(ks), device="cuda")
    param_ops.STATS.clear()
    y, _ = torch.ops.optimus.grouped_linear_params(x, ws, [], [300] * 4, ks, ns, "relu", "columns")
    assert param_ops.STATS["weight_view"] == 1
    want = torch.cat([F.relu(F.linear(c, w)) for c, w in zip(x.split(ks, 1), ws)], 1)
    torch.testing.assert_close(y, want, rtol=2e-4, atol=2e-4)
    gy = torch.randn_like(y)
    got = torch.autograd.grad(y, ws, gy)
    exp = torch.autograd.grad(want, ws, gy)
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4)
