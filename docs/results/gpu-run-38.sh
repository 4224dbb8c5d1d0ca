#!/usr/bin/env bash
# H200 run 38 (2026-12-04, eighth session): does the canonicalization rule alone raise splitcat
# training's peak on the GPU, as on the CPU proxy (56.83 -> 77.24 MiB: after
# canonicalize_split_cat_args, AOTAutograd's partitioner saves more)? Paired, training:
# Inductor, only canonicalize_split_cat_args at Torch-IR, and the "vertical" preset.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$(mktemp -d)
ARGS_splitcat='--passes canon={"torch_ir":["canonicalize_split_cat_args"],"aten_ir":"none","inductor_ir":"none"} --passes vertical="vertical"' \
RUN_DIR=$R TAG=run38 MODE=train MODELS=splitcat ROUNDS=3 LIMIT=540 CONFIGS=inductor bash docs/results/gpu-run-14.sh > $R/run38-train.out 2>&1
tail -n 6 $R/run38-train.out
