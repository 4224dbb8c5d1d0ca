"""Compile the grouped-linear and layer-norm Triton kernels for an H100/H200 (sm_90) without a GPU.

    python -m optimus.tools.bench.kernels.aot_check            # bf16, the main configurations
    PYTHONPATH=/path/to/other/triton python -m optimus.tools.bench.kernels.aot_check --dtype fp32

For every kernel and a representative set of constexprs it runs Triton's compiler for target
``cuda:90`` and then ptxas (shipped inside the triton wheel) and prints: whether the dots became
``wgmma``, shared memory, registers, and spills.  It catches compile errors, shared-memory
overflows and register spills before any device time is spent, and lets one check a change against
another Triton version (install it with ``pip install --target DIR triton==X`` and put DIR first on
PYTHONPATH).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile


def _ptxas_info(ptx: str) -> str:
    import triton

    base = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    m = re.search(r"\.version (\d+)\.", ptx)
    exe = base + "-blackwell" if (m and int(m.group(1)) >= 9 and os.path.exists(base + "-blackwell")) else base
    arch = re.search(r"\.target (\S+)", ptx).group(1)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        r = subprocess.run([exe, "-v", f"--gpu-name={arch}", f.name, "-o", os.devnull], capture_output=True,
                           text=True)
    finally:
        os.unlink(f.name)
    out = r.stdout + r.stderr
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores", out)
    if regs is None:
        return "ptxas: " + out.strip().splitlines()[-1] if out.strip() else "ptxas: no report"
    return f"regs={regs.group(1)} spill_stores={spill.group(1) if spill else '?'}B"


def compile_kernel(jit_fn, types, consts, num_warps, num_stages):
    """Compile ``jit_fn`` for sm_90; ``types`` maps every non-constexpr argument to a Triton type
    string ("*bf16", "i32", "fp32", ...); pointers are assumed 16-byte aligned."""
    import triton
    from triton.backends.compiler import GPUTarget

    sig, attrs = {}, {}
    for i, name in enumerate(jit_fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        else:
            sig[name] = types[name]
            if types[name].startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = triton.compiler.ASTSource(jit_fn, sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, num_stages=num_stages))
    ptx = k.asm["ptx"]
    mma = "wgmma" if "wgmma" in ptx else ("mma" if "mma.sync" in ptx else "-")
    return f"{mma:5s} smem={k.metadata.shared:6d} {_ptxas_info(ptx)}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    args = ap.parse_args(argv)
    import triton

    from optimus.kernels.layer_norm import kernel as LN
    from optimus.kernels.linear import kernel as GL

    dt = args.dtype
    bk = 32 if dt == "fp32" else 64
    align = 4 if dt == "fp32" else 8
    print(f"triton {triton.__version__}, target sm_90, dtype {dt}")
    ok = True
    meta_i = dict(G="i32", KEY_M="i32", KEY_N="i32", KEY_K="i32", tab_ptr="*i64")
    jobs = []
    for act in (0, 2):
        for bm, bn, w, s in ((128, 128, 8, 3), (64, 64, 4, 4), (128, 256, 8, 3)):
            blk = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PROGS_PER_SM=2)
            jobs.append((f"gl fwd act{act} {bm}x{bn}x{bk} w{w}", GL._gl_fwd_kernel,
                         dict(x_ptr="*" + dt, w_ptr="*" + dt, b_ptr="*" + dt, y_ptr="*" + dt, z_ptr="*" + dt, **meta_i),
                         dict(HAS_BIAS=True, ACT=act, STORE_Z=act == 2, ALIGN=align, DOT_F32=False, **blk), w, s))
            jobs.append((f"gl dx  act{act} {bm}x{bn}x{bk} w{w}", GL._gl_dx_kernel,
                         dict(dy_ptr="*" + dt, aux_ptr="*" + dt, w_ptr="*" + dt, dx_ptr="*" + dt, **meta_i),
                         dict(ACT=act, ALIGN=align, DOT_F32=False, **blk), w, s))
            if bn <= 128:
                jobs.append((f"gl dw  act{act} {bm}x{bn}x{bk} w{w}", GL._gl_dw_kernel,
                             dict(dy_ptr="*" + dt, aux_ptr="*" + dt, x_ptr="*" + dt, ws_ptr="*fp32", **meta_i),
                             dict(HAS_BIAS=True, ACT=act, ALIGN=align, DOT_F32=False, SPLIT=1024, **blk), w, s))
    for mc, w in ((4, 4), (4, 8), (6, 8), (9, 16)):
        c = dict(HAS_W=True, HAS_B=True, ALIGN=align, MIN_D=64, TILE=4096, MAX_CLS=mc)
        jobs.append((f"ln fwd maxcls{mc} w{w}", LN._ln_fwd_kernel,
                     dict(x_ptr="*" + dt, y_ptr="*" + dt, w_ptr="*" + dt, b_ptr="*" + dt, stats_ptr="*fp32",
                          gtab_ptr="*i64", ctab_ptr="*i32", eps="fp32", TOT_ROWS="i32"), c, w, 1))
        jobs.append((f"ln bwd maxcls{mc} w{w}", LN._ln_bwd_kernel,
                     dict(x_ptr="*" + dt, dy_ptr="*" + dt, dx_ptr="*" + dt, w_ptr="*" + dt, stats_ptr="*fp32",
                          part_ptr="*fp32", gtab_ptr="*i64", ctab_ptr="*i32", TOT_ROWS="i32", TOT_PART="i32"),
                     dict(c, NEED_DX=True), w, 1))
    jobs.append(("ln reduce", LN._ln_reduce_kernel,
                 dict(part_ptr="*fp32", dw_ptr="*" + dt, db_ptr="*" + dt, gtab_ptr="*i64", TOT_PART="i32"),
                 dict(HAS_W=True, HAS_B=True, BLOCK_J=32, BLOCK_C=128), 4, 1))
    for name, fn, types, consts, w, s in jobs:
        try:
            print(f"OK   {name:32s} {compile_kernel(fn, types, consts, w, s)}", flush=True)
        except Exception as ex:  # report and go on
            ok = False
            print(f"FAIL {name:32s} {type(ex).__name__}: {str(ex)[:400]}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
