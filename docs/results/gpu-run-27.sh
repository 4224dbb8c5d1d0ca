#!/usr/bin/env bash
# H200 run 27 (2026-12-03, fifth session), part 1: the lean op registration (kernels/runtime/registration.py)
# and direct launches (kernels/runtime/launch.py). (1) the kernel tests on the GPU (direct launches,
# the column layout's int32 strides, the parameter-list ops); (2) one grouped op call's host time
# by layer with direct launches off and on (gpu-op-host.py). Part 2 is gpu-run-27b.sh.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 260 python -m pytest -q -p no:cacheprovider -m gpu tests/kernels/runtime/test_runtime_launch.py \
    tests/kernels/test_kernels_columns.py tests/kernels/test_kernels_param_ops.py > $OUT/run27-tests.log 2>&1
for d in 0 1; do
  OPTIMUS_KERNELS_DIRECT_LAUNCH=$d DIAG_TAG=-direct$d timeout 100 python docs/results/gpu-op-host.py > $OUT/run27-op-host-direct$d.log 2>&1
done
grep -E "passed|failed|error" $OUT/run27-tests.log | tail -2
paste $OUT/run27-op-host-direct0.log $OUT/run27-op-host-direct1.log | tail -17
