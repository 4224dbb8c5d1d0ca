"""The table of gpu-paired.py's JSON files: per model and mode, Inductor's step and, for each
Optimus configuration, the median per-round speedup [min-max over rounds], peak memory
against Inductor's, kernels, and whether the first step passed the accuracy check.
`python docs/results/paired_table.py OUT.json IN.json...` (OUT: the files merged)."""
from __future__ import annotations

import json
import sys


def main(out: str, paths: list[str]) -> None:
    rows: dict = {}
    meta = {}
    for p in paths:
        d = json.load(open(p))
        rows.update(d["rows"])
        meta = {k: d[k] for k in ("torch", "device", "rounds", "iters")}
    json.dump({**meta, "rows": rows}, open(out, "w"), indent=1)
    keys = sorted({tuple(k.split("/")[:2]) for k in rows})
    cfgs = sorted({k.split("/")[2] for k in rows} - {"inductor"})
    print(f"{'model':14s}{'mode':6s}{'inductor ms':>12s}" + "".join(f"  {c:>34s}" for c in cfgs))
    for model, mode in keys:
        ind = rows.get(f"{model}/{mode}/inductor", {})
        line = f"{model:14s}{mode:6s}{ind.get('step_ms', float('nan')):12.3f}"
        for c in cfgs:
            r = rows.get(f"{model}/{mode}/{c}", {})
            if "error" in r or "speedup_vs_inductor" not in r:
                line += f"  {('error: ' + r.get('error', 'missing'))[:34]:>34s}"
                continue
            s = r["speedup_vs_inductor"]
            ok = "ok" if (r.get("parity") or {}).get("ok") else "WRONG"
            line += f"  {s['median']:.2f}x [{s['min']:.2f}-{s['max']:.2f}] m{r.get('memory_vs_inductor', float('nan')):.2f} k{r.get('kernels', '?')} {ok}".rjust(36)
        print(line)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
