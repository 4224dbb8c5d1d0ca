#!/usr/bin/env bash
# H200 run 9 (2026-12-01 night, after run 8): one call of ~9 minutes.
#  1. the GPU tests fixed after run 8 (embedding alignment, cudagraph trees), the probe's
#     leftover memory (it held 128 MiB: one cuBLAS workspace per probe stream) and the
#     step-memory measurement;
#  2. the grouped-op kernel benchmark (device time against the loop of torch ops and bmm,
#     eager host cost per call);
#  3. hetero_towers and towers32 inference, one row at a time (--workers 1), with the device
#     profile of run 8 (no probe in the process): is optimus-auto's slower step (run 8:
#     hetero_towers 3.40 ms against optimus 1.42 ms) the plan or the worker?
#  4. training of every model, inductor / optimus / optimus-auto, peak memory now the step's own;
#  5. the compact tables.
# fp32, TF32 off. Writes to $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/cache && cp docs/results/h200-profile/*.json $OUT/cache/ && export OPTIMUS_CACHE_DIR=$OUT/cache
timeout 80 python -m pytest -q -p no:cacheprovider tests/bench/test_measure_gpu.py tests/planner/test_probe_gpu.py \
    tests/kernels/test_kernels_gpu.py -k "embedding_aligned or cudagraph_trees or step_memory or probe" > $OUT/pytest-gpu.log 2>&1
echo "gpu tests exit $?"; grep -E "passed|failed|FAILED|Error" $OUT/pytest-gpu.log | head -12
timeout -k 5 115 python -m optimus.bench.kernels.overhead --out $OUT/grouped --budget-s 100 > $OUT/grouped.log 2>&1
echo "grouped exit $?"; tail -14 $OUT/grouped.log
C="--device cuda --size realistic --quiet --iters 20 --repeats 2"
timeout 140 python -m optimus.bench $C --workers 1 --model hetero_towers,towers32 --mode infer --budget-minutes 1.8 \
    --configs inductor,optimus,optimus-auto --json $OUT/h200-run9-serial.json > $OUT/bench-serial.log 2>&1
echo "serial exit $?"
timeout 220 python -m optimus.bench $C --workers 7 --compile-threads 2 --model all --mode train --budget-minutes 2.6 \
    --configs inductor,optimus,optimus-auto --json $OUT/h200-run9-train.json > $OUT/bench-train.log 2>&1
echo "train exit $?"
for f in serial train; do python docs/results/zoo_table.py $OUT/h200-run9-$f.json $OUT/table-$f.json; done
