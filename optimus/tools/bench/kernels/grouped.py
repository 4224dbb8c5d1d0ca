"""GPU correctness check + benchmark of grouped_linear and batched_layer_norm (one command, hard
time budget).

    python -m optimus.tools.bench.kernels.grouped --out OUT_DIR --budget-s 170
    python -m optimus.tools.bench.kernels.grouped --dry-run --out DIR     # CPU, Triton interpreter, tiny shapes

Phase A (parallel worker processes, also fills Triton's on-disk compile cache; own time limit):
    correctness of grouped_linear / batched_layer_norm at realistic sizes against float64
    references on fresh random inputs (fp32/TF32, fp16, bf16; every activation; ragged, unaligned,
    G = 1, zero-sized members; the packed custom ops and torch.compile(aot_eager) over them), and
    compilation of the autotuning candidates used by phase B.
Phase B (this process, GPU otherwise idle): ceilings measured in the same run (1 GiB
    device-to-device copy, 8192^3 bf16 and TF32 matmul), then the cases, target cases first:
    grouped linear for G in {4, 16, 64} x {mixed-small, mixed, uniform-small, uniform-large} (bf16;
    mixed-small G = 16 also in fp32/TF32 and with a fused relu) against a loop of F.linear,
    torch.baddbmm on stacked inputs and torch._grouped_mm (uniform, bf16, where it runs); batched
    layer norm against a loop of F.layer_norm and one F.layer_norm on the stacked tensor.

Timings (ms per step, medians):
    fwd    forward under no_grad, eager
    step   forward + backward (from the G outputs with given upstream grads, through the autograd
           engine; both sides identical), eager
           eager = CUDA events around every step on the current stream, after warm-up, 3 input
           sets rotated (weights shared): max(host issue time, device time) of a steady-state step
    graph  the whole step captured once in a CUDA graph and replayed: device time only (what a
           compiled / graphed model sees), for ours, the loop and bmm
Every case runs in its own try/except (a failure becomes a row with its error); random data comes
from private generators; no new measurement starts after --budget-s (SIGTERM also stops it) and
the table of what was measured is printed anyway.  Writes OUT/bench.json (everything),
OUT/bench.log and OUT/table.txt (the table printed last).
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

import optimus.kernels as ops
from optimus.kernels import batched_layer_norm, grouped_linear
from optimus.kernels.runtime import plans as _plans
from optimus.core.table import format_table

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
    from optimus.kernels.linear import kernel as K
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
    from optimus.kernels.linear import kernel as K
    K.set_autotune(True)
    K._CHOSEN.clear()  # a pool worker may have run another slice: tune (and compile) this one
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
        K._CHOSEN.clear()
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
# timing
# ------------------------------------------------------------------------------------------------
class Budget(Exception):
    """Raised when the run's time budget is spent (the partial results are kept)."""


class _Clock:
    def __init__(self, budget_s):
        self.t0 = time.time()
        self.budget_s = budget_s

    def elapsed(self):
        return time.time() - self.t0

    def left(self):
        return self.budget_s - self.elapsed()

    def check(self, need_s=0.0):
        if self.left() < need_s:
            raise Budget(f"time budget spent ({self.elapsed():.0f}s of {self.budget_s:.0f}s)")


CLOCK = _Clock(1e9)
MEASURE_S = 0.12  # target seconds of timed repetitions per measurement


def _median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def time_steps(step, n_sets=1, warmup=3, target_s=None):
    """Per-step time of ``step(i)`` (i = repetition index; the step picks input set i % n_sets).

    Every repetition is bracketed by CUDA events on the current stream, so a step's time is
    max(host time to issue it, device time to run it): the steady-state time of an eager step.
    Returns dict(ms = median over repetitions, p20, p80, reps, host_ms = host wall clock per step
    including the final synchronisation)."""
    CLOCK.check(1.0)
    target_s = MEASURE_S if target_s is None else target_s
    if DRY:
        t0 = time.perf_counter()
        step(0)
        ms = (time.perf_counter() - t0) * 1e3
        return dict(ms=ms, p20=ms, p80=ms, reps=1, host_ms=ms)
    for i in range(warmup):
        step(i)
    sync()
    t0 = time.perf_counter()
    step(warmup)
    sync()
    one = max(time.perf_counter() - t0, 1e-5)
    reps = int(max(8, min(400, target_s / one)))
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    t0 = time.perf_counter()
    for i in range(reps):
        ev[i][0].record()
        step(i)
        ev[i][1].record()
    sync()
    host = (time.perf_counter() - t0) / reps * 1e3
    ts = sorted(a.elapsed_time(b) for a, b in ev)
    return dict(ms=_median(ts), p20=ts[int(0.2 * (reps - 1))], p80=ts[int(0.8 * (reps - 1))], reps=reps,
                host_ms=host)


def time_graph(build, target_s=None):
    """CUDA-graph replay time of one step.  ``build()`` runs on a side stream and returns a
    zero-argument step; it should create its leaf tensors there (autograd then runs the backward
    on that stream, which the capture requires).  The step is warmed up three times, captured
    once, replayed in batches timed with CUDA events; returns dict(ms = median per replay over
    batches, batches, replays)."""
    CLOCK.check(2.0)
    if DRY:
        raise RuntimeError("no CUDA graphs in --dry-run")
    target_s = MEASURE_S if target_s is None else target_s
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
    t0 = time.perf_counter()
    g.replay()
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    per = int(max(5, min(200, 0.2 * target_s / one)))
    res = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per):
            g.replay()
        b.record()
        sync()
        res.append(a.elapsed_time(b) / per)
    del g
    return dict(ms=_median(res), batches=len(res), replays=per)


_engine_backward = None


def backward_fn():
    """(outputs, grads, inputs) -> input grads, through the autograd engine directly.

    ``torch.autograd.grad`` first checks every (output, grad) pair in Python (``_make_grads``,
    tens of microseconds per output on slow hosts); a training step pays that once, for the
    scalar loss, not once per member, so the benchmark step calls the engine the way
    ``torch.autograd.grad`` does after those checks.  Both sides of every comparison use it."""
    global _engine_backward
    if _engine_backward is None:
        try:
            from torch.autograd.graph import _engine_run_backward

            def eb(outs, grads, inputs):
                return _engine_run_backward(tuple(outs), tuple(grads), False, False, tuple(inputs), True, False)

            x = torch.ones(2, requires_grad=True)
            eb([x * 2], [torch.ones(2)], [x])
            _engine_backward = eb
        except Exception:  # pragma: no cover - other torch versions
            _engine_backward = lambda outs, grads, inputs: torch.autograd.grad(outs, inputs, grads)
    return _engine_backward


# ------------------------------------------------------------------------------------------------
# ceilings
# ------------------------------------------------------------------------------------------------
def device_ms(fn, rep_ms=100):
    """Median device time of ``fn()`` in ms, by ``triton.testing.do_bench`` (warm-up, then
    ~``rep_ms`` of repetitions, each between CUDA events, L2 flushed before each one).

    Used for the ceilings: each operand (1 GiB copy, 8192^2 matrices) is larger than L2, so
    the flush changes nothing and one op per event pair is pure device time. The cases'
    eager timings keep ``time_steps``: they must measure max(host issue time, device time)
    of a steady-state step with rotated inputs, and do_bench's flush between calls would
    hide the host time. The graph timings keep ``time_graph``: ``do_bench_cudagraph``
    warms up and captures on streams of its own, and a step whose backward runs through
    autograd must be captured on the stream its leaf tensors were made on."""
    CLOCK.check(1.0)
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))


def ceilings():
    if DRY:
        return dict(copy_TBps=1.0, bf16_mm_TFLOPs=1.0, fp32_tf32_mm_TFLOPs=1.0)
    dev = dev_()
    g = torch.Generator(device=dev)
    g.manual_seed(0)
    n = 1 << 28  # 1 GiB of fp32
    a = torch.randn(n, device=dev, generator=g)
    b = torch.empty_like(a)
    t = device_ms(lambda: b.copy_(a))
    copy_tbs = 2 * a.numel() * 4 / (t * 1e-3) / 1e12
    del a, b
    m = 8192
    x = torch.randn(m, m, device=dev, dtype=torch.bfloat16, generator=g)
    y = torch.randn(m, m, device=dev, dtype=torch.bfloat16, generator=g)
    t = device_ms(lambda: x @ y)
    mm = 2 * m ** 3 / (t * 1e-3) / 1e12
    x, y = x.float(), y.float()
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        t = device_ms(lambda: x @ y)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    mm32 = 2 * m ** 3 / (t * 1e-3) / 1e12
    del x, y
    torch.cuda.empty_cache()
    return dict(copy_TBps=copy_tbs, bf16_mm_TFLOPs=mm, fp32_tf32_mm_TFLOPs=mm32)


# ------------------------------------------------------------------------------------------------
# grouped linear
# ------------------------------------------------------------------------------------------------
N_SETS = 3  # input sets rotated through in eager timings (weights shared, like training)


def _gen(dev, seed):
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    return g


def _gl_sets(dims, dtype, dev, seed, n_sets, grad=True):
    """Shared weights / biases, ``n_sets`` sets of inputs and output grads (private generator)."""
    g = _gen(dev, seed)
    ws = [(torch.randn(n, k, dtype=dtype, device=dev, generator=g) / math.sqrt(max(k, 1))).requires_grad_(grad)
          for m, k, n in dims]
    bs = [torch.randn(n, dtype=dtype, device=dev, generator=g).requires_grad_(grad) for m, k, n in dims]
    sets = []
    for _ in range(n_sets):
        xs = [torch.randn(m, k, dtype=dtype, device=dev, generator=g).requires_grad_(grad) for m, k, n in dims]
        gys = [torch.randn(m, n, dtype=dtype, device=dev, generator=g) for m, k, n in dims]
        sets.append((xs, gys))
    return ws, bs, sets


def _loop_fwd(xs, ws, bs, act):
    f = ACT_FN[act]
    return [f(F.linear(x, w, b)) for x, w, b in zip(xs, ws, bs)]


def _time_pair(T, name, fwd_fn, sets, params_fn, res):
    """Eager fwd (no grad) and fwd+bwd step timings of one implementation, errors recorded."""
    eb = backward_fn()
    try:
        with torch.no_grad():
            T[name + "_fwd"] = time_steps(lambda i: fwd_fn(*sets[i % len(sets)]))
    except Budget:
        raise
    except Exception as ex:
        res.setdefault("errors", {})[name + "_fwd"] = repr(ex)[:400]
    try:
        def step(i):
            st = sets[i % len(sets)]
            outs, grads = fwd_fn(*st), st[-1]
            if isinstance(outs, torch.Tensor):
                outs = [outs]
            if isinstance(grads, torch.Tensor):
                grads = [grads]
            return eb(outs, grads, params_fn(st))
        T[name + "_step"] = time_steps(step)
    except Budget:
        raise
    except Exception as ex:
        res.setdefault("errors", {})[name + "_step"] = repr(ex)[:400]


def _graph(T, name, build, res, state):
    if not state.get("graphs", True):
        return
    try:
        T[name + "_graph"] = time_graph(build)
    except Budget:
        raise
    except Exception as ex:
        res.setdefault("errors", {})[name + "_graph"] = repr(ex)[:400]
        try:  # a failed capture must not poison the rest of the run
            sync()
            torch.zeros(1, device=dev_()).add_(1)
            sync()
        except Exception:
            state["graphs"] = False
            res["errors"]["graphs_disabled"] = "CUDA state unusable after a failed capture"


def bench_gl_case(kind, G, dtype, act, ceil, state, graphs=True, fixed_config=False):
    dev = dev_()
    dims = gl_dims(kind, G)
    seed = 1000 + G
    ws, bs, sets = _gl_sets(dims, dtype, dev, seed, N_SETS)
    es = torch.tensor([], dtype=dtype).element_size()
    flops = sum(2 * m * k * n for m, k, n in dims)
    bytes_f = sum(m * k + n * k + n + m * n for m, k, n in dims) * es
    bytes_b = sum(m * n + m * k + n * k + m * k + n * k + n for m, k, n in dims) * es  # dy, x, w in; dx, dW, db out
    res = dict(kind=kind, G=G, dtype=str(dtype).split(".")[-1], act=act, dims=dims, flops_fwd=flops,
               flops_step=3 * flops, bytes_fwd=bytes_f, bytes_step=bytes_f + bytes_b,
               config="fixed (OPTIMUS_KERNELS_AUTOTUNE=0 default)" if fixed_config else "autotuned")
    T = res["times_ms"] = {}
    eb = backward_fn()

    # sanity: ours vs the loop on these inputs (first call also tunes / compiles)
    xs, gys = sets[0]
    ys = grouped_linear(xs, ws, bs, act)
    params = list(xs) + ws + bs
    ga = eb(ys, gys, params)
    ref = _loop_fwd(xs, ws, bs, act)
    gl_ = eb(ref, gys, params)
    res["rel_err_vs_loop"] = dict(y=rel(cat_flat(ys), cat_flat(ref)), grads=rel(cat_flat(ga), cat_flat(gl_)))
    del ys, ga, ref, gl_

    pf = lambda st: list(st[0]) + ws + bs
    _time_pair(T, "ours", lambda xs, gys: grouped_linear(xs, ws, bs, act), sets, pf, res)
    _time_pair(T, "loop", lambda xs, gys: _loop_fwd(xs, ws, bs, act), sets, pf, res)
    if G == 16 and kind == "mixed-small" and act == "none" and dtype == torch.bfloat16:
        # the same step with the device-table cache off: every call uploads its tables
        _plans.set_table_cache(False)
        try:
            T["ours_nocache_step"] = time_steps(
                lambda i: eb(grouped_linear(sets[i % N_SETS][0], ws, bs, act), sets[i % N_SETS][1],
                             list(sets[i % N_SETS][0]) + ws + bs))
        finally:
            _plans.set_table_cache(True)
    uniform = kind.startswith("uniform")
    if uniform:
        m, k, n = dims[0]
        W = torch.stack([w.detach() for w in ws]).requires_grad_()
        B = torch.stack([b.detach() for b in bs]).unsqueeze(1).requires_grad_()
        bsets = [(torch.stack([x.detach() for x in xs]).requires_grad_(), torch.stack(gys)) for xs, gys in sets]
        bmm_f = lambda X, GY: ACT_FN[act](torch.baddbmm(B, X, W.transpose(1, 2)))
        _time_pair(T, "bmm", bmm_f, bsets, lambda st: (st[0], W, B), res)
        if hasattr(torch, "_grouped_mm") and dtype == torch.bfloat16:
            try:
                offs = torch.arange(1, G + 1, device=dev, dtype=torch.int32) * m
                gsets = [(X.detach().reshape(G * m, k).requires_grad_(), GY) for X, GY in bsets]
                gmm_f = lambda X2, GY: ACT_FN[act](torch._grouped_mm(X2, W.transpose(-2, -1), offs=offs)
                                                   .view(G, m, n) + B)
                res["gmm_rel_err_vs_bmm"] = rel(gmm_f(*gsets[0]).detach(), bmm_f(*bsets[0]).detach())
                _time_pair(T, "gmm", gmm_f, gsets, lambda st: (st[0], W, B), res)
            except Budget:
                raise
            except Exception as ex:
                res.setdefault("errors", {})["gmm"] = repr(ex)[:400]

    if graphs and not DRY:
        xs0 = [x.detach() for x in sets[0][0]]
        gys0 = sets[0][1]
        w0 = [w.detach() for w in ws]
        b0 = [b.detach() for b in bs]

        def build(which):
            def b():
                xs = [x.clone().requires_grad_() for x in xs0]
                wl = [w.clone().requires_grad_() for w in w0]
                bl = [v.clone().requires_grad_() for v in b0]
                gy = [g.clone() for g in gys0]
                ps = xs + wl + bl
                if which == "ours":
                    return lambda: eb(grouped_linear(xs, wl, bl, act), gy, ps)
                return lambda: eb(_loop_fwd(xs, wl, bl, act), gy, ps)
            return b

        _graph(T, "ours", build("ours"), res, state)
        _graph(T, "loop", build("loop"), res, state)
        if uniform:
            X0, GY0 = bsets[0]

            def bb():
                X = X0.detach().clone().requires_grad_()
                Wc = W.detach().clone().requires_grad_()
                Bc = B.detach().clone().requires_grad_()
                return lambda: eb([ACT_FN[act](torch.baddbmm(Bc, X, Wc.transpose(1, 2)))], [GY0], (X, Wc, Bc))
            _graph(T, "bmm", bb, res, state)
    # throughput of ours at its best device time (graph replay when measured)
    t_dev = T.get("ours_graph", T.get("ours_step", {})).get("ms")
    if t_dev:
        res["ours_step_TFLOPs"] = 3 * flops / (t_dev * 1e-3) / 1e12
        res["ours_step_GBps"] = (bytes_f + bytes_b) / (t_dev * 1e-3) / 1e9
        peak = ceil["fp32_tf32_mm_TFLOPs"] if dtype == torch.float32 else ceil["bf16_mm_TFLOPs"]
        res["pct_mm_ceiling"] = 100 * res["ours_step_TFLOPs"] / peak
        res["pct_copy_ceiling"] = 100 * res["ours_step_GBps"] / (ceil["copy_TBps"] * 1e3)
    return res


# ------------------------------------------------------------------------------------------------
# batched layer norm
# ------------------------------------------------------------------------------------------------
def make_ln(dims, dtype, dev, affine=True, seed=0):
    g = _gen(dev, seed)
    xs = [(torch.randn(r, d, device=dev, dtype=dtype, generator=g)).requires_grad_() for r, d in dims]
    ws = [(torch.randn(d, device=dev, dtype=dtype, generator=g) * 0.1 + 1).requires_grad_() for r, d in dims]
    bs = [torch.randn(d, device=dev, dtype=dtype, generator=g).requires_grad_() for r, d in dims]
    return xs, ws, bs


def bench_ln_case(kind, G, dtype, ceil, state, graphs=True):
    dev = dev_()
    dims = ln_dims(kind, G)
    n_sets = 2 if kind == "large" else N_SETS
    xs0, ws, bs = make_ln(dims, dtype, dev, seed=2000 + G)
    g = _gen(dev, 3000 + G)
    sets = [(xs0, [torch.randn(r, d, device=dev, dtype=dtype, generator=g) for r, d in dims])]
    for _ in range(n_sets - 1):
        sets.append(([torch.randn(r, d, device=dev, dtype=dtype, generator=g).requires_grad_() for r, d in dims],
                     [torch.randn(r, d, device=dev, dtype=dtype, generator=g) for r, d in dims]))
    es = torch.tensor([], dtype=dtype).element_size()
    nbytes = sum(r * d for r, d in dims) * es
    res = dict(kind=kind, G=G, dtype=str(dtype).split(".")[-1], dims=dims, bytes_fwd=2 * nbytes,
               bytes_step=5 * nbytes)
    T = res["times_ms"] = {}
    eb = backward_fn()
    xs, gys = sets[0]
    ys = batched_layer_norm(xs, ws, bs)
    ref = [F.layer_norm(x, (x.shape[-1],), w, b) for x, w, b in zip(xs, ws, bs)]
    params = list(xs) + ws + bs
    ga, gl_ = eb(ys, gys, params), eb(ref, gys, params)
    res["rel_err_vs_loop"] = dict(y=rel(cat_flat(ys), cat_flat(ref)), dx=rel(cat_flat(ga[:G]), cat_flat(gl_[:G])),
                                  dwdb=rel(cat_flat(ga[G:]), cat_flat(gl_[G:])))
    del ys, ref, ga, gl_
    pf = lambda st: list(st[0]) + ws + bs
    loop = lambda xs, gys: [F.layer_norm(x, (x.shape[-1],), w, b) for x, w, b in zip(xs, ws, bs)]
    _time_pair(T, "ours", lambda xs, gys: batched_layer_norm(xs, ws, bs), sets, pf, res)
    _time_pair(T, "loop", loop, sets, pf, res)
    if kind in ("uniform", "large"):
        r, d = dims[0]
        w1, b1 = ws[0].detach().clone().requires_grad_(), bs[0].detach().clone().requires_grad_()
        ssets = [(torch.stack([x.detach() for x in xs]).reshape(G * r, d).requires_grad_(),
                  torch.stack(gys).reshape(G * r, d)) for xs, gys in sets]
        _time_pair(T, "stacked", lambda X, GY: [F.layer_norm(X, (d,), w1, b1)], ssets, lambda st: (st[0], w1, b1), res)
    if graphs and not DRY:
        xc = [x.detach() for x in sets[0][0]]
        gy0 = sets[0][1]

        def build(which):
            def b():
                xl = [x.clone().requires_grad_() for x in xc]
                wl = [w.detach().clone().requires_grad_() for w in ws]
                bl = [v.detach().clone().requires_grad_() for v in bs]
                ps = xl + wl + bl
                if which == "ours":
                    return lambda: eb(batched_layer_norm(xl, wl, bl), gy0, ps)
                return lambda: eb([F.layer_norm(x, (x.shape[-1],), w, v) for x, w, v in zip(xl, wl, bl)], gy0, ps)
            return b
        _graph(T, "ours", build("ours"), res, state)
        _graph(T, "loop", build("loop"), res, state)
    bw = ceil["copy_TBps"] * 1e3
    for key, nb in (("fwd", 2 * nbytes), ("step", 5 * nbytes)):
        t = T.get("ours_" + key, {}).get("ms")
        if t:
            res[f"ours_{key}_GBps"] = nb / (t * 1e-3) / 1e9
            res[f"pct_copy_{key}"] = 100 * res[f"ours_{key}_GBps"] / bw
    t = T.get("stacked_fwd", {}).get("ms")
    if t:
        res["stacked_fwd_GBps"] = 2 * nbytes / (t * 1e-3) / 1e9
    return res


# ------------------------------------------------------------------------------------------------
# phase A driver
# ------------------------------------------------------------------------------------------------
GL_KINDS = ("mixed-small", "mixed", "uniform-small", "uniform-large")
LN_CASES = [("uniform", 4), ("uniform", 8), ("uniform", 16), ("uniform", 64), ("mixed", 8), ("mixed", 16),
            ("large", 8)]


def phase_a(workers, log, timeout_s):
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
        ex = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
        clean = False
        try:
            futs = [(n, a, ex.submit(run_task, n, a, DEV, DRY)) for n, a in tasks]
            timed_out = False
            for n, a, f in futs:
                left = timeout_s - (time.time() - t0)
                try:
                    results += f.result(timeout=max(0.1, left))
                except cf.TimeoutError:
                    timed_out = True
                    results.append(dict(test=n, args=repr(a), ok=False, error="phase-A timeout"))
                except Exception as e:  # a worker died
                    results.append(dict(test=n, args=repr(a), ok=False, error=f"worker failed: {e!r}"))
            clean = not timed_out
        finally:
            procs = list(getattr(ex, "_processes", {}).values())
            ex.shutdown(wait=clean, cancel_futures=True)
            if not clean:
                for p in procs:  # the workers this run started that are still busy (timeout / signal)
                    if p.is_alive():
                        p.terminate()
    else:
        for n, a in tasks:
            if time.time() - t0 > timeout_s:
                results.append(dict(test=n, args=repr(a), ok=False, error="phase-A timeout"))
                continue
            results += run_task(n, a, DEV, DRY)
    log(f"phase A: {len(tasks)} tasks in {time.time() - t0:.1f}s")
    return results


# ------------------------------------------------------------------------------------------------
# tables
# ------------------------------------------------------------------------------------------------
def fmt(x, nd=3):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _ms(T, key):
    v = T.get(key)
    return v.get("ms") if isinstance(v, dict) else None


def _ratio(a, b):
    return f"{a / b:.2f}" if (a and b) else "-"


def make_table(report):
    ceil = report.get("ceilings", {})
    lines = [f"optimus.kernels bench  {report.get('date')}  {report.get('gpu')}  torch {report.get('torch')}  "
             f"triton {report.get('triton')}  copy {fmt(ceil.get('copy_TBps'), 2)} TB/s  bf16 mm "
             f"{fmt(ceil.get('bf16_mm_TFLOPs'), 0)} TFLOP/s  tf32 mm {fmt(ceil.get('fp32_tf32_mm_TFLOPs'), 0)} TFLOP/s"]
    if "checks" in report:
        lines.append(f"GPU correctness checks: {len(report['checks']) - report.get('checks_failed', 0)} ok, "
                     f"{report.get('checks_failed', 0)} failed")
    lines.append("grouped_linear (ms per step, median; eager = CUDA events around each step, inputs rotated; "
                 "graph = CUDA-graph replay of the whole fwd+bwd step; x = loop / ours or bmm / ours)")
    rows: list = []
    for r in report.get("grouped_linear", []):
        T = r.get("times_ms", {})
        name = r["kind"] + ("" if r["act"] == "none" else "+" + r["act"]) + ("" if r["dtype"] == "bfloat16" else
                                                                            "/" + r["dtype"])
        if "error" in r:
            rows.append([name, r["G"], "|", f"FAILED: {r['error'][:150]}"])
            continue
        of, lf, os_, ls = _ms(T, "ours_fwd"), _ms(T, "loop_fwd"), _ms(T, "ours_step"), _ms(T, "loop_step")
        og, lg = _ms(T, "ours_graph"), _ms(T, "loop_graph")
        bs_, bg, gs = _ms(T, "bmm_step"), _ms(T, "bmm_graph"), _ms(T, "gmm_step")
        err = r.get("rel_err_vs_loop", {})
        rows.append([name, r["G"], "|", fmt(of), fmt(lf), _ratio(lf, of), "|", fmt(os_), fmt(ls), _ratio(ls, os_), "|",
                     fmt(og), fmt(lg), _ratio(lg, og), "|", fmt(bs_), _ratio(bs_, os_), fmt(bg), _ratio(bg, og), "|",
                     fmt(gs), "|", fmt(r.get("ours_step_TFLOPs"), 0), fmt(r.get("pct_mm_ceiling"), 0),
                     f"{fmt(err.get('y'), 4)}/{fmt(err.get('grads'), 4)}"
                     + ("  errors: " + ",".join(r["errors"]) if r.get("errors") else "")])
        if "ours_nocache_step" in T:
            nc = _ms(T, "ours_nocache_step")
            rows.append(["  (table cache off)", "", "|", "", "", "", "|", fmt(nc), fmt(ls), _ratio(ls, nc), "|"])
    lines.append(format_table(["case", "G", "|", "fwd", "loop", "x", "|", "step", "loop", "x", "|", "graph", "loop", "x",
                               "|", "bmm st", "x", "bmm gr", "x", "|", "gmm st", "|", "TF/s", "%mm", "err"], rows,
                              [False, True, False] + [True] * 3 + [False] + [True] * 3 + [False] + [True] * 3 + [False]
                              + [True] * 4 + [False, True, False, True, True, False]))
    lines.append("batched_layer_norm bf16 (ms per step, median; GB/s counts x read + y written (fwd), + x, dy read, "
                 "dx written (step); % of the measured copy bandwidth)")
    rows = []
    for r in report.get("layer_norm", []):
        T = r.get("times_ms", {})
        if "error" in r:
            rows.append([r["kind"], r["G"], "|", f"FAILED: {r['error'][:150]}"])
            continue
        of, lf, sf = _ms(T, "ours_fwd"), _ms(T, "loop_fwd"), _ms(T, "stacked_fwd")
        os_, ls, ss = _ms(T, "ours_step"), _ms(T, "loop_step"), _ms(T, "stacked_step")
        og, lg = _ms(T, "ours_graph"), _ms(T, "loop_graph")
        err = r.get("rel_err_vs_loop", {})
        rows.append([r["kind"], r["G"], "|", fmt(of), fmt(lf), _ratio(lf, of), fmt(sf), "|",
                     fmt(r.get("ours_fwd_GBps"), 0), fmt(r.get("pct_copy_fwd"), 0), "|", fmt(os_), fmt(ls),
                     _ratio(ls, os_), fmt(ss), "|", fmt(r.get("ours_step_GBps"), 0), fmt(r.get("pct_copy_step"), 0), "|",
                     fmt(og), fmt(lg), _ratio(lg, og),
                     f"{fmt(err.get('y'), 4)}/{fmt(err.get('dx'), 4)}"
                     + ("  errors: " + ",".join(r["errors"]) if r.get("errors") else "")])
    lines.append(format_table(["case", "G", "|", "fwd", "loop", "x", "stack", "|", "GB/s", "%copy", "|", "step", "loop",
                               "x", "stack", "|", "GB/s", "%copy", "|", "graph", "loop", "x", "err"], rows,
                              [False, True, False] + [True] * 4 + [False] + [True] * 2 + [False] + [True] * 4 + [False]
                              + [True] * 2 + [False] + [True] * 3 + [False]))
    if report.get("skipped"):
        lines.append(f"skipped (time budget): {', '.join(' '.join(map(str, s)) for s in report['skipped'])}")
    if report.get("stopped"):
        lines.append(f"stopped early: {report['stopped']}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# driver
# ------------------------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--budget-s", type=float, default=200.0,
                    help="hard budget for the whole run: no measurement starts after it; the table is printed")
    ap.add_argument("--check-budget-s", type=float, default=75.0, help="phase-A (correctness) time limit")
    ap.add_argument("--workers", type=int, default=None,
                    help="phase-A worker processes (default: min(12, #cpus - 2); 1 in --dry-run)")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--act", default="none", help="activation used in the grouped-linear benchmark")
    ap.add_argument("--dry-run", action="store_true",
                    help="exercise this script on the CPU with the Triton interpreter at tiny shapes")
    args = ap.parse_args(argv)
    global DEV, DRY, CLOCK
    CLOCK = _Clock(args.budget_s)
    if args.workers is None:
        args.workers = 1 if args.dry_run else max(1, min(12, (os.cpu_count() or 2) - 2))
    if args.dry_run:
        DEV, DRY = "cpu", True
        os.environ["TRITON_INTERPRET"] = "1"
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "bench.log"), "a")

    def log(msg):
        line = f"[{CLOCK.elapsed():7.1f}s] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    if not torch.cuda.is_available() and not DRY:
        print("optimus.tools.bench.kernels.grouped needs a CUDA device (or --dry-run)")
        return 2
    import signal

    def on_term(signum, frame):  # `timeout` sends SIGTERM: stop measuring, still print the table
        raise Budget(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)

    import triton
    if DRY:
        gpu_name, sms = "cpu (dry run, Triton interpreter)", 0
    else:
        props = torch.cuda.get_device_properties(dev_())
        gpu_name, sms = props.name, props.multi_processor_count
    report = dict(date=datetime.date.today().isoformat(), gpu=gpu_name, sms=sms,
                  torch=torch.__version__, triton=triton.__version__, python=sys.version.split()[0],
                  has_grouped_mm=hasattr(torch, "_grouped_mm"), budget_s=args.budget_s,
                  methodology=dict(
                      eager="CUDA events around each step on the current stream, median over repetitions "
                            f"(~{MEASURE_S}s of them) after warm-up, {N_SETS} input sets rotated, weights shared",
                      step="forward + backward through the autograd engine from the G outputs with given "
                           "upstream grads (torch.autograd.grad without its per-output Python checks)",
                      graph="whole step captured in one CUDA graph, replayed in 5 timed batches; median per replay",
                      autotune="ours autotuned once per shape key before timing (first call), then fixed"))
    report["grouped_linear"] = []
    report["layer_norm"] = []
    path = os.path.join(args.out, "bench.json")

    def save():
        with open(path, "w") as f:
            json.dump(report, f, indent=1, default=str)

    log(f"{ {k: v for k, v in report.items() if k != 'methodology'} }")
    try:
        if not args.skip_check:
            res = phase_a(args.workers, log, min(args.check_budget_s, max(10.0, CLOCK.left() - 60)))
            report["checks"] = res
            bad = [r for r in res if not r.get("ok")]
            for r in res:
                if r.get("test") in ("warm_gl", "warm_ln"):
                    continue
                errs = " ".join(f"{k}={v:.1e}" for k, v in r.get("errors", {}).items())
                log(f"check {'OK  ' if r.get('ok') else 'FAIL'} {r.get('test')} {r.get('dtype', '')} "
                    f"{r.get('act', '')} {r.get('case', '')} {'affine' if r.get('affine') else ''} {errs} "
                    f"{str(r.get('error', ''))[:800]}")
            report["checks_failed"] = len(bad)
            log(f"checks: {len(res) - len(bad)} ok, {len(bad)} failed")
            save()

        ceil = ceilings()
        report["ceilings"] = ceil
        log(f"ceilings: copy {ceil['copy_TBps']:.2f} TB/s, bf16 mm {ceil['bf16_mm_TFLOPs']:.0f} TFLOP/s, "
            f"tf32 mm {ceil['fp32_tf32_mm_TFLOPs']:.0f} TFLOP/s")
        save()
        bf = torch.bfloat16
        # the target cases first, so that they survive a short budget
        cases = [("gl", "mixed-small", 16, bf, args.act), ("gl", "uniform-small", 16, bf, args.act),
                 ("gl", "uniform-large", 16, bf, args.act), ("ln", "large", 8, bf, None), ("ln", "uniform", 8, bf, None),
                 ("ln", "uniform", 16, bf, None), ("gl", "mixed-small", 4, bf, args.act),
                 ("gl", "mixed-small", 64, bf, args.act), ("gl", "mixed", 16, bf, args.act),
                 ("gl", "mixed-small", 16, torch.float32, args.act), ("ln", "mixed", 8, bf, None)]
        if args.act == "none":
            cases.append(("gl", "mixed-small", 16, bf, "relu"))  # fused epilogue vs F.linear + F.relu
        rest = [("gl", k, G, bf, args.act) for k in GL_KINDS for G in (4, 16, 64)] + \
               [("ln", k, G, bf, None) for k, G in LN_CASES]
        cases += [c for c in rest if c not in cases]
        if DRY:
            cases = [("gl", "mixed-small", 4, bf, "none"), ("gl", "uniform-small", 4, bf, "none"),
                     ("gl", "mixed-small", 4, torch.float32, "none"), ("ln", "uniform", 4, bf, None),
                     ("ln", "mixed", 8, bf, None)]
        state = {"graphs": not args.no_graphs}
        for what, kind, G, dtype, act in cases:
            if CLOCK.left() < 4:
                report.setdefault("skipped", []).append([what, kind, G, str(dtype).split(".")[-1]])
                continue
            try:
                if what == "gl":
                    # fp32: ours runs TF32 with the fixed default config (compiled by phase A); the
                    # loop and bmm get TF32 too (torch's default for fp32 matmuls is full fp32)
                    fixed = dtype == torch.float32
                    tf32 = torch.backends.cuda.matmul.allow_tf32
                    if fixed and not DRY:
                        from optimus.kernels.linear import kernel as GLK
                        GLK.set_autotune(False)
                        torch.backends.cuda.matmul.allow_tf32 = True
                    try:
                        r = bench_gl_case(kind, G, dtype, act, ceil, state, graphs=not args.no_graphs,
                                          fixed_config=fixed)
                    finally:
                        if fixed and not DRY:
                            GLK.set_autotune(True)
                            torch.backends.cuda.matmul.allow_tf32 = tf32
                    report["grouped_linear"].append(r)
                    T = r["times_ms"]
                    log(f"GL {kind} G={G} {r['dtype']} {act}: step ours {fmt(_ms(T, 'ours_step'))} loop "
                        f"{fmt(_ms(T, 'loop_step'))} | graph ours {fmt(_ms(T, 'ours_graph'))} loop "
                        f"{fmt(_ms(T, 'loop_graph'))} | bmm step {fmt(_ms(T, 'bmm_step'))} graph "
                        f"{fmt(_ms(T, 'bmm_graph'))} | err {r['rel_err_vs_loop']} {r.get('errors', '')}")
                else:
                    r = bench_ln_case(kind, G, dtype, ceil, state, graphs=not args.no_graphs)
                    report["layer_norm"].append(r)
                    T = r["times_ms"]
                    log(f"LN {kind} G={G}: fwd ours {fmt(_ms(T, 'ours_fwd'))} ({fmt(r.get('pct_copy_fwd'), 0)}% copy) "
                        f"loop {fmt(_ms(T, 'loop_fwd'))} stacked {fmt(_ms(T, 'stacked_fwd'))} | step ours "
                        f"{fmt(_ms(T, 'ours_step'))} loop {fmt(_ms(T, 'loop_step'))} | err {r['rel_err_vs_loop']} "
                        f"{r.get('errors', '')}")
            except Budget:
                raise
            except Exception:
                tb = traceback.format_exc()
                log(f"case {what} {kind} G={G} {dtype} failed:\n{tb[-2000:]}")
                rec = dict(kind=kind, G=G, dtype=str(dtype).split(".")[-1], act=act or "none", error=tb[-1500:])
                report["grouped_linear" if what == "gl" else "layer_norm"].append(rec)
            if not DRY:
                torch.cuda.empty_cache()
            save()
    except Budget as b:
        report["stopped"] = str(b)
        log(f"stopped: {b}")
    except Exception:
        report["stopped"] = traceback.format_exc()[-1500:]
        log(f"run failed:\n{report['stopped']}")
    report["eager_caches"] = _plans.eager_cache_info()
    table = make_table(report)
    with open(os.path.join(args.out, "table.txt"), "w") as f:
        f.write(table + "\n")
    report["total_seconds"] = CLOCK.elapsed()
    save()
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
