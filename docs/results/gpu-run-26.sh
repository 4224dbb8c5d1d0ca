#!/usr/bin/env bash
# H200 run 26 (2026-12-03, fifth session): (1) the kernel tests on the GPU, the int32 row strides
# of the column layout (ca83033) and the parameter-list ops included; (2) where one grouped op
# call's host time goes (gpu-op-host.py); (3) whether the kernel rules survive CUDA graphs now
# (gpu-cudagraph-kernels.py, OPTIMUS_CUDAGRAPH_KERNELS=1). Logs and JSON to $OUT, tables last.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 150 python -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_kernels_columns.py \
    tests/kernels/test_kernels_param_ops.py tests/kernels/test_kernels_gpu.py > $OUT/run26-tests.log 2>&1
timeout 120 python docs/results/gpu-op-host.py --profile > $OUT/run26-op-host.log 2>&1
OPTIMUS_CUDAGRAPH_KERNELS=1 TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 240 \
    python docs/results/gpu-cudagraph-kernels.py > $OUT/run26-cudagraph.log 2>&1
tail -2 $OUT/run26-tests.log
cut -c1-300 $OUT/run26-cudagraph.log | tail -6
tail -18 $OUT/run26-op-host.log
