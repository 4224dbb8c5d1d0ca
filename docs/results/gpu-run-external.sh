#!/usr/bin/env bash
# H200: the external models (TorchRec DLRM/DLRM_DCN/DeepFM, HF BERT/GPT-2; realistic
# sizes) through eager, inductor and optimus, training and inference. Writes
# $OUT/h200-external.json and prints the table. Models whose library is not on the
# machine get a "skipped" line (TorchRec: not carried, fbgemm-gpu is too large);
# transformers comes from .gpu_site when it was carried (docs/results/make_gpu_site.sh).
# Run with the device tool: carry [".gpu_site"], command "bash docs/results/gpu-run-external.sh".
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# .gpu_site leaves out numpy, filelock, fsspec, typing_extensions: PYTHONPATH comes before
# site-packages, so those stay the machine's own
[ -d .gpu_site ] && export PYTHONPATH=$PYTHONPATH:$PWD/.gpu_site
python -m optimus.tools.bench --suite external --mode train,infer --device cuda --size realistic \
    --configs ${CONFIGS:-eager,inductor,optimus} --workers 4 --compile-threads 4 \
    --budget-minutes ${BUDGET:-8.5} --quiet --json $OUT/h200-external.json
python -m optimus.tools.bench.report $OUT/h200-external.json > $OUT/h200-external.md 2>/dev/null || true
