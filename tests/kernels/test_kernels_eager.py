"""The eager fast path: per-signature plans, device-table cache, no host syncs, capture mode,
autotuner bypass and tile counts.  CPU only (interpreter or
stubbed launches), a few seconds in all."""

import numpy as np
import pytest
import torch

from kernels_testutil import K, TOL, gl_eager, gl_kernel, ln_eager, ln_kernel, plans, tables, check_gl, check_ln, interpret, interpreter_only, interpreter_works, make_gl, make_ln, needs_triton  # noqa: F401

pytestmark = [interpreter_only, needs_triton, pytest.mark.usefixtures("interpret")]


class _StableEmpty:
    """Stands in for ``torch`` inside eager.py: ``empty`` hands out the same storage for the same
    request, like the CUDA caching allocator does in a steady-state step."""

    def __init__(self):
        self.pool = {}
        self.count = {}

    def reset(self):
        """Start of a step: the n-th request of a (shape, dtype) gets the same storage as last step."""
        self.count.clear()

    def __getattr__(self, name):
        return getattr(torch, name)

    def empty(self, *size, dtype=None, device=None, **kw):
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        key = (shape, dtype, str(device), tuple(sorted(kw.items())))
        i = self.count.get(key, 0)
        self.count[key] = i + 1
        t = self.pool.get(key + (i,))
        if t is None:
            t = self.pool[key + (i,)] = torch.empty(shape, dtype=dtype, device=device, **kw)
        return t


@pytest.fixture
def fresh_caches():
    plans.clear_eager_caches()
    tables.reset_stats()
    yield
    plans.clear_eager_caches()


def _step_gl(xs, ws, bs, act=None, gys=None):
    ys = K.grouped_linear(xs, ws, bs, act)
    gys = gys if gys is not None else [torch.ones_like(y) for y in ys]
    return ys, torch.autograd.grad(ys, list(xs) + list(ws) + [b for b in bs if b is not None], gys)


@interpreter_works
def test_plan_cached_per_signature(fresh_caches):
    xs, ws, bs = make_gl([(5, 8, 4), (3, 16, 8)], torch.float32, seed=1)
    for _ in range(3):
        K.grouped_linear(xs, ws, bs)
    assert plans.eager_cache_info()["plans"] == 1
    with torch.no_grad():  # grad mode is part of the signature
        K.grouped_linear(xs, ws, bs)
    assert plans.eager_cache_info()["plans"] == 2
    xs2, ws2, bs2 = make_gl([(6, 8, 4), (3, 16, 8)], torch.float32, seed=2)  # another shape
    K.grouped_linear(xs2, ws2, bs2)
    assert plans.eager_cache_info()["plans"] == 3
    # a cached plan never skips validation of different metadata: non-contiguous input, other dtype
    bad = [xs[0], torch.randn(16, 3).t()]
    with pytest.raises(ValueError, match=r"xs\[1\].*contiguous"):
        K.grouped_linear(bad, ws, bs)
    with pytest.raises(TypeError, match=r"weights\[1\]"):
        K.grouped_linear(xs, [ws[0], ws[1].double()], bs)


@interpreter_works
def test_table_cache_hits_with_stable_addresses(fresh_caches, monkeypatch):
    """Same plan and same pointers: the device tables are reused (no upload), results stay exact."""
    stable = _StableEmpty()
    for eager in (gl_eager, ln_eager):  # the buffers both eager paths allocate
        monkeypatch.setattr(eager, "torch", stable)
    xs, ws, bs = make_gl([(9, 16, 8), (0, 8, 8), (5, 24, 16)], torch.float32, seed=3)
    gys = [torch.randn(9, 8), torch.randn(0, 8), torch.randn(5, 16)]  # upstream grads: same storage each step
    ref = None
    for i in range(3):
        stable.reset()
        ys, grads = _step_gl(xs, ws, bs, "gelu", gys)
        got = [y.detach().clone() for y in ys] + [g.clone() for g in grads]
        if ref is None:
            ref = got
        else:
            for a, b in zip(got, ref):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
    info = plans.eager_cache_info()
    assert info["misses"] == 2 and info["hits"] == 4, info  # one forward and one backward table
    xs_ = make_ln([(4, 8), (6, 16)], torch.float32, affine=False, seed=4)[0]
    lws = [torch.randn(8, requires_grad=True), None]
    lbs = [None, torch.randn(16, requires_grad=True)]
    lg = [torch.randn(4, 8), torch.randn(6, 16)]
    for _ in range(2):
        stable.reset()
        ys = K.batched_layer_norm(xs_, lws, lbs)
        torch.autograd.grad(ys, xs_, lg)
    info = plans.eager_cache_info()
    assert info["misses"] == 4 and info["hits"] == 6, info


@interpreter_works
def test_table_cache_off_still_correct(fresh_caches):
    plans.set_table_cache(False)
    try:
        xs, ws, bs = make_gl([(7, 16, 8), (3, 8, 24)], torch.float32, seed=5)
        bs[1] = None
        check_gl(xs, ws, bs, "relu", TOL[torch.float32])
        assert plans.eager_cache_info()["tables"] == 0
    finally:
        plans.set_table_cache(True)


@interpreter_works
def test_capture_mode_bypasses_cache(fresh_caches, monkeypatch):
    """While a CUDA graph is being captured, tables are staged fresh every call and never cached
    (a table recorded in a graph holds its values only once the graph runs)."""
    seen = []
    real_upload = tables.upload

    def upload(arr, device, capture=None):
        seen.append(capture)
        return real_upload(arr, device, capture)

    monkeypatch.setattr(tables, "capturing", lambda device: True)
    monkeypatch.setattr(tables, "upload", upload)
    xs, ws, bs = make_gl([(6, 8, 8), (4, 16, 8)], torch.float32, seed=6)
    check_gl(xs, ws, bs, "silu", TOL[torch.float32])
    xl, wl, bl = make_ln([(5, 8), (3, 24)], torch.float32, seed=7)
    check_ln(xl, wl, bl, TOL[torch.float32])
    assert seen and all(c is True for c in seen)
    assert plans.eager_cache_info()["tables"] == 0


def test_capture_without_warmup_raises():
    arr = np.zeros((2, 16), dtype=np.int64)
    saved = dict(tables._arena)
    tables._arena.clear()
    try:
        with pytest.raises(RuntimeError, match="run it once eagerly first"):
            tables.upload(arr, torch.device("cuda", 0), capture=True)
    finally:
        tables._arena.update(saved)


_FORBIDDEN = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


def test_no_host_sync(fresh_caches, monkeypatch):
    """Neither path reads device values on the host: with the launches stubbed out, every
    host-reading tensor method and torch.cuda.synchronize raise, and fwd + bwd still run."""
    glk, lnk = gl_kernel(), ln_kernel()
    for mod, names in ((glk, ("launch_forward", "launch_dx", "launch_dw")), (lnk, ("launch_forward", "launch_backward"))):
        for n in names:
            monkeypatch.setattr(mod, n, lambda *a, **k: None)
    xs, ws, bs = make_gl([(6, 8, 8), (4, 16, 8), (0, 8, 8)], torch.bfloat16, seed=8)
    bs[2] = None
    xl, wl, bl = make_ln([(5, 8), (3, 24)], torch.float16, seed=9)
    wl[0] = None
    gys = [torch.ones(6, 8, dtype=torch.bfloat16), torch.ones(4, 8, dtype=torch.bfloat16),
           torch.ones(0, 8, dtype=torch.bfloat16)]
    lgys = [torch.ones(5, 8, dtype=torch.float16), torch.ones(3, 24, dtype=torch.float16)]

    def boom(*a, **k):
        raise AssertionError("host sync")

    for n in _FORBIDDEN:
        monkeypatch.setattr(torch.Tensor, n, boom)
    monkeypatch.setattr(torch.cuda, "synchronize", boom)
    for _ in range(2):
        ys = K.grouped_linear(xs, ws, bs, "tanh")
        torch.autograd.grad(ys, xs + ws + [bs[0], bs[1]], gys)
        zs = K.batched_layer_norm(xl, wl, bl)
        torch.autograd.grad(zs, xl + [wl[1]] + bl, lgys)


def test_tile_counts_match_kernel_enumeration():
    glk = gl_kernel()
    rng = np.random.default_rng(0)
    ms, ks, ns = [int(v) for v in rng.integers(0, 300, 9)], [int(v) for v in rng.integers(0, 300, 9)], \
        [int(v) for v in rng.integers(0, 300, 9)]
    sig = glk.signature(ms, ks, ns)
    cd = lambda a, b: -(-a // b)
    for bm, bn in ((16, 16), (64, 128), (128, 64)):
        assert sig.tiles(0, bm, bn) == sum(cd(m, bm) * cd(n, bn) for m, n in zip(ms, ns))
        assert sig.tiles(1, bm, bn) == sum(cd(m, bm) * cd(k, bn) for m, k in zip(ms, ks))
        for split in (32, 512):
            assert sig.tiles(2, bm, bn, split) == sum(cd(n, bm) * max(cd(k, bn), 1) * cd(m, split)
                                                      for m, k, n in zip(ms, ks, ns))


def test_autotuner_consulted_once_per_key(monkeypatch):
    """After the autotuner has chosen for a (kernel, key, flags), launches go to the jitted kernel
    with that choice; the autotuner is not called again."""
    glk = gl_kernel()
    calls = {"tuned": 0, "raw": []}

    class Cfg:
        def all_kwargs(self):
            return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, PROGS_PER_SM=1, num_warps=4, num_stages=3)

    class Tuned:
        best_config = Cfg()

        def __getitem__(self, grid):
            def run(*a, **k):
                calls["tuned"] += 1
            return run

    class Raw:
        def __getitem__(self, grid):
            def run(*a, **k):
                calls["raw"].append((grid, k["BLOCK_M"], k["num_warps"]))
            return run

    monkeypatch.setattr(glk, "_INTERPRET", False)
    monkeypatch.setattr(glk, "_AUTOTUNE", True)
    monkeypatch.setattr(glk, "_fwd_tuned", Tuned(), raising=False)
    monkeypatch.setattr(glk, "_gl_fwd_kernel", Raw())
    monkeypatch.setattr(glk, "_CHOSEN", {})
    sig = glk.signature([100, 300], [64, 64], [64, 128])
    x = torch.empty(10, dtype=torch.bfloat16)
    for _ in range(3):
        glk.launch_forward(sig, None, x, x, None, x, None, "none", 8)
    assert calls["tuned"] == 1
    tiles = 2 * 1 + 5 * 2
    assert calls["raw"] == [((min(tiles, 2),), 64, 4)] * 2  # 2 SMs x 1 program per SM on a CPU device
    glk.launch_forward(sig, None, x, x, None, x, None, "relu", 8)  # other flags: consult the tuner once
    assert calls["tuned"] == 2
