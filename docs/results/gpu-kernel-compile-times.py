"""Seconds of Triton compile per generated kernel in one configuration's first step.

Inductor compiles in this process, one kernel after another (``compile_threads=1``), so
each ``async_compile.triton`` call's wall time is that kernel's compile (all its autotune
configs). Also times the first run's autotune benchmarking. One JSON line to stdout
(kernels sorted slowest first; ``by_lines``: [source lines, seconds] of every kernel) and
the four slowest kernels' sources to ``$OUT/src-<model>-<mode>-<config>.py``.

    TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 python docs/results/gpu-kernel-compile-times.py --model towers32 --mode train --config optimus-auto

(docs/inductor-ir.md cites its towers32 training row: the planner on the committed H200
profile, as in docs/results/gpu-compile-time.sh.)
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch._inductor import async_compile
from torch._inductor import config as inductor_config

from optimus.tools.bench import accuracy
from optimus.tools.bench.configs import CONFIGS
from optimus.tools.bench.external import get_bench_model
from optimus.tools.bench.harness import LR, Runner


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--mode", default="train")
    p.add_argument("--config", default="optimus-auto")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    inductor_config.compile_threads = 1
    kernels: list[dict] = []
    benchmarks: list[float] = []
    compile_one = async_compile.AsyncCompile.triton

    def timed_compile(self, kernel_name, source_code, *args, **kwargs):
        t = time.perf_counter()
        out = compile_one(self, kernel_name, source_code, *args, **kwargs)
        kernels.append({"name": kernel_name, "s": round(time.perf_counter() - t, 3), "lines": source_code.count("\n"), "src": source_code})
        return out

    async_compile.AsyncCompile.triton = timed_compile
    from torch._inductor.runtime import triton_heuristics

    benchmark_all = triton_heuristics.CachingAutotuner.benchmark_all_configs

    def timed_benchmark(self, *args, **kwargs):
        t = time.perf_counter()
        out = benchmark_all(self, *args, **kwargs)
        benchmarks.append(time.perf_counter() - t)
        return out

    triton_heuristics.CachingAutotuner.benchmark_all_configs = timed_benchmark
    with accuracy.tf32_mode(False):
        zoo = get_bench_model(a.model, "realistic", a.device, 0)
        r = Runner(zoo, CONFIGS[a.config].wrap(zoo.model), a.mode, LR)
        t0 = time.perf_counter()
        r.forward_backward()
        if a.device == "cuda":
            torch.cuda.synchronize()
        first = time.perf_counter() - t0
    kernels.sort(key=lambda k: -k["s"])
    tag = f"{a.model}-{a.mode}-{a.config}"
    row = {"row": tag, "first_step_s": round(first, 2), "kernels": len(kernels), "compile_s": round(sum(k["s"] for k in kernels), 2),
           "bench_s": round(sum(benchmarks), 2), "n_bench": len(benchmarks),
           "top": [{k: v for k, v in x.items() if k != "src"} for x in kernels[:12]],
           "by_lines": [[x["lines"], x["s"]] for x in kernels]}
    print(json.dumps(row), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(f"{out}/src-{tag}.py", "w") as f:
            for x in kernels[:4]:
                f.write(f"# ==== {x['name']} {x['s']}s\n{x['src']}\n")


if __name__ == "__main__":
    main()
