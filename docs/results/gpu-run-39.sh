#!/usr/bin/env bash
# H200 run 39 (2026-12-04, ninth session): the planner's training estimate for Torch-IR groups
# (docs/planner.md, "Memory"; docs/benchmarks.md, run 39). Run 39: the saved-stack change
# re-landed as it was (run 36, withdrawn in 3e8d0ac) after the split-spelling fix (run 38b).
# Run 39b (TAG=run39b MODELS="splitcat hetero_towers towers32 interformer"): an intermediate
# estimate, withdrawn. Run 39c (the same, CONFIGS_hetero_towers=inductor,optimus-auto-packed):
# the committed code. Run 39d (TAG=run39d MODELS="dhen dcnv2" LIMIT=500): the committed code on
# the two models whose CPU-proxy decisions it changed (not run yet: no device was lent).
# Paired timing, training, one process per model with its own configurations (CONFIGS_<model>, default inductor,optimus-auto; compiles
# concurrent, timing one model at a time).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCHINDUCTOR_COMPILE_THREADS=1
C=$(mktemp -d) && cp docs/results/h200-profile/*.json $C/ && export OPTIMUS_CACHE_DIR=$C
TAG=${TAG:-run39} ROUNDS=${ROUNDS:-3} LIMIT=${LIMIT:-540}
CONFIGS_splitcat=${CONFIGS_splitcat:-inductor,optimus,optimus-auto}
CONFIGS_hetero_towers=${CONFIGS_hetero_towers:-inductor,optimus-auto,optimus-auto-packed}
CONFIGS_towers32=${CONFIGS_towers32:-inductor,optimus-auto}
for m in ${MODELS:-splitcat hetero_towers towers32}; do
  v=CONFIGS_$m
  timeout $LIMIT python docs/results/gpu-paired.py --model $m --modes train --configs ${!v:-inductor,optimus-auto} --rounds $ROUNDS \
      --lock $C/lock --json $OUT/paired-$m-train.json > $OUT/paired-$m-train.log 2>&1 &
done
wait
python docs/results/paired_table.py $OUT/$TAG-train.json $OUT/paired-*-train.json
(cd $OUT && tar czf $TAG-train-pieces.tgz paired-*-train.* && rm paired-*-train.*)
