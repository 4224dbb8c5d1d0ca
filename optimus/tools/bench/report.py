"""Render bench results as markdown: ``python -m optimus.tools.bench.report results.json [more.json ...]``.

Prints one table per mode (training, inference) and precision (fp32, amp-bf16, ...) with
every model and configuration, preceded by the commands, dates, versions and devices that
produced the rows. Several
files (e.g. one per piece of a GPU run) are merged first; a later file's row replaces an
earlier one for the same model/mode/config. ``--merge-into FILE`` also writes the merged
results as one JSON file.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from ..models import MODELS
from .configs import CONFIG_NAMES
from .accuracy import RULE_TEXT
from .precision import PRECISION_NAMES, PRECISIONS, row_precision
from .results import (empty, has_cudagraph_rows, load, merge, row_cells, rows_by, save, several_precisions, table_header,
                      validate)

MODE_TITLES = {"train": "Training (forward + backward + SGD step)", "infer": "Inference (forward, no_grad)"}


def _fmt(x: Any, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _cell_error(row: dict[str, Any]) -> str:
    msg = (row.get("error") or "error").replace("|", "\\|").replace("\n", " ")
    return f"{row.get('status') or 'error'}: {msg[:160]}"


def provenance(data: dict[str, Any]) -> list[str]:
    envs: dict[tuple, list[str]] = {}
    for row in data["rows"].values():
        env = row.get("env", {})
        key = (env.get("device_name"), env.get("torch"), env.get("triton"), env.get("python"), row.get("size"))
        envs.setdefault(key, []).append(env.get("date", "?"))
    lines = []
    for (device, torch_v, triton_v, py, size), dates in envs.items():
        span = min(dates) if min(dates) == max(dates) else f"{min(dates)} to {max(dates)}"
        lines.append(f"- Device: {device}; torch {torch_v}; triton {triton_v}; Python {py}; "
                     f"{size} configs; measured {span}")
    return lines


def accuracy_legend(data: dict[str, Any]) -> list[str]:
    """What the accuracy column means, for each rule that judged a row of ``data``."""
    rules = {(r.get("parity") or {}).get("rule", "max-rel") for r in data["rows"].values() if r.get("parity")}
    lines = []
    if rules - {"max-rel"}:
        tols = sorted({r["parity"]["tol"] for r in data["rows"].values() if (r.get("parity") or {}).get("rule")})
        lines.append("Accuracy (TF32 off; tol " + ", ".join(f"{t:g}" for t in tols) + "): " + RULE_TEXT
                     + ". The cell gives the worst RMSE(fp64, config) / RMSE(fp64, eager fp32) over the outputs and "
                     "gradients the RMSE rule judged, and its limit; `allclose`: every tensor within tol of eager fp32.")
        if any(row_precision(r) not in ("fp32", "tf32") for r in data["rows"].values()):
            lines.append("In another precision, eager fp32 is eager in that precision (under the same autocast, or "
                         "the bf16 model), tol 1e-3 under autocast, and the multiplier 3 for bf16/fp16 results; "
                         "the fp64 reference is the same.")
    if "max-rel" in rules:
        lines.append("`max-rel` cells (older rows): max |config - eager| / max |eager| per tensor, limit 2e-3 "
                     "(2e-2 with TF32).")
    return lines


def render(data: dict[str, Any]) -> str:
    out: list[str] = []
    out += provenance(data)
    if data.get("commands"):
        out += ["", "Commands:", "", "```"] + list(data["commands"]) + ["```"]
    up = next((r.get("upstream_options") for r in data["rows"].values() if r.get("upstream_options")), None)
    if up:
        out += ["", "`upstream` enabled these options: pre-grad " + ", ".join(f"`{n}`" for n in up["pre_grad"])
                + "; post-grad " + ", ".join(f"`{n}`" for n in up["post_grad"]) + "."]
    legend = accuracy_legend(data)
    if legend:
        out += [""] + legend
    notes = _run_notes(data)
    if notes:
        out += [""] + notes
    grouped = rows_by(data)
    cg = has_cudagraph_rows(data)
    header = ["model", *table_header(cg)]
    present_precisions = {p for (_, _, p) in grouped}
    precisions = [p for p in PRECISION_NAMES if p in present_precisions] + sorted(present_precisions - set(PRECISION_NAMES))
    for mode in ("train", "infer"):
        for precision in precisions:
            present = [m for (m, md, p) in grouped if md == mode and p == precision]
            models = [m for m in MODELS if m in present] + [m for m in present if m not in MODELS]
            if not models:
                continue
            summary = PRECISIONS[precision].summary if precision in PRECISIONS else precision
            out += ["", f"### {MODE_TITLES[mode]}, {precision} ({summary})", ""]
            out.append("| " + " | ".join(header) + " |")
            out.append("|---|---|" + "---:|" * (len(header) - 3) + "---|")
            for model in models:
                cfgs = grouped[(model, mode, precision)]
                fp32 = grouped.get((model, mode, "fp32"), {})
                order = [c for c in CONFIG_NAMES if c in cfgs] + [c for c in cfgs if c not in CONFIG_NAMES]
                for config in order:
                    row = cfgs[config]
                    if row["status"] != "ok":
                        out.append(f"| {model} | {config} | {_cell_error(row)} |" + " |" * (len(header) - 3))
                        continue
                    cells = row_cells(row, cfgs, cg, fp32.get(config))
                    cells[-1] = cells[-1].replace("FAIL", "**FAIL**")
                    out.append("| " + " | ".join([model, *cells]) + " |")
    out += time_split_table(data)
    return "\n".join(out) + "\n"


def time_split_table(data: dict[str, Any]) -> list[str]:
    """Where each row's step time goes (rows measured with ``--time-split``), in ms per step:
    device busy time, the profiled step, and its host time by part (``measure.time_split``)."""
    from ..measure import SPLIT_PARTS

    rows = [r for r in data["rows"].values() if r.get("status") == "ok" and r.get("time_split")]
    if not rows:
        return []
    shown = several_precisions(data)
    header = ["model", "mode", *(["precision"] if shown else []), "config", "step ms", "device busy", "profiled step",
              *SPLIT_PARTS]
    out = ["", "### Where the step time goes (ms per step)", "",
           "Device busy: the GPU kernels' summed time. Profiled step: the host's view under the profiler "
           "(inflated by it), split into the generated code of the compiled graphs, Dynamo's and AOTAutograd's "
           "wrappers, guards, autograd outside the graphs, the optimizer and the rest.", "",
           "| " + " | ".join(header) + " |", "|---|---|---|" + ("---|" if shown else "") + "---:|" * (len(header) - 3 - shown)]
    for r in rows:
        t = r["time_split"]
        cells = [r["model"], r["mode"], *([row_precision(r)] if shown else []), r["config"], _fmt(r.get("step_ms"), ".3f"), _fmt(t["device_busy_ms"], ".3f"),
                 _fmt(t["wall_ms"], ".3f"), *(_fmt(t["host_ms"].get(k), ".3f") for k in SPLIT_PARTS)]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _run_notes(data: dict[str, Any]) -> list[str]:
    """How the rows were measured, where that is not the plain serial protocol."""
    rows = list(data["rows"].values())
    notes = []
    workers = sorted({r.get("workers") or 1 for r in rows})
    if workers != [1]:
        threads = sorted({r.get("compile_threads") for r in rows if (r.get("workers") or 1) > 1} - {None})
        notes.append("Compile times measured with " + "/".join(map(str, workers)) + " concurrent worker processes"
                     + (f" ({'/'.join(map(str, threads))} Inductor compile threads each)" if threads else "")
                     + "; timed sections ran one at a time.")
    if any(r.get("step_ms_spread") is not None for r in rows):
        reps = sorted({r.get("repeats") for r in rows if r.get("step_ms_spread") is not None})
        notes.append("Step ms: the median of " + "/".join(map(str, reps)) + " repeated medians; in brackets the "
                     "spread (max - min) / median of those medians.")
    if any(r.get("tf32") for r in rows):
        notes.append("Steps timed with TF32 matmuls (`--precision tf32`) where the row says so; accuracy judged "
                     "with TF32 off.")
    if any(r.get("dynamic") for r in rows):
        notes.append("Compiled with `dynamic=True`.")
    if any(row_precision(r) not in ("fp32", "tf32") for r in rows):
        notes.append("Rewrites: Optimus's rewrites in the compiled program; in another precision, their share of the "
                     "same configuration's fp32 count.")
    for key, r in data["rows"].items():
        for fallback in r.get("optimus_fallbacks") or ():
            notes.append(f"**{key}**: the safety net compiled a graph again with fewer Optimus passes, so the row times that program: {fallback}")
    return notes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optimus.tools.bench.report", description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="results files written by optimus bench --json")
    parser.add_argument("--title", default=None, help="a '## title' line to print first")
    parser.add_argument("--merge-into", metavar="FILE", default=None, help="also write the merged results here")
    args = parser.parse_args(argv)
    data = empty()
    try:
        for path in args.json:
            part = load(path)
            if not part["rows"] and not part["commands"]:
                raise ValueError(f"{path}: no such results file, or it holds no rows")
            merge(data, part["rows"].values())
            for command in part.get("commands", []):
                merge(data, [], command)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    problems = validate(data)
    if problems:
        print("error: malformed results file:\n  " + "\n  ".join(problems[:20]), file=sys.stderr)
        return 2
    if args.merge_into:
        save(args.merge_into, data)
    if args.title:
        print(f"## {args.title}\n")
    sys.stdout.write(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
