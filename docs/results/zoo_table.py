"""A compact table of one bench JSON: each model/mode, Inductor's step, and for each
Optimus configuration its ratio to its Inductor pair (plain or CUDA graphs), kernels and
peak memory against Inductor's. `python docs/results/zoo_table.py run.json [out.json]`
(the second argument: the same table as JSON)."""

from __future__ import annotations

import json
import math
import sys

PAIRS = [
    ("optimus", "inductor"),
    ("optimus-auto", "inductor"),
    ("optimus-packed", "inductor"),
    ("optimus-cudagraphs", "inductor-cudagraphs"),
    ("optimus-auto-cudagraphs", "inductor-cudagraphs"),
]


def main(path: str, out: str | None = None) -> None:
    rows = json.load(open(path))["rows"]
    by = {(r["model"], r["mode"], r["config"]): r for r in rows.values()}
    table = []
    for model, mode in sorted({(k[0], k[1]) for k in by}):
        line = {"model": model, "mode": mode}
        for cfg in ("inductor", "inductor-cudagraphs"):
            r = by.get((model, mode, cfg))
            line[cfg] = r.get("step_ms") if r and r.get("status") == "ok" else None
        for cfg, ref in PAIRS:
            r, b = by.get((model, mode, cfg)), by.get((model, mode, ref))
            if r is None:
                continue
            cell = {"status": r.get("status"), "kernels": r.get("kernels"), "step_ms": r.get("step_ms")}
            if r.get("status") == "ok" and b and b.get("status") == "ok":
                cell["x"] = b["step_ms"] / r["step_ms"]
                if r.get("peak_memory_bytes") and b.get("peak_memory_bytes"):
                    cell["mem"] = r["peak_memory_bytes"] / b["peak_memory_bytes"]
                cell["parity"] = (r.get("parity") or {}).get("ok")
                cell["spread"] = r.get("step_ms_spread")
            else:
                cell["error"] = (r.get("error") or "")[:120]
            line[cfg] = cell
        table.append(line)
    head = f"{'model':<14}{'mode':<6}{'ind ms':>8}{'ind-cg':>8}"
    head += "".join(f"{c.replace('optimus', 'o'):>22}" for c, _ in PAIRS)
    print(head)
    for line in table:
        s = f"{line['model']:<14}{line['mode']:<6}"
        s += "".join(f"{line[c]:>8.3f}" if line.get(c) else f"{'-':>8}" for c in ("inductor", "inductor-cudagraphs"))
        for cfg, _ in PAIRS:
            c = line.get(cfg)
            if not c:
                s += f"{'-':>22}"
            elif "x" in c:
                mem = f"m{c['mem']:.2f}" if "mem" in c else ""
                bad = "" if c.get("parity") else "!"
                s += f"{c['x']:.2f}x/{c['kernels']}/{mem}{bad}".rjust(22)
            else:
                s += f"{'ERR':>22}"
        print(s)
    for cfg, _ in PAIRS:
        xs = [line[cfg]["x"] for line in table if isinstance(line.get(cfg), dict) and "x" in line[cfg]]
        for mode in ("train", "infer"):
            xm = [line[cfg]["x"] for line in table if line["mode"] == mode and isinstance(line.get(cfg), dict) and "x" in line[cfg]]
            if xm:
                g = math.exp(sum(math.log(x) for x in xm) / len(xm))
                print(f"{cfg:<26}{mode:<6} geomean {g:.2f}x over {len(xm)}, min {min(xm):.2f}x")
    errs = [(l["model"], l["mode"], c, l[c]["error"]) for l in table for c, _ in PAIRS if isinstance(l.get(c), dict) and "error" in l[c]]
    for e in errs:
        print("error:", *e)
    if out:
        json.dump(table, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
