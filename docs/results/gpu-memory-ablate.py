"""Where the extra peak memory of a fused configuration comes from, on the GPU: per model, a
training step (forward + backward, no optimizer) under Inductor and under each passes
configuration, with the step's own peak (above what was allocated when it started), the
forward's peak with what it saves for the backward, and the backward's rise above that.
A configuration less one rule (``"all,-batch_layer_norm"``) gives that rule's share.

    python docs/results/gpu-memory-ablate.py OUT.json [MODEL:CONFIG,CONFIG,... ...]

Default: towers32, hetero_towers and tables26 at their realistic sizes, Inductor, ``"all"`` and
``"all"`` less each group rule they take. Prints a table last.
"""
import json
import sys

import torch

import optimus
from optimus.tools.bench.external import get_bench_model

MiB = 2**20
DEFAULT = [
    "towers32:inductor,all,all,-batch_layer_norm,all,-batch_linear",
    "hetero_towers:inductor,all,all,-batched_layer_norm,all,-grouped_linear",
    "tables26:inductor,all,all,-group_embedding_lookups",
]


def configs(spec):
    """'a,b,-c,d' -> ['a', 'b,-c', 'd']: an exclusion belongs to the configuration before it."""
    out = []
    for part in spec.split(","):
        if part.startswith("-") and out:
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def peak(fn):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / MiB, result


def main():
    out_path = sys.argv[1]
    rows = []
    for spec in sys.argv[2:] or DEFAULT:
        name, _, cfgs = spec.partition(":")
        for cfg in configs(cfgs):
            torch._dynamo.reset()
            z = get_bench_model(name, "realistic", device="cuda")
            fn = torch.compile(z.model, fullgraph=True) if cfg == "inductor" else optimus.compile(z.model, passes=cfg, fullgraph=True)

            def step():
                z.loss(fn(*z.inputs)).backward()

            for _ in range(3):
                step()
            step_peak, _ = peak(step)
            fwd_peak, out = peak(lambda: fn(*z.inputs))
            bwd_rise, _ = peak(lambda: z.loss(out).backward())
            del out
            rows.append({"model": name, "config": cfg, "step_peak_mib": step_peak, "forward_peak_mib": fwd_peak,
                         "backward_rise_mib": bwd_rise, "device": torch.cuda.get_device_name()})
            json.dump(rows, open(out_path, "w"), indent=1)
    base = {r["model"]: r["step_peak_mib"] for r in rows if r["config"] == "inductor"}
    print(f"{'model':14s} {'config':32s} {'step MiB':>9s} {'x Ind.':>7s} {'fwd MiB':>8s} {'bwd rise':>9s}")
    for r in rows:
        ratio = r["step_peak_mib"] / base[r["model"]] if base.get(r["model"]) else float("nan")
        print(f"{r['model']:14s} {r['config']:32s} {r['step_peak_mib']:9.2f} {ratio:7.2f} "
              f"{r['forward_peak_mib']:8.2f} {r['backward_rise_mib']:9.2f}")


if __name__ == "__main__":
    main()
