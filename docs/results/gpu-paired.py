"""Paired timing on the GPU: Inductor and Optimus configurations of one model, compiled in one
process and timed in alternation, so the ratio of each round cancels what drifts between rounds.

Why: timed each in its own worker process, identical graphs differed by up to 60% and one
row's repeated medians by up to 41% (launch-bound steps move with the host). Here every round times
each configuration once (``iters`` steps, the median), in a rotated order, and the figure is
the median over rounds of the per-round ratio, with its range.

    python docs/results/gpu-paired.py --model dlrm --modes infer,train --json $OUT/dlrm.json

Many models: one process each, started together. They compile concurrently under a shared
lock (``--lock FILE``) and time one at a time under the exclusive one, so no compile runs while
anything is timed. Accuracy of each configuration's first step: the bench's rule
(``optimus.tools.bench.accuracy``, fp64 eager reference). fp32, TF32 off; ``--precisions
fp32,amp-bf16`` runs every configuration in each precision (``optimus.tools.bench.precision``; rows
keyed ``model/mode/config/precision`` unless fp32), each against Inductor in its precision, and a
configuration in another precision also against its fp32 self (``speedup_vs_fp32``, per round).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import statistics
import time

import torch

from optimus.tools import measure
from optimus.tools.bench import accuracy
from optimus.tools.bench import precision as precisions
from optimus.tools.bench.configs import CONFIGS, BenchConfig, _optimus
from optimus.tools.bench.external import get_bench_model
from optimus.tools.bench.harness import LR, Runner, _count_kernels, _optimus_summary, _peak_memory
from optimus.tools.bench.results import key as row_key


@contextlib.contextmanager
def locked(path: str | None, exclusive: bool):
    if path is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--configs", default="inductor,optimus,optimus-auto")
    p.add_argument("--size", default="realistic")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--device", default="cuda")  # cpu: a dry run (--size small)
    p.add_argument("--lock")
    p.add_argument("--json", required=True)
    p.add_argument("--passes", action="append", default=[],
                   help="NAME=JSON: one more configuration, optimus.compile(passes=JSON) (a diagnosis)")
    p.add_argument("--time-split", action="store_true", help="also profile where each configuration's step time goes")
    p.add_argument("--code", help="directory: each configuration's generated code of the first step")
    p.add_argument("--precisions", default="fp32", help="comma list of optimus.tools.bench.precision names")
    p.add_argument("--ref-lock", help="a lock file the processes of one model share: one computes its eager and "
                                      "fp64 references at a time (the fp64 step's memory is twice fp32's)")
    a = p.parse_args()
    precision_list = precisions.parse(a.precisions)
    for spec in a.passes:
        cname, js = spec.split("=", 1)
        CONFIGS[cname] = BenchConfig(cname, f"optimus.compile(passes={js})", True, _optimus(json.loads(js)), contextlib.nullcontext)
    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.accumulated_cache_size_limit = 512
    dev = torch.device(a.device)
    configs = a.configs.split(",") + [spec.split("=", 1)[0] for spec in a.passes]
    out = {"model": a.model, "torch": torch.__version__, "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "rounds": a.rounds, "iters": a.iters, "precisions": precision_list, "rows": {}}
    for mode in a.modes.split(","):
        runners, rows = {}, {}  # keyed (config, precision)
        with locked(a.lock, exclusive=False), accuracy.tf32_mode(False):  # build, compile, first step
            for prec in precision_list:
                with locked(a.ref_lock, exclusive=True):
                    ref = accuracy.eager_reference(a.model, mode, a.size, a.device, 0, prec)
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()  # the fp64 step's blocks, back for the other processes
                for cfg in configs:
                    run_one(a, dev, mode, cfg, prec, ref, rows, runners)
                del ref
        for (cfg, prec), row in rows.items():  # what a timeout would otherwise lose
            out["rows"][row_key(a.model, mode, cfg, prec)] = row
        json.dump(out, open(a.json, "w"), indent=1, default=str)
        with locked(a.lock, exclusive=True):  # timed: nothing else runs
            times = {which: [] for which in runners}
            for (cfg, prec), r in runners.items():
                with accuracy.tf32_mode(r.precision.tf32 and dev.type == "cuda"):
                    for _ in range(3):  # under CUDA graphs: warm-up, capture, then replays
                        r.step()
                    if dev.type == "cuda":  # the profiler's kernel events (the CPU count needs the first step)
                        _count_kernels(rows[(cfg, prec)], r, dev, None)
            names = list(runners)
            for i in range(a.rounds):
                order = names[i % len(names):] + names[: i % len(names)]
                for which in order:
                    with accuracy.tf32_mode(runners[which].precision.tf32 and dev.type == "cuda"):
                        times[which].append(measure.step_ms_medians(runners[which].step, dev, warmup=2, iters=a.iters)[0])
            for which, r in runners.items():
                row = rows[which]
                with accuracy.tf32_mode(r.precision.tf32 and dev.type == "cuda"):
                    if r.cudagraphs:  # a replay allocates nothing: the graph's pool was taken at capture
                        row["peak_memory_bytes"], row["memory_method"] = None, "n/a under CUDA graphs"
                    else:
                        row["peak_memory_bytes"], row["memory_method"], _ = _peak_memory(r.step, dev)
                    row["step_ms_rounds"] = [round(t, 4) for t in times[which]]
                    row["step_ms"] = statistics.median(times[which])
                    if a.time_split:  # where the step's time goes (optimus bench --time-split)
                        row["time_split"] = measure.time_split(r.step, dev)
        for (cfg, prec), r in runners.items():
            row = rows[(cfg, prec)]
            # each configuration against Inductor under the same launch regime (CUDA graphs or not) and precision
            base_cfg = "inductor-cudagraphs" if r.cudagraphs else "inductor"
            base = times.get((base_cfg, prec))
            if base and cfg != base_cfg:
                ratios = sorted(b / t for b, t in zip(base, times[(cfg, prec)]))
                row["speedup_vs_inductor"] = {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}
                row["baseline"] = base_cfg
                mb, mi = row.get("peak_memory_bytes"), rows[(base_cfg, prec)].get("peak_memory_bytes")
                if mb and mi:
                    row["memory_vs_inductor"] = mb / mi
            fp32 = times.get((cfg, "fp32"))
            if fp32 and prec != "fp32":  # the same configuration in fp32, paired round by round
                ratios = sorted(b / t for b, t in zip(fp32, times[(cfg, prec)]))
                row["speedup_vs_fp32"] = {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}
        for (cfg, prec), row in rows.items():
            out["rows"][row_key(a.model, mode, cfg, prec)] = row
        del runners
        torch._dynamo.reset()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        json.dump(out, open(a.json, "w"), indent=1, default=str)


def run_one(a, dev, mode: str, cfg: str, prec: str, ref, rows: dict, runners: dict) -> None:
    """Build, compile and run the first step of one configuration in one precision; the row
    records the first step, its accuracy and Optimus's rewrites; the runner is kept for timing."""
    row = rows[(cfg, prec)] = {"config": cfg, "mode": mode, **precisions.get(prec).record()}
    try:
        zoo = get_bench_model(a.model, a.size, a.device, 0)
        c = CONFIGS[cfg]
        inputs = Runner.prepare(zoo, prec)
        r = Runner(zoo, c.wrap(zoo.model), mode, LR, cudagraphs=c.cudagraphs, precision=prec, inputs=inputs)
        t0 = time.perf_counter()
        with c.context():
            if a.code:  # the generated modules' source, one file per configuration
                from torch._inductor.utils import run_and_get_code  # private: only for --code

                first, code = run_and_get_code(r.forward_backward)
                os.makedirs(a.code, exist_ok=True)
                name = f"{a.model}-{mode}-{cfg}" + ("" if prec == "fp32" else f"-{prec}")
                with open(os.path.join(a.code, f"{name}.py"), "w") as f:
                    f.write("\n\n# ---- next module ----\n\n".join(code))
            else:
                first = r.forward_backward()
        measure.synchronize(dev)
        row["first_step_s"] = round(time.perf_counter() - t0, 2)
        row["output_dtype"] = str(first.dtype).replace("torch.", "")
        row["parity"] = accuracy.judge(ref, first, r.grads() if mode == "train" else None, accuracy.accuracy_tolerance(a.device, mode, prec))
        if r.opt is not None:
            r.opt.step()
        del first
        row.update(_optimus_summary(r.fn))
        if getattr(r.fn, "optimus_report", None) is not None:  # every decision, with its reason
            row["optimus_report"] = str(r.fn.optimus_report)
        runners[(cfg, prec)] = r
    except Exception as e:  # one configuration failing keeps the others
        row["error"] = f"{type(e).__name__}: {e}"[:500]


if __name__ == "__main__":
    main()
