#!/usr/bin/env bash
# H200 run 33 (2026-12-03, sixth session): packing by default. (1) the packing GPU tests (the
# default compile packs on CUDA, not under CUDA graphs); (2) why packed models were slower under
# CUDA graphs in run 32: one training step's kernels and host time, towers32, CG packed and not
# (gpu-diag-kernels.py, packed_linear kept on); (3) paired: the new default ("optimus" packs)
# against "optimus-unpacked", training and inference; both sides under CUDA graphs in inference
# (lost in run 32). Each launcher writes its own folder (run 32's shared one overwrote files).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/diag $OUT/a $OUT/b $OUT/c
timeout 120 python -m pytest -m gpu -q tests/test_packing.py -p no:cacheprovider 2>&1 | grep -v Warn | tail -4 > $OUT/run33-tests.log &
OPTIMUS_CUDAGRAPH_KERNELS=1 TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 DIAG_HOST=1 OUT=$OUT/diag timeout 200 python docs/results/gpu-diag-kernels.py \
    towers32/train/optimus-cudagraphs towers32/train/optimus-packed-cudagraphs > $OUT/run33-diag.log 2>&1 &
wait
R=$(mktemp -d)
for mode in train infer; do
  OUT=$OUT/$([ $mode = train ] && echo a || echo b) RUN_DIR=$R TAG=run33 MODE=$mode MODELS="towers32 hetero_towers" ROUNDS=3 LIMIT=330 \
      CONFIGS=inductor,optimus,optimus-unpacked bash docs/results/gpu-run-14.sh > $R/run33-$mode.out 2>&1 &
done
OUT=$OUT/c OPTIMUS_CUDAGRAPH_KERNELS=1 RUN_DIR=$R TAG=run33cg MODE=infer MODELS="towers32 hetero_towers" ROUNDS=3 LIMIT=330 \
    CONFIGS=inductor-cudagraphs,optimus-cudagraphs,optimus-packed-cudagraphs bash docs/results/gpu-run-14.sh > $R/run33cg-infer.out 2>&1 &
wait
cat $OUT/run33-tests.log; tail -2 $OUT/run33-diag.log
tail -n 4 $R/run33-train.out $R/run33-infer.out $R/run33cg-infer.out
