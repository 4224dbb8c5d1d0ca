#!/usr/bin/env bash
# H200 run 1 of 2026-12-01: device profile for the planner, the issue-11 combo diagnosis,
# a smoke of the parallel bench harness with the CUDA-graph configs, the grouped
# embedding-bag kernel benchmark. Run from the repository root; writes to $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
echo "== 1 device profile"
timeout 60 python -c "
import json, torch
from optimus.planner import costmodel as c
p = c.probe(torch.device('cuda'))
print(json.dumps(p.to_json(), indent=1))
open('$OUT/profile.json', 'w').write(json.dumps(p.to_json(), indent=1))
" 2>&1 | tail -30
echo "== 2 combo diagnosis"
timeout 170 python tests/inductor_ir/gpu_diagnose_combo.py --budget 120 --out $OUT > $OUT/diag.log 2>&1; echo "rc=$?"; tail -25 $OUT/diag.log
echo "== 3 bench harness smoke (workers, cudagraphs configs)"
timeout 150 python -m optimus.bench --model towers32 --mode all --device cuda --size small \
  --configs eager,inductor,optimus,inductor-cudagraphs,optimus-cudagraphs --workers 3 --json $OUT/smoke.json --quiet > $OUT/smoke.log 2>&1; echo "rc=$?"; tail -30 $OUT/smoke.log
echo "== 4 grouped embedding bag"
timeout -k 5 150 python -m optimus.bench.kernels.embedding_bag --out $OUT --budget-s 120 > $OUT/emb.log 2>&1; echo "rc=$?"; tail -45 $OUT/emb.log
