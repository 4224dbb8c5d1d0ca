"""Which inputs does a CUDA-graph replay copy, packed and not? (docs/packing.md)

A profile had a packed towers32 replay spend 414 us of host time in
``aten::_foreach_copy_`` against 92 us unpacked: cudagraph trees copy every input it does not
treat as static into the graph's own buffer before each replay. This compiles towers32 and
hetero_towers (realistic, inference) with ``mode="reduce-overhead"`` packed and not, runs three steps,
and prints per recorded graph node how many inputs are static and how many are copied, and
how many parameters are not 16-byte aligned (Inductor copies those).

    OPTIMUS_CUDAGRAPH_KERNELS=1 python docs/results/gpu-cg-static-inputs.py
"""
import json
import os

import torch

import optimus
from optimus.tools.bench.external import get_bench_model
from torch._inductor import cudagraph_trees


def nodes(manager):
    todo = list(manager.roots.values()) if isinstance(manager.roots, dict) else list(manager.roots)
    out = []
    while todo:
        n = todo.pop()
        if isinstance(n, list):
            todo.extend(n)
            continue
        out.append(n)
        kids = getattr(n, "children", {})
        for v in (kids.values() if isinstance(kids, dict) else kids):
            todo.extend(v if isinstance(v, list) else [v])
    return out


rows = {}
for name, pack in [(m, p) for m in ("towers32", "hetero_towers") for p in (False, True)]:
    torch._dynamo.reset()
    zoo = get_bench_model(name, "realistic", "cuda", 0)
    model = zoo.model
    compiled = optimus.compile(model, mode="reduce-overhead", pack_parameters=pack)
    with torch.no_grad():
        for _ in range(3):
            torch.compiler.cudagraph_mark_step_begin()
            compiled(*zoo.inputs)
    torch.cuda.synchronize()
    mgr = cudagraph_trees.get_container(torch.cuda.current_device()).tree_manager
    info = []
    for n in nodes(mgr):
        static = getattr(n, "static_input_idxs", None)
        copied = getattr(n, "non_static_input_idx", None)
        info.append({"static": len(static) if static is not None else None, "copied": len(copied) if copied is not None else None})
    params = list(model.parameters())
    rows[f"{name} packed={pack}"] = {"nodes": info, "params": len(params),
                              "misaligned_params": sum(p.data_ptr() % 16 != 0 for p in params),
                              "notes": [n for n in compiled.optimus_report.notes if "pack" in n][:3]}
    print(f"{name} packed={pack}", json.dumps(rows[f"{name} packed={pack}"])[:900], flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "cg-static-inputs.json"), "w") as f:
    json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)
