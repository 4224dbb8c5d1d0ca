"""Which kernels one step launches, and what the largest generated kernels compute.

For each ``model/mode/config`` row: compiles it (fp32, no TF32), runs a few steps, and
records (1) every kernel of one step in launch order from the CUDA profiler (names and
device microseconds), (2) every generated Triton kernel with 64 or more ``tl.load``s, with
the graph fragment Inductor's wrapper prints above it (the post-grad FX nodes it fuses),
(3) ``optimus.last_report()``'s text and, with ``DIAG_HOST=1``, (4) the step's wall time and
its host time per op (CPU profiler, self and total microseconds per step); with
``DIAG_PYPROF=1``, (5) the host time by Python function (cProfile: calls, own and cumulative
microseconds per step). One JSON file per run to ``$OUT/diag-kernels.json``.

    TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 python docs/results/gpu-diag-kernels.py \
        splitcat/train/optimus-auto towers32/train/optimus towers32/train/optimus-packed

(docs/kernels.md and docs/packing.md cite what it found.)
"""
from __future__ import annotations

import json
import os
import re
import sys
import time

import torch
from torch._inductor import codecache

import optimus
from optimus.tools.bench import accuracy
from optimus.tools.bench.configs import CONFIGS
from optimus.tools.bench.external import get_bench_model
from optimus.tools.bench.harness import LR, Runner

# the comment lines Inductor writes above a kernel (no re.S there: a comment is one line)
KERNEL = re.compile(r"((?:#[^\n]*\n)+)(\w+) = async_compile\.triton\('(\w+)', '''(.*?)'''", re.S)


def big_kernels(wrapper: str, min_loads: int = 64) -> list[dict]:
    found = []
    for m in KERNEL.finditer(wrapper):
        comments, _, name, src = m.groups()
        loads = src.count("tl.load")
        if loads >= min_loads:
            found.append({"name": name, "loads": loads, "stores": src.count("tl.store"), "lines": src.count("\n"),
                          "fragment": comments[-20000:]})
    return found


def most_loads(wrapper: str, top: int = 6) -> list[list]:
    """The generated kernels with the most ``tl.load``s: [name, loads, source lines]."""
    found = [[m.group(3), m.group(4).count("tl.load"), m.group(4).count("\n")] for m in KERNEL.finditer(wrapper)]
    return sorted(found, key=lambda k: -k[1])[:top]


def launches(wrapper: str) -> list[str]:
    body = wrapper.split("def call(self, args)", 1)[-1].split("\ndef ", 1)[0]
    return [ln.strip()[:160] for ln in body.splitlines()
            if re.search(r"\.run\(|extern_kernels\.|torch\.ops\.(optimus|aten)\.", ln) and not ln.strip().startswith("#")]


def main() -> None:
    rows = sys.argv[1:]
    out_dir = os.environ.get("OUT", ".")
    dev = os.environ.get("DIAG_DEVICE", "cuda")  # "cpu": a smoke test of this script
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if dev == "cuda" else dev, "rows": {}}
    wrappers: list[str] = []
    load = codecache.PyCodeCache.load_by_key_path.__func__

    def capture(cls, key, path, *args, **kwargs):
        with open(path) as f:
            src = f.read()
        if "async_compile" in src and "def call(self, args)" in src:
            wrappers.append(src)
        return load(cls, key, path, *args, **kwargs)

    codecache.PyCodeCache.load_by_key_path = classmethod(capture)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for spec in rows:
        model, mode, cfg = spec.split("/")
        wrappers.clear()
        torch._dynamo.reset()
        t0 = time.perf_counter()
        row: dict = {}
        try:
            with accuracy.tf32_mode(False):
                zoo = get_bench_model(model, "realistic", dev, 0)
                r = Runner(zoo, CONFIGS[cfg].wrap(zoo.model), mode, LR, cudagraphs=CONFIGS[cfg].cudagraphs)
                for _ in range(3):
                    r.step()
                sync()
                row["first_steps_s"] = round(time.perf_counter() - t0, 1)
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA if dev == "cuda" else ProfilerActivity.CPU]) as prof:
                    r.step()
                    sync()
                if os.environ.get("DIAG_HOST"):  # where the step's host time goes
                    with profile(activities=[ProfilerActivity.CPU]) as host:
                        for _ in range(5):
                            r.step()
                        sync()
                    t = time.perf_counter()
                    for _ in range(20):
                        r.step()
                    sync()
                    row["step_ms"] = round((time.perf_counter() - t) / 20 * 1e3, 3)
                    avg = sorted(host.key_averages(), key=lambda a: -a.self_cpu_time_total)[:40]
                    row["host_top"] = [[a.key[:90], a.count // 5, round(a.self_cpu_time_total / 5, 1), round(a.cpu_time_total / 5, 1)] for a in avg]
                if os.environ.get("DIAG_PYPROF"):  # the host time by Python function (cProfile, 10 steps)
                    import cProfile
                    import pstats

                    pr = cProfile.Profile()
                    pr.enable()
                    for _ in range(10):
                        r.step()
                    sync()
                    pr.disable()
                    st = pstats.Stats(pr)
                    top = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:45]  # by own time
                    row["pyprof_top"] = [[f"{os.path.basename(f)}:{ln}({fn})", cc // 10, round(tt / 10 * 1e6, 1), round(ct / 10 * 1e6, 1)]
                                         for (f, ln, fn), (cc, nc, tt, ct, _) in top]
            evs = [e for e in prof.events() if "CUDA" in str(getattr(e, "device_type", "")) and not (e.name or "").startswith(("Memcpy", "Memset", "[memory]"))]
            evs.sort(key=lambda e: e.time_range.start)
            row["kernels"] = len(evs)
            row["timeline"] = [[(e.name or "?")[:90], round(float(getattr(e, "device_time", 0.0) or 0.0), 2)] for e in evs]
            row["graphs"] = [{"launches": launches(w), "big": big_kernels(w), "most_loads": most_loads(w)} for w in wrappers]
            rep = optimus.last_report() if cfg.startswith("optimus") else None
            row["report"] = str(rep)[-30000:] if rep is not None else None
        except Exception as e:  # keep the other rows
            row["error"] = f"{type(e).__name__}: {e}"[:2000]
        result["rows"][spec] = row
        with open(f"{out_dir}/diag-kernels.json", "w") as f:
            json.dump(result, f, indent=1)
        big = [tuple(k[:2]) for g in row.get("graphs", []) for k in g["most_loads"][:2]]
        device_us = round(sum(t for _, t in row.get("timeline", [])), 1)
        print(f"{spec}: {row.get('kernels')} kernels/step ({device_us} us on the device), step {row.get('step_ms')} ms, "
              f"graphs {len(row.get('graphs', []))}, most loads {big}, {row.get('error', '')}", flush=True)
        for name, calls, own, total in row.get("host_top", [])[:8]:
            print(f"    host {own:9.1f} us own {total:9.1f} us total {calls:4d}x {name}", flush=True)


if __name__ == "__main__":
    main()
