#!/usr/bin/env bash
# H200 run 36 (2026-12-04, seventh session): the planner now keeps a group's stacked operands
# live to the end of a Torch-IR training graph (saved for the backward). Does `auto`, packed
# and not, now keep training's peak memory within +2% of Inductor's (run 32: auto-packed
# hetero_towers m1.90), and what does it cost in speed? Paired timing, training, three models.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$(mktemp -d)
RUN_DIR=$R TAG=run36 MODE=train MODELS="hetero_towers towers32 splitcat" ROUNDS=3 LIMIT=450 \
    CONFIGS=inductor,optimus,optimus-auto,optimus-auto-packed bash docs/results/gpu-run-14.sh > $R/run36-train.out 2>&1
tail -n 14 $R/run36-train.out
