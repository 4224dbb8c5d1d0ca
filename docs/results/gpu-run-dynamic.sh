#!/usr/bin/env bash
# H200: kernels per step and step time, static shapes vs dynamic=True (issue 13 targets:
# kernels within 10%, step time within 5%). Four zoo models, small configs, training and
# inference, Inductor and Optimus. About 3 minutes with 6 workers. Writes to $OUT and prints a
# comparison table last.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
M="--model towers32,splitcat,dcnv2,interformer --mode infer,train --device cuda --size small --configs inductor,optimus --iters 30 --workers 6"
timeout 110 python -m optimus.bench $M --budget-minutes 1.7 --quiet --json $OUT/static.json > $OUT/static.log 2>&1
timeout 110 python -m optimus.bench $M --budget-minutes 1.7 --quiet --dynamic --json $OUT/dynamic.json > $OUT/dynamic.log 2>&1
python docs/results/compare_dynamic.py $OUT/static.json $OUT/dynamic.json $OUT/dynamic-compare.json
