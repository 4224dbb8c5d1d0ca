#!/usr/bin/env bash
# H200 run 25 (2026-12-03): packed parameters of different shapes (issue 15 item 3) read in
# place by the grouped kernels' parameter-list ops. (1) their GPU test; (2) hetero_towers
# training and inference, paired (gpu-run-14.sh): Inductor, "all" and "all" with
# pack_parameters=True; (3) the training step's kernels and host time with packing
# (gpu-diag-kernels.py, DIAG_HOST=1). Prints the tables last.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 60 python -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_kernels_param_ops.py > $OUT/run25-tests.log 2>&1
tail -1 $OUT/run25-tests.log
R=$(mktemp -d)
for mode in train infer; do
  RUN_DIR=$R TAG=run25 MODE=$mode MODELS=hetero_towers ROUNDS=${ROUNDS:-3} LIMIT=${LIMIT:-200} \
      CONFIGS=inductor,optimus,optimus-packed bash docs/results/gpu-run-14.sh > $R/run25-$mode.out 2>&1 &
done
wait
TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 DIAG_HOST=1 timeout 80 python docs/results/gpu-diag-kernels.py hetero_towers/train/optimus-packed > $OUT/run25-diag.log 2>&1
tail -1 $OUT/run25-diag.log
tail -n 3 $R/run25-train.out $R/run25-infer.out
