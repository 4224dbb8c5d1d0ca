"""The custom ops' column layout (``layout="columns"``): members side by side in one
(M, sum widths) matrix, read and written in place. Checked against a loop of F.linear /
F.layer_norm over the column blocks (outputs and gradients), on the plain-torch path (fp64)
and through the Triton kernels in the CPU interpreter (fp32, ragged and unaligned widths)."""

import pytest
import torch
import torch.nn.functional as F

from kernels_testutil import ACT, HAS_CUDA, K, interpret, interpreter_only, interpreter_works, needs_triton  # noqa: F401

KS, NS = [5, 16, 3, 9], [7, 2, 16, 4]


def _gl_case(dtype, m, bias=True, seed=0, device="cpu", ks=KS, ns=NS):
    g = torch.Generator().manual_seed(seed)

    def leaf(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=dtype) * scale).to(device).requires_grad_()

    x = leaf(m, sum(ks))
    ws = [leaf(n, k, scale=k ** -0.5) for k, n in zip(ks, ns)]
    bs = [leaf(n) for n in ns] if bias else None
    return x, ws, bs


def _check_gl(dtype, act, m, tol, bias=True, x_transform=None, device="cpu", ks=KS, ns=NS):
    KS, NS = ks, ns  # noqa: N806  (the module's widths unless given)
    x, ws, bs = _gl_case(dtype, m, bias, device=device, ks=ks, ns=ns)
    xin = x_transform(x) if x_transform is not None else x
    W = torch.cat([w.reshape(-1) for w in ws])
    B = torch.cat(bs) if bias else None
    y, _ = torch.ops.optimus.grouped_linear(xin, W, B, [m] * len(KS), KS, NS, act, "columns")
    f = ACT[act]
    want = torch.cat([f(F.linear(c, w, bs[i] if bias else None)) for i, (c, w) in enumerate(zip(xin.split(KS, 1), ws))], 1)
    assert y.shape == (m, sum(NS)) and y.is_contiguous()
    leaves = [x] + ws + (bs or [])
    gy = torch.randn_like(y)
    got = torch.autograd.grad(y, leaves, gy)
    exp = torch.autograd.grad(want, leaves, gy)
    for a, b in zip([y, *got], [want, *exp]):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def _check_ln(dtype, m, tol, affine=True, device="cpu", ns=NS):
    NS = ns  # noqa: N806
    g = torch.Generator().manual_seed(1)

    def leaf(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype).to(device).requires_grad_()

    x = leaf(m, sum(NS))
    ws = [leaf(n) for n in NS] if affine else None
    bs = [leaf(n) for n in NS] if affine else None
    y, stats = torch.ops.optimus.batched_layer_norm(x, torch.cat(ws) if affine else None, torch.cat(bs) if affine else None,
                                                    [m] * len(NS), NS, 1e-5, "columns")
    want = torch.cat([F.layer_norm(c, (n,), ws[i] if affine else None, bs[i] if affine else None, 1e-5)
                      for i, (c, n) in enumerate(zip(x.split(NS, 1), NS))], 1)
    assert y.shape == (m, sum(NS)) and stats.shape == (2, m * len(NS))
    leaves = [x] + (ws + bs if affine else [])
    gy = torch.randn_like(y)
    for a, b in zip([y, *torch.autograd.grad(y, leaves, gy)], [want, *torch.autograd.grad(want, leaves, gy)]):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# ------------------------------------------------------------------ plain-torch path
@pytest.fixture
def torch_backend():
    K.set_backend("torch")
    yield
    K.set_backend("auto")


@pytest.mark.usefixtures("torch_backend")
@pytest.mark.parametrize("act", ["none", "relu", "gelu"])
def test_grouped_linear_columns_match_the_loop(act):
    _check_gl(torch.float64, act, 6, 1e-10)


@pytest.mark.usefixtures("torch_backend")
def test_grouped_linear_columns_take_a_strided_input():
    """A non-contiguous x (a transpose) is read as its values, not its storage."""
    _check_gl(torch.float64, "none", 6, 1e-10, x_transform=lambda x: x.t().contiguous().t())


@pytest.mark.usefixtures("torch_backend")
@pytest.mark.parametrize("affine", [True, False])
def test_batched_layer_norm_columns_match_the_loop(affine):
    _check_ln(torch.float64, 5, 1e-4, affine)  # the saved mean / rstd are fp32 (as the kernels keep them)


@pytest.mark.usefixtures("torch_backend")
def test_opcheck_columns():
    x, ws, bs = _gl_case(torch.float64, 3)
    W, B = torch.cat([w.detach().reshape(-1) for w in ws]).requires_grad_(), torch.cat([b.detach() for b in bs]).requires_grad_()
    torch.library.opcheck(torch.ops.optimus.grouped_linear.default, (x, W, B, [3] * 4, KS, NS, "silu", "columns"))
    z = torch.randn(3, sum(NS), dtype=torch.float64, requires_grad=True)
    lw = torch.randn(sum(NS), dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.optimus.batched_layer_norm.default, (z, lw, None, [3] * 4, NS, 1e-5, "columns"))


@pytest.mark.usefixtures("torch_backend")
def test_columns_bad_input():
    x, ws, bs = _gl_case(torch.float64, 4)
    W = torch.cat([w.detach().reshape(-1) for w in ws])
    with pytest.raises(ValueError, match="same rows"):
        torch.ops.optimus.grouped_linear(x, W, None, [4, 4, 4, 3], KS, NS, "none", "columns")
    with pytest.raises(ValueError, match="must be 2-D"):
        torch.ops.optimus.grouped_linear(x.reshape(-1), W, None, [4] * 4, KS, NS, "none", "columns")
    with pytest.raises(Exception, match="shape lists need"):
        torch.ops.optimus.grouped_linear(x[:, 1:], W, None, [4] * 4, KS, NS, "none", "columns")
    with pytest.raises(ValueError, match="layout must be"):
        torch.ops.optimus.grouped_linear(x, W, None, [4] * 4, KS, NS, "none", "rows")
    with pytest.raises(ValueError, match="same rows"):
        torch.ops.optimus.batched_layer_norm(torch.randn(4, sum(NS)), None, None, [4, 4, 2, 4], NS, 1e-5, "columns")


# ------------------------------------------------------------------ Triton kernels, interpreter
@interpreter_only
@needs_triton
@interpreter_works
@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("act,bias", [("none", True), ("relu", False), ("gelu", True)])
def test_grouped_linear_columns_kernels(act, bias):
    _check_gl(torch.float32, act, 37, 1e-4, bias)


@interpreter_only
@needs_triton
@interpreter_works
@pytest.mark.usefixtures("interpret")
def test_columns_kernels_half_precision_on_the_aligned_path():
    """fp16 with every width a multiple of 8: the kernels take the aligned path (strides,
    offsets and widths multiples of 8 elements)."""
    ks, ns = [16, 8, 24], [8, 32, 16]
    _check_gl(torch.float16, "relu", 9, 3e-2, ks=ks, ns=ns)
    _check_ln(torch.float16, 9, 3e-2, ns=ns)


@interpreter_only
@needs_triton
@interpreter_works
@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("affine", [True, False])
def test_batched_layer_norm_columns_kernels(affine):
    _check_ln(torch.float32, 19, 1e-4, affine)


# ------------------------------------------------------------------ Triton kernels, GPU
ALIGNED_KS, ALIGNED_NS = [16, 64, 40, 24], [32, 8, 48, 16]  # multiples of 8: the aligned (vector) path


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("widths", ["ragged", "aligned"])
@pytest.mark.parametrize("act", ["none", "relu", "gelu"])
def test_columns_on_the_gpu(widths, act):
    ks, ns = (KS, NS) if widths == "ragged" else (ALIGNED_KS, ALIGNED_NS)
    torch.backends.cuda.matmul.allow_tf32 = False
    _check_gl(torch.float32, act, 300, 2e-4, device="cuda", ks=ks, ns=ns)
    _check_ln(torch.float32, 300, 2e-4, device="cuda", ns=ns)
