#!/usr/bin/env bash
# Issue 16 targets on the H200 (torch 2.11): dlrm, wukong, dhen training, realistic size,
# Inductor and Optimus (with group_embedding_lookups) side by side in one run.
#   dlrm: kernels/step <= 150 and step >= 1.4x Inductor's
#   wukong, dhen: kernels/step at least 80 below today's optimus row (dhen 234 on 2026-11-30;
#   dlrm 673 and wukong: the issue's figures / the lead's last row)
# About 2-3 minutes: 6 rows, compiles in 3 workers (about 30-40 s each on the H200).
# Usage (repository root): OUT=... bash docs/results/gpu-embedding-rule.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout -k 5 230 python -m optimus.bench --model dlrm,wukong,dhen --mode train --device cuda --size realistic \
    --configs inductor,optimus --workers 3 --compile-threads 4 --repeats 3 --budget-minutes 3 --quiet \
    --json "$OUT/emb-rule-train.json"
python -m optimus.bench.report "$OUT/emb-rule-train.json" > "$OUT/emb-rule-train.md" 2>/dev/null
python - "$OUT/emb-rule-train.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
rows = rows.get("rows", rows) if isinstance(rows, dict) else {f"{r['model']}/{r['mode']}/{r['config']}": r for r in rows}
before = {"dlrm": 673, "dhen": 234}  # today's optimus rows (issue 16; h200-train-2026-11-30.json)
print(f"{'model':8} {'inductor k':>10} {'optimus k':>9} {'ind ms':>8} {'opt ms':>8} {'speedup':>7}  target")
for m in ("dlrm", "wukong", "dhen"):
    i, o = rows.get(f"{m}/train/inductor", {}), rows.get(f"{m}/train/optimus", {})
    ki, ko, ti, to = i.get("kernels"), o.get("kernels"), i.get("step_ms"), o.get("step_ms")
    sp = ti / to if ti and to else None
    if m == "dlrm":
        goal = f"kernels <= 150: {ko is not None and ko <= 150}; >= 1.4x: {sp is not None and sp >= 1.4}"
    else:
        b = before.get(m)
        goal = f"kernels <= {b - 80}: {ko is not None and ko <= b - 80}" if b else "kernels: compare with the last optimus row - 80"
    f = lambda v, p=0: "-" if v is None else (f"{v:.{p}f}" if isinstance(v, float) else str(v))
    print(f"{m:8} {f(ki):>10} {f(ko):>9} {f(ti, 2):>8} {f(to, 2):>8} {f(sp, 2):>7}  {goal}  {o.get('status', 'missing')}")
EOF
# Optional (VARIANTS=1, about 2 more minutes): dlrm without the rule (today's row, same run) and
# with the atomic backward.
if [ "${VARIANTS:-0}" = 1 ]; then
  timeout -k 5 200 python docs/results/emb_rule_variants.py --model dlrm --mode train --device cuda --size realistic \
      --configs optimus-noemb,optimus-atomic --repeats 3 --quiet --json "$OUT/emb-rule-train.json"
fi
