#!/usr/bin/env bash
# H200 run 14 (2026-12-02): paired timing (docs/results/gpu-paired.py), every zoo model in one
# mode (MODE=infer or train), one process per model: compiles run concurrently, timing one
# model at a time with nothing else running, configurations alternated round by round.
# fp32, TF32 off. Writes $OUT/paired-<model>-<mode>.json/.log and $OUT/run14-<mode>.json.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCHINDUCTOR_COMPILE_THREADS=1
mkdir -p $OUT/cache && cp docs/results/h200-profile/*.json $OUT/cache/ && export OPTIMUS_CACHE_DIR=$OUT/cache
MODE=${MODE:-infer}
MODELS=${MODELS:-"splitcat interformer dhen hetero_towers towers32 wukong dcnv2 dlrm hstu"}
for m in $MODELS; do
  timeout ${LIMIT:-520} python docs/results/gpu-paired.py --model $m --modes $MODE --lock $OUT/lock \
      --json $OUT/paired-$m-$MODE.json > $OUT/paired-$m-$MODE.log 2>&1 &
done
wait
python docs/results/paired_table.py $OUT/run14-$MODE.json $OUT/paired-*-$MODE.json
