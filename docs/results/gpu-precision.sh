#!/usr/bin/env bash
# The headline table of docs/benchmarks.md ("fp32 and bf16 autocast"): every zoo model in fp32 and
# under bf16 autocast (optimus.tools.bench.precision), paired timing (docs/results/gpu-paired.py
# --precisions): one process per model and precision, compiling concurrently under a shared lock and
# timing one at a time under the exclusive one, configurations alternated round by round, each against
# Inductor in its own precision. Realistic sizes, the planner priced by the committed H200 profile.
# One invocation is one mode; run from the repository root with $OUT set, e.g.
#
#   MODE=train CG=0 bash docs/results/gpu-precision.sh      # Inductor and "auto", no CUDA graphs
#   MODE=train CG=1 bash docs/results/gpu-precision.sh      # the same pair under CUDA graphs
#   MODE=infer CG=both bash docs/results/gpu-precision.sh   # inference, both pairs in one call
#   MODE=infer CONFIGS=eager,inductor,upstream TAG=base bash docs/results/gpu-precision.sh
#
# Variables: MODE (train or infer), CG (0: inductor,optimus-auto; 1: inductor-cudagraphs,
# optimus-auto-cudagraphs; both: the four), CONFIGS (instead of CG's list; Inductor first),
# CONFIGS_<model> (that model's own list), PRECISIONS (default fp32,amp-bf16; bf16 adds the
# bf16 model), MODELS (default: every zoo model), ROUNDS (3), ITERS (steps per timing, 15),
# LIMIT (seconds per process, 420: the call ends within about LIMIT + 30 s), PAIR (1: one process
# per model with every precision in it, also paired round by round; default 0, one per model and
# precision: shorter compile chains), SPLIT (non-empty: also --time-split, where each step's
# time goes), TAG (names the output), DEVICE/SIZE (cpu/small: a dry run
# of the plumbing). Writes $OUT/$TAG-$MODE-cg$CG.json (merged) and $TAG-$MODE-cg$CG-pieces.tgz
# (per-process JSON and logs), and prints the markdown table last
# (docs/results/precision_table.py, which also merges the pieces' JSON files into one table).
# The base pieces (CONFIGS=eager,inductor,upstream) in training: CONFIGS_splitcat=eager,inductor
# (upstream compiles splitcat's training graph for minutes and holds up every timing). GPU memory:
# a model's processes take turns for their fp64 references (twice fp32's memory: about 19 GB for
# dhen's training step); PAIR=1 halves the processes where memory is short.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCHINDUCTOR_COMPILE_THREADS=1
# transformers for MODELS="hf_bert hf_gpt2", where .gpu_site was carried (docs/results/make_gpu_site.sh)
[ -d .gpu_site ] && export PYTHONPATH=$PYTHONPATH:$PWD/.gpu_site
DEVICE=${DEVICE:-cuda} SIZE=${SIZE:-realistic}
python -c "import sys, torch; print('torch', torch.__version__, torch.cuda.get_device_name() if sys.argv[1] == 'cuda' else 'cpu')" $DEVICE
C=${RUN_DIR:-$(mktemp -d)} && cp docs/results/h200-profile/*.json $C/ && export OPTIMUS_CACHE_DIR=$C
MODE=${MODE:-train} CG=${CG:-0} TAG=${TAG:-precision} PRECISIONS=${PRECISIONS:-fp32,amp-bf16}
case $CG in
  0) DEFAULT_CONFIGS=inductor,optimus-auto ;;
  1) DEFAULT_CONFIGS=inductor-cudagraphs,optimus-auto-cudagraphs ;;
  both) DEFAULT_CONFIGS=inductor,optimus-auto,inductor-cudagraphs,optimus-auto-cudagraphs ;;
  *) echo "CG must be 0, 1 or both (got $CG)" >&2; exit 2 ;;
esac
CONFIGS=${CONFIGS:-$DEFAULT_CONFIGS}
MODELS=${MODELS:-$(python -c "from optimus.tools.models import model_names; print(' '.join(model_names()))")}
if [ "${PAIR:-0}" = 1 ]; then GROUPS_=$PRECISIONS; else GROUPS_=${PRECISIONS//,/ }; fi
NAME=$TAG-$MODE-cg$CG
for m in $MODELS; do
  v=CONFIGS_$m; configs=${!v:-$CONFIGS}
  for p in $GROUPS_; do
    piece=$NAME-$m-${p//,/+}
    timeout ${LIMIT:-420} python docs/results/gpu-paired.py --model $m --modes $MODE --configs $configs \
        --precisions $p --rounds ${ROUNDS:-3} --iters ${ITERS:-15} --device $DEVICE --size $SIZE \
        --lock $C/lock --ref-lock $C/ref-$m.lock ${SPLIT:+--time-split} --json $OUT/$piece.json > $OUT/$piece.log 2>&1 &
  done
done
wait
for f in $OUT/$NAME-*.log; do  # a process that died or ran out of time: its log's last lines
  j=${f%.log}.json
  if [ ! -s $j ] || ! grep -q step_ms $j; then echo "== $(basename $f): no timings"; tail -3 $f; fi
done
# few files come back: the per-process JSON and logs in one archive
(cd $OUT && tar czf $NAME-pieces.tgz $NAME-*.json $NAME-*.log)
python docs/results/precision_table.py $OUT/$NAME.json $(ls $OUT/$NAME-*.json) && (cd $OUT && rm -f $NAME-*.json $NAME-*.log)
