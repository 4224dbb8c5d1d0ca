#!/usr/bin/env bash
# H200 run 28 (2026-12-03, fifth session): after the lean registration and direct launches.
# (1) issue 15 item 5's kernel benchmark (bench_grouped.py: G = 16 eager and CUDA-graph steps
# against loops of F.linear and bmm); (2) where hetero_towers training's host time goes now
# (gpu-diag-kernels.py, DIAG_HOST=1); (3) hetero_towers paired with packed parameters (their
# parameter-list ops go through the same registration). Tables last.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout -k 5 115 python -m optimus.bench.kernels.overhead --out $OUT/grouped --budget-s 100 > $OUT/run28-bench-grouped.txt 2>&1
TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 DIAG_HOST=1 timeout 90 python docs/results/gpu-diag-kernels.py hetero_towers/train/optimus > $OUT/run28-diag.log 2>&1
R=$(mktemp -d)
for mode in train infer; do
  RUN_DIR=$R TAG=run28 MODE=$mode MODELS=hetero_towers ROUNDS=3 LIMIT=200 \
      CONFIGS=inductor,optimus,optimus-packed bash docs/results/gpu-run-14.sh > $R/run28-$mode.out 2>&1 &
done
wait
(cd $OUT && tar czf run28-extra.tgz grouped run28-*-pieces.tgz && rm -rf grouped run28-*-pieces.tgz)  # few files come back
tail -n 3 $R/run28-train.out $R/run28-infer.out
grep -A12 "Step ms\|case " $OUT/run28-bench-grouped.txt | tail -24
tail -1 $OUT/run28-diag.log
