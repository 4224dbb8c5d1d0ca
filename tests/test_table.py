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
    """Tables go through format_table: no f-string aligned to a column width (``{x:>8}``,
    ``{name:<20s}``) is left in the package's printers, the kernel benchmarks' included."""
    padded = re.compile(r"\{[^{}]*:[<>]\d+s?\}")
    offenders = []
    for path in sorted((ROOT / "optimus").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if padded.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_kernel_benchmark_tables_render():
    """The GPU benchmarks' tables, from made-up reports (the figures need a GPU; the layout does not)."""
    from optimus.tools.bench.kernels import embedding_bag, grouped

    report = {"date": "d", "gpu": "g", "torch": "t", "triton": "x", "ceilings": {},
              "grouped_linear": [{"kind": "uniform", "act": "none", "dtype": "bfloat16", "G": 8,
                                  "times_ms": {"ours_fwd": {"ms": 0.1}, "loop_fwd": {"ms": 0.5}},
                                  "rel_err_vs_loop": {"y": 1e-3, "grads": 2e-3}},
                                 {"kind": "hetero", "act": "relu", "dtype": "float32", "G": 4, "error": "boom"}],
              "layer_norm": [{"kind": "ln", "G": 8, "times_ms": {"ours_fwd": {"ms": 0.25}}, "rel_err_vs_loop": {}}]}
    lines = grouped.make_table(report).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("case "))
    assert lines[head].split()[:4] == ["case", "G", "|", "fwd"]
    assert lines[head + 2].split()[:6] == ["uniform", "8", "|", "0.100", "0.500", "5.00"]
    assert "hetero+relu/float32" in lines[head + 3] and "FAILED: boom" in lines[head + 3]
    text = embedding_bag.make_table({"date": "d", "gpu": "g", "torch": "t", "triton": "x", "copy_GBps": 3000.0,
                                     "cases": [{"case": "c", "T": 8, "B": 512, "L": 4, "fwd_ours": 0.1, "fwd_loop": 0.5},
                                               {"case": "bad", "error": "oops"}]})
    rows = text.splitlines()
    assert rows[-2].split()[:8] == ["c", "8", "512", "4", "|", "0.100", "0.500", "5.00"] and rows[-1] == "bad   ERROR oops"
