"""Rewrites in fp32 and under bf16 autocast, for every zoo model (CPU, small configs).

``python -m optimus.tools.precision_report [--models a,b] [--modes inference,training]
[--precisions fp32,amp-bf16] [--passes P] [--json] [--json-out FILE]`` compiles each zoo
model once per precision (``optimus.tools.bench.precision``: by default fp32 and
``amp-bf16``, the forward and the loss under ``torch.autocast("cpu", torch.bfloat16)``)
with passes ``P`` (default: optimus.compile's, ``"auto"``), runs one step as the bench
does (``optimus.tools.bench.harness.Runner``) and counts the rewrites its report records
(dead-code removal left out; ``optimus.tools.dynamic_report.count_rewrites``). Each step
is judged as the bench judges it (``optimus.tools.bench.accuracy``: eager in the same
precision against fp64, the harness's tolerance and multiplier), every result in eager's
dtype; a compile that raises is recorded, never hidden. The table lists, per model and
mode, the count of each precision and its share of the fp32 count (the bench's target:
at least 90%); the JSON has every count per rule and level and the top decline reasons.

No timing: the quick check of the rewrites Optimus keeps under autocast, before a GPU
run (``optimus bench --precision``) measures what they are worth. Passes run on every
compile: Inductor's and AOTAutograd's caches are off (a cache hit would skip them and
their report).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Sequence

import torch

from .cli_json import add_json_arguments, json_targets
from .dynamic_report import _fresh_caches, count_rewrites, crash_text, report_meta, rewrite_table, write_rows

MODES = {"inference": "infer", "training": "train"}  # this report's names, the bench's
DEFAULT_PRECISIONS = ("fp32", "amp-bf16")
TARGET = 0.9  # the share of the fp32 count a precision keeps, at least


def measure(name: str, mode: str, precision: str, passes: Any = None) -> dict[str, Any]:
    """Compile zoo model ``name`` once in ``mode`` (``inference`` or ``training``) and
    ``precision`` and judge its first step (see the module doc)."""
    import optimus
    from optimus.tools.bench import accuracy
    from optimus.tools.bench.external import get_bench_model
    from optimus.tools.bench.harness import LR, Runner
    from optimus.compile import DEFAULT_PASSES

    bench_mode = MODES[mode]
    torch._dynamo.reset()
    row: dict[str, Any] = {"model": name, "mode": mode, "precision": precision, "passes": passes or DEFAULT_PASSES}
    t0 = time.perf_counter()
    try:
        ref = accuracy.eager_reference(name, bench_mode, "small", "cpu", 0, precision)
        zoo = get_bench_model(name, "small", "cpu", 0)
        inputs = Runner.prepare(zoo, precision)
        compiled = optimus.compile(zoo.model, **({"passes": passes} if passes is not None else {}))
        runner = Runner(zoo, compiled, bench_mode, LR, precision=precision, inputs=inputs)
        out = runner.forward_backward()
        row.update(count_rewrites(compiled.optimus_report))
        grads = runner.grads() if bench_mode == "train" else None
        parity = accuracy.judge(ref, out, grads, accuracy.accuracy_tolerance("cpu", bench_mode, precision))
        dtypes_match = out.dtype == ref.output.dtype and all(
            (g is None) == (r is None) and (g is None or g.dtype == r.dtype) for g, r in zip(grads or [], ref.grads))
        row["accurate"] = parity["ok"] and dtypes_match
        row["accuracy_note"] = "; ".join(parity["failed"]) if not parity["ok"] else (
            "" if dtypes_match else f"output {out.dtype} or a gradient not in eager's dtype ({ref.output.dtype})")
        row["output_dtype"] = str(out.dtype).replace("torch.", "")
        row["crash"] = None
    except Exception as e:  # recorded: a crash is a result of this report
        row["crash"] = crash_text(e)
    row["time_s"] = round(time.perf_counter() - t0, 2)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """Per model and mode: each precision's rewrites (with its share of fp32's) and the flags."""
    def flags_of(r: dict[str, Any], p: str, fp32: Any) -> list[str]:
        out = []
        if p != "fp32" and r["rewrites"] < TARGET * (fp32 or 0):
            out.append(f"{p}: below {100 * TARGET:.0f}% of fp32")
        if r.get("accurate") is False:
            out.append(f"{p}: INACCURATE ({r.get('accuracy_note', '')[:60]})")
        return out

    return rewrite_table(rows, "precision", list(dict.fromkeys(r["precision"] for r in rows)), "fp32", flags_of)


def main(argv: Sequence[str] | None = None) -> int:
    from optimus.tools.bench import precision as bench_precision
    from optimus.tools.bench.external import EXTERNAL
    from optimus.tools.models import model_names

    p = argparse.ArgumentParser(prog="python -m optimus.tools.precision_report", description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(model_names()),
                   help=f"comma-separated zoo models (default: all) or external ones ({', '.join(EXTERNAL)})")
    p.add_argument("--modes", default=",".join(MODES), help="inference,training")
    p.add_argument("--precisions", default=",".join(DEFAULT_PRECISIONS),
                   help=f"comma list of {', '.join(bench_precision.PRECISION_NAMES)} (default: fp32,amp-bf16)")
    p.add_argument("--passes", default=None, help="a preset (default: optimus.compile's, auto)")
    add_json_arguments(p, "every row", file_form=True)
    args = p.parse_args(argv)
    as_json, json_path = json_targets(args)
    try:
        precisions = bench_precision.parse(args.precisions)
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = [m for m in modes if m not in MODES]
        if unknown or not modes:
            raise ValueError(f"unknown mode {', '.join(map(repr, unknown)) or repr(args.modes)}; "
                             f"choose from: {', '.join(MODES)}")
        known = [*model_names(), *EXTERNAL]
        unknown = [m for m in args.models.split(",") if m not in known]
        if unknown:
            raise ValueError(f"unknown model {', '.join(map(repr, unknown))}; choose from: {', '.join(known)}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    _fresh_caches()
    rows = []
    for name in args.models.split(","):
        for mode in modes:
            for precision in precisions:
                row = measure(name, mode, precision, args.passes)
                rows.append(row)
                if json_path:  # after every row: a long run interrupted keeps what it measured
                    write_rows(json_path, rows)
                print(f"{name:12} {mode:10} {precision:9} rewrites={row.get('rewrites')} "
                      f"accurate={row.get('accurate')} crash={row['crash']} ({row['time_s']} s)",
                      file=sys.stderr, flush=True)
    if as_json:
        print(json.dumps({"meta": report_meta(), "rows": rows}, indent=1, default=str))
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
