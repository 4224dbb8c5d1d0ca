"""Host overhead and speed of the grouped ops, and the measured routing table (issue 15, item 5).

    PYTHONPATH=. timeout -k 5 190 python -m kernels.bench_grouped --out $OUT --budget-s 170   # H200
    PYTHONPATH=. python -m kernels.bench_grouped --host [--out DIR]          # CPU, host time only

GPU mode (one process, well under 3 minutes on the H200):
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
  the eager step.  Copy that file to ``kernels/routes.json`` to make ``grouped_linear`` use it
  (``kernels/_routing.py``); without the file every call takes the Triton kernels.
  Also writes ``OUT/bench_grouped.json`` (everything) and prints a short table last.

Host mode (``--host``, no GPU): CPU tensors through the eager path with every kernel launch
replaced by a no-op (``TRITON_INTERPRET=1`` routes CPU tensors there), so what is timed is the
Python and dispatcher work of a call only.  Minimum over repeats of the mean per call; the
machine is shared, so the minimum is the figure that noise inflates least.  Also counts
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
if HOST:
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: CPU tensors take the eager path

import torch
import torch.nn.functional as F


def _kernels():
    try:
        import optimus.kernels as K

        return K
    except Exception:  # pragma: no cover - run as a bare folder
        import kernels as K

        return K


K = _kernels()
eager = __import__(K.__name__ + ".eager", fromlist=["eager"])
routing = __import__(K.__name__ + "._routing", fromlist=["_routing"])


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
    glk, lnk = eager._glk(), eager._lnk()
    for n in ("launch_forward", "launch_dx", "launch_dw"):
        setattr(glk, n, lambda *a, **k: None)
    for n in ("launch_forward", "launch_backward"):
        setattr(lnk, n, lambda *a, **k: None)


def _host_time(fn, calls=100, repeats=5):
    for i in range(20):
        fn(i)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(calls):
            fn(i)
        best = min(best, (time.perf_counter() - t0) / calls)
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


def host_mode(out_dir):
    _stub_launches()
    dt = torch.float32  # ours is dtype-blind with launches stubbed; fp32 keeps the CPU loop's compute negligible
    rows = []
    for G in (4, 16):
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
        eager._dt.reset_stats()
        r["gl_fwd_us"] = _host_time(gl_fwd)
        r["gl_step_us"] = _host_time(gl_step)
        r["gl_step_same_inputs_us"] = _host_time(lambda i: gl_step(i, same))
        r["loop_linear_step_cpu_us"] = _host_time(loop_step)
        r["ln_fwd_us"] = _host_time(ln_fwd)
        r["ln_step_us"] = _host_time(ln_step)
        r["gl_step_pycalls"] = _count_calls(gl_step)
        r["ln_step_pycalls"] = _count_calls(ln_step)
        r["table_stats"] = eager._dt.stats()
        rows.append(r)
        print(json.dumps(r), flush=True)
    head = ("host time per call (us, CPU, launches stubbed; min over repeats of the mean)\n"
            f"{'G':>4} {'gl fwd':>8} {'gl step':>8} {'step same-x':>11} {'ln fwd':>8} {'ln step':>8} "
            f"{'gl calls':>8} {'ln calls':>8} {'loop step (CPU F.linear)':>24}")
    lines = [head] + [f"{r['G']:>4} {r['gl_fwd_us']:8.1f} {r['gl_step_us']:8.1f} {r['gl_step_same_inputs_us']:11.1f} "
                      f"{r['ln_fwd_us']:8.1f} {r['ln_step_us']:8.1f} {r['gl_step_pycalls']:8.0f} "
                      f"{r['ln_step_pycalls']:8.0f} {r['loop_linear_step_cpu_us']:24.1f}" for r in rows]
    table = "\n".join(lines)
    print(table)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "host_overhead.json"), "w") as f:
            json.dump(dict(date=datetime.date.today().isoformat(), torch=torch.__version__, rows=rows), f, indent=1)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", action="store_true", help="CPU host-overhead mode (launches stubbed)")
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--budget-s", type=float, default=170.0)
    a = ap.parse_args(argv)
    if a.host:
        host_mode(a.out)
        return 0
    return gpu_mode(a.out, a.budget_s)


if __name__ == "__main__":
    sys.exit(main())
