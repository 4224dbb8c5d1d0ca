"""Bench results: the JSON file (merged across partial runs) and the text table."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Iterable

from ...core import table
from .precision import row_precision

SCHEMA = 1

ROW_KEYS: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "mode": (str,),
    "config": (str,),
    "size": (str,),
    "device": (str,),
    "status": (str,),
    "error": (str, type(None)),
    "batch_size": (int, type(None)),
    "kernels": (int, type(None)),
    "step_ms": (float, int, type(None)),
    "examples_per_s": (float, int, type(None)),
    "peak_memory_bytes": (int, type(None)),
    "compile_s": (float, int, type(None)),
    "first_step_s": (float, int, type(None)),
    "parity": (dict, type(None)),
    "env": (dict,),
}


def key(model: str, mode: str, config: str, precision: str = "fp32") -> str:
    """A row's key: ``model/mode/config``, with ``/precision`` after it unless fp32 (so files
    written before rows had a precision keep their keys)."""
    base = f"{model}/{mode}/{config}"
    return base if precision == "fp32" else f"{base}/{precision}"


def row_key(row: dict[str, Any]) -> str:
    return key(row["model"], row["mode"], row["config"], row.get("precision") or "fp32")


def empty() -> dict[str, Any]:
    return {"schema": SCHEMA, "commands": [], "rows": {}}


def load(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        return empty()
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("rows"), dict):
        raise ValueError(f"{path} is not an optimus bench results file (schema {SCHEMA})")
    return data


def merge(data: dict[str, Any], rows: Iterable[dict[str, Any]], command: str | None = None) -> dict[str, Any]:
    """Add rows to ``data``; a row replaces the earlier one of the same key (model/mode/config/precision)."""
    for row in rows:
        data["rows"][row_key(row)] = row
    if command and command not in data["commands"]:
        data["commands"].append(command)
    return data


def save(path: str, data: dict[str, Any]) -> None:
    """Write atomically so an interrupted run never leaves a truncated file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".bench-", suffix=".json", dir=directory)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def validate(data: dict[str, Any]) -> list[str]:
    """Problems with a results file (empty list when it is well formed)."""
    problems: list[str] = []
    if data.get("schema") != SCHEMA:
        problems.append(f"schema is {data.get('schema')!r}, expected {SCHEMA}")
    rows = data.get("rows")
    if not isinstance(rows, dict):
        return problems + ["'rows' is not an object"]
    for key, row in rows.items():
        for field, types in ROW_KEYS.items():
            if field not in row:
                problems.append(f"{key}: missing {field!r}")
            elif not isinstance(row[field], types) or isinstance(row[field], bool) and bool not in types:
                problems.append(f"{key}: {field!r} has type {type(row[field]).__name__}")
        if key != row_key(row):
            problems.append(f"{key}: key does not match its row ({row_key(row)})")
        if row.get("status") == "ok":
            for field in ("kernels", "step_ms", "examples_per_s", "compile_s"):
                if row.get(field) is None:
                    problems.append(f"{key}: status ok but {field!r} is missing")
        elif row.get("status") in ("error", "skipped") and not row.get("error"):
            problems.append(f"{key}: status {row['status']} without a message")
    return problems


def rows_by(data: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, dict[str, Any]]]:
    """``{(model, mode, precision): {config: row}}`` in insertion order: speed-ups compare
    configurations of one precision."""
    out: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for row in data["rows"].values():
        out.setdefault((row["model"], row["mode"], row_precision(row)), {})[row["config"]] = row
    return out


def rewrites_cell(row: dict[str, Any], fp32_row: dict[str, Any] | None) -> str:
    """Optimus's rewrites in the row (``-`` without Optimus); beside them, in another
    precision, their share of the same configuration's fp32 count."""
    n = row.get("optimus_rewrites")
    if n is None:
        return "-"
    base = (fp32_row or {}).get("optimus_rewrites")
    return f"{n} ({100 * n / base:.0f}% of fp32)" if fp32_row is not row and base else str(n)


def speedup(row: dict[str, Any], base: dict[str, Any] | None) -> float | None:
    if not base or row.get("step_ms") is None or base.get("step_ms") is None or row["step_ms"] <= 0:
        return None
    return base["step_ms"] / row["step_ms"]


# --- formatting -----------------------------------------------------------------------


def _num(x: Any, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def accuracy_cell(row: dict[str, Any]) -> str:
    """``ok (allclose)``, ``ok (1.31x <= 2x)`` (worst RMSE ratio against eager fp32, and
    its limit), ``FAIL (7.10x > 2x, 3 tensors)``; rows of the old max-relative-error rule
    say ``max-rel``."""
    p = row.get("parity")
    if not p:
        return "-"
    verdict = "ok" if p["ok"] else "FAIL"
    if "rule" not in p:  # before the fp64 rule: max |got - eager| / max |eager|
        worst = max(p.get("out_max_rel", 0.0), p.get("grad_max_rel", 0.0))
        return f"{verdict} (max-rel {worst:.1e})"
    ratio, limit = p.get("worst_rmse_ratio"), p.get("worst_multiplier")
    if ratio is None:
        detail = "allclose" if p["ok"] else "failed"
    else:
        known = isinstance(limit, (int, float)) and limit == limit  # not None, not NaN
        detail = f"{ratio:.2f}x {'<=' if p['ok'] else '>'} {limit:g}x" if known else f"{ratio:.2f}x"
    if not p["ok"] and p.get("failed_count"):
        detail += f", {p['failed_count']} tensor{'s' if p['failed_count'] != 1 else ''}"
    return f"{verdict} ({detail})"


def config_cell(row: dict[str, Any]) -> str:
    """The configuration, with its CUDA-graph status when that is not simply "on"."""
    status = row.get("cudagraphs")
    return row["config"] if status in (None, "on") else f"{row['config']} ({status.split(':')[0]})"


def step_cell(row: dict[str, Any]) -> str:
    """The median step time; with repeats, the spread of the repeated medians."""
    text = _num(row.get("step_ms"), ".3f")
    if row.get("step_ms_spread") is not None:
        text += f" ({100 * row['step_ms_spread']:.1f}%)"
    return text


def has_cudagraph_rows(data: dict[str, Any]) -> bool:
    return any(r.get("config") == "inductor-cudagraphs" for r in data["rows"].values())


def _speed(row: dict[str, Any], base: dict[str, Any] | None) -> str:
    s = speedup(row, base)
    return _num(s, ".2f") + ("x" if s else "")


def row_cells(row: dict[str, Any], configs: dict[str, dict[str, Any]], cudagraph_column: bool,
              fp32_row: dict[str, Any] | None = None) -> list[str]:
    """The figures of one ok row, in ``table_header`` order after model/mode/precision;
    ``configs`` are the rows of its precision, ``fp32_row`` its configuration's fp32 row."""
    mem = row.get("peak_memory_bytes")
    cells = [
        config_cell(row),
        _num(row.get("kernels"), "d"),
        step_cell(row),
        _num(row.get("examples_per_s"), ",.0f"),
        _speed(row, configs.get("eager")),
        _speed(row, configs.get("inductor")),
    ]
    if cudagraph_column:
        cells.append(_speed(row, configs.get("inductor-cudagraphs")))
    cells += [
        table.format_bytes(mem),
        _num(row.get("compile_s"), ".1f"),
        rewrites_cell(row, fp32_row),
        accuracy_cell(row),
    ]
    return cells


def table_header(cudagraph_column: bool) -> list[str]:
    header = ["config", "kernels", "step ms", "examples/s", "vs eager", "vs inductor"]
    if cudagraph_column:
        header.append("vs inductor-cudagraphs")
    return header + ["peak memory", "compile s", "rewrites", "accuracy"]


def several_precisions(data: dict[str, Any]) -> bool:
    """Whether a table of ``data`` needs a precision column (some row is not fp32)."""
    return any(row_precision(r) != "fp32" for r in data["rows"].values())


def table_rows(data: dict[str, Any]) -> list[list[str]]:
    lines: list[list[str]] = []
    cg = has_cudagraph_rows(data)
    shown = several_precisions(data)
    grouped = rows_by(data)
    for (model, mode, precision), configs in grouped.items():
        fp32 = grouped.get((model, mode, "fp32"), {})
        lead = [model, mode, precision] if shown else [model, mode]
        for config, row in configs.items():
            if row["status"] != "ok":
                lines.append([*lead, config, f"{row['status']}: {row['error']}"])
                continue
            lines.append([*lead, *row_cells(row, configs, cg, fp32.get(config))])
    return lines


def format_table(data: dict[str, Any]) -> str:
    """A text table (``core.table.format_table``); error rows carry their message in place of the
    figures. A precision column where some row is not fp32."""
    lead = ["model", "mode", "precision"] if several_precisions(data) else ["model", "mode"]
    return table.format_table([*lead, *table_header(has_cudagraph_rows(data))], table_rows(data))
