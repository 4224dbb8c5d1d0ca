#!/usr/bin/env bash
# Compile time (first step) of inductor, optimus (passes="all") and optimus-auto on every zoo
# model in one mode (MODE=infer or train): a fresh process per row, every compile cache off,
# LANES processes at a time (models dealt round-robin to lanes; within a lane a model's three
# configurations run back to back, their order rotated model by model). The planner's
# calibration is the committed H200 profile (as in the benchmark), so no probe runs.
# Writes $OUT/$TAG-$MODE.jsonl and .json, prints the table last.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCHINDUCTOR_FORCE_DISABLE_CACHES=1
C=$(mktemp -d) && cp docs/results/h200-profile/*.json $C/ && export OPTIMUS_CACHE_DIR=$C
MODE=${MODE:-infer} TAG=${TAG:-compile} LANES=${LANES:-3}
MODELS=(${MODELS:-splitcat interformer dhen hetero_towers towers32 wukong dcnv2 dlrm hstu})
CONFIGS=(inductor optimus optimus-auto)
lane() {
  local i=$1 j=0
  for ((k = i; k < ${#MODELS[@]}; k += LANES)); do
    for c in 0 1 2; do
      cfg=${CONFIGS[$(((c + j) % 3))]}
      timeout ${LIMIT:-300} python docs/results/gpu-compile-time.py --model ${MODELS[$k]} --mode $MODE --config $cfg 2>>$OUT/$TAG-$MODE-lane$i.log >> $OUT/$TAG-$MODE-lane$i.jsonl
    done
    j=$((j + 1))
  done
}
for ((i = 0; i < LANES; i++)); do lane $i & done
wait
cat $OUT/$TAG-$MODE-lane*.jsonl > $OUT/$TAG-$MODE.jsonl && rm $OUT/$TAG-$MODE-lane*.jsonl
python docs/results/gpu-compile-time.py --table $OUT/$TAG-$MODE.jsonl
