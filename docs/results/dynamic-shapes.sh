#!/usr/bin/env bash
# The GPU table of docs/dynamic-shapes.md: kernels per step and step time, static shapes
# against dynamic=True, Inductor and Optimus ("all"), small configs, training and inference.
# The static and the dynamic bench run at the same time (kernel counts are exact, step times
# share the GPU and the host). Run from the repository root with $OUT set:
#
#   bash docs/results/dynamic-shapes.sh                                          # towers32, splitcat
#   MODELS=towers32,splitcat,dcnv2,interformer bash docs/results/dynamic-shapes.sh
#
# The published rows ran `optimus` before it packed parameters on CUDA by default:
# CONFIGS=inductor,optimus-unpacked measures that configuration again.
# Writes $OUT/static.json, $OUT/dynamic.json and $OUT/dynamic-compare.json, prints the table.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
D="--model ${MODELS:-towers32,splitcat} --mode infer,train --device cuda --size small --configs ${CONFIGS:-inductor,optimus} --iters 20 --workers 4 --quiet"
timeout ${LIMIT:-70} python -m optimus.tools.bench $D --json $OUT/static.json > $OUT/static.log 2>&1 &
timeout ${LIMIT:-70} python -m optimus.tools.bench $D --dynamic --json $OUT/dynamic.json > $OUT/dynamic.log 2>&1 &
wait
python docs/results/compare_dynamic.py $OUT/static.json $OUT/dynamic.json $OUT/dynamic-compare.json
