"""Render bench results as markdown: ``python -m optimus.bench.report results.json [more.json ...]``.

Prints one table per mode (training, inference) with every model and configuration,
preceded by the commands, dates, versions and devices that produced the rows. Several
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
from .results import empty, load, merge, rows_by, save, speedup, validate

MODE_TITLES = {"train": "Training (forward + backward + SGD step)", "infer": "Inference (forward, no_grad)"}


def _fmt(x: Any, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _cell_error(row: dict[str, Any]) -> str:
    msg = (row.get("error") or "error").replace("|", "\\|").replace("\n", " ")
    return f"error: {msg[:160]}"


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


def render(data: dict[str, Any]) -> str:
    out: list[str] = []
    out += provenance(data)
    if data.get("commands"):
        out += ["", "Commands:", "", "```"] + list(data["commands"]) + ["```"]
    up = next((r.get("upstream_options") for r in data["rows"].values() if r.get("upstream_options")), None)
    if up:
        out += ["", "`upstream` enabled these options: pre-grad " + ", ".join(f"`{n}`" for n in up["pre_grad"])
                + "; post-grad " + ", ".join(f"`{n}`" for n in up["post_grad"]) + "."]
    grouped = rows_by(data)
    for mode in ("train", "infer"):
        present = [m for (m, md) in grouped if md == mode]
        models = [m for m in MODELS if m in present] + [m for m in present if m not in MODELS]
        if not models:
            continue
        out += ["", f"### {MODE_TITLES[mode]}", ""]
        out.append("| model | config | kernels/step | step ms | examples/s | vs eager | vs inductor "
                   "| peak MiB | compile s | parity (max rel err) |")
        out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for model in models:
            cfgs = grouped[(model, mode)]
            order = [c for c in CONFIG_NAMES if c in cfgs] + [c for c in cfgs if c not in CONFIG_NAMES]
            for config in order:
                row = cfgs[config]
                if row["status"] != "ok":
                    out.append(f"| {model} | {config} | {_cell_error(row)} | | | | | | | |")
                    continue
                p = row.get("parity")
                parity = "–" if not p else (
                    f"{'ok' if p['ok'] else '**FAIL**'} ({max(p.get('out_max_rel', 0), p.get('grad_max_rel', 0)):.1e})"
                )
                se, si = speedup(row, cfgs.get("eager")), speedup(row, cfgs.get("inductor"))
                mem = row.get("peak_memory_bytes")
                out.append(
                    f"| {model} | {config} | {_fmt(row.get('kernels'), 'd')} | {_fmt(row.get('step_ms'), '.3f')} "
                    f"| {_fmt(row.get('examples_per_s'), ',.0f')} | {_fmt(se, '.2f')}{'x' if se else ''} "
                    f"| {_fmt(si, '.2f')}{'x' if si else ''} | {_fmt(None if mem is None else mem / 2**20, ',.0f')} "
                    f"| {_fmt(row.get('compile_s'), '.1f')} | {parity} |"
                )
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optimus.bench.report", description=__doc__.splitlines()[0])
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
