#!/usr/bin/env bash
# H200 run 12 (written 2026-12-01 late night, for the next session with a GPU): ~9.5 minutes.
# The issue-14 targets need rows no other compile disturbs (runs 6-10: identical graphs timed
# 9.4 and 14.5 ms with 7 workers), so this run uses --isolate:
#  1. inference, every zoo model, inductor / optimus / optimus-auto / inductor-cudagraphs / optimus-auto-cudagraphs, and training under CUDA graphs (inductor-cudagraphs / optimus-auto-cudagraphs), 7 workers, --isolate;
#  2. the compact tables (run 11: training without CUDA graphs; rows the budget misses: run again with --skip-existing).
# fp32, TF32 off. Writes to $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/cache && cp docs/results/h200-profile/*.json $OUT/cache/ && export OPTIMUS_CACHE_DIR=$OUT/cache
timeout 250 python -m optimus.bench --device cuda --size realistic --quiet --iters 20 --repeats 3 \
    --workers 7 --compile-threads 2 --isolate --model all --mode infer --budget-minutes 3.5 \
    --configs inductor,optimus,optimus-auto,inductor-cudagraphs,optimus-auto-cudagraphs --json $OUT/h200-run12-infer.json > $OUT/bench.log 2>&1
echo "bench exit $?"
timeout 220 python -m optimus.bench --device cuda --size realistic --quiet --iters 20 --repeats 3 \
    --workers 7 --compile-threads 2 --isolate --model all --mode train --budget-minutes 2.8 \
    --configs inductor-cudagraphs,optimus-auto-cudagraphs --json $OUT/h200-run12-cg.json > $OUT/bench-cg.log 2>&1
echo "cudagraphs bench exit $?"
python docs/results/zoo_table.py $OUT/h200-run12-cg.json $OUT/table-cg.json
python docs/results/zoo_table.py $OUT/h200-run12-infer.json $OUT/table.json
