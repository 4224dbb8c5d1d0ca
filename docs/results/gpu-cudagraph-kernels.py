"""Do the grouped kernels' rules survive CUDA graphs now? (OPTIMUS_CUDAGRAPH_KERNELS=1)

compile.py leaves the rules that emit our Triton ops out under CUDA graphs, because in H200
run 4 (2026-12-01) cudagraph trees refused their cached tables at the first replay; the
tables have since moved (kernels/runtime/tables.py) and the experiment flag keeps the rules on.
This runs hetero_towers (realistic) on the GPU: per configuration, a fresh model, 3 warm-up
steps, then the forward output and gradients of one more step against an eager copy's (the
same parameters and inputs; training and inference), and the step time over 20 steps
(CUDA-synchronized wall clock, after the warm-up). Prints a line per configuration as it
goes and writes $OUT/cudagraph-kernels.json.

    OPTIMUS_CUDAGRAPH_KERNELS=1 python docs/results/gpu-cudagraph-kernels.py
"""

import copy
import json
import os
import time

import torch

import optimus
from optimus.bench.configs import CONFIGS
from optimus.bench.external import get_bench_model
from optimus.bench.harness import LR, Runner


def sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    dev = os.environ.get("DIAG_DEVICE", "cuda")  # "cpu": a smoke test of this script
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out, rows = os.environ.get("OUT", "."), {}
    # ours first, Inductor's longest compile last: a run cut short still answers the question
    order = [("train", "optimus-cudagraphs"), ("infer", "optimus-cudagraphs"), ("infer", "inductor-cudagraphs"),
             ("train", "inductor-cudagraphs")]
    for mode, cfg in order:
        key = f"hetero_towers/{mode}/{cfg}"
        row = rows[key] = {}
        try:
            torch._dynamo.reset()
            zoo = get_bench_model("hetero_towers", "realistic" if dev == "cuda" else "small", dev, 0)
            eager = copy.deepcopy(zoo.model)
            r = Runner(zoo, CONFIGS[cfg].wrap(zoo.model), mode, LR, cudagraphs=True)
            t = time.perf_counter()
            for _ in range(3):
                r.forward_backward()
            sync(dev)
            row["warmup_s"] = round(time.perf_counter() - t, 2)
            got = r.forward_backward().detach().clone()
            want = eager(*zoo.inputs) if mode == "train" else torch.no_grad()(eager)(*zoo.inputs)
            row["out_max_abs"] = float((got - want.detach()).abs().max())
            if mode == "train":
                for p in eager.parameters():
                    p.grad = None
                zoo.loss(want).backward()
                row["grad_max_abs"] = max(float((p.grad - q.grad).abs().max()) for p, q in zip(zoo.model.parameters(), eager.parameters()))
            sync(dev)
            t = time.perf_counter()
            for _ in range(20):
                r.step()
            sync(dev)
            row["step_ms"] = round((time.perf_counter() - t) / 20 * 1e3, 3)
            rep = optimus.last_report() if cfg.startswith("optimus") else None
            if rep is not None:
                row["grouped_matched"] = sum(g.rules[k].matched for g in rep.graphs for k in ("grouped_linear", "batched_layer_norm") if k in g.rules)
                row["notes"] = [ln.strip() for ln in str(rep).splitlines() if "CUDA graphs" in ln][:4]
        except Exception as e:  # keep the other rows
            row["error"] = f"{type(e).__name__}: {e}"[:1500]
        print(key, json.dumps(row)[:600], flush=True)
        with open(f"{out}/cudagraph-kernels.json", "w") as f:
            json.dump({"torch": torch.__version__, "env": os.environ.get("OPTIMUS_CUDAGRAPH_KERNELS"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
