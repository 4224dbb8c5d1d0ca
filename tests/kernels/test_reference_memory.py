"""The plain-torch paths of the grouped ops (the ops' implementation off Triton, the CPU memory
proxy's) allocate what the kernels allocate: the op's outputs as whole-group buffers, and
temporaries of one member at a time. No operand is copied into another layout and no result is
built from per-member pieces and concatenated (which held two copies of every table's gradient,
or of a column-layout group's activations, at once).

Each test measures the peak of CPU tensor memory of one call (``measure.peak_tensor_memory``:
the allocator's events, deterministic) and bounds it by the outputs plus a few member-sized
temporaries, far below the copies the per-member lists and layout conversions made, and checks
the values against the per-member torch ops."""

import torch
import torch.nn.functional as F

from optimus.kernels.embedding_bag import reference as eb_ref
from optimus.kernels.layer_norm import reference as ln_ref
from optimus.kernels.linear import reference as gl_ref
from optimus.tools.measure import peak_tensor_memory


def _peak(fn):
    out = {}
    peak = peak_tensor_memory(lambda: out.setdefault("r", fn()))
    assert peak is not None, "this torch's profiler records no CPU allocations"
    return peak, out["r"]


def _nbytes(*ts):
    return sum(t.numel() * t.element_size() for t in ts)


def test_layer_norm_columns_backward_holds_one_member_of_temporaries():
    torch.manual_seed(0)
    widths = [40, 48, 56, 64, 72, 80, 88, 96]
    rows = [512] * len(widths)
    x = torch.randn(512, sum(widths))
    w, b = torch.randn(sum(widths)), torch.randn(sum(widths))
    y, stats = ln_ref.batched_layer_norm_layout(x, w, b, rows, widths, 1e-5, "columns")
    dy = torch.randn_like(y)
    peak, (dx, dw, db) = _peak(lambda: ln_ref.batched_layer_norm_backward_layout(
        dy, x, w, stats, rows, widths, True, True, True, True, "columns"))
    block = 512 * max(widths) * 4
    # dx and the affine gradients, and a handful of one member's temporaries (xhat, w * dy, ...);
    # the copies of dy and x into the packed layout and dx's per-member pieces were 3x dx more
    assert peak <= _nbytes(dx, dw, db) + 6 * block, (peak, _nbytes(dx))
    assert peak < 2 * _nbytes(dx)
    xs = [c.detach().requires_grad_() for c in x.split(widths, 1)]
    ws = [c.detach().requires_grad_() for c in w.split(widths)]
    bs = [c.detach().requires_grad_() for c in b.split(widths)]
    want = torch.cat([F.layer_norm(xi, (d,), wi, bi, 1e-5) for xi, d, wi, bi in zip(xs, widths, ws, bs)], 1)
    torch.testing.assert_close(y, want)
    gx = torch.autograd.grad(want, xs + ws + bs, dy)
    torch.testing.assert_close(dx, torch.cat(gx[:8], 1))
    torch.testing.assert_close(dw, torch.cat(gx[8:16]), rtol=1e-4, atol=1e-4)  # sums over 512 rows
    torch.testing.assert_close(db, torch.cat(gx[16:]), rtol=1e-4, atol=1e-4)


def test_layer_norm_forward_writes_its_output_in_place():
    torch.manual_seed(1)
    widths = [40, 48, 56, 64, 72, 80, 88, 96]
    rows = [256] * len(widths)
    x = torch.randn(256 * sum(widths))
    peak, (y, stats) = _peak(lambda: ln_ref.batched_layer_norm_layout(x, None, None, rows, widths, 1e-5, "packed"))
    assert peak <= _nbytes(y, stats) + 6 * 256 * max(widths) * 4
    parts = x.split([r * d for r, d in zip(rows, widths)])
    want = torch.cat([F.layer_norm(p.view(r, d), (d,)).reshape(-1) for p, r, d in zip(parts, rows, widths)])
    torch.testing.assert_close(y, want)


def test_grouped_linear_columns_holds_one_member_of_temporaries():
    torch.manual_seed(2)
    ks = [24, 32, 40, 48, 56, 64, 72, 80]
    ns = [80, 72, 64, 56, 48, 40, 32, 24]
    m = 512
    x = torch.randn(m, sum(ks))
    ws = [torch.randn(n, k) * k ** -0.5 for k, n in zip(ks, ns)]
    bs = [torch.randn(n) for n in ns]
    W, B = torch.cat([w.reshape(-1) for w in ws]), torch.cat(bs)
    peak, (y, z) = _peak(lambda: gl_ref.grouped_linear_layout(x, W, B, [m] * 8, ks, ns, "gelu", "columns"))
    block = m * max(ns) * 4
    assert peak <= _nbytes(y, z) + 4 * block
    want_z = torch.cat([F.linear(c, w, bi) for c, w, bi in zip(x.split(ks, 1), ws, bs)], 1)
    torch.testing.assert_close(z, want_z)
    torch.testing.assert_close(y, F.gelu(want_z))
    dy = torch.randn_like(y)
    peak, (dx, dw, db) = _peak(lambda: gl_ref.grouped_linear_backward_layout(
        dy, x, W, z, [m] * 8, ks, ns, "gelu", True, True, True, True, "columns"))
    # dx, dW, db, and one member's dz and products; the packed copies of dy, x and the
    # pre-activation and dx's per-member pieces were more than 4x dx
    assert peak <= _nbytes(dx, dw, db) + 6 * m * max(max(ks), max(ns)) * 4, (peak, _nbytes(dx))
    assert peak < 2 * _nbytes(dx) + _nbytes(dw, db)
    xs = [c.detach().requires_grad_() for c in x.split(ks, 1)]
    wl = [w.clone().requires_grad_() for w in ws]
    bl = [bi.clone().requires_grad_() for bi in bs]
    want = torch.cat([F.gelu(F.linear(c, w, bi)) for c, w, bi in zip(xs, wl, bl)], 1)
    g = torch.autograd.grad(want, xs + wl + bl, dy)
    torch.testing.assert_close(dx, torch.cat(g[:8], 1))
    torch.testing.assert_close(dw, torch.cat([t.reshape(-1) for t in g[8:16]]), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(db, torch.cat(g[16:]), rtol=1e-4, atol=1e-4)


def test_embedding_backward_accumulates_into_one_gradient_buffer():
    torch.manual_seed(3)
    T, N, D, B, L = 8, 4000, 32, 64, 4
    weights = [torch.randn(N, D) for _ in range(T)]
    idx = [torch.randint(0, N, (B, L)) for _ in range(T)]
    indices = torch.cat([i.reshape(-1) for i in idx])
    modes, pads = [0, 1] * (T // 2), [-1, -1, 7, -1, -1, 3, -1, -1]
    grad_out = torch.randn(B, T * D)
    peak, (dense, spv, spr, pswg) = _peak(lambda: eb_ref.backward(
        grad_out, weights, indices, None, None, modes, pads, [L] * T, [True] * T, [False] * T, False, []))
    # the gradient buffer and one table's gathered rows; the per-table gradients concatenated
    # at the end held every table's gradient twice
    assert peak <= _nbytes(dense) + 4 * B * L * D * 4 + 64 * 1024, (peak, _nbytes(dense))
    ws = [w.clone().requires_grad_() for w in weights]
    outs = [F.embedding_bag(i, w, mode=("sum", "mean")[m], padding_idx=(p if p >= 0 else None))
            for i, w, m, p in zip(idx, ws, modes, pads)]
    got = torch.autograd.grad(torch.cat(outs, 1), ws, grad_out)
    torch.testing.assert_close(dense, torch.cat([g.reshape(-1) for g in got]))
    fwd = eb_ref.forward(weights, indices, None, None, modes, pads, [L] * T)
    torch.testing.assert_close(fwd, torch.cat(outs, 1).detach())


def test_embedding_backward_gathers_in_pieces_with_the_same_sums(monkeypatch):
    """The backward gathers one piece of a table's entries at a time (``GATHER_PIECE``): dense
    (fp32 and bf16, with padding rows), sparse and per-sample-weight gradients equal one
    piece's bitwise."""
    torch.manual_seed(4)
    T, N, D, B, L = 3, 50, 8, 16, 5
    for dt in (torch.float32, torch.bfloat16):
        weights = [torch.randn(N, D).to(dt) for _ in range(T)]
        indices = torch.randint(0, N, (T * B * L,))
        psw = torch.rand(T * B * L).to(dt)
        grad_out = torch.randn(B, T * D).to(dt)
        args = (grad_out, weights, indices, None, psw, [0, 0, 1], [3, -1, 2], [L] * T, [True] * T,
                [False, True, False], True, [])
        got = {}
        for piece in (7, 1 << 20):
            monkeypatch.setattr(eb_ref, "GATHER_PIECE", piece)
            got[piece] = eb_ref.backward(*args)
        for a, b in zip(*got.values()):
            assert torch.equal(a, b), dt
