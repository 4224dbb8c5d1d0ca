#!/usr/bin/env bash
# H200 run 13 (2026-12-02): the memory model that leaves out what Inductor fuses and judges a
# group on the graph it produces (optimus/planner/memory.py), --isolate. Run 13 itself measured
# an intermediate version (docs/benchmarks.md); run it again on main to check the memory rows and
# splitcat's accuracy with "auto":
#  1. inference, every zoo model, inductor / optimus / optimus-auto / inductor-cudagraphs / optimus-auto-cudagraphs;
#  2. training of the models whose memory missed in run 11, inductor / optimus-auto.
# fp32, TF32 off. Writes to $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/cache && cp docs/results/h200-profile/*.json $OUT/cache/ && export OPTIMUS_CACHE_DIR=$OUT/cache
timeout 270 python -m optimus.bench --device cuda --size realistic --quiet --iters 20 --repeats 3 \
    --workers 7 --compile-threads 2 --isolate --model all --mode infer --budget-minutes 3.8 \
    --configs inductor,optimus,optimus-auto,inductor-cudagraphs,optimus-auto-cudagraphs --json $OUT/h200-run13-infer.json > $OUT/bench.log 2>&1
echo "bench exit $?"
timeout 190 python -m optimus.bench --device cuda --size realistic --quiet --iters 20 --repeats 3 \
    --workers 7 --compile-threads 2 --isolate --model towers32,hetero_towers,dlrm,interformer,dcnv2,hstu --mode train --budget-minutes 2.6 \
    --configs inductor,optimus-auto --json $OUT/h200-run13-train.json > $OUT/bench-train.log 2>&1
echo "train bench exit $?"
python docs/results/zoo_table.py $OUT/h200-run13-train.json $OUT/table-train.json
python docs/results/zoo_table.py $OUT/h200-run13-infer.json $OUT/table.json
