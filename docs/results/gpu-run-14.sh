#!/usr/bin/env bash
# H200 run 14 (2026-12-02): paired timing (docs/results/gpu-paired.py), every zoo model in one
# mode (MODE=infer or train), one process per model: compiles run concurrently, timing one
# model at a time with nothing else running, configurations alternated round by round.
# fp32, TF32 off. Writes $OUT/$TAG-<mode>.json (merged) and $TAG-<mode>-pieces.tgz (per model JSON
# and logs). CONFIGS, MODELS, ROUNDS, LIMIT (seconds per model process) override the defaults;
# ARGS_<model> adds arguments to that model's process (e.g. --passes NAME=JSON --code DIR);
# launchers given one RUN_DIR share its lock (an inference and a training launcher side by side).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCHINDUCTOR_COMPILE_THREADS=1
C=${RUN_DIR:-$(mktemp -d)} && cp docs/results/h200-profile/*.json $C/ && export OPTIMUS_CACHE_DIR=$C
MODE=${MODE:-infer} CONFIGS=${CONFIGS:-inductor,optimus,optimus-auto} TAG=${TAG:-run14}
MODELS=${MODELS:-"splitcat interformer dhen hetero_towers towers32 wukong dcnv2 dlrm hstu"}
for m in $MODELS; do
  v=ARGS_$m; extra=${!v:-}
  timeout ${LIMIT:-520} python docs/results/gpu-paired.py --model $m --modes $MODE --configs $CONFIGS --rounds ${ROUNDS:-7} \
      --lock $C/lock --json $OUT/paired-$m-$MODE.json $extra > $OUT/paired-$m-$MODE.log 2>&1 &
done
wait
python docs/results/paired_table.py $OUT/$TAG-$MODE.json $OUT/paired-*-$MODE.json
# few files come back: the per-model JSON and logs in one archive
(cd $OUT && tar czf $TAG-$MODE-pieces.tgz paired-*-$MODE.* && rm paired-*-$MODE.*)
