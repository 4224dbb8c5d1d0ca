"""optimus.kernels on a CUDA GPU (compiled Triton) at realistic sizes.  Marked ``gpu``."""

import warnings

import pytest
import torch

from kernels_testutil import GPU_TOL, HAS_CUDA, K, check_gl, check_ln, gl_eager, gl_kernel, ln_kernel, make_gl, make_ln, plans, tables

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


def _gl_ln_step(xs, ws, bs, lws, gys):
    ys = K.grouped_linear(xs, ws, bs, "gelu")
    zs = K.batched_layer_norm(ys, lws, None)
    params = list(xs) + list(ws) + [b for b in bs if b is not None] + list(lws)
    return [z.detach() for z in zs], torch.autograd.grad(zs, params, gys)


def test_cuda_graph_capture_gpu():
    """The eager list API captured in a CUDA graph (tables staged through the capture arena):
    replays match eager results, also after the inputs change in place."""
    dims = [(512, 64, 128), (1024, 256, 64), (0, 64, 64), (300, 40, 24)]
    xs0, ws0, bs0 = make_gl(dims, torch.bfloat16, device="cuda", seed=4)
    bs0[1] = None
    g = torch.Generator(device="cuda").manual_seed(5)
    gys = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g) for m, k, n in dims]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        xs = [x.detach().clone().requires_grad_() for x in xs0]
        ws = [w.detach().clone().requires_grad_() for w in ws0]
        bs = [b.detach().clone().requires_grad_() if b is not None else None for b in bs0]
        lws = [torch.ones(n, device="cuda", dtype=torch.bfloat16, requires_grad=True) for m, k, n in dims]
        step = lambda: _gl_ln_step(xs, ws, bs, lws, gys)
        for _ in range(2):
            step()
        s.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            out_z, out_g = step()
    torch.cuda.current_stream().wait_stream(s)
    for it in range(2):
        if it:
            with torch.no_grad():
                for x in xs:
                    x.mul_(0.5).add_(0.25)
        graph.replay()
        torch.cuda.synchronize()
        ref_z, ref_g = step()
        for a, b in zip(out_z + list(out_g), ref_z + list(ref_g)):
            torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


def test_steady_state_reuses_tables_gpu():
    """A repeated eager step reuses device tables when the caching allocator repeats
    addresses. On the H200 with torch 2.11 (2026-11-30) it alternated between two sets of
    addresses: 16 uploads and 8 hits over 6 steps, so the test asserts reuse, not zero
    uploads."""
    dims = [(256, 64, 32), (128, 32, 64), (64, 16, 16)]
    xs, ws, bs = make_gl(dims, torch.bfloat16, device="cuda", seed=6)
    lws = [torch.ones(n, device="cuda", dtype=torch.bfloat16, requires_grad=True) for m, k, n in dims]
    gys = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for m, k, n in dims]
    _gl_ln_step(xs, ws, bs, lws, gys)
    tables.reset_stats()
    for _ in range(6):
        out = _gl_ln_step(xs, ws, bs, lws, gys)
        del out
    torch.cuda.synchronize()
    st = tables.stats()
    assert st["hits"] >= 1 and st["uploads"] + st["hits"] >= 18, st


@pytest.mark.parametrize("tf32", [False, True])
def test_fp32_precision_follows_torch_tf32_flag_gpu(tf32):
    # Triton's default for an fp32 tl.dot is TF32 (~1e-3 relative error); torch's fp32 matmuls
    # are exact unless allow_tf32 is on, and the grouped kernels must follow the same flag.
    dims = [(512, 136, 208), (512, 24, 40), (300, 33, 17)]
    xs, ws, bs = make_gl(dims, torch.float32, device="cuda", seed=4)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        errs = check_gl(xs, ws, bs, "relu", 5e-3 if tf32 else 1e-5)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    if tf32:
        assert errs["y"] > 1e-5, f"TF32 allowed but the products look exact: {errs}"


# ------------------------------------------------------------------------------------------------
# kernel review (2026-12-01, session 4): what only a compiled kernel on a GPU can show
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tf32", [False, True])
def test_fp32_precision_follows_torch_fp32_precision_api_gpu(tf32):
    """torch >= 2.9's second TF32 API: after ``fp32_precision = "tf32"`` reading the legacy
    ``allow_tf32`` raises, which made every fp32 grouped-linear launch raise too."""
    m = torch.backends.cuda.matmul
    if not hasattr(m, "fp32_precision"):
        pytest.skip("this torch has only the legacy TF32 flag")
    dims = [(512, 136, 208), (512, 24, 40), (300, 33, 17)]
    xs, ws, bs = make_gl(dims, torch.float32, device="cuda", seed=4)
    prev = m.fp32_precision
    m.fp32_precision = "tf32" if tf32 else "ieee"
    try:
        errs = check_gl(xs, ws, bs, "relu", 5e-3 if tf32 else 1e-5)
    finally:
        m.fp32_precision = prev
    if tf32:
        assert errs["y"] > 1e-5, f"TF32 allowed but the products look exact: {errs}"


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def test_grouped_linear_member_just_below_int32_limit_gpu():
    """A member of 2**31 - 64 elements (4 GiB of bf16) on the kernels: the int32 row offsets of the
    last rows are right, and the masked lanes past them (whose offsets wrap) do not fault."""
    M, Kd, N = 2 ** 25 - 1, 64, 64
    g = torch.Generator(device="cuda").manual_seed(7)
    big = torch.randn(M, Kd, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    small = torch.randn(64, Kd, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    ws = [(torch.randn(N, Kd, device="cuda", generator=g) / 8).to(torch.bfloat16).requires_grad_() for _ in range(2)]
    gl_eager.set_gl_route("triton")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            ys = K.grouped_linear([small, big], ws, None)
        assert not [w for w in seen if "int32" in str(w.message)], "under the limit: no plain-torch fallback"
        gy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, generator=g)
        dx, dw = torch.autograd.grad(ys[1], [big, ws[1]], gy)
    finally:
        gl_eager.set_gl_route(None)
    tail = slice(M - 4096, M)
    with torch.no_grad():
        assert _rel(ys[1][tail], big[tail].float() @ ws[1].float().t()) < 1e-2
        assert _rel(ys[1][:4096], big[:4096].float() @ ws[1].float().t()) < 1e-2
        assert _rel(dx[tail], gy[tail].float() @ ws[1].float()) < 1e-2
        assert _rel(dw, torch.matmul(gy.t(), big)) < 2e-2
        assert _rel(ys[0], small.float() @ ws[0].float().t()) < 1e-2


def test_member_past_int32_limit_runs_plain_torch_gpu():
    """2**31 + 1024 elements in one member's x: the eager path and the packed op both take the
    plain-torch path (with a warning) instead of launching kernels whose int32 offsets would wrap."""
    M, Kd, N = 2 ** 25 + 16, 64, 8
    plans.clear_eager_caches()  # the warnings come once per plan / signature
    gl_kernel()._SIGS.clear()
    g = torch.Generator(device="cuda").manual_seed(8)
    big = torch.randn(M, Kd, device="cuda", dtype=torch.bfloat16, generator=g)
    small = torch.randn(64, Kd, device="cuda", dtype=torch.bfloat16, generator=g)
    ws = [torch.randn(N, Kd, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2)]
    gl_eager.set_gl_route("triton")
    try:
        with pytest.warns(RuntimeWarning, match="int32 indexing"):
            ys = K.grouped_linear([small, big], ws, None)
    finally:
        gl_eager.set_gl_route(None)
    tail = slice(M - 4096, M)
    assert _rel(ys[1][tail], torch.nn.functional.linear(big[tail], ws[1])) < 1e-2
    with pytest.warns(RuntimeWarning, match="int32 indexing"):
        y, _ = torch.ops.optimus.grouped_linear(K.pack([small, big]), K.pack(ws), None, [64, M], [Kd, Kd],
                                                [N, N], "none")
    assert _rel(y[-4096 * N:].view(4096, N), torch.nn.functional.linear(big[tail], ws[1])) < 1e-2
    del big, y, ys
    xl = torch.randn(2 ** 25 + 1, 64, device="cuda", dtype=torch.bfloat16, generator=g)  # layer norm: 2**31 + 64
    with pytest.warns(RuntimeWarning, match="int32 indexing"):
        (z,) = K.batched_layer_norm([xl])
    assert _rel(z[-4096:], torch.nn.functional.layer_norm(xl[-4096:], (64,))) < 1e-2


def test_layer_norm_member_just_below_int32_limit_gpu():
    R, D = 2 ** 25 - 1, 64
    g = torch.Generator(device="cuda").manual_seed(9)
    x = torch.randn(R, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    w = torch.randn(D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    (y,) = K.batched_layer_norm([x], [w])
    gy = torch.randn(R, D, device="cuda", dtype=torch.bfloat16, generator=g)
    dx, dw = torch.autograd.grad(y, [x, w], gy)
    tail = slice(R - 4096, R)
    xt = x[tail].detach().float().requires_grad_()
    rt = torch.nn.functional.layer_norm(xt, (D,), w.detach().float())
    (rdx,) = torch.autograd.grad(rt, [xt], gy[tail].float())
    assert _rel(y[tail], rt) < 1e-2 and _rel(dx[tail], rdx) < 2e-2
    with torch.no_grad():
        rdw = torch.zeros(D, device="cuda", dtype=torch.float64)
        for r0 in range(0, R, 2 ** 22):  # dW = sum_r dy * xhat, in slices (fp32 copies of 4 GiB otherwise)
            xhat = torch.nn.functional.layer_norm(x[r0:r0 + 2 ** 22].float(), (D,))
            rdw += (gy[r0:r0 + 2 ** 22].float() * xhat).sum(0).double()
            if r0 == 0:
                assert _rel(y[: 2 ** 22], xhat * w.float()) < 1e-2
    assert _rel(dw, rdw) < 2e-2


def test_packed_tables_are_per_stream_gpu():
    """A packed-op table cached on stream A (its upload queued behind A's work) is not used by a
    launch on an idle stream B before the copy lands: each stream uploads its own.  The kernels are
    tuned first on a signature of the same tuning key, so no autotuner sync hides the race."""
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(10)

    def gl_inputs(ms, ks, ns):
        x = torch.randn(sum(m * k for m, k in zip(ms, ks)), device=dev, generator=g)
        w = torch.randn(sum(n * k for n, k in zip(ns, ks)), device=dev, generator=g)
        return x, w

    def gl_ref(x, w, ms, ks, ns):
        out, ox, ow = [], 0, 0
        for m, k, n in zip(ms, ks, ns):
            out.append((x[ox:ox + m * k].view(m, k).double() @ w[ow:ow + n * k].view(n, k).double().t()).reshape(-1))
            ox, ow = ox + m * k, ow + n * k
        return torch.cat(out)

    warm = ([36, 1000], [24, 40], [56, 8])
    race = ([37, 1000], [24, 40], [56, 8])     # same tuning key (G, next_pow2 of the largest dims)
    torch.ops.optimus.grouped_linear(*gl_inputs(*warm), None, *warm, "none")
    lw = ([100, 200], [64, 32])
    lr = ([200, 100], [64, 32])                # same tuning key (widest class, total rows)
    torch.ops.optimus.batched_layer_norm(torch.randn(100 * 64 + 200 * 32, device=dev), None, None, *lw, 1e-5)
    x, w = gl_inputs(*race)
    xl = torch.randn(200 * 64 + 100 * 32, device=dev, generator=g)
    torch.cuda.synchronize()
    sa, sb = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(sa):
        torch.cuda._sleep(int(3e8))            # ~0.15 s of GPU time ahead of the uploads on stream A
        ya, _ = torch.ops.optimus.grouped_linear(x, w, None, *race, "none")
        za, _ = torch.ops.optimus.batched_layer_norm(xl, None, None, *lr, 1e-5)
    with torch.cuda.stream(sb):
        yb, _ = torch.ops.optimus.grouped_linear(x, w, None, *race, "none")
        zb, _ = torch.ops.optimus.batched_layer_norm(xl, None, None, *lr, 1e-5)
    torch.cuda.synchronize()
    want = gl_ref(x, w, *race)
    zwant = torch.cat([torch.nn.functional.layer_norm(xl[:200 * 64].view(200, 64), (64,)).reshape(-1),
                       torch.nn.functional.layer_norm(xl[200 * 64:].view(100, 32), (32,)).reshape(-1)])
    for y in (ya, yb):
        assert _rel(y, want) < 1e-5
    for z in (za, zb):
        assert _rel(z, zwant) < 1e-4


def test_captured_graph_survives_signature_cache_clear_gpu():
    """A CUDA graph that captured the packed ops reads their cached device tables at every replay;
    clearing the signature caches (they are cleared when full) must not free those tables."""
    glk, lnk = gl_kernel(), ln_kernel()
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(11)
    ms, ks, ns = [33, 70], [24, 40], [48, 16]
    x = torch.randn(sum(m * k for m, k in zip(ms, ks)), device=dev, generator=g)
    w = torch.randn(sum(n * k for n, k in zip(ns, ks)), device=dev, generator=g)
    rows, widths = [33, 70], [48, 16]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm-up on the capture stream: tuned, tables cached for this stream
            y, _ = torch.ops.optimus.grouped_linear(x, w, None, ms, ks, ns, "gelu")
            z, _ = torch.ops.optimus.batched_layer_norm(y, None, None, rows, widths, 1e-5)
        s.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            y, _ = torch.ops.optimus.grouped_linear(x, w, None, ms, ks, ns, "gelu")
            z, _ = torch.ops.optimus.batched_layer_norm(y, None, None, rows, widths, 1e-5)
    torch.cuda.current_stream().wait_stream(s)
    graph.replay()
    torch.cuda.synchronize()
    want_y, want_z = y.clone(), z.clone()
    glk._SIGS.clear()
    lnk._SIGS.clear()
    __import__("gc").collect()
    junk = [torch.full((n,), -(2 ** 40), dtype=torch.int64, device=dev) for n in (16, 32, 64, 96, 128, 256, 512)
            for _ in range(32)]  # reuse any freed small block with garbage offsets
    graph.replay()
    torch.cuda.synchronize()
    del junk
    torch.testing.assert_close(y, want_y)
    torch.testing.assert_close(z, want_z)


@pytest.mark.parametrize("deterministic", [True, False])
def test_embedding_aligned_sparse_and_dense_tables_gpu(deterministic):
    """16-byte-aligned tables (ALIGN > 1, vector loads / stores) where some tables are sparse: their
    dense-gradient offset is -1, which the walk and segment kernels no longer hint as a multiple of
    ALIGN (a false ``tl.multiple_of`` is undefined behaviour on the GPU only)."""
    from embedding_testutil import check_case, make_case, to_device

    # no per-sample weights: like torch's embedding_bag, the op takes them with mode "sum" only
    c = make_case([1000, 4096, 64, 20_000], [16, 64, 128, 256], B=512, modes=["sum", "mean", "sum", "sum"],
                  pads=[3, None, 0, None], max_bag=12, dtype=torch.bfloat16, psw=False, seed=12)
    check_case(to_device(c, "cuda"), GPU_TOL[torch.bfloat16], form="packed", deterministic=deterministic,
               sparse=[True, False, True, False])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_a_device_that_is_not_current_gpu():
    """Triton launches on the current device; the launchers switch to the tensors' device
    (cuda:1 here, while cuda:0 is current) instead of running there with foreign pointers."""
    from embedding_testutil import check_case, make_case, to_device

    assert torch.cuda.current_device() == 0
    dims = [(300, 33, 17), (64, 64, 128)]
    xs, ws, bs = make_gl(dims, torch.bfloat16, device="cuda:1", seed=13)
    check_gl(xs, ws, bs, "gelu", GPU_TOL[torch.bfloat16])
    xs, ws, bs = make_ln([(100, 64), (37, 1000)], torch.bfloat16, device="cuda:1", seed=14)
    check_ln(xs, ws, bs, GPU_TOL[torch.bfloat16])
    c = make_case([1000, 64], [16, 64], B=64, modes=["sum", "mean"], dtype=torch.float32, seed=15)
    check_case(to_device(c, "cuda:1"), 1e-4, form="packed")
    assert torch.cuda.current_device() == 0


def test_tanh_activation_is_accurate_near_zero_gpu():
    """Compiled tanh epilogue (approximate exp / division on the GPU) stays within a few ulps of
    torch.tanh, also for tiny pre-activations (the old 2 / (1 + exp(-2z)) - 1 returned 0 there)."""
    from test_kernels_limits import max_tanh_ulps, tanh_points

    z = tanh_points("cuda")
    w = torch.ones(1, 1, device="cuda")
    gl_eager.set_gl_route("triton")
    try:
        (y,) = K.grouped_linear([z[:, None]], [w], None, "tanh")
    finally:
        gl_eager.set_gl_route(None)
    assert max_tanh_ulps(y[:, 0], z) <= 8


def _replays_match_eager(model, inputs_per_step, passes="auto"):
    """``model`` (a small zoo model) compiled with mode="reduce-overhead", inference and training:
    every step's output and every parameter's gradient match eager's on the same inputs (warm-up,
    recording, replays). Returns the rules that matched, per mode."""
    import optimus
    from optimus.tools.models import get_model

    matched = {}
    for train in (False, True):
        torch._dynamo.reset()
        z = get_model(model, "small", device="cuda")
        ref = get_model(model, "small", device="cuda")
        fn = optimus.compile(z.model, passes=passes, mode="reduce-overhead", fullgraph=True)
        for inputs in inputs_per_step(z.inputs):
            torch.compiler.cudagraph_mark_step_begin()
            with torch.set_grad_enabled(train):
                out = fn(*inputs)
                want = ref.model(*inputs)
            torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
            if train:
                z.loss(out).backward()
                ref.loss(want).backward()
                for p, q in zip(z.model.parameters(), ref.model.parameters()):
                    torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
                    p.grad = q.grad = None
        matched[train] = {r for g in fn.optimus_report.graphs for r, s in g.rules.items() if s.matched}
    return matched


def test_grouped_ops_under_cudagraph_trees_gpu():
    """The rules' custom ops compiled with mode="reduce-overhead" (cudagraph trees): warm-up,
    record and replays leave no cached table in the graph pool ("tensors in the cudagraph pool
    not tracked as outputs", H200 run 4) and replays match eager, training and inference."""
    from optimus.core.registry import REGISTRY

    assert REGISTRY.get("grouped_linear").cudagraph_safe  # on under CUDA graphs by default
    matched = _replays_match_eager("hetero_towers", lambda inputs: [inputs] * 4)
    assert matched[True] & {"grouped_linear", "batched_layer_norm"}, matched[True]


@pytest.mark.parametrize("model", ["dlrm", "tables26"])
def test_grouped_embedding_lookups_under_cudagraph_trees_gpu(model, monkeypatch):
    """The grouped embedding-bag op compiled with mode="reduce-overhead": the rule matches,
    and forward and gradients match eager over the warm-up, the recording and replays whose
    indices change every step (a stale table or pointer would show as a wrong pooled row)."""
    from optimus.compile import CUDAGRAPH_KERNELS_ENV

    monkeypatch.setenv(CUDAGRAPH_KERNELS_ENV, "1")  # on whether or not the rule is marked capture-safe

    def new_ids_each_step(inputs):
        dense, sparse = inputs
        gen = torch.Generator(device="cuda").manual_seed(7)
        yield dense, sparse
        for _ in range(4):  # each table's ids stay within its rows: the batch's bags reshuffled
            yield dense, sparse[torch.randperm(sparse.shape[0], device="cuda", generator=gen)].flip(-1)

    matched = _replays_match_eager(model, new_ids_each_step, passes="all")
    for rules in matched.values():
        assert "group_embedding_lookups" in rules, rules
