#!/usr/bin/env bash
# Issue 15 (branch wip/hfuse): training kernels per step and step time, Optimus against
# Inductor, without and with CUDA graphs, for the towers of distinct widths (hetero_towers,
# the model the grouped_linear / batched_layer_norm rules are for), towers32 (uniform:
# stack + bmm, plus the gradient-layout rule) and splitcat. Small configs (the kernel
# targets of issue 15 are per step, about the same at both sizes), then hetero_towers
# realistic for the step-time target. Rows go to $OUT/hfuse-train.json; each bench call
# prints its table last. About 3 minutes on the H200 (4 compile workers; --budget-minutes
# stops starting rows that would overrun, so late rows may be missing: rerun with
# --skip-existing to fill them in).
#
#   OUT=/tmp/out bash docs/results/gpu-hfuse.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
CFG=inductor,optimus,optimus-auto,inductor-cudagraphs,optimus-cudagraphs
timeout 150 python -m optimus.bench --model hetero_towers,towers32,splitcat --mode train --size small \
    --configs $CFG --iters 20 --warmup 3 --workers 4 --budget-minutes 2 --json $OUT/hfuse-train.json 2>&1 | tail -20
timeout 60 python -m optimus.bench --model hetero_towers --mode train --size realistic \
    --configs inductor,optimus --iters 20 --warmup 3 --workers 2 --budget-minutes 0.8 --json $OUT/hfuse-train-realistic.json 2>&1 | tail -6
