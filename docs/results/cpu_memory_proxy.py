"""CPU proxy for the planner's memory target (docs/planner.md, "Memory").

Compiles a zoo model (or an external one: hf_bert, hf_gpt2) on the CPU with the planner priced for the H200 (the committed device
profile) and the kernel-op rules on, runs two steps, then measures one step's own peak of
tensor memory (profiler allocation events, ``optimus.tools.measure.peak_tensor_memory``).

    python docs/results/cpu_memory_proxy.py MODEL infer|train inductor,all,auto[,all-packed,auto-packed]

Prints one line per configuration: the peak and the planner's decisions (rule:members:Y/n).
CPU Inductor fuses differently from GPU Inductor: a proxy, not the H200's figure.
"""
import json
import os
import sys

os.environ["OPTIMUS_KERNEL_RULES_ON_CPU"] = "1"
import torch  # noqa: E402

import optimus  # noqa: E402
from optimus.tools import measure  # noqa: E402
from optimus.tools.bench.external import get_bench_model  # noqa: E402  (zoo and external models)
from optimus.planner import costmodel  # noqa: E402

PROFILE = os.path.join(os.path.dirname(__file__), "h200-profile", "profile-NVIDIA_H200_2_11_0_cu130.json")
costmodel.set_profile("cpu", costmodel.DeviceProfile.from_json(json.load(open(PROFILE))))
name, mode = sys.argv[1], sys.argv[2]
for cfg in sys.argv[3].split(","):
    torch._dynamo.reset()
    z = get_bench_model(name, "realistic", device="cpu")
    passes, _, packed = cfg.partition("-")
    fn = (torch.compile(z.model, fullgraph=True) if cfg == "inductor"
          else optimus.compile(z.model, passes=passes, fullgraph=True, pack_parameters=packed == "packed"))

    def step():
        if mode == "infer":
            with torch.no_grad():
                return fn(*z.inputs)
        out = fn(*z.inputs)
        z.loss(out).backward() if hasattr(z, "loss") else (out if isinstance(out, torch.Tensor) else out[0]).float().sum().backward()

    step()
    step()
    peak = measure.peak_tensor_memory(step)
    rep = optimus.last_report() if cfg != "inductor" else None
    decisions = [f"{d['rule']}:{d['members']}:{'Y' if d['accepted'] else 'n'}" for g in (rep.graphs if rep else []) for d in g.decisions]
    print(f"{name} {mode} {cfg:9s} peak {peak / 2**20:8.2f} MiB  {' '.join(decisions)[:300]}")
