#!/usr/bin/env bash
# H200 run 10 (2026-12-01 night, after run 9): ~2.5 minutes. The planner now prices the host
# call of an optimus:: kernel op (estimate.CUSTOM_OP_HOST_LAUNCHES): hetero_towers and
# towers32 inference one row at a time (--workers 1), inductor / optimus / optimus-auto,
# with run 8's device profile. Run 9 (same command, before): hetero_towers optimus-auto
# 0.64x Inductor (three grouped linear and three layer norm calls against optimus' one each).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/cache && cp docs/results/h200-profile/*.json $OUT/cache/ && export OPTIMUS_CACHE_DIR=$OUT/cache
timeout 200 python -m optimus.bench --device cuda --size realistic --quiet --iters 20 --repeats 2 --workers 1 \
    --model hetero_towers,towers32 --mode infer --configs inductor,optimus,optimus-auto --json $OUT/h200-run10-serial.json > $OUT/bench-serial.log 2>&1
echo "serial exit $?"
python docs/results/zoo_table.py $OUT/h200-run10-serial.json $OUT/table-serial.json
