"""The zoo under symbolic shapes: ``dynamic=True`` and ``mark_dynamic`` on the batch dim.

Each case compiles a small config once (``optimus.tools.dynamic_report.measure``), runs
it at the traced batch and at ``batch + 3``, and asserts: no crash, no rule error,
outputs (and gradients, in training) equal eager at both sizes, and no recompile at the
second. One case per setting runs by default; the rest of the grid is ``slow``.
"""

from __future__ import annotations

import pytest

from optimus.tools.models import MODELS
from optimus.tools.dynamic_report import measure

DEFAULT = {("dcnv2", "inference", "dynamic"), ("splitcat", "training", "mark_dynamic")}
GRID = [(m, mode, s) for m in MODELS for mode in ("inference", "training") for s in ("dynamic", "mark_dynamic")]


@pytest.mark.parametrize(
    "name,mode,setting",
    [pytest.param(*case, marks=() if case in DEFAULT else pytest.mark.slow, id="-".join(case)) for case in GRID],
)
def test_zoo_compiles_with_symbolic_batch(name: str, mode: str, setting: str) -> None:
    row = measure(name, mode, setting)
    assert row["crash"] is None, row["crash"]
    assert not row["errors"], row["errors"]
    assert row["parity"] and row["parity_second_batch"], row
    assert row["recompiled"] is False, "compiled again when only the batch changed"
    assert row["rewrites"] > 0
    assert not any("failed" in n for n in row["notes"]), row["notes"]

