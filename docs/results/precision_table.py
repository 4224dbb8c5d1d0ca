"""The headline table of docs/benchmarks.md from gpu-paired.py's JSON files run with
``--precisions``: per mode, one line per model and precision, a column per configuration, and
under it the targets (rewrites under autocast >= 90% of fp32's, Optimus >= 0.98x Inductor in the
same precision, with and without CUDA graphs, geomeans, accuracy). Markdown, ready to paste.

    python docs/results/precision_table.py OUT.json IN.json...   (OUT: the files merged)

A cell: Inductor's ``k<kernels> <ms> ms`` (and its speed-up over fp32 Inductor: paired round by
round where both ran in one process, else ``~``, from the two medians); an Optimus or upstream configuration's ``<speed-up over Inductor in the same precision>x
[range over rounds] m<peak memory over Inductor's> k<kernels> r<rewrites> (<% of the same
configuration's fp32 rewrites>)``; ``FAIL`` where the first step missed the accuracy rule, ``-``
where the row is missing (not run, or its process ran out of time before timing).
"""
from __future__ import annotations

import json
import math
import sys

TITLES = {"eager": "eager", "inductor": "Inductor", "upstream": "upstream", "optimus-auto": '`"auto"` (default)',
          "optimus": '`"all"`', "inductor-cudagraphs": "CG: Inductor", "optimus-auto-cudagraphs": 'CG: `"auto"`',
          "optimus-cudagraphs": 'CG: `"all"`'}
BASELINES = ("inductor", "inductor-cudagraphs")
MODES = {"train": "Training (forward, backward, SGD step)", "infer": "Inference (forward under torch.no_grad())"}
TARGET_SHARE, TARGET_SPEED = 0.9, 0.98


def split_key(key: str) -> tuple[str, str, str, str]:
    parts = key.split("/")
    return parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else "fp32"


def cell(row: dict | None, fp32_row: dict | None, precision: str) -> str:
    if row is None:
        return "-"
    if "error" in row:
        return "error: " + row["error"].replace("|", "/")[:60]
    fail = "" if (row.get("parity") or {}).get("ok") else " **FAIL**"
    k = f"k{row['kernels']}" if row.get("kernels") is not None else ""
    if row["config"] in BASELINES:
        ms = f"{row['step_ms']:.2f} ms" if row.get("step_ms") is not None else "(not timed)"
        vs = row.get("speedup_vs_fp32")
        if vs:
            ms += f" ({vs['median']:.2f}x fp32)"
        elif precision != "fp32" and row.get("step_ms") and (fp32_row or {}).get("step_ms"):
            ms += f" (~{fp32_row['step_ms'] / row['step_ms']:.2f}x fp32)"  # timed in another process
        return " ".join(filter(None, [k, ms])) + fail
    s = row.get("speedup_vs_inductor")
    text = f"{s['median']:.2f}x [{s['min']:.2f}-{s['max']:.2f}]" if s else "(not timed)"
    if row.get("memory_vs_inductor"):
        text += f" m{row['memory_vs_inductor']:.2f}"
    text += f" {k}" if k else ""
    n = row.get("optimus_rewrites")
    if n is not None and row["config"] not in ("eager", "upstream"):
        base = (fp32_row or {}).get("optimus_rewrites")
        text += f" r{n}" + (f" ({100 * n / base:.0f}%)" if precision != "fp32" and base else "")
    return text + fail


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary(rows: dict, mode: str, precisions: list[str], configs: list[str]) -> list[str]:
    """The targets, per precision: geomean speed-up and rows under 0.98x for each Optimus
    configuration, the rewrites' share of fp32's, accuracy."""
    lines = []
    for p in precisions:
        mine = {k: r for k, r in rows.items() if split_key(k)[1] == mode and split_key(k)[3] == p}
        parts = []
        for c in configs:
            if c in BASELINES or c in ("eager", "upstream"):
                continue
            speeds = {split_key(k)[0]: r["speedup_vs_inductor"]["median"] for k, r in mine.items()
                      if split_key(k)[2] == c and r.get("speedup_vs_inductor")}
            if not speeds:
                continue
            slow = sorted(m for m, v in speeds.items() if v < TARGET_SPEED)
            parts.append(f"{TITLES.get(c, c)}: geomean {geomean(list(speeds.values())):.2f}x over {len(speeds)} models, "
                         f"under {TARGET_SPEED}x: {', '.join(slow) or 'none'}")
            if p != "fp32":
                shares = {}
                for k, r in mine.items():
                    model, _, config, _ = split_key(k)
                    base = rows.get(f"{model}/{mode}/{config}", {}).get("optimus_rewrites")
                    if config == c and base and r.get("optimus_rewrites") is not None:
                        shares[model] = r["optimus_rewrites"] / base
                if shares:
                    low = sorted(f"{m} {100 * v:.0f}%" for m, v in shares.items() if v < TARGET_SHARE)
                    parts.append(f"{TITLES.get(c, c)} rewrites under {100 * TARGET_SHARE:.0f}% of fp32: {', '.join(low) or 'none'}")
        judged = [r for r in mine.values() if r.get("parity")]
        failed = sorted(f"{split_key(k)[0]} {split_key(k)[2]}" for k, r in mine.items()
                        if r.get("parity") and not r["parity"]["ok"])
        errors = sorted(f"{split_key(k)[0]} {split_key(k)[2]}" for k, r in mine.items() if "error" in r)
        parts.append(f"accuracy: {len(judged) - len(failed)}/{len(judged)} rows pass" + (f" (FAIL: {', '.join(failed)})" if failed else ""))
        if errors:
            parts.append(f"errors: {', '.join(errors)}")
        lines.append(f"* **{p}**: " + "; ".join(parts) + ".")
    return lines


def render(rows: dict, meta: dict) -> str:
    out = [f"{meta.get('device', '?')}, torch {meta.get('torch', '?')}, {meta.get('rounds', '?')} rounds of "
           f"{meta.get('iters', '?')} steps."]
    for mode, title in MODES.items():
        keys = [split_key(k) for k in rows if split_key(k)[1] == mode]
        if not keys:
            continue
        models = sorted({k[0] for k in keys})
        precisions = sorted({k[3] for k in keys}, key=lambda p: (p != "fp32", p))
        present = {k[2] for k in keys}
        configs = [c for c in TITLES if c in present] + sorted(present - set(TITLES))
        out += ["", f"**{title}**", "", "| model | precision | " + " | ".join(TITLES.get(c, c) for c in configs) + " |",
                "|---|---|" + "---|" * len(configs)]
        for model in models:
            for p in precisions:
                suffix = "" if p == "fp32" else f"/{p}"
                cells = [cell(rows.get(f"{model}/{mode}/{c}{suffix}"), rows.get(f"{model}/{mode}/{c}"), p) for c in configs]
                if any(c != "-" for c in cells):
                    out.append(f"| {model} | {p} | " + " | ".join(cells) + " |")
        out += [""] + summary(rows, mode, precisions, configs)
    return "\n".join(out) + "\n"


def main(out_path: str, paths: list[str]) -> int:
    rows: dict = {}
    meta: dict = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        rows.update(data["rows"])
        meta = {k: data.get(k) for k in ("torch", "device", "rounds", "iters")}
    with open(out_path, "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)
    sys.stdout.write(render(rows, meta))
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python docs/results/precision_table.py OUT.json IN.json...")
    sys.exit(main(sys.argv[1], sys.argv[2:]))
