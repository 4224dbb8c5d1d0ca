"""GPU correctness check + benchmark for optimus.kernels (one command).

    PYTHONPATH=. python -m kernels.bench --out OUT_DIR

Phase A (parallel worker processes, also fills Triton's on-disk compile cache):
    correctness of grouped_linear / batched_layer_norm at realistic sizes against float64
    references (fp32, fp16, bf16; every activation; ragged, unaligned, G = 1, zero-sized
    members; the packed custom ops and torch.compile(aot_eager) over them), and compilation of
    every autotuning candidate used by phase B.
Phase B (this process, GPU otherwise idle):
    ceilings measured in the same run (large device-to-device copy, 8192^3 bf16 matmul), then
    grouped linear for G in {4, 16, 64} (mixed-small, mixed, uniform-small, uniform-large) against
    a loop of F.linear, torch.baddbmm on stacked inputs and torch._grouped_mm (uniform, bf16) and
    batched layernorm against a loop of F.layer_norm and one F.layer_norm on a stacked tensor.

Timings (milliseconds):
    wall   steady-state wall clock of back-to-back calls (includes Python / launch overhead;
           what an eager training step sees)
    gpu    triton.testing.do_bench median (CUDA events, L2 flushed before each call)
    graph  CUDA-graph replay (do_bench median) of the same work: launch overhead removed
           (ours captured through the packed custom op, whose tables live on the device)
Writes OUT/bench.json (everything) and OUT/table.txt (the table printed last).
"""

import argparse
import datetime
import json
import math
import os
import random
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from . import ops
from .ops import batched_layer_norm, grouped_linear

ACT_FN = {"none": lambda z: z, "relu": F.relu, "gelu": F.gelu, "silu": F.silu, "sigmoid": torch.sigmoid,
          "tanh": torch.tanh}
TOL = {torch.float32: 5e-3, torch.float16: 5e-3, torch.bfloat16: 2e-2}
LN_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


DEV = "cuda"
DRY = False  # --dry-run: CPU + Triton interpreter, shapes scaled down, timings are single wall-clock calls


def dev_():
    return torch.device(DEV)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def _scale(v, f):
    return v if (not DRY or v == 0) else max(1, v // f)


def rel(a, r):
    a = a.double()
    r = r.double()
    if not torch.isfinite(a).all():
        return float("inf")
    d = r.norm().item()
    return (a - r).norm().item() / (d if d > 0 else 1.0)


_GEN = {}


def randn_like(t, seed=None):
    """Random normal like t from a private generator (never the default CUDA generator, so a
    failed CUDA-graph capture cannot leave random-number generation broken)."""
    key = (t.device.type, t.device.index)
    g = _GEN.get(key)
    if g is None:
        g = _GEN[key] = torch.Generator(device=t.device)
        g.manual_seed(1234)
    if seed is not None:
        g.manual_seed(seed)
    return torch.randn(t.shape, generator=g, device=t.device, dtype=t.dtype)


def cat_flat(ts):
    ts = [t.reshape(-1) for t in ts if t is not None]
    return torch.cat(ts) if ts else torch.zeros(0)


# ------------------------------------------------------------------------------------------------
# shapes
# ------------------------------------------------------------------------------------------------
def gl_dims(kind, G, seed=0):
    return [(_scale(m, 64), _scale(k, 16), _scale(n, 16)) for m, k, n in _gl_dims(kind, G, seed)]


def ln_dims(kind, G, seed=0):
    return [(_scale(r, 64), _scale(d, 16)) for r, d in _ln_dims(kind, G, seed)]


def _gl_dims(kind, G, seed=0):
    rng = random.Random(seed * 1000 + G)
    if kind == "mixed-small":
        return [(rng.choice([512, 1024]), rng.choice([64, 128, 256]), rng.choice([64, 128, 256])) for _ in range(G)]
    if kind == "mixed":
        return [(rng.choice([512, 1024, 2048, 4096]), rng.choice([64, 128, 256, 512]),
                 rng.choice([64, 128, 256, 512])) for _ in range(G)]
    if kind == "uniform-small":
        return [(1024, 128, 128)] * G
    if kind == "uniform-large":
        return [(4096, 512, 512)] * G
    raise ValueError(kind)


def _ln_dims(kind, G, seed=0):
    rng = random.Random(seed * 1000 + G + 7)
    if kind == "uniform":
        return [(4096, 512)] * G
    if kind == "mixed":
        return [(rng.choice([1024, 2048, 4096, 8192]), rng.choice([64, 128, 256, 512, 1024, 2048])) for _ in range(G)]
    if kind == "large":
        return [(32768, 1024)] * G
    raise ValueError(kind)


def make_gl(dims, dtype, dev, bias=True, grad=True, seed=0):
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    xs = [torch.randn(m, k, dtype=dtype, device=dev, generator=g).requires_grad_(grad) for m, k, n in dims]
    ws = [(torch.randn(n, k, dtype=dtype, device=dev, generator=g) / math.sqrt(max(k, 1))).requires_grad_(grad)
          for m, k, n in dims]
    bs = [torch.randn(n, dtype=dtype, device=dev, generator=g).requires_grad_(grad) for m, k, n in dims] if bias \
        else None
    return xs, ws, bs


# ------------------------------------------------------------------------------------------------
# phase A tasks (run in worker processes)
# ------------------------------------------------------------------------------------------------
def _gl_ref64(xs, ws, bs, act, gys, ys_ours=None):
    """float64 outputs and grads.  For relu the backward mask is taken from our own forward output
    (ys_ours): relu' is discontinuous, and with TF32 (fp32 inputs) pre-activations within rounding
    of 0 can change sign; that is a property of the forward's precision, not of the backward."""
    x64 = [x.detach().double().requires_grad_() for x in xs]
    w64 = [w.detach().double().requires_grad_() for w in ws]
    b64 = [b.detach().double().requires_grad_() if b is not None else None for b in bs] if bs is not None else None
    zs = [F.linear(x, w, b64[i] if b64 is not None else None) for i, (x, w) in enumerate(zip(x64, w64))]
    if act == "relu" and ys_ours is not None:
        ys = [z * (y.detach() > 0).double() for z, y in zip(zs, ys_ours)]
    else:
        ys = [ACT_FN[act](z) for z in zs]
    params = x64 + w64 + ([b for b in b64 if b is not None] if b64 is not None else [])
    grads = torch.autograd.grad(ys, params, [g.double() for g in gys], allow_unused=True)
    return ys, grads


def _autotune(flag):
    from . import grouped_linear_kernel as K
    K.set_autotune(flag)


def task_gl_check(dtype_name, acts, seed):
    _autotune(False)
    torch.manual_seed(seed)
    dev = dev_()
    dtype = DT[dtype_name]
    out = []
    cases = {
        # ragged + unaligned + zero-sized members (M = 0, K = 0, N = 0)
        "ragged": [(300, 33, 17), (0, 64, 128), (777, 200, 1), (5, 0, 40), (2048, 512, 384), (64, 96, 0),
                   (1, 24, 8)],
        # realistic aligned mix
        "aligned": [(4096, 512, 256), (512, 64, 512), (2048, 256, 256), (0, 128, 128), (1024, 128, 64)],
        "G1": [(2048, 512, 384)],
    }
    for act in acts:
        for cname, dims in cases.items():
            dims = [(_scale(m, 64), _scale(k, 16), _scale(n, 16)) for m, k, n in dims]
            xs, ws, bs = make_gl(dims, dtype, dev, bias=True, seed=seed)
            if cname == "ragged":
                bs[2] = None  # a member without bias
            t0 = time.time()
            ys = grouped_linear(xs, ws, bs, act)
            gys = [randn_like(y) for y in ys]
            params = list(xs) + list(ws) + [b for b in bs if b is not None]
            grads = torch.autograd.grad(ys, params, gys, allow_unused=True)
            sync()
            ry, rg = _gl_ref64(xs, ws, bs, act, gys, ys)
            G = len(dims)
            e = dict(y=rel(cat_flat(ys), cat_flat(ry)),
                     dx=rel(cat_flat(grads[:G]), cat_flat(rg[:G])),
                     dw=rel(cat_flat(grads[G:2 * G]), cat_flat(rg[G:2 * G])),
                     db=rel(cat_flat(grads[2 * G:]), cat_flat(rg[2 * G:])))
            ok = all(v <= TOL[dtype] for v in e.values())
            out.append(dict(test="grouped_linear", dtype=dtype_name, act=act, case=cname, errors=e, ok=ok,
                            seconds=round(time.time() - t0, 2)))
    return out


def task_gl_op(dtype_name, seed):
    """Packed custom op (eager) and torch.compile(fullgraph, aot_eager) over the public functions."""
    _autotune(False)
    dev = dev_()
    dtype = DT[dtype_name]
    dims = [(_scale(m, 64), _scale(k, 16), _scale(n, 16)) for m, k, n in [(1000, 256, 128), (0, 64, 64), (513, 128, 384)]]
    xs, ws, bs = make_gl(dims, dtype, dev, seed=seed)
    res = []
    ms, ks, ns = [d[0] for d in dims], [d[1] for d in dims], [d[2] for d in dims]
    xp = ops.pack([x.detach() for x in xs]).requires_grad_()
    wp = ops.pack([w.detach() for w in ws]).requires_grad_()
    bp = ops.pack([b.detach() for b in bs]).requires_grad_()
    yp = ops.grouped_linear_packed(xp, wp, bp, ms, ks, ns, "silu")
    gy = randn_like(yp)
    dx, dw, db = torch.autograd.grad(yp, (xp, wp, bp), gy)
    gys = ops.unpack(gy, [(m, n) for m, k, n in dims])
    ry, rg = _gl_ref64(xs, ws, bs, "silu", gys)
    G = len(dims)
    e = dict(y=rel(yp, cat_flat(ry)), dx=rel(dx, cat_flat(rg[:G])), dw=rel(dw, cat_flat(rg[G:2 * G])),
             db=rel(db, cat_flat(rg[2 * G:])))
    res.append(dict(test="grouped_linear_op", dtype=dtype_name, errors=e, ok=all(v <= TOL[dtype] for v in e.values())))

    lws = [torch.randn(n, dtype=dtype, device=dev, requires_grad=True) for m, k, n in dims]
    lbs = [torch.randn(n, dtype=dtype, device=dev, requires_grad=True) for m, k, n in dims]

    def f(xs, ws, bs, lws, lbs):
        ys = grouped_linear(xs, ws, bs, "gelu")
        zs = batched_layer_norm(ys, lws, lbs)
        return sum((z.float() * z.float()).sum() for z in zs)

    params = list(xs) + list(ws) + list(bs) + lws + lbs
    try:
        o0 = f(xs, ws, bs, lws, lbs)
        g0 = torch.autograd.grad(o0, params, allow_unused=True)
        cf = torch.compile(f, fullgraph=True, backend="aot_eager")
        o1 = cf(xs, ws, bs, lws, lbs)
        g1 = torch.autograd.grad(o1, params, allow_unused=True)
        e = dict(out=rel(o1.detach().reshape(1), o0.detach().reshape(1)),
                 grads=max(rel(a, b) for a, b in zip(g1, g0) if a is not None and b is not None))
        res.append(dict(test="torch.compile(aot_eager)", dtype=dtype_name, errors=e,
                        ok=all(v <= TOL[dtype] for v in e.values())))
    except Exception as ex:  # pragma: no cover - reported
        res.append(dict(test="torch.compile(aot_eager)", dtype=dtype_name, ok=False, error=repr(ex)[:500]))
    return res


def task_ln_check(dtype_name, affine, seed):
    dev = dev_()
    dtype = DT[dtype_name]
    cases = {
        "ragged": [(1000, 1), (0, 64), (3000, 100), (777, 1024), (64, 4096), (50, 5000), (20, 12000), (7, 20000),
                   (123, 0)],
        "aligned": [(4096, 256), (2048, 1024), (8192, 64), (1, 512)],
        "G1": [(8192, 768)],
    }
    out = []
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    for cname, dims in cases.items():
        dims = [(_scale(r, 64), _scale(d, 16)) for r, d in dims]
        xs = [(torch.randn(r, d, dtype=torch.float32, device=dev, generator=g) * 3 + 1).to(dtype).requires_grad_()
              for r, d in dims]
        ws = bs = None
        if affine:
            ws = [(torch.randn(d, device=dev, generator=g) * 0.5 + 1).to(dtype).requires_grad_() for r, d in dims]
            bs = [torch.randn(d, device=dev, generator=g).to(dtype).requires_grad_() for r, d in dims]
            if cname == "ragged":
                ws[3] = None
        ys = batched_layer_norm(xs, ws, bs, 1e-5)
        gys = [randn_like(y) for y in ys]
        params = xs + ([w for w in ws if w is not None] + bs if affine else [])
        grads = torch.autograd.grad(ys, params, gys, allow_unused=True)
        x64 = [x.detach().double().requires_grad_() for x in xs]
        w64 = [w.detach().double().requires_grad_() if w is not None else None for w in ws] if affine else None
        b64 = [b.detach().double().requires_grad_() for b in bs] if affine else None
        ry = [F.layer_norm(x, (x.shape[-1],), w64[i] if affine else None, b64[i] if affine else None, 1e-5)
              for i, x in enumerate(x64)]
        p64 = x64 + ([w for w in w64 if w is not None] + b64 if affine else [])
        rg = torch.autograd.grad(ry, p64, [gg.double() for gg in gys], allow_unused=True)
        G = len(dims)
        fix = lambda gs, ps: [gg if gg is not None else torch.zeros_like(p) for gg, p in zip(gs, ps)]
        rg = fix(rg, p64)
        grads = fix(grads, params)
        e = dict(y=rel(cat_flat(ys), cat_flat(ry)), dx=rel(cat_flat(grads[:G]), cat_flat(rg[:G])))
        if affine:
            e["dw_db"] = rel(cat_flat(grads[G:]), cat_flat(rg[G:]))
        out.append(dict(test="batched_layer_norm", dtype=dtype_name, affine=affine, case=cname, errors=e,
                        ok=all(v <= LN_TOL[dtype] for v in e.values())))
    return out


def task_warm_gl(part, nparts, acts):
    """Compile (and pre-tune) a slice of the autotuning candidates for the benchmark shapes."""
    from . import grouped_linear_kernel as K
    K.set_autotune(True)
    pairs = ((K._fwd_tuned, K._FWD_CONFIGS), (K._dx_tuned, K._FWD_CONFIGS), (K._dw_tuned, K._DW_CONFIGS))
    for tuned, cfgs in pairs:
        tuned.configs = cfgs[part::nparts] or cfgs[:1]
        tuned.cache.clear()
    dev = dev_()
    t0 = time.time()
    try:
        for act in acts:
            for dims in ([(4096, 512, 512), (2048, 256, 64), (1024, 64, 256)],):
                dims = [(_scale(m, 64), _scale(k, 16), _scale(n, 16)) for m, k, n in dims]
                xs, ws, bs = make_gl(dims, torch.bfloat16, dev)
                ys = grouped_linear(xs, ws, bs, act)
                torch.autograd.grad(ys, xs + ws + bs, [torch.ones_like(y) for y in ys])
        sync()
    finally:
        for tuned, cfgs in pairs:
            tuned.configs = cfgs
            tuned.cache.clear()
    return [dict(test="warm_gl", part=part, seconds=round(time.time() - t0, 1), ok=True)]


def task_warm_ln(kind, G):
    dev = dev_()
    dims = ln_dims(kind, G)
    xs, ws, bs = make_ln(dims, torch.bfloat16, dev)
    ys = batched_layer_norm(xs, ws, bs)
    torch.autograd.grad(ys, xs + ws + bs, [torch.ones_like(y) for y in ys])
    sync()
    return [dict(test="warm_ln", kind=kind, G=G, ok=True)]


def run_task(name, args, dev="cuda", dry=False):
    global DEV, DRY
    DEV, DRY = dev, dry
    if dry:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        return globals()[name](*args)
    except Exception as ex:
        return [dict(test=name, args=repr(args), ok=False, error=traceback.format_exc()[-3000:])]


# ------------------------------------------------------------------------------------------------
# timing helpers
# ------------------------------------------------------------------------------------------------
def t_gpu(fn):
    if DRY:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton
    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def t_wall(fn, min_time=0.04):
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(1 if DRY else 3):
        fn()
    sync()
    dt = (time.perf_counter() - t0) / (1 if DRY else 3)
    n = max(1 if DRY else 5, min(300, int(min_time / max(dt, 1e-6))))
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n * 1e3


def t_graph(build):
    """CUDA-graph replay time of the work ``build()`` returns (a zero-argument callable).

    ``build`` runs on a side stream and should create fresh leaf tensors there, so that autograd's
    per-leaf streams match the capture stream (required to capture a backward pass)."""
    if DRY:
        raise RuntimeError("no CUDA graphs in --dry-run")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn = build()
        for _ in range(3):
            fn()
        s.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    sync()
    t = t_gpu(g.replay)
    del g
    return t


def timed(fn):
    return dict(wall=t_wall(fn), gpu=t_gpu(fn))


def _try_timed(T, key, fn, res, nograd=False):
    try:
        if nograd:
            with torch.no_grad():
                T[key] = timed(fn)
        else:
            T[key] = timed(fn)
    except Exception as ex:
        res.setdefault("errors", {})[key] = repr(ex)[:300]


# ------------------------------------------------------------------------------------------------
# phase B: benchmarks
# ------------------------------------------------------------------------------------------------
def ceilings():
    if DRY:
        return dict(copy_TBps=1.0, bf16_mm_TFLOPs=1.0)
    dev = dev_()
    n = 1 << 28  # 1 GiB of fp32
    a = torch.randn(n, device=dev)
    b = torch.empty_like(a)
    t = t_gpu(lambda: b.copy_(a))
    copy_tbs = 2 * a.numel() * 4 / (t * 1e-3) / 1e12
    del a, b
    m = 8192
    x = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    y = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    t = t_gpu(lambda: x @ y)
    mm_tflops = 2 * m ** 3 / (t * 1e-3) / 1e12
    del x, y
    torch.cuda.empty_cache()
    return dict(copy_TBps=copy_tbs, bf16_mm_TFLOPs=mm_tflops)


def bench_gl_case(kind, G, dtype, act, ceil):
    dev = dev_()
    dims = gl_dims(kind, G)
    xs, ws, bs = make_gl(dims, dtype, dev, seed=G)
    params = xs + ws + bs
    ys0 = grouped_linear(xs, ws, bs, act)
    gys = [randn_like(y) for y in ys0]
    es = xs[0].element_size()
    flops = sum(2 * m * k * n for m, k, n in dims)
    bytes_f = sum(m * k + n * k + n + m * n for m, k, n in dims) * es
    bytes_b = sum(m * n + m * k + n * k + m * k + n * k + n for m, k, n in dims) * es  # dy, x, w in; dx, dw, db out
    res = dict(kind=kind, G=G, dtype=str(dtype).split(".")[-1], act=act, dims=dims, flops_fwd=flops,
               bytes_fwd=bytes_f, bytes_fwdbwd=bytes_f + bytes_b)

    # correctness of the autotuned path against an fp32 loop
    with torch.no_grad():
        ref = [ACT_FN[act](F.linear(x.float(), w.float(), b.float())) for x, w, b in zip(xs, ws, bs)]
    res["check_rel_err"] = rel(cat_flat(ys0), cat_flat(ref))
    ga = torch.autograd.grad(ys0, params, gys)
    gl = torch.autograd.grad([ACT_FN[act](F.linear(x, w, b)) for x, w, b in zip(xs, ws, bs)], params, gys)
    res["check_grad_rel_err_vs_loop"] = rel(cat_flat(ga), cat_flat(gl))
    del ref, ga, gl

    ours_f = lambda: grouped_linear(xs, ws, bs, act)
    loop_f = lambda: [ACT_FN[act](F.linear(x, w, b)) for x, w, b in zip(xs, ws, bs)]
    ours_fb = lambda: torch.autograd.grad(ours_f(), params, gys)
    loop_fb = lambda: torch.autograd.grad(loop_f(), params, gys)
    T = {}
    with torch.no_grad():
        T["ours_fwd"] = timed(ours_f)
        T["loop_fwd"] = timed(loop_f)
    T["ours_fwdbwd"] = timed(ours_fb)
    T["loop_fwdbwd"] = timed(loop_fb)
    if kind.startswith("uniform"):
        m, k, n = dims[0]
        X = torch.stack([x.detach() for x in xs]).requires_grad_()
        W = torch.stack([w.detach() for w in ws]).requires_grad_()
        B = torch.stack([b.detach() for b in bs]).unsqueeze(1).requires_grad_()
        GY = torch.stack(gys)
        bmm_f = lambda: ACT_FN[act](torch.baddbmm(B, X, W.transpose(1, 2)))
        bmm_fb = lambda: torch.autograd.grad(bmm_f(), (X, W, B), GY)
        _try_timed(T, "bmm_fwd", bmm_f, res, nograd=True)
        _try_timed(T, "bmm_fwdbwd", bmm_fb, res)
        # ours on pre-packed buffers through the custom op (same data layout as stacked bmm inputs)
        xp = X.detach().reshape(-1).requires_grad_()
        wp = W.detach().reshape(-1).requires_grad_()
        bp = B.detach().reshape(-1).requires_grad_()
        ms, ks, ns = [m] * G, [k] * G, [n] * G
        op_f = lambda: ops.grouped_linear_packed(xp, wp, bp, ms, ks, ns, act)
        gyp = GY.reshape(-1)
        op_fb2 = lambda: torch.autograd.grad(op_f(), (xp, wp, bp), gyp)
        _try_timed(T, "ours_packed_fwd", op_f, res, nograd=True)
        _try_timed(T, "ours_packed_fwdbwd", op_fb2, res)
        if hasattr(torch, "_grouped_mm") and dtype == torch.bfloat16:
            try:
                X2 = X.detach().reshape(G * m, k).requires_grad_()
                offs = torch.arange(1, G + 1, device=dev, dtype=torch.int32) * m
                gmm_f = lambda: ACT_FN[act]((torch._grouped_mm(X2, W.transpose(-2, -1), offs=offs)
                                             .view(G, m, n) + B))
                ref_g = bmm_f().detach()
                res["gmm_rel_err_vs_bmm"] = rel(gmm_f().detach(), ref_g)
                with torch.no_grad():
                    T["gmm_fwd"] = timed(gmm_f)
                try:
                    gmm_fb = lambda: torch.autograd.grad(gmm_f(), (X2, W, B), GY)
                    T["gmm_fwdbwd"] = timed(gmm_fb)
                except Exception as ex:
                    res["gmm_bwd_error"] = repr(ex)[:300]
            except Exception as ex:
                res["gmm_error"] = repr(ex)[:300]
    res["times_ms"] = T
    tw = T["ours_fwdbwd"]["gpu"]
    res["ours_fwd_TFLOPs"] = flops / (T["ours_fwd"]["gpu"] * 1e-3) / 1e12
    res["ours_fwdbwd_TFLOPs"] = 3 * flops / (tw * 1e-3) / 1e12
    res["ours_fwd_GBps"] = bytes_f / (T["ours_fwd"]["gpu"] * 1e-3) / 1e9
    res["ours_fwdbwd_GBps"] = (bytes_f + bytes_b) / (tw * 1e-3) / 1e9
    res["pct_mm_peak_fwdbwd"] = 100 * res["ours_fwdbwd_TFLOPs"] / ceil["bf16_mm_TFLOPs"]
    res["pct_copy_bw_fwdbwd"] = 100 * res["ours_fwdbwd_GBps"] / (ceil["copy_TBps"] * 1e3)
    return res


def graph_gl_case(kind, G, dtype, act):
    """fwd+bwd under CUDA-graph replay: ours (packed custom op, device-resident tables; the eager
    path's per-call table copies cannot be captured) against the loop of F.linear."""
    dev = dev_()
    dims = gl_dims(kind, G)
    xs0, ws0, bs0 = make_gl(dims, dtype, dev, seed=G, grad=False)
    gys0 = [randn_like(torch.empty(m, n, device=dev, dtype=dtype), seed=G) for m, k, n in dims]
    out = {}

    def build(use_ours):
        def b():
            xs = [x.clone().requires_grad_() for x in xs0]
            ws = [w.clone().requires_grad_() for w in ws0]
            bs = [v.clone().requires_grad_() for v in bs0]
            gys = [g.clone() for g in gys0]
            params = xs + ws + bs
            if use_ours:
                return lambda: torch.autograd.grad(ops._gl_via_op(xs, ws, bs, act), params, gys)
            return lambda: torch.autograd.grad([ACT_FN[act](F.linear(x, w, v)) for x, w, v in zip(xs, ws, bs)],
                                               params, gys)
        return b

    for name, use in (("ours_op", True), ("loop", False)):
        try:
            out[name] = t_graph(build(use))
        except Exception as ex:
            out[name] = None
            out[name + "_error"] = repr(ex)[:400]
    return out


def make_ln(dims, dtype, dev, affine=True, seed=0):
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    xs = [(torch.randn(r, d, device=dev, dtype=dtype, generator=g)).requires_grad_() for r, d in dims]
    ws = [(torch.randn(d, device=dev, dtype=dtype, generator=g) * 0.1 + 1).requires_grad_() for r, d in dims]
    bs = [torch.randn(d, device=dev, dtype=dtype, generator=g).requires_grad_() for r, d in dims]
    return xs, ws, bs


def bench_ln_case(kind, G, dtype, ceil):
    dev = dev_()
    dims = ln_dims(kind, G)
    xs, ws, bs = make_ln(dims, dtype, dev, seed=G)
    params = xs + ws + bs
    es = xs[0].element_size()
    nbytes = sum(r * d for r, d in dims) * es
    res = dict(kind=kind, G=G, dtype=str(dtype).split(".")[-1], dims=dims, bytes_fwd=2 * nbytes,
               bytes_fwdbwd=5 * nbytes)
    ys0 = batched_layer_norm(xs, ws, bs)
    gys = [randn_like(y) for y in ys0]
    with torch.no_grad():
        ref = [F.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float()) for x, w, b in zip(xs, ws, bs)]
    res["check_rel_err"] = rel(cat_flat(ys0), cat_flat(ref))
    ga = torch.autograd.grad(ys0, params, gys)
    gl = torch.autograd.grad([F.layer_norm(x, (x.shape[-1],), w, b) for x, w, b in zip(xs, ws, bs)], params, gys)
    res["check_grad_rel_err_vs_loop"] = rel(cat_flat(ga[:G]), cat_flat(gl[:G]))
    res["check_wgrad_rel_err_vs_loop"] = rel(cat_flat(ga[G:]), cat_flat(gl[G:]))
    del ref, ga, gl
    ours_f = lambda: batched_layer_norm(xs, ws, bs)
    loop_f = lambda: [F.layer_norm(x, (x.shape[-1],), w, b) for x, w, b in zip(xs, ws, bs)]
    T = {}
    with torch.no_grad():
        T["ours_fwd"] = timed(ours_f)
        T["loop_fwd"] = timed(loop_f)
    T["ours_fwdbwd"] = timed(lambda: torch.autograd.grad(ours_f(), params, gys))
    T["loop_fwdbwd"] = timed(lambda: torch.autograd.grad(loop_f(), params, gys))
    if kind in ("uniform", "large"):
        r, d = dims[0]
        X = torch.stack([x.detach() for x in xs]).reshape(G * r, d).requires_grad_()
        w1, b1 = ws[0].detach().clone().requires_grad_(), bs[0].detach().clone().requires_grad_()
        GY = torch.stack(gys).reshape(G * r, d)
        st_f = lambda: F.layer_norm(X, (d,), w1, b1)
        with torch.no_grad():
            T["stacked_fwd"] = timed(st_f)
        _try_timed(T, "stacked_fwdbwd", lambda: torch.autograd.grad(st_f(), (X, w1, b1), GY), res)
    res["times_ms"] = T
    bw = ceil["copy_TBps"] * 1e3
    res["ours_fwd_GBps"] = 2 * nbytes / (T["ours_fwd"]["gpu"] * 1e-3) / 1e9
    res["ours_fwdbwd_GBps"] = 5 * nbytes / (T["ours_fwdbwd"]["gpu"] * 1e-3) / 1e9
    res["pct_copy_fwd"] = 100 * res["ours_fwd_GBps"] / bw
    res["pct_copy_fwdbwd"] = 100 * res["ours_fwdbwd_GBps"] / bw
    if "stacked_fwd" in T:
        res["stacked_fwd_GBps"] = 2 * nbytes / (T["stacked_fwd"]["gpu"] * 1e-3) / 1e9
    return res


# ------------------------------------------------------------------------------------------------
# driver
# ------------------------------------------------------------------------------------------------
GL_CASES = [(k, G) for k in ("mixed-small", "mixed", "uniform-small", "uniform-large") for G in (4, 16, 64)]
LN_CASES = [("uniform", 4), ("uniform", 8), ("uniform", 16), ("uniform", 64), ("mixed", 8), ("mixed", 16),
            ("large", 8)]


def phase_a(workers, log):
    tasks = []
    for i, acts in enumerate((["none", "relu"], ["gelu", "silu"], ["sigmoid", "tanh"])):
        tasks.append(("task_gl_check", ("bf16", acts, i)))
    tasks.append(("task_gl_check", ("fp16", ["none", "gelu", "silu"], 5)))
    tasks.append(("task_gl_check", ("fp32", ["none", "relu"], 6)))
    for d in ("bf16", "fp16", "fp32"):
        tasks.append(("task_gl_op", (d, 7)))
    for d, aff in (("bf16", True), ("bf16", False), ("fp16", True), ("fp32", True)):
        tasks.append(("task_ln_check", (d, aff, 8)))
    nwarm = 6
    for p in range(nwarm):
        tasks.append(("task_warm_gl", (p, nwarm, ["none", "relu"])))
    for kind, G in LN_CASES:
        tasks.append(("task_warm_ln", (kind, G)))
    if DRY:  # one of each kind
        keep = {"task_gl_check", "task_gl_op", "task_ln_check", "task_warm_ln"}
        seen = set()
        tasks2 = []
        for n, a in tasks:
            if n in keep and n not in seen:
                seen.add(n)
                tasks2.append((n, a))
        tasks = tasks2
    results = []
    t0 = time.time()
    if workers > 1:
        import concurrent.futures as cf
        import multiprocessing as mp
        try:
            with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
                futs = [ex.submit(run_task, n, a, DEV, DRY) for n, a in tasks]
                for f in futs:
                    results += f.result()
        except Exception as ex:  # pool broke: fall back to sequential
            log(f"worker pool failed ({ex!r}); running phase A sequentially")
            results = []
            workers = 1
    if workers <= 1:
        for n, a in tasks:
            results += run_task(n, a, DEV, DRY)
    log(f"phase A: {len(tasks)} tasks in {time.time() - t0:.1f}s")
    return results


def fmt(x, nd=3):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--budget-s", type=float, default=270.0, help="stop starting new benchmark cases after this")
    ap.add_argument("--workers", type=int, default=None,
                    help="phase-A worker processes (default: min(12, #cpus - 2); 1 in --dry-run)")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--act", default="none", help="activation used in the grouped-linear benchmark")
    ap.add_argument("--dry-run", action="store_true",
                    help="exercise this script on the CPU with the Triton interpreter at tiny shapes")
    args = ap.parse_args(argv)
    global DEV, DRY
    if args.workers is None:
        args.workers = 1 if args.dry_run else max(1, min(12, (os.cpu_count() or 2) - 2))
    if args.dry_run:
        DEV, DRY = "cpu", True
        os.environ["TRITON_INTERPRET"] = "1"
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "bench.log"), "a")

    def log(msg):
        line = f"[{time.time() - t_start:7.1f}s] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    if not torch.cuda.is_available() and not DRY:
        print("kernels.bench needs a CUDA device (or --dry-run)")
        return 2
    import triton
    if DRY:
        gpu_name, sms = "cpu (dry run, Triton interpreter)", 0
    else:
        props = torch.cuda.get_device_properties(dev_())
        gpu_name, sms = props.name, props.multi_processor_count
    report = dict(date=datetime.date.today().isoformat(), gpu=gpu_name, sms=sms,
                  torch=torch.__version__, triton=triton.__version__, python=sys.version.split()[0],
                  has_grouped_mm=hasattr(torch, "_grouped_mm"))
    log(f"{report}")
    path = os.path.join(args.out, "bench.json")

    def save():
        with open(path, "w") as f:
            json.dump(report, f, indent=1, default=str)

    if not args.skip_check:
        res = phase_a(args.workers, log)
        report["checks"] = res
        save()
        bad = [r for r in res if not r.get("ok")]
        for r in res:
            if r.get("test") in ("warm_gl", "warm_ln"):
                continue
            errs = " ".join(f"{k}={v:.1e}" for k, v in r.get("errors", {}).items())
            log(f"check {'OK  ' if r.get('ok') else 'FAIL'} {r.get('test')} {r.get('dtype', '')} {r.get('act', '')} "
                f"{r.get('case', '')} {'affine' if r.get('affine') else ''} {errs} {r.get('error', '')[:800]}")
        report["checks_failed"] = len(bad)
        log(f"checks: {len(res) - len(bad)} ok, {len(bad)} failed")

    ceil = ceilings()
    report["ceilings"] = ceil
    log(f"ceilings: copy {ceil['copy_TBps']:.2f} TB/s, bf16 matmul {ceil['bf16_mm_TFLOPs']:.0f} TFLOP/s")
    save()
    report["grouped_linear"] = []
    report["layer_norm"] = []
    cases = [("ln", k, G) for k, G in LN_CASES] + [("gl", k, G) for k, G in GL_CASES]
    if DRY:
        cases = [("gl", "mixed-small", 4), ("gl", "uniform-small", 4), ("ln", "uniform", 4), ("ln", "mixed", 8)]
    # the target cases first, so they survive a short budget
    prio = [("gl", "mixed-small", 16), ("gl", "uniform-small", 16), ("gl", "uniform-large", 16),
            ("ln", "large", 8), ("ln", "uniform", 8)]
    cases = prio + [c for c in cases if c not in prio]
    if not DRY and args.act == "none":
        cases.append(("gl-relu", "mixed-small", 16))  # fused activation epilogue vs F.linear + F.relu
    for what, kind, G in cases:
        if time.time() - t_start > args.budget_s:
            log(f"budget reached; skipping {what} {kind} G={G}")
            report.setdefault("skipped", []).append([what, kind, G])
            continue
        try:
            if what.startswith("gl"):
                act = "relu" if what == "gl-relu" else args.act
                r = bench_gl_case(kind, G, torch.bfloat16, act, ceil)
                report["grouped_linear"].append(r)
                T = r["times_ms"]
                log(f"GL {kind} G={G}: ours fwd+bwd wall {T['ours_fwdbwd']['wall']:.3f} gpu "
                    f"{T['ours_fwdbwd']['gpu']:.3f} | loop wall {T['loop_fwdbwd']['wall']:.3f} gpu "
                    f"{T['loop_fwdbwd']['gpu']:.3f} | err {r['check_rel_err']:.1e}/{r['check_grad_rel_err_vs_loop']:.1e}")
            else:
                r = bench_ln_case(kind, G, torch.bfloat16, ceil)
                report["layer_norm"].append(r)
                T = r["times_ms"]
                log(f"LN {kind} G={G}: ours fwd gpu {T['ours_fwd']['gpu']:.3f} ({r['pct_copy_fwd']:.0f}% copy) "
                    f"fwd+bwd {T['ours_fwdbwd']['gpu']:.3f} | loop fwd {T['loop_fwd']['gpu']:.3f} "
                    f"| err {r['check_rel_err']:.1e}")
        except Exception:
            log(f"case {what} {kind} G={G} failed:\n{traceback.format_exc()[-2000:]}")
            report.setdefault("case_errors", []).append([what, kind, G, traceback.format_exc()[-2000:]])
        if not DRY:
            torch.cuda.empty_cache()
        save()

    # ------------------------------------------------------------------ CUDA graphs (last: a failed
    # capture must not disturb the other measurements)
    graph_cases = [("mixed-small", 16), ("uniform-small", 16), ("uniform-large", 16), ("mixed", 16),
                   ("mixed-small", 4), ("mixed-small", 64), ("mixed", 64)]
    if DRY:
        graph_cases = []
    for kind, G in graph_cases:
        if time.time() - t_start > args.budget_s + 20:
            log(f"budget reached; skipping graph {kind} G={G}")
            continue
        rec = next((r for r in report["grouped_linear"] if r["kind"] == kind and r["G"] == G
                    and r["act"] == args.act), None)
        if rec is None:
            continue
        try:
            rec["graph_ms"] = graph_gl_case(kind, G, torch.bfloat16, args.act)
            log(f"graph {kind} G={G}: {rec['graph_ms']}")
        except Exception:
            log(f"graph {kind} G={G} failed:\n{traceback.format_exc()[-1500:]}")
        save()

    # ------------------------------------------------------------------ table
    lines = []
    lines.append(f"optimus.kernels bench  {report['date']}  {report['gpu']}  torch {report['torch']}  "
                 f"triton {report['triton']}  copy {ceil['copy_TBps']:.2f} TB/s  mm {ceil['bf16_mm_TFLOPs']:.0f} TFLOP/s")
    if "checks" in report:
        lines.append(f"GPU correctness checks: {len(report['checks']) - report['checks_failed']} ok, "
                     f"{report['checks_failed']} failed")
    lines.append("grouped_linear bf16 (ms; wall = eager steady state, gpu = do_bench events, graph = CUDA graph)")
    lines.append(f"{'case':16s} {'G':>3s} | {'fwd ours':>8s} {'loop':>7s} {'x':>5s} | {'f+b ours':>8s} {'loop':>7s} "
                 f"{'x':>5s} | {'gpu ours':>8s} {'loop':>7s} {'x':>5s} | {'graph':>6s} {'loop':>6s} {'x':>5s} | "
                 f"{'bmm f+b':>7s} {'x':>5s} {'pk/bmm':>6s} | {'gmm f+b':>7s} | {'TF/s':>5s} {'%mm':>4s}")
    for r in report["grouped_linear"]:
        T = r["times_ms"]
        of, lf = T["ours_fwd"]["wall"], T["loop_fwd"]["wall"]
        ob, lb = T["ours_fwdbwd"]["wall"], T["loop_fwdbwd"]["wall"]
        og, lg = T["ours_fwdbwd"]["gpu"], T["loop_fwdbwd"]["gpu"]
        gr_o, gr_l = r.get("graph_ms", {}).get("ours_op"), r.get("graph_ms", {}).get("loop")
        bmm = T.get("bmm_fwdbwd", {}).get("gpu")
        pk = T.get("ours_packed_fwdbwd", {}).get("gpu")
        gmm = T.get("gmm_fwdbwd", {}).get("gpu")
        kname = r["kind"] if r["act"] == "none" else f"{r['kind']}+{r['act']}"
        lines.append(
            f"{kname:16s} {r['G']:3d} | {of:8.3f} {lf:7.3f} {lf / of:5.2f} | {ob:8.3f} {lb:7.3f} {lb / ob:5.2f} | "
            f"{og:8.3f} {lg:7.3f} {lg / og:5.2f} | {fmt(gr_o):>6s} {fmt(gr_l):>6s} "
            f"{(fmt(gr_l / gr_o, 2) if gr_o and gr_l else '-'):>5s} | {fmt(bmm):>7s} "
            f"{(fmt(bmm / og, 2) if bmm else '-'):>5s} {(fmt(pk / bmm, 2) if (pk and bmm) else '-'):>6s} | "
            f"{fmt(gmm):>7s} | {r['ours_fwdbwd_TFLOPs']:5.0f} {r['pct_mm_peak_fwdbwd']:4.0f}")
    lines.append("batched_layer_norm bf16 (gpu ms unless noted; GB/s counts x read + y written (fwd), "
                 "+ x, dy read, dx written (bwd))")
    lines.append(f"{'case':8s} {'G':>3s} | {'fwd ours':>8s} {'loop':>7s} {'x':>5s} {'stack':>7s} | {'GB/s':>6s} "
                 f"{'%copy':>5s} | {'f+b ours':>8s} {'loop':>7s} {'x':>5s} {'stack':>7s} | {'GB/s':>6s} {'%copy':>5s} | "
                 f"{'wall f+b':>8s} {'loop':>7s} {'x':>5s}")
    for r in report["layer_norm"]:
        T = r["times_ms"]
        of, lf = T["ours_fwd"]["gpu"], T["loop_fwd"]["gpu"]
        ob, lb = T["ours_fwdbwd"]["gpu"], T["loop_fwdbwd"]["gpu"]
        sf = T.get("stacked_fwd", {}).get("gpu")
        sb = T.get("stacked_fwdbwd", {}).get("gpu")
        wo, wl = T["ours_fwdbwd"]["wall"], T["loop_fwdbwd"]["wall"]
        lines.append(f"{r['kind']:8s} {r['G']:3d} | {of:8.3f} {lf:7.3f} {lf / of:5.2f} {fmt(sf):>7s} | "
                     f"{r['ours_fwd_GBps']:6.0f} {r['pct_copy_fwd']:5.0f} | {ob:8.3f} {lb:7.3f} {lb / ob:5.2f} "
                     f"{fmt(sb):>7s} | {r['ours_fwdbwd_GBps']:6.0f} {r['pct_copy_fwdbwd']:5.0f} | "
                     f"{wo:8.3f} {wl:7.3f} {wl / wo:5.2f}")
    table = "\n".join(lines)
    with open(os.path.join(args.out, "table.txt"), "w") as f:
        f.write(table + "\n")
    report["total_seconds"] = time.time() - t_start
    save()
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
