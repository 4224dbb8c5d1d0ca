"""The one text-table function and the byte units every printer uses (optimus/core/table.py)."""

import pathlib
import re

from optimus.core.table import format_bytes, format_table

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_columns_align_and_numbers_right_align():
    text = format_table(["rule", "kind", "n"], [["a_long_rule_name", "vertical", 12], ["b", "horizontal", 3]])
    head, rule, first, second = text.splitlines()
    assert [m.start() for m in re.finditer(r"-+", rule)] == [head.index("rule"), head.index("kind"), rule.rindex(" ") + 1]
    assert first.endswith("12") and second.endswith(" 3")
    assert first.index("vertical") == second.index("horizontal") == head.index("kind")


def test_short_rows_run_on_and_text_rows_stand_alone():
    text = format_table(["model", "mode", "kernels", "ms"],
                        [["dlrm", "infer", 4, "1.5"], ["dlrm", "train", "error: a long message"], "    a note"])
    lines = text.splitlines()
    assert lines[3] == "dlrm   train  error: a long message"
    assert lines[4] == "    a note"
    assert len(lines[0]) == len(lines[1]) == len(lines[2])


def test_bytes_have_readable_units():
    assert format_bytes(None) == "-"
    assert format_bytes(0) == "0 B" and format_bytes(1023) == "1023 B"
    assert format_bytes(200 * 1024) == "200 KiB"  # a sub-MiB peak is not "0"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(41 * 2**20) == "41.0 MiB"
    assert format_bytes(2598 * 2**20) == "2.54 GiB"


def test_no_printer_hand_pads_columns():
    """Tables go through format_table: no f-string column padding left in the package's printers."""
    padded = re.compile(r"\{[^{}]*:[<>]\d+\}")
    offenders = []
    for path in sorted((ROOT / "optimus").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if padded.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
