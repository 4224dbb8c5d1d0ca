#!/usr/bin/env bash
# H200 run 37 (2026-12-04, eighth session): "auto" training after the planner started pricing
# what a training forward's group does to the backward (docs/planner.md, "Memory"): results
# saved for the backward, batched into one buffer, are freed only after the last member's
# backward (`Liveness.shared_saved_bytes`; run 36: towers32 m1.14). Paired timing, training.
# Run 37a/37b (same command, MODELS and ROUNDS as in docs/benchmarks.md) measured a withdrawn
# second change; for 37b the previous commit's tree ran side by side (RUN_DIR shared, old tree's
# launcher started from its own directory with TAG=old37).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=${RUN_DIR:-$(mktemp -d)}
RUN_DIR=$R TAG=${TAG:-run37} MODE=train MODELS="${MODELS:-towers32 wukong interformer hetero_towers}" ROUNDS=${ROUNDS:-3} \
    LIMIT=${LIMIT:-500} CONFIGS=inductor,optimus-auto bash docs/results/gpu-run-14.sh > $R/${TAG:-run37}-train.out 2>&1
tail -n 14 $R/${TAG:-run37}-train.out
