#!/usr/bin/env bash
# H200, one call of ~2.5 minutes (what was left of the session's device time):
#  1. bmm_long_reduction.py: one batched matmul vs one mm per entry on the zoo's long-reduction
#     shapes (unbatch_long_reduction_bmm);
#  2. interformer and wukong training, realistic: inductor / optimus / optimus-auto (the rule
#     above, and the planner no longer taking groups the rules decline);
#  3. issue 13: towers32 and splitcat, small, training and inference, inductor and optimus,
#     static and --dynamic (the two bench processes run at once: kernel counts are exact,
#     step times share the GPU and the CPU).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 40 python docs/results/bmm_long_reduction.py --json $OUT/bmm.json > $OUT/bmm.log 2>&1
timeout 95 python -m optimus.bench --model interformer,wukong --mode train --device cuda --size realistic \
  --configs inductor,optimus,optimus-auto --iters 10 --workers 6 --budget-minutes 1.4 --quiet --json $OUT/train.json > $OUT/train.log 2>&1
# (as first written, with --budget-minutes 1.1, piece 3 ran no row: the budget refused them all;
# it was re-run as below in a second call)
D="--model towers32,splitcat --mode infer,train --device cuda --size small --configs inductor,optimus --iters 20 --workers 4 --quiet"
timeout 70 python -m optimus.bench $D --json $OUT/static.json > $OUT/static.log 2>&1 &
timeout 70 python -m optimus.bench $D --dynamic --json $OUT/dynamic.json > $OUT/dynamic.log 2>&1 &
wait
python - <<PY
import sys
sys.path.insert(0, "docs/results")
from compare_dynamic import fmt as f, rows
t = rows("$OUT/train.json")
print(f"{'train row':34} {'kernels':>8} {'ms':>8} {'x ind':>6} {'MiB':>7}  parity / error")
for k in sorted(t):
    r = t[k]; ind = t.get(k.rsplit("/", 1)[0] + "/inductor", {}).get("step_ms")
    x = ind / r["step_ms"] if ind and r.get("step_ms") else None
    mem = r.get("peak_memory_bytes")
    print(f"{k:34} {f(r.get('kernels')):>8} {f(r.get('step_ms'), 2):>8} {f(x, 2):>6} {f(mem / 2**20 if mem else None, 0):>7}  {(r.get('parity') or {}).get('ok')} {r.get('error') or ''}")
PY
python docs/results/compare_dynamic.py $OUT/static.json $OUT/dynamic.json $OUT/dynamic-compare.json
cat $OUT/bmm.log | tail -8
