#!/usr/bin/env bash
# H200 run 8 (2026-12-01 night, after run 6): one call of ~8 minutes.
#  1. the GPU tests that are not parametrized over kernel shapes (TF32, per-stream tables,
#     cudagraph trees, int32 edges excluded) and the step-memory measurement test;
#  2. the rows run 6 did not reach (inference of six models), and training of every model with
#     inductor / optimus-auto again: peak memory is now the step's own (run 6 had process
#     totals, which depend on what the worker holds besides the row);
#  3. dhen training under CUDA graphs, one row at a time (--workers 1): in run 6, with 7 workers,
#     optimus-cudagraphs read 0.70x inductor-cudagraphs, with the same cuDNN FFT kernels taking
#     2.3x their device time (concurrent GPU work of other workers' first steps?);
#  4. the compact tables.
# fp32, TF32 off. Writes to $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD OPTIMUS_CACHE_DIR=$OUT/optimus-cache
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
timeout 110 python -m pytest -q -p no:cacheprovider --durations=8 tests/bench/test_measure_gpu.py \
    tests/kernels/test_kernels_gpu.py -k "not int32 and not test_grouped_linear_gpu and not test_batched_layer_norm_gpu" > $OUT/pytest-gpu.log 2>&1
echo "gpu tests exit $?"; grep -E "passed|failed|FAILED|Error|s call" $OUT/pytest-gpu.log | head -20
C="--device cuda --size realistic --quiet --compile-threads 2 --iters 20 --repeats 2"
timeout 280 python -m optimus.bench $C --workers 7 --model dlrm,dcnv2,wukong,hstu,towers32,hetero_towers --mode infer --budget-minutes 2.6 \
    --configs inductor,optimus,optimus-auto,inductor-cudagraphs,optimus-auto-cudagraphs --json $OUT/h200-run8-infer.json > $OUT/bench-infer.log 2>&1
echo "infer bench exit $?"
timeout 150 python -m optimus.bench $C --workers 7 --model all --mode train --budget-minutes 1.6 \
    --configs inductor,optimus-auto --json $OUT/h200-run8-train.json > $OUT/bench-train.log 2>&1
echo "train bench exit $?"
timeout 110 python -m optimus.bench $C --workers 1 --model dhen --mode train --budget-minutes 1.6 \
    --configs inductor-cudagraphs,optimus-cudagraphs --json $OUT/h200-run8-dhen-cg.json > $OUT/bench-dhen.log 2>&1
echo "dhen serial exit $?"
for f in infer train dhen-cg; do python docs/results/zoo_table.py $OUT/h200-run8-$f.json $OUT/table-$f.json; done
