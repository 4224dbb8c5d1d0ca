"""Rewrites under static and dynamic shapes, for every zoo model (CPU, small configs).

``python -m optimus.tools.dynamic_report [--models a,b] [--modes inference,training]
[--passes P] [--json] [--json-out FILE]`` compiles each zoo model three ways with passes ``P`` (default:
optimus.compile's default, ``"auto"``) and counts the rewrites its report records
(dead-code removal left out):

* ``static``: ``optimus.compile(model, dynamic=False)``;
* ``dynamic``: ``dynamic=True`` (every size symbolic);
* ``mark_dynamic``: the default ``dynamic`` with ``torch._dynamo.mark_dynamic(x, 0)`` on
  every input (the batch dim).

For the two symbolic settings it then runs a second batch size (``batch + 3``) and records whether the
model compiled again (Dynamo's frame counter) and whether both batches match eager. A
compile that raises is recorded, never hidden. The table lists, per model and mode,
the three counts and the ratio to static; the JSON has every count per rule and level,
the top decline reasons and the report's notes.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import torch

from .cli_json import add_json_arguments, json_targets

SETTINGS = ("static", "dynamic", "mark_dynamic")
MODES = ("inference", "training")
DEAD_CODE = "dead_code_elimination"


def _fresh_caches() -> None:
    """Every compile runs Optimus's passes (a cache hit would skip them and their report)."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="optimus-dynamic-report-"))
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False


def second_batch(inputs: Sequence[torch.Tensor], batch: int) -> tuple[torch.Tensor, ...]:
    """The inputs at another batch size (every zoo input has the batch as dim 0):
    ``batch + 3`` rows, the last three repeating the first (a size no compile saw; larger,
    because a model may itself guard the batch from below: DHEN's conv1d adds
    ``batch >= 16`` while Dynamo traces it)."""
    return tuple(torch.cat([t, t[:3]]) for t in inputs)


def _step(model: torch.nn.Module, inputs: Sequence[torch.Tensor], training: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    if not training:
        with torch.no_grad():
            return model(*inputs).detach(), []
    out = model(*inputs)
    out.float().sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _close(a: tuple[torch.Tensor, list[torch.Tensor]], b: tuple[torch.Tensor, list[torch.Tensor]]) -> bool:
    if a[0].shape != b[0].shape or len(a[1]) != len(b[1]):
        return False
    tol = {"rtol": 1e-4, "atol": 1e-4}
    return torch.allclose(a[0], b[0], **tol) and all(torch.allclose(x, y, **tol) for x, y in zip(a[1], b[1]))


def count_rewrites(report: Any) -> dict[str, Any]:
    """Rewrites per level and rule in a report (graphs the safety net discarded left out)."""
    per_level: collections.Counter = collections.Counter()
    per_rule: collections.Counter = collections.Counter()
    declines: collections.Counter = collections.Counter()
    errors: list[str] = []
    for g in report.graphs:
        if g.discarded:
            continue
        for name, s in g.rules.items():
            if name == DEAD_CODE:
                continue
            per_level[g.level] += s.matched
            per_rule[f"{g.level}:{name}"] += s.matched
            for reason, n in s.declined.items():
                declines[f"{name}: {reason}"] += n
            errors.extend(f"{g.level} {g.graph} {name}: {e}" for e in s.errors)
    notes = [n for g in report.graphs for n in g.notes if "scheduler nodes before" not in n] + list(report.notes)
    return {
        "rewrites": sum(per_level.values()),
        "per_level": dict(per_level),
        "per_rule": {k: v for k, v in sorted(per_rule.items()) if v},
        "top_declines": dict(declines.most_common(8)),
        "errors": errors,
        "notes": notes,
        "discarded": [f"{g.level} {g.graph}: {g.discarded}" for g in report.graphs if g.discarded],
    }


def measure(name: str, mode: str, setting: str, passes: Any = None) -> dict[str, Any]:
    """Compile zoo model ``name`` once in ``mode`` under ``setting`` (``passes``: None for
    optimus.compile's default); see the module doc."""
    import optimus
    from optimus.compile import DEFAULT_PASSES
    from optimus.tools.models import get_model

    torch._dynamo.reset()
    torch.manual_seed(0)
    zoo = get_model(name, "small")
    training = mode == "training"
    zoo.model.train(training)
    inputs = [t.clone() for t in zoo.inputs]
    other = list(second_batch(inputs, zoo.batch_size))
    eager = (_step(zoo.model, inputs, training), _step(zoo.model, other, training))
    if setting == "mark_dynamic":
        for t in inputs:
            torch._dynamo.mark_dynamic(t, 0)
    kwargs = {"dynamic": {"static": False, "dynamic": True, "mark_dynamic": None}[setting]}
    if passes is not None:
        kwargs["passes"] = passes
    row: dict[str, Any] = {"model": name, "mode": mode, "setting": setting, "passes": passes or DEFAULT_PASSES}
    t0 = time.perf_counter()
    counters = torch._dynamo.utils.counters
    counters.clear()
    try:
        compiled = optimus.compile(zoo.model, **kwargs)
        first = _step(compiled, inputs, training)
        frames = counters["frames"]["ok"]
        row.update(count_rewrites(compiled.optimus_report))
        row["parity"] = _close(first, eager[0])
        if setting != "static":
            second = _step(compiled, other, training)
            row["recompiled"] = counters["frames"]["ok"] > frames
            row["parity_second_batch"] = _close(second, eager[1])
        row["crash"] = None
    except Exception as e:  # recorded: a crash is a result of this report
        row["crash"] = crash_text(e)
    row["time_s"] = round(time.perf_counter() - t0, 2)
    return row


def crash_text(e: BaseException) -> str:
    """A crash as a row records it: the exception's type and the first line of its message."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def rewrite_table(rows: list[dict[str, Any]], key: str, columns: Sequence[str], base: str,
                  flags_of: Callable[[dict[str, Any], str, Any], list[str]], titles: Sequence[str] | None = None) -> str:
    """Per model and mode, each column's rewrites (``row[key]`` names the column) with its share
    of the ``base`` column's, and a notes column: crashes, then ``flags_of(row, column, base's rewrites)``.
    ``titles``: the columns' headings (default: their names)."""
    from optimus.core.table import format_table

    by = {(r["model"], r["mode"], r[key]): r for r in rows}
    out = []
    for (model, mode) in dict.fromkeys((r["model"], r["mode"]) for r in rows):
        cells: list[Any] = [model, mode]
        reference = by.get((model, mode, base), {}).get("rewrites")
        flags: list[str] = []
        for c in columns:
            r = by.get((model, mode, c))
            if r is None:
                cells.append("-")
            elif r.get("crash"):
                cells.append("crash")
                flags.append(f"{c}: {r['crash'][:60]}")
            else:
                n = r["rewrites"]
                pct = f" ({100 * n / reference:.0f}%)" if reference and c != base else ""
                cells.append(f"{n}{pct}")
                flags += flags_of(r, c, reference)
                if r.get("errors"):
                    flags.append(f"{c}: {len(r['errors'])} rule errors")
        cells.append("; ".join(flags))
        out.append(cells)
    return format_table(["model", "mode", *(titles or columns), "notes"], out, [False] * (len(columns) + 3))


def table(rows: list[dict[str, Any]]) -> str:
    def flags_of(r: dict[str, Any], s: str, _static: Any) -> list[str]:
        out = [f"{s}: recompiled"] if r.get("recompiled") else []
        if r.get("parity") is False or r.get("parity_second_batch") is False:
            out.append(f"{s}: MISMATCH")
        return out

    return rewrite_table(rows, "setting", SETTINGS, "static", flags_of, ("static", "dynamic=True", "mark_dynamic"))


def main(argv: Sequence[str] | None = None) -> int:
    from optimus.tools.models import model_names

    p = argparse.ArgumentParser(prog="python -m optimus.tools.dynamic_report", description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(model_names()), help="comma-separated zoo models (default: all)")
    p.add_argument("--modes", default=",".join(MODES), help="inference,training")
    p.add_argument("--settings", default=",".join(SETTINGS), help="static,dynamic,mark_dynamic")
    p.add_argument("--passes", default=None, help="a preset (default: optimus.compile's, auto)")
    add_json_arguments(p, "every row", file_form=True)
    args = p.parse_args(argv)
    as_json, json_path = json_targets(args)
    _fresh_caches()
    rows = []
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            for setting in args.settings.split(","):
                row = measure(name, mode, setting, args.passes)
                rows.append(row)
                if json_path:  # after every row: a long run interrupted keeps what it measured
                    write_rows(json_path, rows)
                print(f"{name:12} {mode:10} {setting:13} rewrites={row.get('rewrites')} crash={row['crash']} "
                      f"recompiled={row.get('recompiled')} ({row['time_s']} s)", file=sys.stderr, flush=True)
    if as_json:
        print(json.dumps({"meta": report_meta(), "rows": rows}, indent=1, default=str))
    else:
        print(table(rows))
    return 0


def report_meta() -> dict[str, Any]:
    """What every CPU report's JSON records about its run."""
    return {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "device": "cpu", "size": "small"}


def write_rows(path: str, rows: list[dict[str, Any]]) -> None:
    """The report's rows so far, with ``report_meta``, to ``path`` (rewritten after every row)."""
    with open(path, "w") as f:
        json.dump({"meta": report_meta(), "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
