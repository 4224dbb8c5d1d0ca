#!/usr/bin/env bash
# H200 run 4 of 2026-12-01 (after the planner fix of run 3 and the merges of issues 15-17):
# the zoo with hetero_towers, training and inference, Inductor / Optimus "all" / Optimus
# "auto", both under CUDA graphs; upstream's passes in training; the grouped-op kernel
# benchmark. fp32 without TF32. Writes to $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD OPTIMUS_CACHE_DIR=$OUT/optimus-cache
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
C="--model all --device cuda --size realistic --quiet --workers 7 --compile-threads 2 --iters 20 --repeats 2 --json $OUT/h200-bench.json"
timeout 320 python -m optimus.bench $C --mode train,infer --budget-minutes 4.9 \
    --configs inductor,optimus,optimus-auto,inductor-cudagraphs,optimus-auto-cudagraphs > $OUT/bench.log 2>&1
echo "bench exit $?"
timeout 150 python -m optimus.bench $C --mode train --budget-minutes 2.0 --configs upstream > $OUT/bench-upstream.log 2>&1
echo "upstream exit $?"
timeout -k 5 95 python -m optimus.bench.kernels.overhead --out $OUT/grouped --budget-s 85 > $OUT/grouped.log 2>&1
echo "grouped exit $?"
tail -25 $OUT/grouped.log
python - <<'PY'
import json, os
rows = json.load(open(os.environ["OUT"] + "/h200-bench.json"))["rows"]
by = {(r["model"], r["mode"], r["config"]): r for r in rows.values() if r.get("status") == "ok"}
cols = [("optimus", "inductor"), ("optimus-auto", "inductor"), ("upstream", "inductor"), ("optimus-auto-cudagraphs", "inductor-cudagraphs")]
print(f"{'model':<14}{'mode':<6}{'inductor':>10}{'ind-cg':>9}" + "".join(f"{c[:13]:>15}" for c, _ in cols))
for m, mode in sorted({(k[0], k[1]) for k in by}):
    def ms(cfg):
        r = by.get((m, mode, cfg)); return f"{r['step_ms']:.3f}" if r else "-"
    def cell(cfg, ref):
        r, b = by.get((m, mode, cfg)), by.get((m, mode, ref))
        return f"{b['step_ms'] / r['step_ms']:.2f}x/{r.get('kernels')}" if r and b else "-"
    print(f"{m:<14}{mode:<6}{ms('inductor'):>10}{ms('inductor-cudagraphs'):>9}" + "".join(f"{cell(c, ref):>15}" for c, ref in cols))
PY
