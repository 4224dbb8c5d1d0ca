#!/usr/bin/env bash
# H200 run 27, part 2: hetero_towers training and inference, paired (gpu-paired.py through
# gpu-run-14.sh), Inductor and "all", without and with CUDA graphs on both sides (the kernel
# rules now stay on under CUDA graphs). Tables last.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$(mktemp -d)
for mode in train infer; do
  RUN_DIR=$R TAG=run27 MODE=$mode MODELS=${MODELS:-hetero_towers} ROUNDS=${ROUNDS:-3} LIMIT=${LIMIT:-250} \
      CONFIGS=${CONFIGS:-inductor,optimus,inductor-cudagraphs,optimus-cudagraphs} bash docs/results/gpu-run-14.sh > $R/run27-$mode.out 2>&1 &
done
wait
tail -n 6 $R/run27-train.out $R/run27-infer.out
