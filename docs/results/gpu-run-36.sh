#!/usr/bin/env bash
# H200 run 36 (2026-12-04, seventh session): with a trial change (not kept; docs/benchmarks.md, run 36) that kept a group's stacked operands
# live to the end of a Torch-IR training graph (saved for the backward). Does `auto`, packed
# and not, now keep training's peak memory within +2% of Inductor's (run 32: auto-packed
# hetero_towers m1.90), and what does it cost in speed? Paired timing, training, two models (a first try with splitcat and "optimus" too ran past its limit compiling).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$(mktemp -d)
RUN_DIR=$R TAG=run36 MODE=train MODELS="hetero_towers towers32" ROUNDS=3 LIMIT=540 \
    CONFIGS=inductor,optimus-auto,optimus-auto-packed bash docs/results/gpu-run-14.sh > $R/run36-train.out 2>&1
tail -n 14 $R/run36-train.out
