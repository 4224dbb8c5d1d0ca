"""Batched layer norm through the Triton kernels in the CPU interpreter (TRITON_INTERPRET=1)."""

import pytest
import torch

from kernels_testutil import K, TOL, check_ln, interpret, interpreter_only, interpreter_works, make_ln, needs_triton  # noqa: F401

pytestmark = [interpreter_only, needs_triton, interpreter_works, pytest.mark.usefixtures("interpret")]

# widths reach every width class of the interpreter configuration (multi-row tiles, the single-row
# 2x / 4x tiles, and the looped path for rows wider than 4 tiles), plus zero-sized members
RAGGED = [(7, 3), (0, 16), (33, 40), (5, 300), (2, 600), (1, 1100), (9, 16), (4, 0)]


@pytest.mark.parametrize("dtype,affine", [(torch.float32, True), (torch.float16, True), (torch.bfloat16, False)])
def test_ragged_forward_backward(dtype, affine):
    xs, ws, bs = make_ln(RAGGED, dtype, affine=affine, seed=1)
    check_ln(xs, ws, bs, TOL[dtype])


def test_uniform_and_partial_affine():
    xs, ws, bs = make_ln([(40, 32)] * 3, torch.float32, seed=2)
    ws[1] = None
    bs[2] = None
    check_ln(xs, ws, bs, TOL[torch.float32], eps=1e-3)


def test_single_member_leading_dims():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 24, generator=g).requires_grad_()
    w = torch.randn(24, generator=g).requires_grad_()
    (y,) = K.batched_layer_norm([x], [w], None)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (24,), w), rtol=1e-5, atol=1e-5)


def test_packed_op():
    dims = [(12, 20), (0, 8), (5, 64)]
    xs, ws, bs = make_ln(dims, torch.float32, seed=4)
    rows, widths = [r for r, d in dims], [d for r, d in dims]
    xp = K.pack([x.detach() for x in xs]).requires_grad_()
    wp = K.pack([w.detach() for w in ws]).requires_grad_()
    bp = K.pack([b.detach() for b in bs]).requires_grad_()
    y = K.batched_layer_norm_packed(xp, wp, bp, rows, widths, 1e-5)
    ref = torch.cat([torch.nn.functional.layer_norm(x.detach(), (x.shape[-1],), w.detach(), b.detach()).reshape(-1)
                     for x, w, b in zip(xs, ws, bs)])
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    gy = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, (xp, wp, bp), gy)
    ys = [torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b) for x, w, b in zip(xs, ws, bs)]
    gys = torch.split(gy, [r * d for r, d in dims])
    rg = torch.autograd.grad(ys, xs + ws + bs, [g.view(r, d) for g, (r, d) in zip(gys, dims)], allow_unused=True)
    rg = [g if g is not None else torch.zeros_like(p) for g, p in zip(rg, xs + ws + bs)]
    torch.testing.assert_close(dx, K.pack(rg[:3]), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dw, K.pack(rg[3:6]), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(db, K.pack(rg[6:]), rtol=1e-4, atol=1e-5)
