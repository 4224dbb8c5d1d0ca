"""The zoo under bf16 autocast: Optimus keeps its rewrites and eager's accuracy.

Each case compiles a small config in fp32 and under ``torch.autocast("cpu", bfloat16)``
(``optimus.tools.precision_report.measure``) and asserts: no crash, no rule error, every
result in eager's dtype and within PyTorch's accuracy rule for the precision. One model
by default; the rest of the zoo is ``slow``.
"""

from __future__ import annotations

import pytest

from optimus.tools.models import MODELS
from optimus.tools import precision_report
from optimus.tools.precision_report import measure

DEFAULT = {("towers32", "training")}
GRID = [(m, mode) for m in MODELS for mode in ("inference", "training")]


@pytest.mark.parametrize(
    "name,mode",
    [pytest.param(*case, marks=() if case in DEFAULT else pytest.mark.slow, id="-".join(case)) for case in GRID],
)
def test_zoo_under_bf16_autocast(name: str, mode: str) -> None:
    fp32, amp = measure(name, mode, "fp32"), measure(name, mode, "amp-bf16")
    for row in (fp32, amp):
        assert row["crash"] is None, row["crash"]
        assert not row["errors"], row["errors"]
        assert row["accurate"], row["accuracy_note"]
        assert row["rewrites"] > 0
    assert amp["output_dtype"] == "bfloat16" and fp32["output_dtype"] == "float32"
    if (name, mode) in DEFAULT:  # a model whose rules all see through autocast
        assert amp["rewrites"] >= precision_report.TARGET * fp32["rewrites"], (fp32["per_rule"], amp["per_rule"])


def test_table_flags_what_misses_the_target() -> None:
    rows = [
        {"model": "m", "mode": "training", "precision": "fp32", "rewrites": 20, "crash": None, "accurate": True},
        {"model": "m", "mode": "training", "precision": "amp-bf16", "rewrites": 17, "crash": None,
         "accurate": False, "accuracy_note": "grad w: RMSE"},
        {"model": "n", "mode": "training", "precision": "fp32", "rewrites": 4, "crash": None, "accurate": True},
        {"model": "n", "mode": "training", "precision": "amp-bf16", "crash": "RuntimeError: boom"},
    ]
    text = precision_report.table(rows)
    assert "17 (85%)" in text and "amp-bf16: below 90% of fp32" in text and "amp-bf16: INACCURATE" in text
    assert "crash" in text and "RuntimeError: boom" in text


def test_bad_input(capsys) -> None:
    assert precision_report.main(["--models", "resnet"]) == 2
    assert "unknown model 'resnet'" in capsys.readouterr().err
    assert precision_report.main(["--precisions", "fp8"]) == 2
    assert "unknown precision 'fp8'" in capsys.readouterr().err
    assert precision_report.main(["--modes", "fly"]) == 2
    assert "unknown mode 'fly'" in capsys.readouterr().err


def test_json_out_keeps_every_row_with_the_runs_facts(tmp_path, monkeypatch) -> None:
    """``--json-out`` writes the rows after each one, with the date, torch and size (the
    CPU reports share ``dynamic_report.write_rows``)."""
    import json

    import torch

    monkeypatch.setattr(precision_report, "measure", lambda name, mode, precision, passes: {"model": name, "mode": mode, "precision": precision, "rewrites": 3, "crash": None, "accurate": True, "time_s": 0.0})
    out = tmp_path / "p.json"
    assert precision_report.main(["--models", "dlrm", "--modes", "inference", "--json-out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["precision"] for r in data["rows"]] == ["fp32", "amp-bf16"]
    assert data["meta"]["torch"] == torch.__version__ and data["meta"]["size"] == "small"
