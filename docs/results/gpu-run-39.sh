#!/usr/bin/env bash
# H200 run 39 (2026-12-04, ninth session): the saved-stack change re-landed (a Torch-IR training
# group's stacked operands stay live to the end of the estimate; run 36, withdrawn in 3e8d0ac)
# after the split-spelling fix (run 38b). Paired timing, training, one process per model with its
# own configurations (compiles concurrent, timing one model at a time): splitcat's "all" and
# "auto" (not re-measured since the fix), hetero_towers' packed "auto" (run 32: m1.90),
# towers32's "auto" (run 37: m1.00).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCHINDUCTOR_COMPILE_THREADS=1
C=$(mktemp -d) && cp docs/results/h200-profile/*.json $C/ && export OPTIMUS_CACHE_DIR=$C
TAG=${TAG:-run39} ROUNDS=${ROUNDS:-3} LIMIT=${LIMIT:-540}
run() {  # model, configs
  timeout $LIMIT python docs/results/gpu-paired.py --model $1 --modes train --configs $2 --rounds $ROUNDS \
      --lock $C/lock --json $OUT/paired-$1-train.json > $OUT/paired-$1-train.log 2>&1 &
}
run splitcat ${SPLITCAT:-inductor,optimus,optimus-auto}
run hetero_towers ${HETERO:-inductor,optimus-auto,optimus-auto-packed}
run towers32 ${TOWERS:-inductor,optimus-auto}
wait
python docs/results/paired_table.py $OUT/$TAG-train.json $OUT/paired-*-train.json
(cd $OUT && tar czf $TAG-train-pieces.tgz paired-*-train.* && rm paired-*-train.*)
