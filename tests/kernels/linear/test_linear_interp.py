"""Grouped linear through the Triton kernels in the CPU interpreter (TRITON_INTERPRET=1)."""

import pytest
import torch

from kernels_testutil import K, TOL, check_gl, interpret, interpreter_only, interpreter_works, make_gl, needs_triton  # noqa: F401

pytestmark = [interpreter_only, needs_triton, interpreter_works, pytest.mark.usefixtures("interpret")]

# ragged shapes with zero-sized members: M = 0, K = 0, N = 0, unaligned K and N
RAGGED = [(37, 24, 40), (0, 16, 8), (5, 33, 17), (70, 16, 16), (9, 0, 12), (6, 8, 0)]


@pytest.mark.parametrize("dtype,act", [
    (torch.float32, None), (torch.float32, "gelu"), (torch.float32, "sigmoid"),
    (torch.float16, "relu"), (torch.float16, "silu"),
    (torch.bfloat16, None), (torch.bfloat16, "tanh"),
])
def test_ragged_forward_backward(dtype, act):
    xs, ws, bs = make_gl(RAGGED, dtype, seed=1)
    check_gl(xs, ws, bs, act, TOL[dtype])


def test_single_member():
    xs, ws, bs = make_gl([(50, 40, 24)], torch.float32, seed=2)
    check_gl(xs, ws, bs, "relu", TOL[torch.float32])


def test_no_bias_and_partial_bias():
    dims = [(20, 16, 24), (33, 8, 8), (7, 24, 16)]
    xs, ws, _ = make_gl(dims, torch.float32, bias=False, seed=3)
    check_gl(xs, ws, None, None, TOL[torch.float32])
    xs, ws, bs = make_gl(dims, torch.float32, seed=4)
    bs[1] = None
    check_gl(xs, ws, bs, "silu", TOL[torch.float32])


def test_leading_dims_and_partial_requires_grad():
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(2, 3, 16, generator=g), torch.randn(24, generator=g)]  # (.., K) and 1-D
    ws = [torch.randn(8, 16, generator=g).requires_grad_(), torch.randn(4, 24, generator=g).requires_grad_()]
    ys = K.grouped_linear(xs, ws)
    assert ys[0].shape == (2, 3, 8) and ys[1].shape == (4,)
    torch.testing.assert_close(ys[0], torch.nn.functional.linear(xs[0], ws[0]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ys[1], torch.nn.functional.linear(xs[1], ws[1]), rtol=1e-5, atol=1e-5)
    gw = torch.autograd.grad([y.sum() for y in ys], ws)  # x does not require grad: no dX pass
    torch.testing.assert_close(gw[0], torch.ones(2, 3, 8).reshape(-1, 8).t() @ xs[0].reshape(-1, 16))
    torch.testing.assert_close(gw[1], torch.ones(4, 1) @ xs[1][None])


def test_packed_op_bf16():
    dims = [(30, 16, 24), (0, 8, 8), (17, 40, 16)]
    xs, ws, bs = make_gl(dims, torch.bfloat16, seed=6)
    ms, ks, ns = [d[0] for d in dims], [d[1] for d in dims], [d[2] for d in dims]
    xp = K.pack([x.detach() for x in xs]).requires_grad_()
    wp = K.pack([w.detach() for w in ws]).requires_grad_()
    bp = K.pack([b.detach() for b in bs]).requires_grad_()
    y = K.grouped_linear_packed(xp, wp, bp, ms, ks, ns, "gelu")
    ref = [torch.nn.functional.gelu(torch.nn.functional.linear(x.detach().double(), w.detach().double(),
                                                              b.detach().double())) for x, w, b in zip(xs, ws, bs)]
    ref = torch.cat([r.reshape(-1) for r in ref])
    assert (y.double() - ref).norm() / ref.norm() < 2e-2
    gy = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, (xp, wp, bp), gy)
    assert dx.shape == xp.shape and dw.shape == wp.shape and db.shape == bp.shape
    assert torch.isfinite(dx).all() and torch.isfinite(dw).all()
