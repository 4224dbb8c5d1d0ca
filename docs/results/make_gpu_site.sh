#!/usr/bin/env bash
# Build .gpu_site/: Hugging Face transformers (and what it imports) for the H200 machine,
# which has torch 2.11 and no way to install. The device tool carries ignored paths of
# at most 64 MiB in all; this folder is ~42 MiB. Run HERE (not on the GPU machine), from
# the repository root, with a Python of the GPU machine's version (3.11: /work/venv211).
#
#   bash docs/results/make_gpu_site.sh [PYTHON]      # default /work/venv211/bin/python
#   du -sh .gpu_site                                   # must stay well under 64M
#
# Then on the GPU machine: PYTHONPATH=$PWD/.gpu_site (see docs/results/gpu-run-external.sh).
set -euo pipefail
PY=${1:-/work/venv211/bin/python}  # NOTE: the H200 runs CPython 3.12; docs/models.md ("External models") gives the 3.12 build
rm -rf .gpu_site
PIP_CONFIG_FILE=/dev/null "$PY" -m pip install -q --target .gpu_site "transformers==5.24.0"
cd .gpu_site
# already on the GPU machine (torch's and optimus's own dependencies): keep theirs
rm -rf numpy numpy.libs numpy-*.dist-info filelock filelock-*.dist-info fsspec fsspec-*.dist-info \
       typing_extensions.py typing_extensions-*.dist-info bin
# only used by downloads and the command-line tools, not by building a model from a config
rm -rf hf_xet hf_xet-*.dist-info pygments pygments-*.dist-info rich rich-*.dist-info \
       markdown_it markdown_it_py-*.dist-info mdurl mdurl-*.dist-info typer typer-*.dist-info \
       shellingham shellingham-*.dist-info click click-*.dist-info
# every model family but the two the bench builds (and the auto classes)
find transformers/models -mindepth 1 -maxdepth 1 -type d ! -name auto ! -name bert ! -name gpt2 -exec rm -rf {} +
find . -name __pycache__ -prune -exec rm -rf {} +
cd ..
du -sh .gpu_site
PYTHONPATH=$PWD/.gpu_site "$PY" -c "
import torch
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel
m = BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=64, num_labels=1))
g = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, bos_token_id=63, eos_token_id=63))
ids = torch.randint(0, 64, (2, 8))
print('ok: transformers from .gpu_site builds BERT', tuple(m(input_ids=ids).logits.shape),
      'and GPT-2', tuple(g(input_ids=ids).logits.shape), 'with torch', torch.__version__)"
