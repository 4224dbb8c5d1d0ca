#!/usr/bin/env bash
# H200 run 11 (written 2026-12-01 late night, for the next session with a GPU): ~9.5 minutes.
# The issue-14 targets need rows no other compile disturbs (runs 6-10: identical graphs timed
# 9.4 and 14.5 ms with 7 workers), so this run uses --isolate:
#  1. the probe test with its corrected bound;
#  2. training, every zoo model, inductor / optimus / optimus-auto, 7 workers, --isolate;
#  3. the compact table. Run 12 (gpu-run-12.sh): inference and CUDA graphs the same way.
# fp32, TF32 off. Writes to $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/cache && cp docs/results/h200-profile/*.json $OUT/cache/ && export OPTIMUS_CACHE_DIR=$OUT/cache
timeout 40 python -m pytest -q -p no:cacheprovider tests/planner/test_probe_gpu.py > $OUT/pytest-probe.log 2>&1
echo "probe test exit $?"; tail -1 $OUT/pytest-probe.log
timeout 480 python -m optimus.bench --device cuda --size realistic --quiet --iters 20 --repeats 3 \
    --workers 7 --compile-threads 2 --isolate --model all --mode train --budget-minutes 6.5 \
    --configs inductor,optimus,optimus-auto --json $OUT/h200-run11-train.json > $OUT/bench.log 2>&1
echo "bench exit $?"
python docs/results/zoo_table.py $OUT/h200-run11-train.json $OUT/table.json
