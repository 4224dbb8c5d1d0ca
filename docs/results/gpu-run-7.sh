#!/usr/bin/env bash
# H200 run 7 (written 2026-12-01 night; the call after run 6): ~9.5 minutes.
#  1. CUDA graphs with the kernel rules kept on (OPTIMUS_CUDAGRAPH_KERNELS=1: the cached tables
#     are now allocated off the thread cudagraph trees route to its pool): the models whose
#     graphs the grouped/embedding rules rewrite, optimus and optimus-auto under CUDA graphs;
#  2. the grouped-op kernel benchmark (eager host cost, routes), and the int32-limit kernel tests;
#  3. the compact table.
# fp32, TF32 off. Writes to $OUT. Carry .gpu_site for the HF rows of run 8 (external), not here.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD OPTIMUS_CACHE_DIR=$OUT/optimus-cache
C="--device cuda --size realistic --quiet --workers 6 --compile-threads 2 --iters 20 --repeats 2"
OPTIMUS_CUDAGRAPH_KERNELS=1 timeout 300 python -m optimus.bench $C --model hetero_towers,dlrm,dcnv2,interformer,dhen,wukong \
    --mode train,infer --budget-minutes 4.2 \
    --configs inductor,inductor-cudagraphs,optimus-cudagraphs,optimus-auto-cudagraphs \
    --json $OUT/h200-run7-cudagraphs.json > $OUT/bench-cg.log 2>&1
echo "cudagraphs bench exit $?"
timeout -k 5 150 python -m optimus.bench.kernels.overhead --out $OUT/grouped --budget-s 140 > $OUT/grouped.log 2>&1
echo "grouped exit $?"; tail -12 $OUT/grouped.log
timeout 90 python -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_gpu.py -k int32 > $OUT/pytest-int32.log 2>&1
echo "int32 tests exit $?"; tail -3 $OUT/pytest-int32.log
python docs/results/zoo_table.py $OUT/h200-run7-cudagraphs.json $OUT/table-cg.json
