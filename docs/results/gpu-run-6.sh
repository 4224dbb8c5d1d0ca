#!/usr/bin/env bash
# H200 run 6 (written 2026-12-01 night, for the next session with a GPU): one call of ~9.5 minutes.
#  1. the GPU kernel tests (fp32 products exact unless TF32 is allowed, through either torch API;
#     per-stream tables; cudagraph trees with the grouped ops; kernel review fixes);
#  2. the whole zoo, training and inference, realistic sizes: inductor / optimus ("all") /
#     optimus-auto / optimus-packed, and under CUDA graphs inductor / optimus / optimus-auto
#     (7 compile workers, timed sections one at a time, median of 2 medians of 20 steps);
#  3. the compact table (docs/results/zoo_table.py).
# fp32, TF32 off. Writes to $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD OPTIMUS_CACHE_DIR=$OUT/optimus-cache
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
# the GPU kernel tests but the int32-limit ones (4 GiB tensors, minutes of autotuning: run 7)
timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_gpu.py -k "not int32" > $OUT/pytest-gpu.log 2>&1
echo "gpu tests exit $?"; tail -15 $OUT/pytest-gpu.log | grep -E "passed|failed|FAILED|Error" | head -12
C="--model all --device cuda --size realistic --quiet --workers 7 --compile-threads 2 --iters 20 --repeats 2"
timeout ${BENCH_S:-400} python -m optimus.bench $C --mode train,infer --budget-minutes ${BUDGET:-5.6} \
    --configs inductor,optimus,optimus-auto,optimus-packed,inductor-cudagraphs,optimus-cudagraphs,optimus-auto-cudagraphs \
    --json $OUT/h200-run6.json > $OUT/bench.log 2>&1
echo "bench exit $?"
python docs/results/zoo_table.py $OUT/h200-run6.json $OUT/table.json
