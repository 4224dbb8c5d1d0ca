"""Host overhead and speed of the grouped ops, and the measured routing table.

    timeout -k 5 190 python -m optimus.tools.bench.kernels.overhead --out $OUT --budget-s 170   # GPU
    python -m optimus.tools.bench.kernels.overhead --host [--out DIR]          # CPU, host time only
    python -m optimus.tools.bench.kernels.overhead --host --baseline OLD_CHECKOUT   # CPU, A/B against older kernels/

GPU mode (one process, well under 3 minutes on an H200):
  * grouped_linear G = 16 small layers (mixed-small: M 512/1024, K, N 64..256, bf16): eager
    forward + backward of ours against a loop of ``F.linear``, with the device-table cache hit
    (same inputs every step) and missed (3 input sets rotated);
  * uniform shapes (every member (M, K, N) equal, bf16 and fp32) and uniform-(K, N) shapes with
    ragged M: every route of ``grouped_linear`` forced in turn ("triton", "bmm", "grouped_mm"),
    against ``torch.bmm`` on inputs that are already stacked (the bmm floor), eager and under
    CUDA graphs;
  * batched_layer_norm G = 16 against a loop of ``F.layer_norm``.
  Steps are timed with CUDA events around every step (max(host issue time, device time), the
  steady-state eager step) and as CUDA-graph replays (device time).  From the route timings it
  writes ``OUT/routes.json``: per (dtype, uniformity, size class, G class) the fastest route of
  the eager step.  Copy that file to ``kernels/linear/routes.json`` to make ``grouped_linear`` use
  it (``kernels/linear/vendor.py``); without the file every call takes the Triton kernels.
  Also writes ``OUT/bench_grouped.json`` (everything) and prints a short table last.

Host mode (``--host``, no GPU): CPU tensors through the eager path with every kernel launch
replaced by a no-op (``TRITON_INTERPRET=1`` routes CPU tensors there), so what is timed is the
Python and dispatcher work of a call only: thread CPU time, minimum over repeats of the mean
per call (on a shared machine that is the figure other processes inflate least).  Also counts
Python-level function calls per call (cProfile), which does not depend on load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import sys
import time
import traceback

HOST = "--host" in sys.argv
DRY = "--dry-run" in sys.argv  # the GPU mode end to end on CPU (interpreter, tiny shapes, one call per timing)
if HOST or DRY:
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: CPU tensors take the eager path

import torch
import torch.nn.functional as F


import optimus.kernels as K  # noqa: E402  (after TRITON_INTERPRET is set)
from optimus.kernels.linear import vendor as routing_mod  # noqa: E402
from optimus.kernels.linear.eager import set_gl_route  # noqa: E402
from optimus.kernels.runtime import tables as _dt  # noqa: E402
from optimus.core.table import format_table  # noqa: E402


def _launch_modules(pkg):
    """The grouped-linear and layer-norm Triton modules of a kernels package: this layout's, or
    those of an older checkout's flat ``kernels/`` (``eager._glk()``, ``eager._lnk()``)."""
    import importlib

    try:
        return (importlib.import_module(pkg.__name__ + ".linear.kernel"),
                importlib.import_module(pkg.__name__ + ".layer_norm.kernel"))
    except ImportError:
        flat = importlib.import_module(pkg.__name__ + ".eager")
        return flat._glk(), flat._lnk()


def _engine_backward():
    """The autograd engine call of ``torch.autograd.grad`` without its per-output Python checks
    (a training step pays those once, for the loss); both sides of a comparison use it."""
    try:
        from torch.autograd.graph import _engine_run_backward

        def eb(outs, grads, inputs):
            return _engine_run_backward(tuple(outs), tuple(grads), False, False, tuple(inputs), True, False)

        x = torch.ones(2, requires_grad=True)
        eb([x * 2], [torch.ones(2)], [x])
        return eb
    except Exception:  # pragma: no cover - other torch versions
        return lambda outs, grads, inputs: torch.autograd.grad(outs, inputs, grads)


EB = _engine_backward()


def gl_dims(kind: str, G: int, seed: int = 0, scale: int = 1):
    rng = random.Random(seed * 1000 + G)
    if kind == "mixed-small":
        d = [(rng.choice([512, 1024]), rng.choice([64, 128, 256]), rng.choice([64, 128, 256])) for _ in range(G)]
    elif kind == "uniform-small":
        d = [(1024, 128, 128)] * G
    elif kind == "uniform-large":
        d = [(4096, 512, 512)] * G
    elif kind == "ragged-m":  # equal (K, N), M differs: grouped_mm applies, bmm does not
        d = [(rng.choice([256, 512, 1024]), 256, 256) for _ in range(G)]
    else:
        raise ValueError(kind)
    return [(max(1, m // scale), max(1, k // scale), max(1, n // scale)) for m, k, n in d]


def make_sets(dims, dtype, dev, n_sets, seed=0):
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    ws = [(torch.randn(n, k, dtype=dtype, device=dev, generator=g) / math.sqrt(k)).requires_grad_() for m, k, n in dims]
    bs = [torch.randn(n, dtype=dtype, device=dev, generator=g).requires_grad_() for m, k, n in dims]
    sets = []
    for _ in range(n_sets):
        xs = [torch.randn(m, k, dtype=dtype, device=dev, generator=g).requires_grad_() for m, k, n in dims]
        gys = [torch.randn(m, n, dtype=dtype, device=dev, generator=g) for m, k, n in dims]
        sets.append((xs, gys))
    return ws, bs, sets


def loop_linear(xs, ws, bs):
    return [F.linear(x, w, b) for x, w, b in zip(xs, ws, bs)]


# ------------------------------------------------------------------------------------------------
# host mode
# ------------------------------------------------------------------------------------------------
def _stub_launches():
    glk, lnk = _launch_modules(K)
    for n in ("launch_forward", "launch_dx", "launch_dw"):
        setattr(glk, n, lambda *a, **k: None)
    for n in ("launch_forward", "launch_backward"):
        setattr(lnk, n, lambda *a, **k: None)


def _host_time(fn, calls=100, repeats=5):
    """Minimum over repeats of the mean thread CPU time per call (us): time spent descheduled on a
    shared machine does not count, so this is the host work a call costs."""
    for i in range(20):
        fn(i)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        for i in range(calls):
            fn(i)
        best = min(best, (time.thread_time() - t0) / calls)
    return best * 1e6


def _count_calls(fn, calls=20):
    import cProfile
    import pstats

    for i in range(5):
        fn(i)
    pr = cProfile.Profile()
    pr.enable()
    for i in range(calls):
        fn(i)
    pr.disable()
    return pstats.Stats(pr).total_calls / calls


def host_mode(out_dir, groups=(4, 16)):
    _stub_launches()
    dt = torch.float32  # ours is dtype-blind with launches stubbed; fp32 keeps the CPU loop's compute negligible
    rows = []
    for G in groups:
        rng = random.Random(G)
        dims = [(rng.choice([2, 4]), rng.choice([4, 8]), rng.choice([4, 8])) for _ in range(G)]
        ws, bs, sets = make_sets(dims, dt, "cpu", 3)
        same = [sets[0]] * 3  # one input set: the pointers repeat (device-table cache can hit)

        def gl_fwd(i, s=sets):
            with torch.no_grad():
                K.grouped_linear(s[i % 3][0], ws, bs)

        def gl_step(i, s=sets):
            xs, gys = s[i % 3]
            EB(K.grouped_linear(xs, ws, bs), gys, [*xs, *ws, *bs])

        def loop_step(i, s=sets):
            xs, gys = s[i % 3]
            EB(loop_linear(xs, ws, bs), gys, [*xs, *ws, *bs])

        lx = [[torch.randn(r, d, dtype=dt).requires_grad_() for r, d, _ in dims] for _ in range(3)]
        lw = [torch.randn(d, dtype=dt).requires_grad_() for _, d, _ in dims]
        lb = [torch.randn(d, dtype=dt).requires_grad_() for _, d, _ in dims]
        lg = [[torch.randn(r, d, dtype=dt) for r, d, _ in dims] for _ in range(3)]

        def ln_fwd(i):
            with torch.no_grad():
                K.batched_layer_norm(lx[i % 3], lw, lb)

        def ln_step(i):
            EB(K.batched_layer_norm(lx[i % 3], lw, lb), lg[i % 3], [*lx[i % 3], *lw, *lb])

        r = dict(G=G)
        _dt.reset_stats()
        r["gl_fwd_us"] = _host_time(gl_fwd)
        r["gl_step_us"] = _host_time(gl_step)
        r["gl_step_same_inputs_us"] = _host_time(lambda i: gl_step(i, same))
        r["loop_linear_step_cpu_us"] = _host_time(loop_step)
        r["ln_fwd_us"] = _host_time(ln_fwd)
        r["ln_step_us"] = _host_time(ln_step)
        r["gl_step_pycalls"] = _count_calls(gl_step)
        r["ln_step_pycalls"] = _count_calls(ln_step)
        r["table_stats"] = _dt.stats()
        rows.append(r)
        print(json.dumps(r), flush=True)
    cells = [[r["G"], f"{r['gl_fwd_us']:.1f}", f"{r['gl_step_us']:.1f}", f"{r['gl_step_same_inputs_us']:.1f}",
              f"{r['ln_fwd_us']:.1f}", f"{r['ln_step_us']:.1f}", f"{r['gl_step_pycalls']:.0f}",
              f"{r['ln_step_pycalls']:.0f}", f"{r['loop_linear_step_cpu_us']:.1f}"] for r in rows]
    lines = ["host time per call (us, CPU, launches stubbed; min over repeats of the mean)",
             format_table(["G", "gl fwd", "gl step", "step same-x", "ln fwd", "ln step", "gl calls", "ln calls",
                           "loop step (CPU F.linear)"], cells, [True] * 9)]
    table = "\n".join(lines)
    print(table)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "host_overhead.json"), "w") as f:
            json.dump(dict(date=datetime.date.today().isoformat(), torch=torch.__version__, rows=rows), f, indent=1)
    return rows

# ------------------------------------------------------------------------------------------------
# GPU mode
# ------------------------------------------------------------------------------------------------
def _rel(a, r):
    a, r = torch.cat([t.reshape(-1) for t in a]).double(), torch.cat([t.reshape(-1) for t in r]).double()
    d = r.norm().item()
    return float("inf") if not torch.isfinite(a).all() else (a - r).norm().item() / (d if d > 0 else 1.0)


class _Case:
    """One case: timings (ms) and errors per implementation, correctness against the loop."""

    def __init__(self, name, kind, G, dtype, dims):
        self.r = dict(case=name, kind=kind, G=G, dtype=str(dtype).split(".")[-1], dims=dims, ms={}, graph_ms={},
                      rel_err={}, errors={}, tables={})

    def eager(self, B, impl, step):
        try:
            self.r["ms"][impl] = B.time_steps(step)["ms"]
        except B.Budget:
            raise
        except Exception as ex:
            self.r["errors"][impl] = repr(ex)[:300]

    def graph(self, B, impl, build):
        try:
            self.r["graph_ms"][impl] = B.time_graph(build)["ms"]
        except B.Budget:
            raise
        except Exception as ex:
            self.r["errors"][impl + "_graph"] = repr(ex)[:300]
            try:
                torch.cuda.synchronize()
            except Exception:
                pass


def _gl_case(B, name, kind, G, dtype, impls, graphs=True):
    """impls: "loop", "bmm_floor" (pre-stacked inputs), and routes of grouped_linear ("triton", ...)."""
    dev = torch.device("cpu" if DRY else "cuda")
    dims = gl_dims(kind, G, scale=32 if DRY else 1)
    c = _Case(name, kind, G, dtype, dims)
    ws, bs, sets = make_sets(dims, dtype, dev, 3, seed=G)
    ps = lambda st: [*st[0], *ws, *bs]
    xs0, gys0 = sets[0]
    ref_y = loop_linear(xs0, ws, bs)
    ref_g = EB(ref_y, gys0, ps(sets[0]))
    for impl in impls:
        B.CLOCK.check(3.0)
        if impl == "loop":
            fn = loop_linear
        elif impl == "bmm_floor":
            m, k, n = dims[0]
            W = torch.stack([w.detach() for w in ws]).requires_grad_()
            Bs = torch.stack([b.detach() for b in bs]).unsqueeze(1).requires_grad_()
            st = [(torch.stack([x.detach() for x in xs]).requires_grad_(), torch.stack(g)) for xs, g in sets]
            c.eager(B, impl, lambda i: EB([torch.baddbmm(Bs, st[i % 3][0], W.transpose(1, 2))], [st[i % 3][1]],
                                         [st[i % 3][0], W, Bs]))
            if graphs:
                def bb():
                    X, Wc, Bc = (t.detach().clone().requires_grad_() for t in (st[0][0], W, Bs))
                    gy = st[0][1].clone()
                    return lambda: EB([torch.baddbmm(Bc, X, Wc.transpose(1, 2))], [gy], [X, Wc, Bc])
                c.graph(B, impl, bb)
            continue
        else:
            route = impl
            if not routing_mod.applies(route, dtype, [m for m, _, _ in dims], [k for _, k, _ in dims],
                                       [n for _, _, n in dims]):
                c.r["errors"][impl] = "route does not apply"
                continue

            def fn(xs, ws_, bs_, _r=route):
                return K.grouped_linear(xs, ws_, bs_)
        try:
            set_gl_route(None if impl == "loop" else impl)
            if impl != "loop":
                y = fn(xs0, ws, bs)
                g = EB(y, gys0, ps(sets[0]))
                c.r["rel_err"][impl] = dict(y=_rel(y, ref_y), grads=_rel(g, ref_g))
                del y, g
            with torch.no_grad():
                c.eager(B, impl + "_fwd", lambda i: fn(sets[i % 3][0], ws, bs))
            _dt.reset_stats()
            c.eager(B, impl, lambda i: EB(fn(sets[i % 3][0], ws, bs), sets[i % 3][1], ps(sets[i % 3])))
            st0 = _dt.stats()
            c.eager(B, impl + "_same_inputs", lambda i: EB(fn(xs0, ws, bs), gys0, ps(sets[0])))
            st1 = _dt.stats()
            c.r["tables"][impl] = dict(rotated=st0, same_inputs={k: st1[k] - st0[k] for k in st1})
            if graphs:
                def build(_fn=fn):
                    xs = [x.detach().clone().requires_grad_() for x in xs0]
                    wl = [w.detach().clone().requires_grad_() for w in ws]
                    bl = [b.detach().clone().requires_grad_() for b in bs]
                    gy = [g.clone() for g in gys0]
                    return lambda: EB(_fn(xs, wl, bl), gy, [*xs, *wl, *bl])
                c.graph(B, impl, build)
        except B.Budget:
            raise
        except Exception as ex:
            c.r["errors"][impl] = repr(ex)[:300]
        finally:
            set_gl_route(None)
    return c.r


def _ln_case(B, name, dims, dtype, graphs=True):
    dev = torch.device("cpu" if DRY else "cuda")
    if DRY:
        dims = [(max(1, r // 256), max(1, d // 16)) for r, d in dims]
    c = _Case(name, "layer_norm", len(dims), dtype, dims)
    g = torch.Generator(device=dev)
    g.manual_seed(5)
    lw = [(torch.randn(d, device=dev, dtype=dtype, generator=g) * 0.1 + 1).requires_grad_() for _, d in dims]
    lb = [torch.randn(d, device=dev, dtype=dtype, generator=g).requires_grad_() for _, d in dims]
    sets = [([torch.randn(r, d, device=dev, dtype=dtype, generator=g).requires_grad_() for r, d in dims],
             [torch.randn(r, d, device=dev, dtype=dtype, generator=g) for r, d in dims]) for _ in range(3)]
    loop = lambda xs: [F.layer_norm(x, (x.shape[-1],), w, b) for x, w, b in zip(xs, lw, lb)]
    ours = lambda xs: K.batched_layer_norm(xs, lw, lb)
    y, r = ours(sets[0][0]), loop(sets[0][0])
    c.r["rel_err"]["ours"] = dict(y=_rel(y, r), grads=float("nan"))
    for impl, fn in (("ours", ours), ("loop", loop)):
        with torch.no_grad():
            c.eager(B, impl + "_fwd", lambda i: fn(sets[i % 3][0]))
        c.eager(B, impl, lambda i: EB(fn(sets[i % 3][0]), sets[i % 3][1], [*sets[i % 3][0], *lw, *lb]))
        if graphs:
            def build(_fn=fn):
                xs = [x.detach().clone().requires_grad_() for x in sets[0][0]]
                gy = [v.clone() for v in sets[0][1]]
                return lambda: EB(_fn(xs), gy, [*xs, *lw, *lb])
            c.graph(B, impl, build)
    return c.r


def _routes_from(cases, device_name):
    """Per measured uniform case: the route with the smallest eager step among those that ran and
    matched the loop (relative error of outputs and grads below the dtype's tolerance)."""
    tol = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 5e-3}
    out = []
    for c in cases:
        if c.get("kind") not in ("uniform-small", "uniform-large", "ragged-m"):
            continue
        dims = c["dims"]
        ms, ks, ns = [d[0] for d in dims], [d[1] for d in dims], [d[2] for d in dims]
        cand = {}
        for r in routing_mod.ROUTES:
            e = c["rel_err"].get(r)
            if r in c["ms"] and e and max(e["y"], e["grads"]) < tol[c["dtype"]]:
                cand[r] = c["ms"][r]
        if "triton" not in cand or len(cand) < 2:
            continue
        gcand = {r: c["graph_ms"][r] for r in cand if r in c["graph_ms"]}
        # a vendor route is chosen only where it beats the Triton kernels both eagerly and (when
        # measured) under CUDA graphs; among those, the fastest eager step
        wins = [r for r in cand if r != "triton" and cand[r] < cand["triton"]
                and (not gcand or (r in gcand and "triton" in gcand and gcand[r] < gcand["triton"]))]
        best = min(wins, key=cand.get) if wins else "triton"
        out.append(dict(device=device_name, dtype=c["dtype"], uniformity=routing_mod.uniformity(ms, ks, ns),
                        size=routing_mod.size_class(ms, ks, ns), G=routing_mod.g_class(len(dims)), best=best,
                        eager_step_ms=cand, graph_step_ms=gcand,
                        graph_best=min(gcand, key=gcand.get) if gcand else None, case=c["case"]))
    return out


def _x(a, b):
    return f"{a / b:.2f}" if a and b else "-"


def _fmt(v):
    return f"{v:.3f}" if isinstance(v, (int, float)) else "-"


def gpu_table(report):
    L = [f"optimus.kernels bench_grouped  {report['date']}  {report['gpu']}  torch {report['torch']}  "
         f"triton {report['triton']}  autotune={report['autotune']}",
         "eager fwd+bwd step ms (CUDA events, 3 input sets rotated; 'same' = one input set), graph = CUDA-graph replay ms;"
         " x = loop (or bmm floor) / impl"]
    rows = []
    for c in report["cases"]:
        ms, gm = c["ms"], c["graph_ms"]
        impls = [k for k in ms if not k.endswith(("_fwd", "_same_inputs"))] + \
            [k for k in c["errors"] if not k.endswith("_graph") and k not in ms]
        for impl in dict.fromkeys(impls):
            err = c["rel_err"].get(impl)
            note = c["errors"].get(impl) or c["errors"].get(impl + "_graph") or \
                (f"{err.get('y', 0):.4f}/{err.get('grads', 0):.4f}" if err else "")
            rows.append([c["case"], impl, _fmt(ms.get(impl + "_fwd")), _fmt(ms.get(impl)),
                         _fmt(ms.get(impl + "_same_inputs")), _fmt(gm.get(impl)),
                         _x(ms.get("loop"), ms.get(impl)), _x(gm.get("loop"), gm.get(impl)),
                         _x(ms.get("bmm_floor"), ms.get(impl)), _x(gm.get("bmm_floor"), gm.get(impl)), note[:70]])
    L.append(format_table(["case", "impl", "fwd", "step", "same", "graph", "x loop", "x loopG", "x bmmF", "x bmmFG",
                           "err / note"], rows, [False, False] + [True] * 8 + [False]))
    L.append("routes (fastest eager step per measured signature class): " +
             ", ".join(f"{r['case']}->{r['best']} (graph: {r['graph_best']})" for r in report["routes"]))
    if report.get("stopped"):
        L.append(f"stopped early: {report['stopped']}")
    return "\n".join(L)


def gpu_mode(out_dir, budget_s, autotune=False):
    from . import grouped as B

    if not torch.cuda.is_available() and not DRY:
        print("no CUDA device: use --host for the CPU host-overhead mode (or --dry-run)")
        return 2
    if DRY:
        B.DRY, B.DEV = True, "cpu"
    B.CLOCK = B._Clock(budget_s)
    B.MEASURE_S = 0.1
    glk = _launch_modules(K)[0]
    glk.set_autotune(autotune)
    import triton

    gpu = "cpu (dry run)" if DRY else torch.cuda.get_device_name()
    report = dict(date=datetime.date.today().isoformat(), gpu=gpu, torch=torch.__version__,
                  triton=triton.__version__, autotune=autotune, cases=[], routes=[])
    bf16, f32 = torch.bfloat16, torch.float32
    plan = [
        ("gl", "mixed-small G16", "mixed-small", 16, bf16, ["triton", "loop"]),
        ("gl", "uniform-small G16", "uniform-small", 16, bf16, ["triton", "bmm", "grouped_mm", "bmm_floor", "loop"]),
        ("gl", "uniform-large G16", "uniform-large", 16, bf16, ["triton", "bmm", "grouped_mm", "bmm_floor", "loop"]),
        ("gl", "ragged-m G16", "ragged-m", 16, bf16, ["triton", "grouped_mm", "loop"]),
        ("ln", "ln uniform G16", [(4096, 512)] * 16, bf16),
        ("gl", "uniform-small G16 fp32", "uniform-small", 16, f32, ["triton", "bmm", "bmm_floor", "loop"]),
        ("gl", "mixed-small G64", "mixed-small", 64, bf16, ["triton", "loop"]),
        ("gl", "uniform-small G4", "uniform-small", 4, bf16, ["triton", "bmm", "grouped_mm", "bmm_floor", "loop"]),
        ("ln", "ln mixed G16", [(random.Random(i).choice([1024, 4096]), random.Random(i + 99).choice([64, 256, 1024]))
                                for i in range(16)], bf16),
    ]
    out_dir = out_dir or "."
    os.makedirs(out_dir, exist_ok=True)

    def save():
        report["routes"] = _routes_from(report["cases"], report["gpu"])
        with open(os.path.join(out_dir, "bench_grouped.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
        with open(os.path.join(out_dir, "routes.json"), "w") as f:
            json.dump(dict(date=report["date"], gpu=report["gpu"], torch=report["torch"], triton=report["triton"],
                           measured_by="python -m optimus.tools.bench.kernels.overhead", routes=report["routes"]), f, indent=1)

    try:
        for item in plan:
            B.CLOCK.check(8.0)
            t0 = time.time()
            try:
                if item[0] == "gl":
                    r = _gl_case(B, *item[1:], graphs=not DRY)
                else:
                    r = _ln_case(B, item[1], item[2], item[3], graphs=not DRY)
            except B.Budget:
                raise
            except Exception as ex:
                r = dict(case=item[1], ms={}, graph_ms={}, rel_err={}, errors={"case": repr(ex)[:300]},
                         trace=traceback.format_exc()[-1500:])
            r["wall_s"] = time.time() - t0
            report["cases"].append(r)
            save()
            print(f"[{B.CLOCK.elapsed():6.1f}s] {item[1]} done", flush=True)
    except B.Budget as ex:
        report["stopped"] = str(ex)
    save()
    table = gpu_table(report)
    with open(os.path.join(out_dir, "table.txt"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 0



def host_compare(baseline_root: str, out_dir: str, groups=(4, 16), rounds: int = 8):
    """In-process A/B of the host time per call: this checkout's kernels against the ``kernels/``
    folder of another checkout (``baseline_root``, imported as the top-level package ``kernels``),
    alternating rounds so that machine load hits both sides alike; launches stubbed on both."""
    import importlib

    sys.modules.pop("kernels", None)
    sys.path.insert(0, os.path.abspath(baseline_root))
    try:
        base = importlib.import_module("kernels")
    finally:
        sys.path.pop(0)
    if os.path.realpath(base.__file__) == os.path.realpath(K.__file__):
        raise SystemExit(f"--baseline {baseline_root} resolves to this checkout's kernels ({base.__file__})")
    _stub_launches()
    base_glk, base_lnk = _launch_modules(base)
    for mod, names in ((base_glk, ("launch_forward", "launch_dx", "launch_dw")),
                       (base_lnk, ("launch_forward", "launch_backward"))):
        for n in names:
            setattr(mod, n, lambda *a, **k: None)
    rows = []
    for G in groups:
        rng = random.Random(G)
        dims = [(rng.choice([2, 4]), rng.choice([4, 8]), rng.choice([4, 8])) for _ in range(G)]
        ws, bs, sets = make_sets(dims, torch.float32, "cpu", 3)
        lx = [[torch.randn(r, d).requires_grad_() for r, d, _ in dims] for _ in range(3)]
        lw = [torch.randn(d).requires_grad_() for _, d, _ in dims]
        lb = [torch.randn(d).requires_grad_() for _, d, _ in dims]
        lg = [[torch.randn(r, d) for r, d, _ in dims] for _ in range(3)]

        def fns(M):
            def gl_fwd(i):
                with torch.no_grad():
                    M.grouped_linear(sets[i % 3][0], ws, bs)

            def gl_step(i):
                xs, gys = sets[i % 3]
                EB(M.grouped_linear(xs, ws, bs), gys, [*xs, *ws, *bs])

            def ln_fwd(i):
                with torch.no_grad():
                    M.batched_layer_norm(lx[i % 3], lw, lb)

            def ln_step(i):
                EB(M.batched_layer_norm(lx[i % 3], lw, lb), lg[i % 3], [*lx[i % 3], *lw, *lb])
            return dict(gl_fwd=gl_fwd, gl_step=gl_step, ln_fwd=ln_fwd, ln_step=ln_step)

        fa, fb = fns(K), fns(base)
        for name in fa:
            ta, tb = [], []
            for _ in range(rounds):
                tb.append(_host_time(fb[name], calls=60, repeats=1))
                ta.append(_host_time(fa[name], calls=60, repeats=1))
            r = dict(G=G, what=name, baseline_us=min(tb), this_us=min(ta),
                     baseline_median_us=sorted(tb)[rounds // 2], this_median_us=sorted(ta)[rounds // 2])
            rows.append(r)
            print(json.dumps(r), flush=True)
    cells = [[r["G"], r["what"], f"{r['baseline_us']:.1f}", f"{r['this_us']:.1f}", f"{r['baseline_us'] / r['this_us']:.2f}",
              f"{r['baseline_median_us']:.1f}", f"{r['this_median_us']:.1f}"] for r in rows]
    lines = ["host time per call, in-process A/B (us, thread CPU time, launches stubbed, min / median of "
             f"{rounds} alternating rounds)",
             format_table(["G", "call", "baseline", "this", "ratio", "base med", "this med"], cells,
                          [True, False] + [True] * 5)]
    print("\n".join(lines))
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "host_compare.json"), "w") as f:
            json.dump(dict(baseline=os.path.abspath(baseline_root), rows=rows), f, indent=1)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", action="store_true", help="CPU host-overhead mode (launches stubbed)")
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--dry-run", action="store_true", help="the GPU mode on CPU (interpreter, tiny shapes)")
    ap.add_argument("--groups", default="4,16", help="host mode: group sizes G (comma-separated)")
    ap.add_argument("--baseline", default="", help="host mode: A/B against the kernels/ of this other checkout")
    ap.add_argument("--budget-s", type=float, default=170.0)
    ap.add_argument("--autotune", action="store_true",
                    help="autotune the Triton kernels (compiles many candidates: needs a warm Triton cache to fit 3 min)")
    a = ap.parse_args(argv)
    if a.host:
        groups = tuple(int(g) for g in a.groups.split(","))
        if a.baseline:
            host_compare(a.baseline, a.out, groups)
        else:
            host_mode(a.out, groups)
        return 0
    return gpu_mode(a.out, a.budget_s, a.autotune)


if __name__ == "__main__":
    sys.exit(main())
