#!/usr/bin/env bash
# H200 run 24 (2026-12-03): the column layout of the grouped kernels (issue 15).
# (1) the kernel and rule tests on the GPU (the column layout against loops of F.linear /
# F.layer_norm, outputs and gradients); (2) hetero_towers training and inference, paired
# (docs/results/gpu-paired.py through gpu-run-14.sh), with and without CUDA graphs; (3) what the
# training step's kernels are and where its host time goes (gpu-diag-kernels.py, DIAG_HOST=1).
# Writes $OUT/run24-*.json and -pieces.tgz, the test and diagnosis logs, and diag-kernels.json;
# prints the tables last.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_columns.py tests/kernels/test_kernels_gpu.py \
    tests/rules/test_grouped_kernels.py > $OUT/run24-tests.log 2>&1
tail -2 $OUT/run24-tests.log
R=$(mktemp -d)
RUN_DIR=$R TAG=run24 MODE=train MODELS=hetero_towers ROUNDS=${ROUNDS:-5} LIMIT=${LIMIT:-280} \
    CONFIGS=inductor,optimus,optimus-auto,inductor-cudagraphs,optimus-cudagraphs bash docs/results/gpu-run-14.sh > $R/run24-train.out 2>&1 &
RUN_DIR=$R TAG=run24 MODE=infer MODELS=hetero_towers ROUNDS=${ROUNDS:-5} LIMIT=${LIMIT:-280} \
    CONFIGS=inductor,optimus,optimus-auto,inductor-cudagraphs,optimus-cudagraphs bash docs/results/gpu-run-14.sh > $R/run24-infer.out 2>&1 &
wait
TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 DIAG_HOST=1 timeout 150 python docs/results/gpu-diag-kernels.py hetero_towers/train/optimus > $OUT/run24-diag.log 2>&1
tail -1 $OUT/run24-diag.log
tail -4 $R/run24-train.out $R/run24-infer.out
