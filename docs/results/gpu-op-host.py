"""Where the host time of one grouped-op call goes, on the GPU's host (docs/kernels.md).

At hetero_towers' shapes (G = 24 members, M = 512 rows, fp32, the column layout) it times, per
call, each layer of one ``optimus::grouped_linear`` / ``batched_layer_norm`` forward and
backward, from the outside in:

* ``op``: the custom op as a compiled graph calls it (``torch.ops.optimus.X.default``, no grad);
* ``impl``: the implementation the op dispatches to (``linear.op.gl_forward`` ...), no dispatcher;
* ``kernel_level``: the Triton module's ``forward_packed`` / ``backward_packed`` (no checks);
* ``launch``: the launcher alone, on prebuilt tables and outputs;
* floors of the host: an empty Triton kernel launched through the JIT, one ``torch.empty`` on the
  GPU, one plain ``torch.library`` op with a Python kernel and no arguments but tensors.

Host time per call is the wall clock of N back-to-back calls (no synchronisation inside) divided
by N; ``wall`` adds the final synchronisation (the device's time when the device is the
bottleneck). With ``--profile`` it also writes cProfile's top functions of 200 ``op`` calls.
One JSON file to ``$OUT/op-host$DIAG_TAG.json``; a table last. ``OPTIMUS_KERNELS_DIRECT_LAUNCH=0``
measures the launches through the JIT (kernels/runtime/launch.py).

    python docs/results/gpu-op-host.py [--profile]
"""
from __future__ import annotations

import cProfile
import json
import os
import pstats
import sys
import time

import torch
import triton
import triton.language as tl

import optimus.kernels  # noqa: F401  (registers the optimus:: ops)
from optimus.kernels.layer_norm import op as ln_op
from optimus.kernels.linear import op as gl_op
from optimus.kernels.linear.reference import activation_code
from optimus.kernels.runtime.backend import lazy_module

_glk, _lnk = lazy_module("optimus.kernels.linear"), lazy_module("optimus.kernels.layer_norm")

N = int(os.environ.get("DIAG_CALLS", "300"))
DEV = torch.device(os.environ.get("DIAG_DEVICE", "cuda"))  # "cpu" (with TRITON_INTERPRET=1): a smoke test


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def per_call(fn, n=N):
    for _ in range(10):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    return round((t1 - t0) / n * 1e6, 1), round((t2 - t0) / n * 1e6, 1)


@triton.jit
def _empty_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = DEV
    G, M = 24, int(os.environ.get("DIAG_M", "512"))
    ks = [16 + 8 * i for i in range(G)]
    ns = [24 + 8 * ((i * 7) % G) for i in range(G)]
    ms = [M] * G
    x = torch.randn(M, sum(ks), device=dev)
    w = torch.randn(sum(k * n for k, n in zip(ks, ns)), device=dev)
    b = torch.randn(sum(ns), device=dev)
    gl = torch.ops.optimus.grouped_linear.default
    glb = torch.ops.optimus.grouped_linear_backward.default
    ln = torch.ops.optimus.batched_layer_norm.default
    lnb = torch.ops.optimus.batched_layer_norm_backward.default
    glk, lnk = _glk(), _lnk()
    y, _ = gl(x, w, b, ms, ks, ns, "relu", "columns")
    dy = torch.randn_like(y)
    lw, lb = torch.randn(sum(ns), device=dev), torch.randn(sum(ns), device=dev)
    z, stats = ln(y, lw, lb, ms, ns, 1e-5, "columns")
    sig = glk.signature(ms, ks, ns, "columns")
    tabs = sig.packed_tables(dev)
    yy = torch.empty_like(y)
    align = glk.alignment(sig, x.dtype, [x.data_ptr(), w.data_ptr(), yy.data_ptr(), b.data_ptr()])
    act = activation_code("relu")
    small = torch.zeros(1024, device=dev)

    lib = torch.library.Library("optimus_hostprobe", "DEF")
    lib.define("nop(Tensor x) -> Tensor")
    lib.impl("nop", lambda t: t.new_empty(0), "CUDA" if dev.type == "cuda" else "CPU")

    cases = {
        "gl_fwd/op": lambda: gl(x, w, b, ms, ks, ns, "relu", "columns"),
        "gl_fwd/impl": lambda: gl_op.gl_forward(x, w, b, ms, ks, ns, "relu", "columns"),
        "gl_fwd/kernel_level": lambda: glk.forward_packed(x, w, b, ms, ks, ns, act, "columns"),
        "gl_fwd/launch": lambda: glk.launch_forward(sig, tabs[0], x, w, b, yy, None, act, align),
        "gl_bwd/op": lambda: glb(dy, x, w, y, ms, ks, ns, "relu", True, True, True, True, "columns"),
        "gl_bwd/impl": lambda: gl_op.gl_backward(dy, x, w, y, ms, ks, ns, "relu", True, True, True, True, "columns"),
        "gl_bwd/kernel_level": lambda: glk.backward_packed(dy, x, w, y, ms, ks, ns, act, True, True, True, True, "columns"),
        "ln_fwd/op": lambda: ln(y, lw, lb, ms, ns, 1e-5, "columns"),
        "ln_fwd/impl": lambda: ln_op.ln_forward(y, lw, lb, ms, ns, 1e-5, "columns"),
        "ln_fwd/kernel_level": lambda: lnk.forward_packed(y, lw, lb, ms, ns, 1e-5, "columns"),
        "ln_bwd/op": lambda: lnb(dy, y, lw, stats, ms, ns, True, True, True, True, "columns"),
        "ln_bwd/kernel_level": lambda: lnk.backward_packed(dy, y, lw, stats, ms, ns, True, True, True, True, "columns"),
        "floor/triton_empty_kernel": lambda: _empty_kernel[(1,)](small, 1024, BLOCK=1024),
        "floor/torch_empty": lambda: torch.empty(4096, device=dev),
        "floor/library_op": lambda: torch.ops.optimus_hostprobe.nop.default(small),
        "floor/F.linear_small": lambda: torch.nn.functional.linear(x[:, :16], w[: 24 * 16].view(24, 16)),
    }
    rows = {}
    with torch.no_grad():
        for rnd in range(2):  # the second round is reported (the first one warms caches)
            for name, fn in cases.items():
                try:
                    rows[name] = per_call(fn)
                except Exception as e:  # keep the other rows
                    rows[name] = f"{type(e).__name__}: {e}"[:300]
    result = {"torch": torch.__version__, "triton": triton.__version__, "G": G, "M": M,
              "us_per_call": {k: {"host": v[0], "wall": v[1]} if isinstance(v, tuple) else v for k, v in rows.items()}}
    if "--profile" in sys.argv:
        prof = {}
        for name in ("gl_fwd/op", "gl_bwd/op", "ln_fwd/op"):
            pr = cProfile.Profile()
            with torch.no_grad():
                pr.enable()
                for _ in range(200):
                    cases[name]()
                pr.disable()
            sync()
            st = pstats.Stats(pr)
            top = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:25]
            prof[name] = [[f"{os.path.basename(f)}:{ln_}({fn})", cc // 200, round(tt / 200 * 1e6, 2), round(ct / 200 * 1e6, 2)]
                          for (f, ln_, fn), (cc, nc, tt, ct, _) in top]
        result["pyprof_per_call_us"] = prof
    result["direct_launch"] = os.environ.get("OPTIMUS_KERNELS_DIRECT_LAUNCH", "1")
    name = f"op-host{os.environ.get('DIAG_TAG', '')}.json"
    with open(os.path.join(os.environ.get("OUT", "."), name), "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'case':28s} {'host us':>9s} {'wall us':>9s}")
    for k, v in rows.items():
        print(f"{k:28s} {v[0]:9.1f} {v[1]:9.1f}" if isinstance(v, tuple) else f"{k:28s} {v}")


if __name__ == "__main__":
    main()
