#!/usr/bin/env bash
# H200 run 40 (2026-12-06, eleventh session): the whole zoo and the two Hugging Face models
# (hf_bert: BERT-base, hf_gpt2: GPT-2 124M, realistic sizes, transformers as the machine has
# it) side by side through Inductor, the fixed preset "all" and the planner ("auto"), paired
# (docs/results/gpu-paired.py, via gpu-run-14.sh): the measurement behind making
# passes="auto" the default (issue 14, item 3). One mode per call:
#   MODE=infer CONFIGS=inductor,optimus,optimus-auto,inductor-cudagraphs,optimus-auto-cudagraphs bash docs/results/gpu-run-40.sh
#   MODE=train bash docs/results/gpu-run-40.sh
#   TAG=run40cg MODE=train CONFIGS=inductor-cudagraphs,optimus-auto-cudagraphs LIMIT=420 bash docs/results/gpu-run-40.sh
set -u
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
export TAG=${TAG:-run40} ROUNDS=${ROUNDS:-5} LIMIT=${LIMIT:-540} CONFIGS=${CONFIGS:-inductor,optimus,optimus-auto}
export MODELS=${MODELS:-"splitcat interformer dhen hetero_towers towers32 wukong dcnv2 dlrm hstu hf_bert hf_gpt2"}
bash docs/results/gpu-run-14.sh
