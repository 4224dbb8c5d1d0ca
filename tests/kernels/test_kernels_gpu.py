"""optimus.kernels on a CUDA GPU (compiled Triton) at realistic sizes.  Marked ``gpu``."""

import pytest
import torch

from kernels_testutil import GPU_TOL, HAS_CUDA, K, check_gl, check_ln, make_gl, make_ln

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]

RAGGED = [(300, 33, 17), (0, 64, 128), (777, 200, 1), (5, 0, 40), (2048, 512, 384), (64, 96, 0)]
ALIGNED = [(4096, 512, 256), (512, 64, 512), (0, 128, 128), (1024, 128, 64)]


@pytest.fixture(autouse=True)
def auto_backend():
    K.set_backend("auto")


@pytest.mark.parametrize("dtype,act", [
    (torch.bfloat16, None), (torch.bfloat16, "gelu"), (torch.bfloat16, "tanh"), (torch.float16, "silu"),
    (torch.float32, "relu"),
])
@pytest.mark.parametrize("dims", [RAGGED, ALIGNED + [(2048, 512, 384)]], ids=["ragged", "aligned"])
def test_grouped_linear_gpu(dtype, act, dims):
    xs, ws, bs = make_gl(dims, dtype, device="cuda", seed=1)
    bs[0] = None
    check_gl(xs, ws, bs, act, GPU_TOL[dtype])


@pytest.mark.parametrize("dtype,affine", [(torch.bfloat16, True), (torch.float16, False), (torch.float32, True)])
def test_batched_layer_norm_gpu(dtype, affine):
    dims = [(1000, 1), (0, 64), (3000, 100), (777, 1024), (64, 4096), (50, 5000), (20, 12000), (7, 20000), (9, 0)]
    xs, ws, bs = make_ln(dims, dtype, device="cuda", affine=affine, seed=2)
    check_ln(xs, ws, bs, {torch.float32: 1e-4}.get(dtype, GPU_TOL[dtype]))


def test_packed_ops_and_compile_gpu():
    dims = [(1000, 256, 128), (0, 64, 64), (513, 128, 384)]
    xs, ws, bs = make_gl(dims, torch.bfloat16, device="cuda", seed=3)
    lws = [torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True) for m, k, n in dims]

    def f(xs, ws, bs, lws):
        ys = K.grouped_linear(xs, ws, bs, "gelu")
        zs = K.batched_layer_norm(ys, lws)
        return sum((z.float() ** 2).sum() for z in zs)

    params = xs + ws + bs + lws
    o0 = f(xs, ws, bs, lws)
    g0 = torch.autograd.grad(o0, params, allow_unused=True)
    o1 = torch.compile(f, fullgraph=True, backend="aot_eager")(xs, ws, bs, lws)
    g1 = torch.autograd.grad(o1, params, allow_unused=True)
    torch.testing.assert_close(o1, o0, rtol=2e-2, atol=1e-2)
    for a, b in zip(g1, g0):
        if b is not None:
            assert (a.double() - b.double()).norm() <= 2e-2 * b.double().norm() + 1e-6


def test_device_mismatch_gpu():
    xs = [torch.randn(4, 8, device="cuda"), torch.randn(4, 8)]
    ws = [torch.randn(3, 8, device="cuda"), torch.randn(3, 8, device="cuda")]
    with pytest.raises(ValueError, match=r"xs\[1\]"):
        K.grouped_linear(xs, ws)
