"""Per-signature plans of the eager path (hits, invalidation, strides), the precomputed table fill,
the capture-mode logic, and the measured routing to torch.bmm / torch._grouped_mm.  CPU only:
launches stubbed or the Triton interpreter on tiny shapes; the vendor routes are plain torch."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kernels_testutil import K, TOL, gl_eager, gl_kernel, ln_kernel, plans, tables, vendor, check_gl, interpret, interpreter_only, interpreter_works, make_gl, needs_triton  # noqa: F401

routes = vendor
pytestmark = [interpreter_only, needs_triton, pytest.mark.usefixtures("interpret")]


@pytest.fixture
def fresh(monkeypatch):
    plans.clear_eager_caches()
    gl_eager.set_gl_route(None)
    monkeypatch.setattr(routes, "_table", {})  # no measured table: every call takes "triton"
    tables.reset_stats()
    yield
    gl_eager.set_gl_route(None)
    plans.clear_eager_caches()


@pytest.fixture
def stubbed(monkeypatch):
    """Kernel launches replaced by no-ops (host logic only); records the tables passed."""
    glk, lnk = gl_kernel(), ln_kernel()
    seen = []
    for mod, names in ((glk, ("launch_forward", "launch_dx", "launch_dw")), (lnk, ("launch_forward", "launch_backward"))):
        for n in names:
            monkeypatch.setattr(mod, n, lambda *a, _n=n, **k: seen.append((_n, a)))
    return seen


def _count_validation(monkeypatch):
    calls = {"gl": 0}
    real = gl_eager.validate

    def counting(*a, **k):
        calls["gl"] += 1
        return real(*a, **k)

    monkeypatch.setattr(gl_eager, "validate", counting)
    return calls


def test_plan_hit_on_second_call(fresh, stubbed, monkeypatch):
    calls = _count_validation(monkeypatch)
    xs, ws, bs = make_gl([(5, 8, 4), (3, 16, 8)], torch.float32, seed=1)
    K.grouped_linear(xs, ws, bs)
    plan = next(iter(plans.PLANS.values()))
    xs2 = [x.detach().clone().requires_grad_() for x in xs]  # other tensors, same metadata
    K.grouped_linear(xs2, ws, bs)
    assert calls["gl"] == 1, "the second call must not re-validate"
    assert len(plans.PLANS) == 1 and next(iter(plans.PLANS.values())) is plan


@pytest.mark.parametrize("change", ["shape", "dtype", "requires_grad", "activation", "grad_mode", "bias"])
def test_plan_invalidated_by_new_signature(fresh, stubbed, monkeypatch, change):
    calls = _count_validation(monkeypatch)
    xs, ws, bs = make_gl([(5, 8, 4), (3, 16, 8)], torch.float32, seed=2)
    K.grouped_linear(xs, ws, bs)
    act = None
    if change == "shape":
        xs = [torch.randn(6, 8, requires_grad=True), xs[1]]
    elif change == "dtype":
        xs, ws, bs = make_gl([(5, 8, 4), (3, 16, 8)], torch.float16, seed=2)
    elif change == "requires_grad":
        xs = [x.detach() for x in xs]
    elif change == "activation":
        act = "relu"
    elif change == "bias":
        bs = [bs[0], None]
    if change == "grad_mode":
        with torch.no_grad():
            K.grouped_linear(xs, ws, bs, act)
    else:
        K.grouped_linear(xs, ws, bs, act)
    assert len(plans.PLANS) == 2 and calls["gl"] == 2


def test_plan_and_strides(fresh, stubbed, monkeypatch):
    """A non-contiguous member is a new signature and is rejected; contiguous layouts that differ
    only in the strides of size-1 dims share the plan (the kernels read rows from the pointer)."""
    calls = _count_validation(monkeypatch)
    xs, ws, bs = make_gl([(1, 8, 4), (3, 16, 8)], torch.float32, seed=3)
    K.grouped_linear(xs, ws, bs)
    odd = torch.empty_strided((1, 8), (1, 1)).copy_(xs[0].detach()).requires_grad_()  # contiguous, other strides
    assert odd.is_contiguous() and odd.stride() != xs[0].stride()
    K.grouped_linear([odd, xs[1]], ws, bs)
    assert len(plans.PLANS) == 1 and calls["gl"] == 1
    t = torch.randn(16, 3).t().requires_grad_()  # (3, 16), not contiguous
    with pytest.raises(ValueError, match=r"xs\[1\].*contiguous"):
        K.grouped_linear([xs[0], t], ws, bs)
    assert calls["gl"] == 2


@interpreter_works
def test_size1_stride_variant_numerics(fresh):
    xs, ws, bs = make_gl([(1, 8, 4), (3, 16, 8)], torch.float32, seed=4)
    odd = torch.empty_strided((1, 8), (1, 1)).copy_(xs[0].detach()).requires_grad_()
    check_gl([odd, xs[1]], ws, bs, "relu", TOL[torch.float32])


def test_table_fill_matches_pointer_offsets(fresh):
    """The precomputed gather/scatter (``_Fill``) writes, in the kernel's processing order, each
    member's pointer offset from its operand's base member, and the missing bias points at the
    zero buffer; static columns keep their packed offsets."""
    xs, ws, bs = make_gl([(4, 8, 16), (0, 24, 8), (6, 16, 24)], torch.float32, seed=5)
    bs[1] = None
    plan = gl_eager._GLPlan(xs, ws, bs, "gelu", True)
    C, G, sig = plan.C, plan.G, plan.sig
    rng = np.random.default_rng(0)
    ptrs = [int(v) * 4 for v in rng.integers(1 << 20, 1 << 30, 3 * G + plan.nb + 2)]  # x, w, 2 biases, y, z, zero
    T, por = plan.fwd_fill.build(ptrs)
    o0 = sig.orders[0]
    px, pw, py = ptrs[:G], ptrs[G:2 * G], ptrs[2 * G + 2:3 * G + 2]
    zero = ptrs[-1]
    pb = [ptrs[2 * G], zero, ptrs[2 * G + 1]]
    for r, g in enumerate(o0):
        assert T[r, C["X"]] == (px[g] - px[plan.bx]) // 4
        assert T[r, C["W"]] == (pw[g] - pw[plan.bw]) // 4
        assert T[r, C["Y"]] == (py[g] - py[plan.by]) // 4
        assert T[r, C["B"]] == (pb[g] - pb[0]) // 4
        assert T[r, C["Z"]] == sig.off_y[g]
        assert (T[r, C["M"]], T[r, C["N"]], T[r, C["K"]]) == (sig.ms[g], sig.ns[g], sig.ks[g])
    assert por == np.bitwise_or.reduce(np.array(px + pw + py + [ptrs[3 * G + 2]]))
    pg = [int(v) * 4 for v in rng.integers(1 << 20, 1 << 30, G)]
    Tb, _ = plan.bwd_fill.build(ptrs + pg)
    o1, o2 = sig.orders[1], sig.orders[2]
    for r, g in enumerate(o1):
        assert Tb[0, r, C["DY"]] == (pg[g] - pg[plan.by]) // 4
        assert Tb[0, r, C["DX"]] == sig.off_x[g]
        assert Tb[0, r, C["Z"]] == sig.off_y[g]
    for r, g in enumerate(o2):
        assert Tb[1, r, C["X"]] == (px[g] - px[plan.bx]) // 4
        assert Tb[1, r, C["DW"]] == sig.off_w[g]


def test_backward_table_key_ignores_dx(fresh, stubbed):
    """dx is one buffer of the path's own with packed offsets (static columns): the backward
    table's key holds the forward pointers and the upstream grads' pointers only."""
    G = 2
    xs, ws, bs = make_gl([(4, 8, 8), (3, 16, 8)], torch.float32, seed=6)
    gys = [torch.ones(4, 8), torch.ones(3, 8)]
    ys = K.grouped_linear(xs, ws, bs)
    torch.autograd.grad(ys, xs + ws + bs, gys)
    nf = 3 * G + G  # x, w, b, y
    assert sorted(len(k) for k in plans.TABLES._d) == [2 + nf, 2 + nf + G]
    dx_launch = [a for n, a in stubbed if n == "launch_dx"][0]
    assert dx_launch[5].numel() == 4 * 8 + 3 * 16  # one buffer for both members


def test_capture_mode_logic(fresh, stubbed, monkeypatch):
    """While capturing: every table is staged fresh (capture=True), nothing is cached, the zero
    bias of partial biases is not cached; after capture, eager calls cache again."""
    seen = []
    real_upload = tables.upload

    def upload(arr, device, capture=None):
        seen.append(capture)
        return real_upload(arr, device, capture)

    monkeypatch.setattr(tables, "upload", upload)
    monkeypatch.setattr(routes._dt, "upload", upload)
    xs, ws, bs = make_gl([(4, 8, 8), (3, 16, 8)], torch.float32, seed=7)
    bs[0] = None
    gys = [torch.ones(4, 8), torch.ones(3, 8)]
    monkeypatch.setattr(tables, "capturing", lambda device: True)
    for _ in range(2):
        ys = K.grouped_linear(xs, ws, bs)
        torch.autograd.grad(ys, xs + ws + [bs[1]], gys)
    assert seen == [True] * 4 and len(plans.TABLES) == 0
    plan = next(iter(plans.PLANS.values()))
    assert plan._zero is None
    monkeypatch.setattr(tables, "capturing", lambda device: False)
    seen.clear()
    ys = K.grouped_linear(xs, ws, bs)
    assert seen == [False] and len(plans.TABLES) == 1 and plan._zero is not None


def test_vendor_route_tables_capture(fresh, monkeypatch):
    """The grouped_mm route's row-offset table: uploaded once per signature, never cached while capturing."""
    seen = []
    real_upload = routes._dt.upload
    monkeypatch.setattr(routes._dt, "upload", lambda a, d, c=None: seen.append(c) or real_upload(a, d, c))
    gl_eager.set_gl_route("grouped_mm")
    xs, ws, bs = make_gl([(4, 8, 8), (3, 8, 8)], torch.float32, seed=8)
    monkeypatch.setattr(routes._dt, "capturing", lambda device: True)
    K.grouped_linear(xs, ws, bs)
    K.grouped_linear(xs, ws, bs)
    assert seen.count(True) == 4  # offs + row map, twice
    monkeypatch.setattr(routes._dt, "capturing", lambda device: False)
    seen.clear()
    for _ in range(3):
        K.grouped_linear(xs, ws, bs)
    assert seen == [False, False]


# ------------------------------------------------------------------------------------------------
# routing
# ------------------------------------------------------------------------------------------------
def test_route_applicability():
    a = routes.applies
    f32, bf16 = torch.float32, torch.bfloat16
    assert a("bmm", f32, [4, 4], [8, 8], [8, 8]) and not a("bmm", f32, [4, 5], [8, 8], [8, 8])
    assert a("grouped_mm", bf16, [4, 5], [8, 8], [16, 16]) == routes._HAS_GMM
    assert not a("grouped_mm", bf16, [4, 5], [8, 16], [16, 16])  # ragged K
    assert not a("grouped_mm", bf16, [4, 5], [12, 12], [16, 16])  # K not a multiple of 16 bytes
    assert not a("bmm", f32, [4, 4], [0, 0], [8, 8])
    assert a("triton", f32, [1, 2], [3, 4], [5, 6])
    with pytest.raises(ValueError, match="route must be"):
        routes.set_route("cublas")


def test_route_table_lookup(tmp_path, monkeypatch):
    ms, ks, ns = [1024] * 16, [128] * 16, [128] * 16
    entry = dict(device="cpu", dtype="float32", uniformity="uniform", size=routes.size_class(ms, ks, ns),
                 G=routes.g_class(16), best="bmm")
    p = tmp_path / "routes.json"
    p.write_text(json.dumps(dict(routes=[entry])))
    tab = routes.load_table(str(p))
    assert tab == {("cpu", "float32", "uniform", entry["size"], 16): "bmm"}
    monkeypatch.setattr(routes, "_table", tab)
    monkeypatch.setattr(routes, "_forced", None)
    cpu = torch.device("cpu")
    assert routes.choose(torch.float32, cpu, ms, ks, ns) == "bmm"
    assert routes.choose(torch.float16, cpu, ms, ks, ns) == "triton"           # not measured
    assert routes.choose(torch.float32, cpu, ms[:8], ks[:8], ns[:8]) == "triton"  # other G class
    assert routes.choose(torch.float32, cpu, [1024] * 15 + [512], ks, ns) == "triton"  # not uniform
    assert routes.load_table(str(tmp_path / "absent.json")) == {}
    (tmp_path / "bad.json").write_text("{not json")
    assert routes.load_table(str(tmp_path / "bad.json")) == {}


def _ref(xs, ws, bs, act):
    f = {None: lambda z: z, "relu": F.relu, "gelu": F.gelu, "tanh": torch.tanh}[act]
    return [f(F.linear(x, w, b)) for x, w, b in zip(xs, ws, bs)]


@pytest.mark.parametrize("route,dims", [
    ("bmm", [(5, 16, 8)] * 3),
    ("bmm", [(7, 16, 8)]),
    ("grouped_mm", [(5, 16, 8), (3, 16, 8), (0, 16, 8), (9, 16, 8)]),
])
@pytest.mark.parametrize("act", [None, "relu", "gelu", "tanh"])
def test_vendor_routes_match_linear(fresh, route, dims, act):
    if route == "grouped_mm" and not routes._HAS_GMM:
        pytest.skip("this torch has no torch._grouped_mm")
    gl_eager.set_gl_route(route)
    g = torch.Generator().manual_seed(9)
    xs = [torch.randn(m, k, generator=g, dtype=torch.float64).requires_grad_() for m, k, n in dims]
    ws = [torch.randn(n, k, generator=g, dtype=torch.float64).requires_grad_() for m, k, n in dims]
    bs = [torch.randn(n, generator=g, dtype=torch.float64).requires_grad_() for m, k, n in dims]
    if len(dims) > 1:
        bs[1] = None
    x32 = [x.detach().float().requires_grad_() for x in xs]
    w32 = [w.detach().float().requires_grad_() for w in ws]
    b32 = [b.detach().float().requires_grad_() if b is not None else None for b in bs]
    ys = K.grouped_linear(x32, w32, b32, act)
    assert all(type(p) is routes.VendorPlan and p.route == route for p in plans.PLANS.values())
    ref = _ref(xs, ws, bs, act)
    for y, r in zip(ys, ref):
        assert y.shape == r.shape
        torch.testing.assert_close(y.double(), r, rtol=1e-5, atol=1e-5)
    p32 = x32 + w32 + [b for b in b32 if b is not None]
    p64 = xs + ws + [b for b in bs if b is not None]
    gys = [torch.randn(r.shape, generator=g, dtype=torch.float64) for r in ref]
    got = torch.autograd.grad(ys, p32, [v.float() for v in gys])
    want = torch.autograd.grad(ref, p64, gys)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


def test_vendor_route_outputs_allow_inplace_and_expanded_grads(fresh):
    """Outputs alias one buffer without being autograd views: in-place ops are legal and do not
    change the gradients of the other members; expanded upstream grads (sum().backward()) work."""
    gl_eager.set_gl_route("bmm")
    xs, ws, bs = make_gl([(4, 8, 8)] * 3, torch.float32, seed=10)
    ys = K.grouped_linear(xs, ws, bs, "relu")
    ys[0].mul_(2.0)
    ref = _ref(xs, ws, bs, "relu")
    ref[0] = ref[0] * 2.0
    loss = sum(y.sum() for y in ys)
    lref = sum(r.sum() for r in ref)
    ps = xs + ws + bs
    for a, b in zip(torch.autograd.grad(loss, ps), torch.autograd.grad(lref, ps)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for y, r in zip(ys, ref):
        torch.testing.assert_close(y, r, rtol=1e-5, atol=1e-5)


def test_forced_route_that_does_not_apply_takes_triton(fresh, stubbed):
    gl_eager.set_gl_route("bmm")
    xs, ws, bs = make_gl([(4, 8, 8), (3, 16, 8)], torch.float32, seed=11)  # ragged
    K.grouped_linear(xs, ws, bs)
    assert all(type(p) is gl_eager._GLPlan for p in plans.PLANS.values())


def test_joined_views_adjacent_members_and_copies_others():
    base = torch.arange(3 * 4 * 8, dtype=torch.float32).view(3, 4, 8)
    parts = list(base.unbind(0))                       # back to back in one storage
    v, is_view = routes._joined(parts, [4, 4, 4], 8, stack=True)
    assert is_view and v.data_ptr() == base.data_ptr() and torch.equal(v, base)
    v, is_view = routes._joined(parts, [4, 4, 4], 8, stack=False)
    assert is_view and torch.equal(v, base.view(12, 8))
    v, is_view = routes._joined([parts[0], parts[2], parts[1]], [4, 4, 4], 8, stack=True)  # out of order
    assert not is_view and torch.equal(v, base[[0, 2, 1]])
    sep = [torch.randn(4, 8) for _ in range(3)]
    v, is_view = routes._joined(sep, [4, 4, 4], 8, stack=True)
    assert not is_view and torch.equal(v, torch.stack(sep))
    ragged = list(torch.arange(9 * 8.).view(9, 8).split([2, 3, 4]))
    v, is_view = routes._joined(ragged, [2, 3, 4], 8, stack=False)
    assert is_view and torch.equal(v, torch.cat(ragged))


@pytest.mark.parametrize("route", ["bmm", "grouped_mm"])
def test_vendor_route_chain_and_packed_weights_are_free(fresh, route, monkeypatch):
    """Weights packed in one buffer and the outputs of a vendor-routed group feeding the next group
    are used in place (no stack / cat), and values and gradients still match F.linear."""
    if route == "grouped_mm" and not routes._HAS_GMM:
        pytest.skip("this torch has no torch._grouped_mm")
    gl_eager.set_gl_route(route)
    views = []
    real = routes._joined
    monkeypatch.setattr(routes, "_joined", lambda *a, **k: (lambda r: views.append(r[1]) or r)(real(*a, **k)))
    G, M, D = 3, 4, 16
    flat_w = torch.randn(2 * G * D * D, requires_grad=True)
    w_all = flat_w.view(2, G, D, D)
    w1, w2 = list(w_all[0].unbind(0)), list(w_all[1].unbind(0))   # "packed parameters": views of one buffer
    xs = [torch.randn(M, D, requires_grad=True) for _ in range(G)]
    h = K.grouped_linear(xs, w1, None, "relu")
    ys = K.grouped_linear(h, w2, None)
    assert views[:4] == [False, True, True, True]  # layer 1: x copied, w view; layer 2: x (= h) view, w view
    ref = [F.linear(F.relu(F.linear(x, a)), b) for x, a, b in zip(xs, w1, w2)]
    for y, r in zip(ys, ref):
        torch.testing.assert_close(y, r, rtol=1e-5, atol=1e-5)
    gys = [torch.randn(M, D) for _ in range(G)]
    got = torch.autograd.grad(ys, xs + [flat_w], gys)
    want = torch.autograd.grad(ref, xs + [flat_w], gys)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_vendor_route_detects_inplace_change_of_viewed_inputs(fresh):
    """Viewed inputs are saved as themselves: an in-place change before the backward raises
    (autograd's version check) instead of giving a wrong gradient."""
    gl_eager.set_gl_route("bmm")
    base = torch.randn(3, 4, 8)
    xs = [base[g] for g in range(3)]  # views of one buffer, back to back
    ws = [torch.randn(8, 8, requires_grad=True) for _ in range(3)]
    ys = K.grouped_linear(xs, ws, None)
    with torch.no_grad():
        xs[1].mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(ys, ws, [torch.ones(4, 8)] * 3)


def test_fp32_products_are_exact_unless_torch_allows_tf32(monkeypatch):
    # Triton's fp32 tl.dot defaults to TF32; the kernels ask for exact products unless torch's
    # own flag allows TF32, and always in the interpreter (16-bit dots are unreliable there).
    glk = gl_kernel()
    assert glk._dot_f32(torch.bfloat16) is True  # interpreter mode (this module's fixture)
    monkeypatch.setattr(glk, "_INTERPRET", False)
    from support import float32_matmul_precision  # every flag restored, whichever API set it before

    with float32_matmul_precision("highest"):
        assert glk._dot_f32(torch.float32) is True
        assert glk._dot_f32(torch.bfloat16) is False
    with float32_matmul_precision("high"):
        assert glk._dot_f32(torch.float32) is False
