"""Compile time of one configuration of one zoo model: the first step (Dynamo, our passes,
Inductor, Triton) timed in a fresh process with every compile cache off, and the seconds our
passes took per level (from the report). One JSON line to stdout.

    TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 python docs/results/gpu-compile-time.py --model dlrm --mode train --config optimus-auto

docs/results/gpu-compile-time.sh runs every model and configuration this way, one process
at a time per lane. fp32, TF32 off, as the benchmark.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from optimus.tools import measure
from optimus.tools.bench import accuracy
from optimus.tools.bench.configs import CONFIGS
from optimus.tools.bench.external import get_bench_model
from optimus.tools.bench.harness import LR, Runner


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--mode", default="infer")
    p.add_argument("--config", default="optimus-auto")
    p.add_argument("--size", default="realistic")
    p.add_argument("--device", default="cuda")
    p.add_argument("--table", help="a JSON-lines file of rows: print the summary table and write it as JSON next to it")
    a = p.parse_args()
    if a.table:
        table(a.table)
        return
    row = {"model": a.model, "mode": a.mode, "config": a.config, "torch": torch.__version__}
    try:
        with accuracy.tf32_mode(False):
            zoo = get_bench_model(a.model, a.size, a.device, 0)
            c = CONFIGS[a.config]
            r = Runner(zoo, c.wrap(zoo.model), a.mode, LR, cudagraphs=c.cudagraphs)
            t0 = time.perf_counter()
            with c.context():
                r.forward_backward()
            measure.synchronize(torch.device(a.device))
            row["first_step_s"] = round(time.perf_counter() - t0, 3)
        row["phases_s"] = phases()
        report = getattr(r.fn, "optimus_report", None)
        if report is not None:
            for level in ("torch_ir", "aten_ir", "inductor_ir"):
                row[f"{level}_s"] = round(sum(g.time_s for g in report.graphs if g.level == level), 3)
            row["passes_s"] = round(sum(row[f"{lv}_s"] for lv in ("torch_ir", "aten_ir", "inductor_ir")), 3)
    except Exception as e:  # one failing row keeps the others
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    print(json.dumps(row), flush=True)


PHASES = ("create_aot_dispatcher_function", "compile_fx_inner", "GraphLowering.run", "Scheduler.__init__",
          "Scheduler.fused_nodes", "Scheduler.codegen", "async_compile.wait", "PyCodeCache.load_by_key_path")


def phases() -> dict[str, float]:
    """Seconds of a few of the compile's phases, summed over its graphs (Dynamo's compile
    timers: AOTAutograd, Inductor's lowering, scheduling (our Inductor-IR passes run inside
    ``Scheduler.__init__``), code generation, waiting for Triton's compiles)."""
    try:
        from torch._dynamo.utils import compile_times

        names, values = compile_times(repr="csv", aggregate=True)
        return {n: round(float(v), 3) for n, v in zip(names, values) if n in PHASES}
    except Exception:  # a torch without these timers
        return {}


def table(path: str) -> None:
    """Per model and mode: first step and pass seconds per configuration, and the ratios
    optimus-auto / optimus (``passes="all"``) and optimus-auto / inductor."""
    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    by = {(r["model"], r["mode"], r["config"]): r for r in rows}
    out = {"torch": rows[0]["torch"] if rows else None, "rows": rows, "summary": []}
    print(f"{'model':<14}{'mode':<6}{'inductor':>9}{'optimus':>9}{'auto':>8}{'auto/opt':>9}{'auto/ind':>9}{'pass opt':>9}{'pass auto':>10}")
    for model, mode in dict.fromkeys((r["model"], r["mode"]) for r in rows):
        get = lambda cfg, key: by.get((model, mode, cfg), {}).get(key)
        ind, opt, auto = (get(c, "first_step_s") for c in ("inductor", "optimus", "optimus-auto"))
        s = {"model": model, "mode": mode, "inductor_s": ind, "optimus_s": opt, "auto_s": auto,
             "optimus_passes_s": get("optimus", "passes_s"), "auto_passes_s": get("optimus-auto", "passes_s"),
             "auto_over_optimus": round(auto / opt, 3) if auto and opt else None,
             "auto_over_inductor": round(auto / ind, 3) if auto and ind else None}
        out["summary"].append(s)
        f = lambda x, w, d=2: f"{x:>{w}.{d}f}" if isinstance(x, (int, float)) else f"{'-':>{w}}"
        print(f"{model:<14}{mode:<6}{f(ind, 9, 1)}{f(opt, 9, 1)}{f(auto, 8, 1)}{f(s['auto_over_optimus'], 9)}{f(s['auto_over_inductor'], 9)}"
              f"{f(s['optimus_passes_s'], 9)}{f(s['auto_passes_s'], 10)}")
    json.dump(out, open(path.rsplit(".", 1)[0] + ".json", "w"), indent=1)


if __name__ == "__main__":
    main()
