#!/usr/bin/env bash
# The zoo tables of docs/benchmarks.md ("Current figures"): paired timing
# (docs/results/gpu-paired.py) of every zoo model in one mode, one process per model: compiles
# run concurrently, timing one model at a time with nothing else running, configurations
# alternated round by round. fp32, TF32 off, realistic sizes, the planner priced by the
# committed H200 profile. Run from the repository root with $OUT set, e.g.
#
#   MODE=train CONFIGS=inductor,optimus,optimus-auto ROUNDS=5 LIMIT=540 bash docs/results/zoo-paired.sh
#
# Variables: MODE (infer or train), CONFIGS (bench configurations, Inductor first),
# CONFIGS_<model> (that model's own list), MODELS, ROUNDS, LIMIT (seconds per model process),
# ARGS_<model> (more arguments to that model's process, e.g. --passes NAME=JSON or --code DIR),
# TAG (names the output), SPLIT (non-empty: also --time-split, where each step's time goes), RUN_DIR (launchers given one RUN_DIR share its lock: an inference and
# a training launcher side by side). OPTIMUS_CUDAGRAPH_KERNELS=1 keeps the kernel-op rules and
# packed weights on under CUDA graphs. Writes $OUT/$TAG-$MODE.json (merged) and
# $TAG-$MODE-pieces.tgz (per-model JSON and logs), and prints the table last.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCHINDUCTOR_COMPILE_THREADS=1
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
C=${RUN_DIR:-$(mktemp -d)} && cp docs/results/h200-profile/*.json $C/ && export OPTIMUS_CACHE_DIR=$C
MODE=${MODE:-infer} CONFIGS=${CONFIGS:-inductor,optimus,optimus-auto} TAG=${TAG:-zoo}
MODELS=${MODELS:-"splitcat interformer dhen hetero_towers towers32 wukong dcnv2 dlrm hstu"}
for m in $MODELS; do
  v=ARGS_$m; extra=${!v:-}
  v=CONFIGS_$m; configs=${!v:-$CONFIGS}
  timeout ${LIMIT:-520} python docs/results/gpu-paired.py --model $m --modes $MODE --configs $configs --rounds ${ROUNDS:-7} \
      --lock $C/lock --json $OUT/paired-$m-$MODE.json ${SPLIT:+--time-split} $extra > $OUT/paired-$m-$MODE.log 2>&1 &
done
wait
python docs/results/paired_table.py $OUT/$TAG-$MODE.json $OUT/paired-*-$MODE.json
# few files come back: the per-model JSON and logs in one archive
(cd $OUT && tar czf $TAG-$MODE-pieces.tgz paired-*-$MODE.* && rm paired-*-$MODE.*)
