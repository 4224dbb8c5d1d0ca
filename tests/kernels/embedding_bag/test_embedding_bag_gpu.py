"""grouped_embedding_bag on a CUDA GPU (compiled Triton) at realistic sizes.  Marked ``gpu``."""

import pytest
import torch

from embedding_testutil import check_case, make_case, packed, to_device
from kernels_testutil import GPU_TOL, HAS_CUDA, K

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]

NS = [1000, 50_000, 3000, 20_000, 7, 100_000]
DS = [16, 128, 40, 256, 8, 300]   # every width class, unaligned widths, two D blocks


@pytest.fixture(autouse=True)
def auto_backend():
    K.set_backend("auto")


def _case(dtype, psw=False, bag=None, seed=0, hot=None):
    c = make_case(NS, DS, B=512, modes=["sum", "mean", "embedding", "sum", "mean", "sum"],
                  pads=[3, None, 0, None, 1, None], bag=bag, max_bag=20, dtype=dtype, psw=psw, seed=seed, hot=hot)
    return to_device(c, "cuda")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("deterministic", [True, False])
def test_dense_gpu(dtype, deterministic):
    check_case(_case(dtype, seed=1), {torch.float32: 1e-4}.get(dtype, GPU_TOL[dtype]), form="packed",
               deterministic=deterministic)


def test_psw_sparse_hot_rows_gpu():
    c = make_case(NS, DS, B=512, modes=["sum"] * 6, pads=[3, None, 0, None, 1, None], max_bag=20,
                  dtype=torch.bfloat16, psw=True, seed=2, hot=[1, 2, None, 5, None, 0])
    check_case(to_device(c, "cuda"), GPU_TOL[torch.bfloat16], form="packed",
               sparse=[True, False, True, False, False, False])


def test_fixed_bags_and_list_form_gpu():
    check_case(_case(torch.float32, bag=[3, 1, 1, 8, 2, 1], seed=3), 1e-4)


@pytest.mark.parametrize("dims", [[16, 128, 64, 32], [16, 40, 8, 300]])  # aligned: vector loads; not
def test_fixed_bags_in_pieces_and_a_cat_gradient_gpu(dims):
    """Fixed bags through the deterministic backward in pieces of whole tables, the output's
    gradient a slice of a cat's (row stride wider than the output): against the fp64 oracle,
    and bitwise against one piece and a contiguous copy of the gradient."""
    kmod = __import__(K.__name__ + ".embedding_bag.kernel", fromlist=["kernel"])
    c = to_device(make_case([1000, 50_000, 3000, 20_000], dims, B=512, modes=["sum", "mean", "sum", "sum"],
                            pads=[3, None, 0, None], bag=[3, 8, 1, 20], dtype=torch.float32, seed=6), "cuda")
    check_case(c, 1e-4)
    width = sum(dims)
    gy = torch.randn(512, 8 + width + 24, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    saved = kmod.get_config()["key_piece"]
    grads = []
    try:
        for piece, strided in ((1024, True), (1 << 30, True), (1 << 30, False)):
            kmod.set_config(key_piece=piece)
            out = K.grouped_embedding_bag(c.weights, c.indices, c.offsets, mode=c.modes, padding_idx=c.pads)
            if strided:
                wide = torch.cat([torch.zeros(512, 8, device="cuda"), out, torch.zeros(512, 24, device="cuda")], 1)
                grads.append(torch.autograd.grad(wide, c.weights, gy))
            else:
                grads.append(torch.autograd.grad(out, c.weights, gy[:, 8:8 + width].contiguous()))
    finally:
        kmod.set_config(key_piece=saved)
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            assert torch.equal(a, b)


def test_deterministic_backward_is_bitwise_stable_gpu():
    c = _case(torch.bfloat16, seed=4, hot=[1, 2, None, 5, None, 0])
    idx, off, _ = packed(c)
    res = []
    for _ in range(2):
        out = K.grouped_embedding_bag(c.weights, idx, off, mode=c.modes, padding_idx=c.pads)
        res.append(torch.autograd.grad(out, c.weights, torch.ones_like(out)))
    for a, b in zip(*res):
        assert torch.equal(a, b)


def test_out_of_range_masked_gpu():
    w = torch.randn(10, 64, device="cuda", requires_grad=True)
    idx = torch.tensor([1, 10, -1, 2, 10 ** 9], device="cuda")
    off = torch.tensor([0, 3, 5], device="cuda")
    out = K.grouped_embedding_bag([w], idx, off, mode="sum")  # unchecked on CUDA: masked, no fault
    ref = torch.stack([w[1], w[2]]).detach()
    torch.testing.assert_close(out, ref)
    with pytest.raises(IndexError, match="table 0"):
        K.grouped_embedding_bag([w], idx, off, mode="sum", check_indices=True)


def test_cuda_graph_capture_gpu():
    c = _case(torch.bfloat16, seed=5)
    idx, off, _ = packed(c)
    gy = torch.randn(512, sum(DS), device="cuda", dtype=torch.bfloat16)

    def step():
        out = K.grouped_embedding_bag(c.weights, idx, off, mode=c.modes, padding_idx=c.pads)
        return torch.autograd.grad(out, c.weights, gy)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        want = step()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            got = step()
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_compile_gpu():
    c = _case(torch.bfloat16, seed=6)
    idx, off, _ = packed(c)

    def f(ws, idx, off):
        return K.grouped_embedding_bag(ws, idx, off, mode=c.modes, padding_idx=c.pads)

    o0 = f(c.weights, idx, off)
    o1 = torch.compile(f, fullgraph=True)(c.weights, idx, off)
    torch.testing.assert_close(o1, o0)
    g0 = torch.autograd.grad(o0.float().square().sum(), c.weights)
    g1 = torch.autograd.grad(o1.float().square().sum(), c.weights)
    for a, b in zip(g1, g0):
        assert (a.double() - b.double()).norm() <= 2e-2 * b.double().norm() + 1e-6
