"""The one text-table function every printer uses, and byte sizes in readable units.

Plain text on purpose: the same bytes in a terminal, a pipe, a log and a test, and no
dependency beyond the standard library (the command line, the report, the benchmark and
the fuzzer all print through ``format_table``).
"""

from __future__ import annotations

from typing import Any, Sequence, Union

Row = Union[Sequence[Any], str]


def format_table(headers: Sequence[str], rows: Sequence[Row], numeric: Sequence[bool] | None = None,
                 indent: str = "") -> str:
    """A header, a rule under it, one line per row; columns two spaces apart.

    Columns are as wide as their widest cell (cells are ``str()``-ed); numeric columns are
    right-aligned (``numeric`` per column; default: a column whose every cell reads as a
    number). A row shorter than the header leaves its last cell unpadded, to run on across
    the columns it does not fill (an error message in place of figures). A row that is a
    plain ``str`` is a line of its own between the rows (a note under the row above).
    """
    cells = [[str(c) for c in row] for row in rows if not isinstance(row, str)]
    full = [r for r in cells if len(r) == len(headers)]
    if numeric is None:
        numeric = [bool(full) and all(_is_number(r[i]) or r[i] in ("", "-") for r in full) for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in full]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        short = len(values) < len(widths)  # the last cell runs on, unpadded
        padded = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values[:-1] if short else values, widths, numeric)]
        return indent + "  ".join(padded + ([values[-1]] if short else [])).rstrip()

    out = [line(list(headers)), indent + "  ".join("-" * w for w in widths)]
    it = iter(cells)
    for row in rows:
        out.append(row if isinstance(row, str) else line(next(it)))
    return "\n".join(out)


def format_bytes(n: float | None) -> str:
    """``n`` bytes in B, KiB, MiB or GiB with about three significant digits
    (``"512 B"``, ``"3.25 KiB"``, ``"41.0 MiB"``, ``"2.54 GiB"``); ``"-"`` for None."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            break
        value /= 1024
    if unit == "B":
        return f"{int(value)} B"
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:,.{digits}f} {unit}"


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", "").rstrip("x%"))
    except ValueError:
        return False
    return True
