#!/usr/bin/env bash
# H200 run 3 of 2026-12-01: the zoo side by side (eager, Inductor, upstream's Optimus
# passes, Optimus "all", Optimus "auto", both under CUDA graphs), training and inference,
# realistic sizes, fp32 without TF32 (upstream's passes in run 4, for lack of time in one call); then DDP of world size 1 (issue 18). Writes to $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD OPTIMUS_CACHE_DIR=$OUT/optimus-cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
C="--model all --mode train,infer --device cuda --size realistic --quiet --workers 7 --compile-threads 2 --iters 20 --repeats 2"
C="$C --configs eager,inductor,optimus,optimus-auto,inductor-cudagraphs,optimus-auto-cudagraphs"
timeout 400 python -m optimus.bench $C --budget-minutes 6.0 --json $OUT/h200-bench.json > $OUT/bench.log 2>&1
echo "bench exit $?"
timeout 150 python -m optimus.bench.distributed --nproc 1 --device cuda --models towers32,dcnv2 --no-tf32 \
    --timeout-minutes 2.3 --json $OUT/h200-ddp-ws1.json > $OUT/ddp.log 2>&1
echo "ddp exit $?"
tail -5 $OUT/ddp.log
python - <<'PY'
import json, os
rows = json.load(open(os.environ["OUT"] + "/h200-bench.json"))
rows = rows.get("rows", rows) if isinstance(rows, dict) else rows
by = {}
for r in (rows.values() if isinstance(rows, dict) else rows):
    if r.get("status") == "ok":
        by[(r["model"], r["mode"], r["config"])] = r
print(f"{'model':<12}{'mode':<6}" + "".join(f"{c[:14]:>15}" for c in ["inductor", "optimus", "optimus-auto", "ind-cg", "auto-cg"]))
for (m, mode) in sorted({(k[0], k[1]) for k in by}):
    base = by.get((m, mode, "inductor"))
    cg = by.get((m, mode, "inductor-cudagraphs"))
    def cell(cfg, ref):
        r = by.get((m, mode, cfg))
        if not r or not ref:
            return "-"
        return f"{ref['step_ms'] / r['step_ms']:.2f}x/{r.get('kernels', '?')}"
    print(f"{m:<12}{mode:<6}{(str(round(base['step_ms'], 3)) + 'ms') if base else '-':>15}" + "".join(
        f"{cell(c, ref):>15}" for c, ref in [("optimus", base), ("optimus-auto", base), ("inductor-cudagraphs", base), ("optimus-auto-cudagraphs", cg)]))
PY
