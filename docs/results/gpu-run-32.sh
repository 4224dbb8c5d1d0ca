#!/usr/bin/env bash
# H200 run 32 (2026-12-03, sixth session): should pack_parameters be on by default, and can
# optimus::packed_linear run under CUDA graphs? (1) the packing GPU tests, also with
# OPTIMUS_CUDAGRAPH_KERNELS=1 (packed_linear kept on under capture); (2) paired timing of
# towers32, splitcat and hetero_towers, training and inference, with and without packing
# under "all" and "auto"; (3) towers32 and hetero_towers with both sides under CUDA graphs,
# packed and not, packed_linear kept on. Tables last.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
{ timeout 150 python -m pytest -m gpu -q tests/test_packing.py -p no:cacheprovider 2>&1 | tail -5
  OPTIMUS_CUDAGRAPH_KERNELS=1 timeout 150 python -m pytest -m gpu -q tests/test_packing.py -p no:cacheprovider -k cuda_graphs 2>&1 | tail -5; } > $OUT/run32-tests.log
R=$(mktemp -d)
for mode in train infer; do
  RUN_DIR=$R TAG=run32 MODE=$mode MODELS="splitcat towers32 hetero_towers" ROUNDS=3 LIMIT=430 \
      CONFIGS=inductor,optimus,optimus-packed,optimus-auto,optimus-auto-packed bash docs/results/gpu-run-14.sh > $R/run32-$mode.out 2>&1 &
done
for mode in train infer; do
  OPTIMUS_CUDAGRAPH_KERNELS=1 RUN_DIR=$R TAG=run32cg MODE=$mode MODELS="towers32 hetero_towers" ROUNDS=3 LIMIT=430 \
      CONFIGS=inductor-cudagraphs,optimus-cudagraphs,optimus-packed-cudagraphs bash docs/results/gpu-run-14.sh > $R/run32cg-$mode.out 2>&1 &
done
wait
(cd $OUT && tar czf run32-pieces.tgz run32*-pieces.tgz && rm -f run32*-*-pieces.tgz)
cat $OUT/run32-tests.log
tail -n 12 $R/run32-train.out $R/run32-infer.out $R/run32cg-train.out $R/run32cg-infer.out
