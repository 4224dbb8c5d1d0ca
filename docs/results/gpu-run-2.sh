#!/usr/bin/env bash
# H200 run 2 of 2026-12-01: where device time goes per preset, with and without CUDA
# graphs (towers32 small and realistic, interformer small; inference), and the device profile again (small matmuls now timed
# from a CUDA graph). Writes to $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 40 python -c "
import json, torch
from optimus.planner import costmodel as c
p = c.probe(torch.device('cuda')); print(json.dumps(p.to_json()))
open('$OUT/profile.json', 'w').write(json.dumps(p.to_json(), indent=1))"
P="--presets inductor,vertical,horizontal,fx,all"
timeout 60 python -m optimus.bench.presets --model towers32 --size small --mode infer --cudagraphs $P --json $OUT/t32s-infer-cg.json 2>/dev/null
timeout 60 python -m optimus.bench.presets --model towers32 --size realistic --mode infer --cudagraphs $P --json $OUT/t32r-infer-cg.json 2>/dev/null
timeout 70 python -m optimus.bench.presets --model interformer --size small --mode infer --cudagraphs $P --json $OUT/ifs-infer-cg.json 2>/dev/null
