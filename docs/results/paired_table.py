"""The table of gpu-paired.py's JSON files: per model and mode, Inductor's step and, for each
Optimus configuration, the median per-round speedup [min-max over rounds], peak memory
against Inductor's (n/a under CUDA graphs), kernels, and whether the first step passed the accuracy check.
`python docs/results/paired_table.py OUT.json IN.json...` (OUT: the files merged)."""
from __future__ import annotations

import json
import sys

BASELINES = ("inductor", "inductor-cudagraphs")


def main(out: str, paths: list[str]) -> None:
    rows: dict = {}
    meta = {}
    for p in paths:
        d = json.load(open(p))
        rows.update(d["rows"])
        meta = {k: d[k] for k in ("torch", "device", "rounds", "iters")}
    json.dump({**meta, "rows": rows}, open(out, "w"), indent=1)
    keys = sorted({tuple(k.split("/")[:2]) for k in rows})
    present = {k.split("/")[2] for k in rows}
    bases = [b for b in BASELINES if b in present]  # Inductor without and with CUDA graphs
    cfgs = sorted(present - set(bases))
    print(f"{'model':14s}{'mode':6s}" + "".join(f"{b + ' ms':>24s}" for b in bases) + "".join(f"  {c:>34s}" for c in cfgs))
    for model, mode in keys:
        line = f"{model:14s}{mode:6s}"
        for b in bases:
            line += f"{rows.get(f'{model}/{mode}/{b}', {}).get('step_ms', float('nan')):24.3f}"
        for c in cfgs:
            r = rows.get(f"{model}/{mode}/{c}", {})
            if "error" in r or "speedup_vs_inductor" not in r:
                line += f"  {('error: ' + r.get('error', 'missing'))[:34]:>34s}"
                continue
            s = r["speedup_vs_inductor"]
            ok = "ok" if (r.get("parity") or {}).get("ok") else "WRONG"
            line += f"  {s['median']:.2f}x [{s['min']:.2f}-{s['max']:.2f}] m{r.get('memory_vs_inductor', float('nan')):.2f} k{r.get('kernels', '?')} {ok}".rjust(36)
        print(line)
    split = [(k, r) for k, r in sorted(rows.items()) if r.get("time_split")]
    if split:  # --time-split: where each step's time goes, ms per step
        parts = list(split[0][1]["time_split"]["host_ms"])
        print(f"\n{'row':44s}{'step':>8s}{'device':>8s}{'prof.':>8s}" + "".join(f"{p[:9]:>10s}" for p in parts))
        for k, r in split:
            t = r["time_split"]
            print(f"{k:44s}{r.get('step_ms', float('nan')):8.3f}{t['device_busy_ms']:8.3f}{t['wall_ms']:8.3f}"
                  + "".join(f"{t['host_ms'][p]:10.3f}" for p in parts))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
