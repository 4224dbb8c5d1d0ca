"""Grouped embedding bag through the Triton kernels in the CPU interpreter (TRITON_INTERPRET=1),
against F.embedding_bag / F.embedding in float64.  The interpreter configuration uses tiny tiles
(several bag blocks per table, D blocks, chunks of 2 sorted positions and 16 columns in the
segment kernel), so masking, every width class present, and segments running past their chunk
are exercised."""

import pytest
import torch
import torch.nn.functional as F

from embedding_testutil import check_case, make_case, oracle, packed
from kernels_testutil import K, TOL, interpret, interpreter_only, interpreter_works, needs_triton  # noqa: F401

pytestmark = [interpreter_only, needs_triton, interpreter_works, pytest.mark.usefixtures("interpret")]

F32 = torch.float32
# widths 3 (class 16, masked), 16, 40 (class 64), 300 (two D blocks of 256)
NS, DS = [7, 20, 33, 5], [3, 16, 40, 300]


def _kmod():
    import importlib

    return importlib.import_module(K.__name__ + ".embedding_bag.kernel")


@pytest.mark.parametrize("deterministic", [True, False])
def test_modes_padding_jagged(deterministic):
    case = make_case(NS, DS, B=4, modes=["sum", "mean", "embedding", "mean"], pads=[2, None, 4, 1], dtype=F32,
                     seed=1)
    check_case(case, TOL[F32], deterministic=deterministic)


@pytest.mark.parametrize("form", ["list", "packed"])
def test_per_sample_weights_and_their_grad(form):
    case = make_case(NS[:3], DS[:3], B=4, modes=["sum"] * 3, pads=[None, 3, None], dtype=F32, psw=True, seed=2)
    check_case(case, TOL[F32], form=form, deterministic=(form == "list"))


def test_fixed_bag_sizes_and_bag_size_one():
    case = make_case(NS, DS, B=3, modes=["sum", "mean", "sum", "embedding"], pads=[1, None, None, 0],
                     bag=[2, 3, 1, 1], dtype=F32, psw=True, seed=3)
    check_case(case, TOL[F32], deterministic=False)


def test_embedding_mode_matches_f_embedding():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(9, 24, generator=g, requires_grad=True)
    x = torch.tensor([3, 0, 3, 8, 1])
    out = K.grouped_embedding_bag([w], x, bag_size=1, mode="embedding", padding_idx=3)
    ref = F.embedding(x, w, padding_idx=3)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    gy = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, w, gy)[0], torch.autograd.grad(ref, w, gy)[0])


@pytest.mark.parametrize("dtype,deterministic", [(torch.float16, True), (torch.bfloat16, False)])
def test_half_precision(dtype, deterministic):
    case = make_case(NS[:3], DS[:3], B=4, modes=["sum", "mean", "sum"], max_bag=6, dtype=dtype, psw=True,
                     seed=5)
    check_case(case, TOL[dtype], deterministic=deterministic)


@pytest.mark.parametrize("deterministic", [True, False])
def test_sparse_and_dense_tables(deterministic):
    case = make_case(NS, DS, B=4, modes=["sum", "mean", "sum", "sum"], pads=[None, 2, None, None], dtype=F32,
                     psw=True, seed=6)
    check_case(case, TOL[F32], sparse=[True, False, True, False], deterministic=deterministic)


def test_sparse_packed_fixed_bags():
    case = make_case(NS[:3], DS[:3], B=3, modes=["sum"] * 3, pads=[0, None, None], bag=[2, 1, 3], dtype=F32,
                     seed=7)
    check_case(case, TOL[F32], form="packed", sparse=True)


def test_hot_rows_cross_chunks_deterministic():
    """Half of all entries hit one row per table: its sorted segment spans many chunks of the
    segment kernel and is summed by the program of the chunk where it starts; bitwise stable."""
    case = make_case(NS[:3], DS[:3], B=6, modes=["sum", "mean", "sum"], max_bag=5, hot=[1, 5, 0], dtype=F32,
                     seed=8)
    check_case(case, TOL[F32])
    out = K.grouped_embedding_bag(case.weights, case.indices, case.offsets, mode=case.modes)
    gy = torch.randn_like(out)
    g1 = torch.autograd.grad(out, case.weights, gy, retain_graph=True)
    g2 = torch.autograd.grad(out, case.weights, gy)
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)


def test_deterministic_backward_in_pieces():
    """Fixed bags: the deterministic backward walks, sorts and reduces runs of whole tables of at
    most ``key_piece`` entries; the gradients equal those of one piece bitwise, and the oracle's."""
    kmod = _kmod()
    case = make_case(NS, DS, B=6, modes=["sum", "mean", "sum", "embedding"], pads=[1, None, 4, None],
                     bag=[3, 2, 4, 1], dtype=F32, psw=True, seed=14)
    sig = kmod.signature(NS, DS, [0, 1, 0, 2], [1, -1, 4, -1], [3, 2, 4, 1], F32)
    pieces = sig.key_pieces(6, 6 * 10)
    assert len(pieces) > 1 and pieces[0][2] == 0 and pieces[-1][3] == 60, pieces
    assert all(a[1] == b[0] and a[3] == b[2] for a, b in zip(pieces, pieces[1:])), pieces
    check_case(case, TOL[F32])
    saved = kmod.get_config()
    grads = {}
    try:
        for piece in (saved["key_piece"], 1 << 30):
            kmod.set_config(key_piece=piece)
            out = K.grouped_embedding_bag(case.weights, case.indices, case.offsets, mode=case.modes,
                                          padding_idx=case.pads)
            grads[piece] = torch.autograd.grad(out, case.weights, torch.ones_like(out))
    finally:
        kmod.set_config(key_piece=saved["key_piece"])
    for a, b in zip(*grads.values()):
        assert torch.equal(a, b)


def test_unchecked_out_of_range_is_masked():
    """check_indices=False: out-of-range indices and malformed offsets never touch memory outside
    the tensors; the bad entries contribute nothing and get no gradient."""
    g = torch.Generator().manual_seed(9)
    ws = [torch.randn(6, 16, generator=g, requires_grad=True), torch.randn(4, 8, generator=g, requires_grad=True)]
    idx = torch.tensor([0, 99, 5, -7, 3, 2, 1000000])
    off = torch.tensor([0, 3, 4, 4, 7])  # table 0: bags [0, 99, 5], [-7]; table 1: [], [3, 2, 1000000]
    out = K.grouped_embedding_bag(ws, idx, off, mode="sum", check_indices=False)
    ref = torch.zeros(2, 24)
    ref[0, :16] = ws[0][0] + ws[0][5]
    ref[1, 16:] = ws[1][3] + ws[1][2]
    torch.testing.assert_close(out, ref.detach())
    for det in (True, False):
        out = K.grouped_embedding_bag(ws, idx, off, mode="sum", check_indices=False, deterministic=det)
        gw = torch.autograd.grad(out.sum(), ws)
        r0 = torch.zeros(6, 16)
        r0[[0, 5]] = 1
        r1 = torch.zeros(4, 8)
        r1[[3, 2]] = 1
        torch.testing.assert_close(gw[0], r0)
        torch.testing.assert_close(gw[1], r1)
    # offsets running past the end and backwards are clamped
    bad_off = torch.tensor([0, 5, 2, 50, 7])
    out = K.grouped_embedding_bag(ws, idx, bad_off, mode="sum", check_indices=False)
    assert torch.isfinite(out).all()
    torch.autograd.grad(out.sum(), ws)


def test_checked_on_cpu_by_default():
    ws = [torch.randn(6, 16)]
    with pytest.raises(IndexError, match="table 0.*value 6"):
        K.grouped_embedding_bag(ws, torch.tensor([0, 6]), torch.tensor([0, 2]))


def test_device_tables_cached():
    """A repeated call with the same tables and batch size uploads no metadata."""
    from kernels_testutil import load_kernels  # noqa: F401

    import importlib

    dt = importlib.import_module(K.__name__ + ".runtime.tables")
    case = make_case(NS[:3], DS[:3], B=4, modes=["sum"] * 3, dtype=F32, seed=10)
    idx, off, _ = packed(case)
    out = K.grouped_embedding_bag(case.weights, idx, off, mode="sum")
    torch.autograd.grad(out.sum(), case.weights)
    dt.reset_stats()
    for _ in range(2):
        out = K.grouped_embedding_bag(case.weights, idx, off, mode="sum")
        torch.autograd.grad(out.sum(), case.weights)
    assert dt.stats()["uploads"] == 0, dt.stats()
    ref, _, _ = oracle(case)
    assert (out - ref).abs().max() < 1e-5


def test_tile_maps_cover_every_tile():
    """The tile maps enumerate each (table, bag block, D block) exactly once."""
    M = _kmod()
    sig = M.signature([5, 9, 3], [3, 300, 64], [0, 0, 1], [-1, -1, -1], None, F32)
    B = 11
    fwd, nf, walk, nw = sig.tiles(B, torch.device("cpu"))
    mask = (1 << M.TILE_SHIFT) - 1
    f = [(int(e) & mask, int(e) >> M.TILE_SHIFT) for e in fwd[:nf]]
    want = []
    for t in range(3):
        nbb = -(-B // sig.bb[t])
        want += [(t, loc) for loc in range(nbb * sig.ndb[t])]
    assert sorted(f) == sorted(want) and len(set(f)) == len(f)
    w = [(int(e) & mask, int(e) >> M.TILE_SHIFT) for e in walk[:nw]]
    assert sorted(w) == sorted((t, b) for t in range(3) for b in range(-(-B // sig.bbw[t])))


def _ops_mod():
    import importlib

    return importlib.import_module(K.__name__ + ".embedding_bag.eager")


def test_custom_op_runs_the_kernels():
    """torch.ops.optimus.grouped_embedding_bag (what graph rewrites emit) on the Triton path,
    forward and backward through the registered autograd, against the plain-torch implementation."""
    case = make_case(NS[:3], DS[:3], B=4, modes=["sum"] * 3, pads=[1, None, None], dtype=F32, psw=True, seed=12)
    idx, off, psw = packed(case)
    args = (idx, off, psw, [0, 0, 0], [1, -1, -1], [], [False, False, False], True, [])
    outs = {}
    for backend in ("auto", "torch"):
        K.set_backend(backend)
        try:
            out = torch.ops.optimus.grouped_embedding_bag(case.weights, *args)
            gy = torch.ones_like(out)
            outs[backend] = (out, torch.autograd.grad(out, case.weights + [psw], gy))
        finally:
            K.set_backend("auto")
    (o1, g1), (o2, g2) = outs["auto"], outs["torch"]
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-5)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("deterministic", [True, False])
def test_output_gradient_read_in_place_from_a_cat(deterministic, monkeypatch):
    """A cat reading the grouped lookup's output hands it a slice of the cat's gradient (rows
    wider apart than the output is wide): the eager API and the custom op both give it to the
    kernels as it is, uncopied, and the weights' gradients equal those from the same gradient
    made contiguous, bitwise."""
    case = make_case(NS, DS, B=5, modes=["sum", "mean", "sum", "sum"], pads=[None, 2, None, None], dtype=F32,
                     seed=13)
    idx, off, _ = packed(case)
    width = sum(DS)
    kmod = _kmod()
    seen = []
    backward = kmod.backward

    def spy(grad_out, *args, **kwargs):
        seen.append(grad_out.stride())
        return backward(grad_out, *args, **kwargs)

    monkeypatch.setattr(kmod, "backward", spy)
    calls = {
        "eager": lambda: K.grouped_embedding_bag(case.weights, idx, off, mode=case.modes, padding_idx=case.pads,
                                                 deterministic=deterministic),
        "op": lambda: torch.ops.optimus.grouped_embedding_bag(
            case.weights, idx, off, None, [0, 1, 0, 0], [-1, 2, -1, -1], [], [False] * 4, deterministic, []),
    }
    gy = torch.randn(case.B, 4 + width + 12, generator=torch.Generator().manual_seed(3))
    for name, call in calls.items():
        seen.clear()
        out = call()
        wide = torch.cat([torch.zeros(case.B, 4), out, torch.zeros(case.B, 12)], 1)
        got = torch.autograd.grad(wide, case.weights, gy)
        assert seen == [(4 + width + 12, 1)], (name, seen)
        want = torch.autograd.grad(call(), case.weights, gy[:, 4:4 + width].contiguous())
        for t, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), (name, t)


def test_eager_plan_cached_and_still_validated():
    ops = _ops_mod()
    ops.clear_eager_caches()
    case = make_case(NS[:2], DS[:2], B=3, modes=["sum"] * 2, dtype=F32, psw=True, seed=13)
    idx, off, psw = packed(case)
    for _ in range(3):
        out = K.grouped_embedding_bag(case.weights, idx, off, psw, mode="sum")
    assert ops.eager_cache_info()["plans"] == 1
    ref, _, _ = oracle(case)
    assert (out - ref).abs().max() < 1e-5
    # a cached plan does not skip the per-call checks: wrong psw length, bad index, bad offsets
    with pytest.raises(ValueError, match="per_sample_weights"):
        K.grouped_embedding_bag(case.weights, idx, off, psw[:-1], mode="sum")
    bad = idx.clone()
    bad[-1] = 1000
    with pytest.raises(IndexError, match="table 1"):
        K.grouped_embedding_bag(case.weights, bad, off, psw, mode="sum")
    with pytest.raises(ValueError, match="T \\* B \\+ 1"):
        K.grouped_embedding_bag(case.weights, idx, off[:-1], psw, mode="sum")


def test_zero_width_table_and_fixed_bags():
    """A table of width 0 (no tiles at all) between others, fixed bag sizes, dense and sparse."""
    case = make_case([6, 4, 9], [16, 0, 24], B=3, modes=["sum", "sum", "mean"], bag=[2, 2, 1], dtype=F32, seed=14)
    check_case(case, TOL[F32], form="packed")
    check_case(case, TOL[F32], form="packed", sparse=[False, True, True])


class _StubKernel:
    def __init__(self):
        self.launches = 0

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.launches += 1
        return run


@pytest.mark.parametrize("deterministic", [True, False])
def test_eager_path_never_synchronises(monkeypatch, deterministic):
    """Launches stubbed, every tensor->host conversion raises: a packed-form fwd + bwd (dense
    tables, per-sample weights) runs without one, on the cached path and on the first call."""
    M = _kmod()
    stubs = {name: _StubKernel() for name in ("_emb_fwd_kernel", "_emb_walk_kernel", "_emb_seg_kernel")}
    for name, stub in stubs.items():
        monkeypatch.setattr(M, name, stub)
    case = make_case(NS[:3], DS[:3], B=4, modes=["sum"] * 3, dtype=F32, psw=True, seed=15)
    idx, off, psw = packed(case)

    def boom(*a, **k):
        raise AssertionError("host synchronisation in the eager path")

    for i in range(2):
        with monkeypatch.context() as m:
            for attr in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
                m.setattr(torch.Tensor, attr, boom)
            out = K.grouped_embedding_bag(case.weights, idx, off, psw, mode="sum", check_indices=False,
                                          deterministic=deterministic)
            grads = torch.autograd.grad(out, case.weights + [psw], torch.ones_like(out))
        assert len(grads) == 4 and grads[0].shape == case.weights[0].shape
    assert stubs["_emb_fwd_kernel"].launches == 2 and stubs["_emb_walk_kernel"].launches == 2
    assert stubs["_emb_seg_kernel"].launches == (2 if deterministic else 0)
