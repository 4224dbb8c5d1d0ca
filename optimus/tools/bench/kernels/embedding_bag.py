"""GPU benchmark + correctness check of the grouped embedding bag (one command, < 3 minutes).

    python -m optimus.tools.bench.kernels.embedding_bag --out $OUT --budget-s 165
    python -m optimus.tools.bench.kernels.embedding_bag --dry-run --out DIR   # CPU, Triton interpreter, tiny shapes
    python -m optimus.tools.bench.kernels.embedding_bag --aot                 # compile for sm_90 without a GPU

Order (the budget stops new measurements; the table of what was measured is printed anyway):

1. warm-up workers (``--workers``, default 4) compile every kernel variant used below in parallel
   processes at tiny sizes, filling Triton's on-disk cache (the main process then loads binaries);
2. ceiling: device-to-device copy bandwidth of a 1 GiB buffer (read + write counted);
3. correctness at realistic sizes against float64 ``F.embedding_bag`` / ``F.embedding``
   (bf16 and fp32; sum / mean / embedding modes with padding, per-sample weights and their grad,
   sparse tables, fixed bag sizes; deterministic and atomic backward);
4. timings, target cases first: T tables of mixed dims (16..256, all width classes), N_t rows in
   5k..100k, bf16, jagged bags with lengths uniform in [ceil(L/2), L] given as KeyedJaggedTensor-
   style packed indices + T * B + 1 offsets; ``mode="sum"``.  Ours (one launch forward; backward
   deterministic = sorted segments, or atomic) against a loop of ``F.embedding_bag`` over the
   per-table slices followed by ``torch.cat`` (which our [B, sum D] output makes free).

Timings are ``triton.testing.do_bench`` medians (L2 flushed before every call) in ms:

    fwd     forward under no_grad, eager
    step    forward + backward (torch.autograd.grad of the [B, sum D] output w.r.t. the T weights
            with a given upstream gradient), eager: host-issue bound when the work is small
    graph   the step captured once in a CUDA graph and replayed (device time only), ours
            (deterministic) and the loop
    mset    zeroing all dense gradients once (one memset): the floor of any dense backward

Bandwidth (GB/s, and % of the measured copy bandwidth), from the graph time when there is one:

    fwd bytes  = gathered rows (sum_t L_t * D_t * es) + indices + offsets + output (B * sum D * es)
    step bytes = fwd bytes + the backward's minimum: dout read (B * sum D * es), one dout row per
                 index entry (sum_t L_t * D_t * es), indices + offsets, dense gradients written
                 (sum_t N_t * D_t * es)

Writes OUT/bench_embedding.json (everything) and OUT/table_embedding.txt (the table printed last).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import signal
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

DRY = False
DEV = "cuda"
TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


class Budget(Exception):
    pass


class Clock:
    def __init__(self, budget_s: float):
        self.t0, self.budget_s = time.time(), budget_s

    def elapsed(self) -> float:
        return time.time() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def check(self, need_s: float = 0.0) -> None:
        if self.left() < need_s:
            raise Budget(f"time budget spent ({self.elapsed():.0f}s of {self.budget_s:.0f}s)")


CLOCK = Clock(1e9)


def _kernels():
    from optimus.kernels import embedding_bag as embedding_ops
    from optimus.kernels.embedding_bag import kernel as grouped_embedding_bag_kernel

    return embedding_ops, grouped_embedding_bag_kernel


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def bench(fn) -> float:
    """Median ms of ``fn()`` (triton.testing.do_bench on the GPU; one wall-clock call in --dry-run)."""
    CLOCK.check(0.5)
    if DRY:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def bench_graph(step) -> float:
    """Median ms of a CUDA-graph replay of ``step`` (captured on a side stream after warm-up)."""
    CLOCK.check(1.0)
    if DRY:
        raise RuntimeError("no CUDA graphs in --dry-run")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
        s.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            step()
    torch.cuda.current_stream().wait_stream(s)
    sync()
    return bench(g.replay)


def rel(a, r) -> float:
    a, r = a.detach().double(), r.detach().double()
    if not torch.isfinite(a).all():
        return float("inf")
    d = r.norm().item()
    return (a - r).norm().item() / (d if d > 0 else 1.0)


# ------------------------------------------------------------------------------------------------
# inputs
# ------------------------------------------------------------------------------------------------
DIMS = [16, 32, 64, 128, 256, 48, 96, 192, 128, 64]   # every width class in any 5 consecutive tables
ROWS = [10_000, 20_000, 50_000, 100_000, 5_000, 40_000]


def _gen(seed):
    g = torch.Generator(device=DEV)
    g.manual_seed(seed)
    return g


def scale(v, f):
    return v if not DRY else max(1, v // f)


def make_tables(T, dtype, seed=0, requires_grad=True):
    g = _gen(seed)
    ws = []
    for t in range(T):
        n, d = scale(ROWS[t % len(ROWS)], 2000), DIMS[t % len(DIMS)] if not DRY else min(DIMS[t % len(DIMS)], 32)
        w = torch.randn(n, d, generator=g, device=DEV, dtype=torch.float32).to(dtype)
        ws.append(w.requires_grad_(requires_grad))
    return ws


def make_batch(ws, B, L, seed=1, zipf=False):
    """Packed indices, T * B + 1 offsets, and the per-table (indices, offsets) views for the loop."""
    T = len(ws)
    g = _gen(seed)
    lo = max(1, (L + 1) // 2)
    lens = torch.randint(lo, L + 1, (T, B), generator=g, device=DEV)
    counts = lens.sum(1).tolist()
    parts = []
    for t, w in enumerate(ws):
        n = w.shape[0]
        if zipf:  # power law over rows: row r drawn with probability ~ 1 / (r + 1)
            u = torch.rand(counts[t], generator=g, device=DEV, dtype=torch.float64)
            x = (torch.exp(u * math.log(n + 1)) - 1).long().clamp_(0, n - 1)
        else:
            x = torch.randint(0, n, (counts[t],), generator=g, device=DEV)
        parts.append(x)
    idx = torch.cat(parts)
    off = torch.zeros(T * B + 1, dtype=torch.int64, device=DEV)
    off[1:] = lens.reshape(-1).cumsum(0)
    per_idx, per_off, base = [], [], 0
    for t in range(T):
        per_idx.append(idx[base: base + counts[t]])
        per_off.append((off[t * B: (t + 1) * B] - base).contiguous())
        base += counts[t]
    return idx, off, per_idx, per_off, counts


def traffic(ws, B, counts, es, idx_es=8):
    sumd = sum(w.shape[1] for w in ws)
    rows = sum(c * w.shape[1] for c, w in zip(counts, ws)) * es
    ix = sum(counts) * idx_es + (len(ws) * B + 1) * 8
    fwd = rows + ix + B * sumd * es
    bwd = B * sumd * es + rows + ix + sum(w.numel() for w in ws) * es
    return fwd, fwd + bwd


# ------------------------------------------------------------------------------------------------
# correctness
# ------------------------------------------------------------------------------------------------
def _oracle(ws64, per_idx, per_off, modes, pads, psws):
    outs = []
    for t, w in enumerate(ws64):
        x, o, m, p = per_idx[t], per_off[t], modes[t], pads[t]
        if m == "embedding":
            rows = F.embedding(x, w, padding_idx=p)
            if o is None:
                outs.append(rows.sum(1))
            else:
                B = o.numel()
                full = torch.cat([o, torch.tensor([x.numel()], device=o.device)])
                bag = torch.repeat_interleave(torch.arange(B, device=o.device), full[1:] - full[:-1])
                outs.append(torch.zeros(B, w.shape[1], dtype=w.dtype, device=w.device).index_add(0, bag, rows))
        else:
            outs.append(F.embedding_bag(x, w, o, mode=m, padding_idx=p, per_sample_weights=psws[t]))
    return torch.cat(outs, 1)


def check_case(name, dtype, T, B, L, modes, pads, deterministic, psw=False, sparse=False, fixed=False, seed=0):
    """One correctness case: forward and all gradients against float64 references."""
    K, _ = _kernels()
    ws = make_tables(T, dtype, seed=seed)
    if fixed:
        g = _gen(seed + 7)
        idx = torch.cat([torch.randint(0, w.shape[0], (B * L,), generator=g, device=DEV) for w in ws])
        per_idx = [idx[t * B * L: (t + 1) * B * L].view(B, L) for t in range(T)]  # views: padding below shows
        per_off = [None] * T
        counts = [B * L] * T
    else:
        idx, off, per_idx, per_off, counts = make_batch(ws, B, L, seed=seed + 1)
    # padding entries: every 5th index of a padded table points at its padding row
    base = 0
    for t, p in enumerate(pads):
        if p is not None:
            seg = idx[base: base + counts[t]]
            seg[::5] = p
        base += counts[t]
    psw_t = None
    if psw:
        psw_t = (torch.rand(idx.numel(), generator=_gen(seed + 3), device=DEV) + 0.5).to(dtype).requires_grad_()
    sp = [bool(sparse and t % 2 == 0) for t in range(T)]
    if fixed:
        out = K.grouped_embedding_bag(ws, idx, None, psw_t, bag_size=L, mode=modes, padding_idx=pads, sparse=sp,
                                      deterministic=deterministic)
    else:
        out = K.grouped_embedding_bag(ws, idx, off, psw_t, mode=modes, padding_idx=pads, sparse=sp,
                                      deterministic=deterministic, index_counts=counts)
    gy = torch.randn(out.shape, generator=_gen(seed + 5), device=DEV).to(dtype)
    leaves = ws + ([psw_t] if psw else [])
    got = torch.autograd.grad(out, leaves, gy)
    ws64 = [w.detach().double().requires_grad_() for w in ws]
    psws64, p64 = [None] * T, None
    if psw:
        p64 = psw_t.detach().double().requires_grad_()
        base, parts = 0, []
        for t in range(T):
            seg = p64[base: base + counts[t]]
            parts.append(seg.view(per_idx[t].shape) if modes[t] == "sum" else None)
            base += counts[t]
        psws64 = parts
    ref = _oracle(ws64, per_idx, per_off, modes, pads, psws64)
    want = torch.autograd.grad(ref, ws64 + ([p64] if psw else []), gy.double(), allow_unused=True)
    errs = {"out": rel(out, ref)}
    for t in range(T):
        gt = got[t].to_dense() if sp[t] else got[t]
        wt = want[t] if want[t] is not None else torch.zeros_like(ws64[t])
        errs[f"dw{t}"] = rel(gt, wt)
    if psw:
        errs["dpsw"] = rel(got[T], want[T] if want[T] is not None else torch.zeros_like(p64))
    worst = max(errs.values())
    return dict(check=name, dtype=str(dtype).split(".")[-1], T=T, B=B, L=L, deterministic=deterministic,
                ok=bool(worst <= TOL[dtype]), worst=worst, tol=TOL[dtype],
                errors={k: v for k, v in errs.items() if v > 0.1 * TOL[dtype]} or {"max": worst})


def checks(which=None):
    bf, f32 = torch.bfloat16, torch.float32
    B = scale(2048, 256)
    mixed = ["sum", "mean", "embedding", "sum", "mean", "sum"]
    pads = [3, None, 0, None, 7, None]
    jobs = [
        ("dense det, modes+padding", bf, 6, B, 16, mixed, pads, True, False, False, False),
        ("dense atomic, modes+padding", bf, 6, B, 16, mixed, pads, False, False, False, False),
        ("psw + sparse det", bf, 6, B, 8, ["sum"] * 6, pads, True, True, True, False),
        ("fp32 fixed bags det", f32, 5, B, 4, ["sum", "mean", "sum", "sum", "mean"], [None] * 5, True, False, False, True),
        ("fp32 fixed bags atomic", f32, 5, B, 4, ["sum", "mean", "sum", "sum", "mean"], [None] * 5, False, False, False,
         True),
        ("bag size 1 = F.embedding", bf, 5, B, 1, ["embedding"] * 5, [1, None, 2, None, 0], True, False, False, True),
    ]
    out = []
    for i, j in enumerate(jobs):
        if which is not None and i not in which:
            continue
        name, dt, T, Bc, L, modes, pd, det, psw, sparse, fixed = j
        try:
            CLOCK.check(2.0)
            out.append(check_case(name, dt, T, Bc, L, modes, pd, det, psw, sparse, fixed, seed=i))
        except Budget:
            raise
        except Exception:
            out.append(dict(check=name, ok=False, error=traceback.format_exc()[-2000:]))
    return out


# ------------------------------------------------------------------------------------------------
# timing cases
# ------------------------------------------------------------------------------------------------
def cases():
    # (label, T, B, L, zipf): the targets first (T = 26 ratios, large-batch bandwidth)
    c = [("target T=26", 26, 2048, 8, False), ("bandwidth", 26, 8192, 64, False),
         ("T=26 small", 26, 512, 8, False), ("T=26 B=8192", 26, 8192, 8, False),
         ("T=8", 8, 4096, 16, False), ("T=64", 64, 2048, 8, False), ("T=128", 128, 2048, 8, False),
         ("bag 1", 26, 8192, 1, False), ("bag 32 T=128", 128, 8192, 32, False),
         ("zipf rows", 26, 4096, 16, True)]
    if DRY:
        c = [("target T=26", 6, 8, 4, False), ("zipf rows", 5, 8, 4, True)]
    return c


def bench_case(label, T, B, L, zipf, copy_GBps, state, dtype=torch.bfloat16):
    K, _ = _kernels()
    ws = make_tables(T, dtype, seed=T)
    idx, off, per_idx, per_off, counts = make_batch(ws, B, L, seed=T + 1, zipf=zipf)
    es = ws[0].element_size()
    gy = torch.randn(B, sum(w.shape[1] for w in ws), generator=_gen(5), device=DEV).to(dtype)
    fwd_bytes, step_bytes = traffic(ws, B, counts, es)
    r = dict(case=label, T=T, B=B, L=L, zipf=zipf, dtype=str(dtype).split(".")[-1], indices=int(idx.numel()),
             fwd_bytes=fwd_bytes, step_bytes=step_bytes)

    def ours_fwd():
        return K.grouped_embedding_bag(ws, idx, off, mode="sum")

    def loop_fwd():
        return torch.cat([F.embedding_bag(per_idx[t], ws[t], per_off[t], mode="sum") for t in range(T)], 1)

    def ours_step(det=True):
        out = K.grouped_embedding_bag(ws, idx, off, mode="sum", deterministic=det)
        return torch.autograd.grad(out, ws, gy)

    def loop_step():
        return torch.autograd.grad(loop_fwd(), ws, gy)

    # same numbers as the loop (bf16: fp32 accumulation on both sides, rounding differs)
    with torch.no_grad():
        r["fwd_err"] = rel(ours_fwd(), loop_fwd())
    g_ours, g_loop = ours_step(True), loop_step()
    r["grad_err"] = max(rel(a, b) for a, b in zip(g_ours, g_loop))
    del g_ours, g_loop
    with torch.no_grad():
        r["fwd_ours"] = bench(ours_fwd)
        r["fwd_loop"] = bench(loop_fwd)
    r["step_ours"] = bench(ours_step)
    r["step_loop"] = bench(loop_step)
    r["step_atomic"] = bench(lambda: ours_step(False))
    n_grad = sum(w.numel() for w in ws)  # zeroing the dense gradients: a floor for any dense backward
    r["memset_ms"] = bench(lambda: torch.zeros(n_grad, dtype=dtype, device=DEV))
    for key, fn in (("graph_ours", ours_step), ("graph_fwd_ours", ours_fwd), ("graph_loop", loop_step)):
        if not state.get("graphs") or DRY:
            break
        try:
            if key == "graph_fwd_ours":
                with torch.no_grad():
                    r[key] = bench_graph(fn)
            else:
                r[key] = bench_graph(fn)
        except Budget:
            raise
        except Exception as ex:
            r[key + "_error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
            try:  # a failed capture can leave the context unusable: check before going on
                torch.zeros(1, device=DEV).add_(1).item()
            except Exception as ex2:
                state["graphs"] = False
                r["graphs_disabled"] = f"{type(ex2).__name__}: {str(ex2)[:200]}"
    fwd_t = r.get("graph_fwd_ours", r["fwd_ours"])
    step_t = r.get("graph_ours", r["step_ours"])
    r["fwd_GBps"] = fwd_bytes / fwd_t / 1e6
    r["step_GBps"] = step_bytes / step_t / 1e6
    if copy_GBps:
        r["fwd_pct_copy"] = 100 * r["fwd_GBps"] / copy_GBps
        r["step_pct_copy"] = 100 * r["step_GBps"] / copy_GBps
    return r


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy (read + write)."""
    if DRY:
        return 0.0
    n = (1 << 30) // 4
    a = torch.empty(n, dtype=torch.float32, device=DEV)
    b = torch.empty_like(a)
    ms = bench(lambda: b.copy_(a))
    del a, b
    return 2 * (1 << 30) / ms / 1e6


SWEEP = [(2048, 4), (1024, 4), (4096, 4), (2048, 8)]  # (forward tile elements, warps); the first is the default


def tile_sweep(copy_GBps):
    """Forward time of the bandwidth case for a few tile sizes (to pick the defaults)."""
    K, M = _kernels()
    out = []
    T, B, L = (26, 8192, 64) if not DRY else (8, 16, 4)
    ws = make_tables(T, torch.bfloat16, seed=T, requires_grad=False)
    idx, off, _, _, counts = make_batch(ws, B, L, seed=T + 1)
    fwd_bytes, _ = traffic(ws, B, counts, 2)
    old = M.get_config()
    try:
        for elems, warps in SWEEP:
            M.set_config(fwd_elems=elems, fwd_warps=warps)
            with torch.no_grad():
                ms = bench(lambda: K.grouped_embedding_bag(ws, idx, off, mode="sum"))
            out.append(dict(fwd_elems=elems, fwd_warps=warps, ms=ms, GBps=fwd_bytes / ms / 1e6,
                            pct_copy=100 * fwd_bytes / ms / 1e6 / copy_GBps if copy_GBps else None))
    finally:
        M.set_config(fwd_elems=old["fwd_elems"], fwd_warps=old["fwd_warps"])
    return out


# ------------------------------------------------------------------------------------------------
# warm-up workers: compile the variants in parallel processes (Triton's on-disk cache is shared)
# ------------------------------------------------------------------------------------------------
def warm_task(i: int, n: int) -> None:
    jobs = list(range(6))  # the correctness checks cover every variant the timings use, and more
    mine = [j for j in jobs if j % n == i]
    checks(which=set(mine))
    K, M = _kernels()
    ws = make_tables(26, torch.bfloat16, seed=26)
    idx, off, _, _, _ = make_batch(ws, 16, 8, seed=27)
    if i == 0:  # the timing variants (bf16, offsets, sum, deterministic + atomic) at a tiny size
        for det in (True, False):
            out = K.grouped_embedding_bag(ws, idx, off, mode="sum", deterministic=det)
            torch.autograd.grad(out, ws, torch.ones_like(out))
    for j, (elems, warps) in enumerate(SWEEP[1:]):  # the tile-sweep forwards
        if (j + 1) % n == i:
            M.set_config(fwd_elems=elems, fwd_warps=warps)
            with torch.no_grad():
                K.grouped_embedding_bag(ws, idx, off, mode="sum")
    sync()


def run_workers(n, log, timeout_s):
    if n <= 0 or DRY:
        return []
    env = dict(os.environ)
    cmd = [sys.executable, "-m", __spec__.name if __spec__ else "optimus.tools.bench.kernels.embedding_bag"]
    procs = [subprocess.Popen(cmd + ["--warm-task", str(i), "--workers", str(n)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(n)]
    res = []
    t0 = time.time()
    for i, p in enumerate(procs):
        try:
            outp, _ = p.communicate(timeout=max(1.0, timeout_s - (time.time() - t0)))
            res.append(dict(worker=i, rc=p.returncode, tail=outp[-800:] if p.returncode else ""))
        except subprocess.TimeoutExpired:
            p.kill()
            res.append(dict(worker=i, rc="timeout"))
    log(f"warm-up workers: {[(r['worker'], r['rc']) for r in res]} in {time.time() - t0:.1f}s")
    return res


# ------------------------------------------------------------------------------------------------
# --aot: compile every kernel variant for sm_90 on a machine without a GPU (registers, spills)
# ------------------------------------------------------------------------------------------------
def aot(dtypes=("bf16", "fp32")) -> int:
    from .aot_check import compile_kernel
    from optimus.kernels.embedding_bag import kernel as M

    cfg = M.get_config()
    ok = True
    for dt in dtypes:
        es = 2 if dt in ("bf16", "fp16") else 4
        align = 16 // es
        bb = {f"BB{c}": max(1, cfg["fwd_elems"][es] // (16 << c)) for c in range(M.NCLS)}
        bbw = {f"BB{c}": max(1, cfg["walk_elems"][es] // (16 << c)) for c in range(M.NCLS)}
        common = dict(w_ptr="*" + dt, idx_ptr="*i64", off_ptr="*i64", psw_ptr="*" + dt, meta_ptr="*i64",
                      tiles_ptr="*i64", B="i32", SUMD="i32", NIDX="i32")
        walk_t = dict(common, dout_ptr="*" + dt, ws_ptr="*fp32", key_ptr="*i32", bag_ptr="*i32", scale_ptr="*fp32",
                      spv_ptr="*" + dt, spr_ptr="*i64", pswg_ptr="*" + dt, SENT="i32")
        jobs = []
        for psw in (False, True):
            jobs.append((f"fwd psw={int(psw)}", M._emb_fwd_kernel, dict(common, out_ptr="*" + dt),
                         dict(HAS_OFFSETS=True, HAS_PSW=psw, ALIGN=align, CLASSES=31, **bb), cfg["fwd_warps"]))
        for atomic, extra in ((False, False), (True, False), (False, True), (True, True)):
            jobs.append((f"walk {'atomic' if atomic else 'keys'}{' +psw/sparse' if extra else ''}", M._emb_walk_kernel,
                         walk_t, dict(ATOMIC=atomic, KEYS=not atomic, HAS_OFFSETS=True, HAS_PSW=extra,
                                      NEED_PSWG=extra, HAS_SPARSE=extra, ALIGN=align, CLASSES=31, **bbw),
                         cfg["walk_warps"]))
        bd = cfg["seg_block_d"]
        jobs.append((f"seg C{max(2, cfg['seg_elems'][es] // bd)}xBD{bd}", M._emb_seg_kernel,
                     dict(skey_ptr="*i32", perm_ptr="*i64", bag_ptr="*i32", scale_ptr="*fp32", dout_ptr="*" + dt,
                          grad_ptr="*" + dt, meta_ptr="*i64", L="i32", B="i32", T="i32", SUMD="i32", SENT="i32"),
                     dict(ALIGN=align, C=max(2, cfg["seg_elems"][es] // bd), BD=bd), cfg["seg_warps"]))
        for name, fn, types, consts, warps in jobs:
            try:
                print(f"OK   {dt} {name:26s} w{warps} {compile_kernel(fn, types, consts, warps, 3)}", flush=True)
            except Exception as ex:
                ok = False
                print(f"FAIL {dt} {name:26s} {type(ex).__name__}: {str(ex)[:400]}", flush=True)
    return 0 if ok else 1


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------
def fmt(x, nd=3):
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isinf(x) or math.isnan(x):
            return str(x)
        return f"{x:.{nd}f}"
    return str(x)


def _x(a, b):
    return None if (a is None or b is None or a <= 0) else b / a


def make_table(rep) -> str:
    from optimus.core.table import format_table  # here: main() may set TRITON_INTERPRET before optimus loads

    lines = [f"grouped_embedding_bag bench {rep['date']}  {rep['gpu']}  torch {rep['torch']}  triton {rep['triton']}  "
             f"copy {fmt(rep.get('copy_GBps', 0) / 1e3, 2)} TB/s"]
    ch = rep.get("checks", [])
    if ch:
        bad = [c for c in ch if not c.get("ok")]
        lines.append(f"GPU correctness checks: {len(ch) - len(bad)} ok, {len(bad)} failed"
                     + "".join(f"\n  FAIL {c.get('check')}: {c.get('errors', c.get('error', ''))}"[:400] for c in bad))
    lines.append("ms, triton.testing.do_bench medians; x = loop / ours; det = sorted-segment backward, atomic = fp32 "
                 "atomics; graph = CUDA-graph replay (device time); GB/s from graph time (see the docstring)")
    rows: list = []
    for r in rep.get("cases", []):
        if "error" in r:
            rows.append([r.get("case", "?"), f"ERROR {r['error'][-200:]}"])
            continue
        rows.append([r["case"], r["T"], r["B"], r["L"], "|", fmt(r.get("fwd_ours")), fmt(r.get("fwd_loop")),
                     fmt(_x(r.get("fwd_ours"), r.get("fwd_loop")), 2), "|", fmt(r.get("step_ours")),
                     fmt(r.get("step_loop")), fmt(_x(r.get("step_ours"), r.get("step_loop")), 2),
                     fmt(r.get("step_atomic")), fmt(_x(r.get("step_atomic"), r.get("step_loop")), 2),
                     fmt(r.get("memset_ms")), "|", fmt(r.get("graph_ours")), fmt(r.get("graph_loop")),
                     fmt(_x(r.get("graph_ours"), r.get("graph_loop")), 2), "|", fmt(r.get("fwd_GBps"), 0),
                     fmt(r.get("fwd_pct_copy"), 0), fmt(r.get("step_GBps"), 0), fmt(r.get("step_pct_copy"), 0), "|",
                     f"{r.get('fwd_err', 0):.0e}/{r.get('grad_err', 0):.0e}"])
    lines.append(format_table(["case", "T", "B", "L", "|", "fwd", "loop", "x", "|", "step", "loop", "x", "atomic", "x",
                               "mset", "|", "graph", "loop", "x", "|", "fwdGB/s", "%cp", "stpGB/s", "%cp", "|", "err"],
                              rows, [False] + [True] * 3 + [False] + [True] * 3 + [False] + [True] * 6 + [False]
                              + [True] * 3 + [False] + [True] * 4 + [False, False]))
    ts = rep.get("tile_sweep")
    if ts:
        lines.append("forward tile sweep (bandwidth case): "
                     + "  ".join(f"E{t['fwd_elems']}/w{t['fwd_warps']} {fmt(t['ms'])}ms {fmt(t.get('pct_copy'), 0)}%"
                                 for t in ts))
    if rep.get("skipped"):
        lines.append(f"skipped (budget): {rep['skipped']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--budget-s", type=float, default=165.0)
    ap.add_argument("--workers", type=int, default=4, help="warm-up compile processes (0: none)")
    ap.add_argument("--warm-task", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--no-sweep", action="store_true", help="skip the forward tile-size sweep")
    ap.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, tiny shapes")
    ap.add_argument("--aot", action="store_true", help="only compile the kernels for sm_90 (no GPU needed)")
    args = ap.parse_args(argv)
    if args.aot:
        return aot()
    global DRY, DEV, CLOCK
    if args.dry_run:
        DRY, DEV = True, "cpu"
        os.environ["TRITON_INTERPRET"] = "1"
    if args.warm_task is not None:
        warm_task(args.warm_task, args.workers)
        return 0
    if not DRY and not torch.cuda.is_available():
        print("optimus.tools.bench.kernels.embedding_bag needs a CUDA device (or --dry-run)")
        return 2
    CLOCK = Clock(args.budget_s)
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "bench_embedding.log"), "a")

    def log(msg):
        line = f"[{CLOCK.elapsed():6.1f}s] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    def on_term(signum, frame):
        raise Budget(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    import triton

    gpu = "cpu (dry run, Triton interpreter)" if DRY else torch.cuda.get_device_name()
    rep = dict(date=datetime.date.today().isoformat(), gpu=gpu, torch=torch.__version__, triton=triton.__version__,
               budget_s=args.budget_s, cases=[], checks=[])
    path = os.path.join(args.out, "bench_embedding.json")

    def save():
        with open(path, "w") as f:
            json.dump(rep, f, indent=1, default=str)

    try:
        rep["workers"] = run_workers(args.workers, log, timeout_s=min(90.0, 0.5 * args.budget_s))
        rep["kernel_config"] = _kernels()[1].get_config()
        rep["copy_GBps"] = copy_bandwidth()
        log(f"copy bandwidth {rep['copy_GBps']:.0f} GB/s")
        rep["checks"] = checks()
        for c in rep["checks"]:
            log(f"check {'OK  ' if c.get('ok') else 'FAIL'} {c.get('check')} {c.get('dtype', '')} "
                f"worst={c.get('worst', float('nan')):.1e} {str(c.get('error', ''))[-600:]}")
        save()
        state = {"graphs": not args.no_graphs}
        for label, T, B, L, zipf in cases():
            if CLOCK.left() < 6:
                rep.setdefault("skipped", []).append(label)
                continue
            try:
                r = bench_case(label, T, B, L, zipf, rep["copy_GBps"], state)
            except Budget:
                raise
            except Exception:
                r = dict(case=label, T=T, B=B, L=L, error=traceback.format_exc()[-1500:])
            rep["cases"].append(r)
            log(f"case {label}: {({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})}")
            save()
            if not DRY:
                torch.cuda.empty_cache()
        if not args.no_sweep and CLOCK.left() > 25:
            rep["tile_sweep"] = tile_sweep(rep["copy_GBps"])
    except Budget as b:
        log(f"stopped: {b}")
    except Exception:
        rep["error"] = traceback.format_exc()[-3000:]
        log(rep["error"])
    save()
    table = make_table(rep)
    with open(os.path.join(args.out, "table_embedding.txt"), "w") as f:
        f.write(table + "\n")
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
