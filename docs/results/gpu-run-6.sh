#!/usr/bin/env bash
# H200 run 6 (2026-12-01, night): one call of ~9.5 minutes.
#  1. the GPU kernel tests of fp32 precision (grouped-linear products exact unless TF32 is allowed);
#  2. the whole zoo, training and inference, realistic sizes: inductor / optimus ("all") /
#     optimus-auto / optimus-packed, and under CUDA graphs inductor / optimus / optimus-auto
#     (7 compile workers, timed sections one at a time, median of 2 medians of 20 steps);
#  3. the compact table (docs/results/zoo_table.py).
# fp32, TF32 off. Writes to $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD OPTIMUS_CACHE_DIR=$OUT/optimus-cache
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
timeout 80 python -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_gpu.py -k "fp32_precision or float32" > $OUT/pytest-gpu.log 2>&1
echo "gpu tests exit $?"; tail -3 $OUT/pytest-gpu.log
C="--model all --device cuda --size realistic --quiet --workers 7 --compile-threads 2 --iters 20 --repeats 2"
timeout ${BENCH_S:-450} python -m optimus.bench $C --mode train,infer --budget-minutes ${BUDGET:-6.3} \
    --configs inductor,optimus,optimus-auto,optimus-packed,inductor-cudagraphs,optimus-cudagraphs,optimus-auto-cudagraphs \
    --json $OUT/h200-run6.json > $OUT/bench.log 2>&1
echo "bench exit $?"
python docs/results/zoo_table.py $OUT/h200-run6.json $OUT/table.json
