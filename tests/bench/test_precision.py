"""``optimus bench --precision``: each row runs and is judged in one precision (CPU: bf16
autocast and a bf16 model, as CI can run them), fp32 and bf16 paired in one run."""

from __future__ import annotations

import json

import pytest
import torch

from optimus.tools.bench import accuracy, cli, harness, parallel, precision, report, results

FAST = ["--device", "cpu", "--size", "small", "--iters", "1", "--warmup", "0", "--quiet", "--warm-cache"]


@pytest.fixture(scope="module")
def paired_json(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One training run of dlrm, eager and Optimus's default, in fp32 and under bf16 autocast."""
    path = tmp_path_factory.mktemp("precision") / "results.json"
    rc = cli.main(["--model", "dlrm", "--mode", "train", "--configs", "eager,optimus-auto",
                   "--precision", "fp32,amp-bf16", "--json-out", str(path), *FAST])
    data = json.loads(path.read_text())
    data["_rc"] = rc
    return data


def test_rows_record_their_precision(paired_json: dict) -> None:
    assert paired_json["_rc"] == 0
    assert results.validate(paired_json) == []
    assert set(paired_json["rows"]) == {"dlrm/train/eager", "dlrm/train/optimus-auto",
                                        "dlrm/train/eager/amp-bf16", "dlrm/train/optimus-auto/amp-bf16"}
    for key, row in paired_json["rows"].items():
        amp = key.endswith("/amp-bf16")
        assert row["status"] == "ok", row["error"]
        assert row["precision"] == ("amp-bf16" if amp else "fp32")
        assert row["autocast"] == ("bfloat16" if amp else None) and row["model_dtype"] is None
        assert results.row_key(row) == key
        assert "--precision fp32,amp-bf16" in row["command"]


def test_autocast_ran_in_eager_and_in_the_compiled_step(paired_json: dict) -> None:
    """The fp32 model's output is bf16 only where the forward ran under autocast: in the
    compiled program too (Dynamo traced the autocast region)."""
    rows = paired_json["rows"]
    assert rows["dlrm/train/optimus-auto/amp-bf16"]["output_dtype"] == "bfloat16"
    assert rows["dlrm/train/eager/amp-bf16"]["output_dtype"] == "bfloat16"
    assert rows["dlrm/train/optimus-auto"]["output_dtype"] == "float32"


def test_accuracy_judged_per_precision(paired_json: dict) -> None:
    rows = paired_json["rows"]
    for key, row in rows.items():
        parity = row["parity"]
        assert parity["ok"] and parity["rule"] == accuracy.RULE, (key, parity)
        assert parity["tensors"] > 1  # the output and every parameter gradient
        assert parity["tol"] == (1e-3 if key.endswith("/amp-bf16") else 1e-4)
    # eager against eager in the same precision: exactly equal, in both precisions
    assert rows["dlrm/train/eager/amp-bf16"]["parity"]["out_max_abs"] == 0.0
    assert rows["dlrm/train/eager"]["parity"]["passed_allclose"] == rows["dlrm/train/eager"]["parity"]["tensors"]


def test_rewrite_counts_and_their_share_of_fp32(paired_json: dict) -> None:
    rows = paired_json["rows"]
    fp32, amp = rows["dlrm/train/optimus-auto"], rows["dlrm/train/optimus-auto/amp-bf16"]
    assert fp32["optimus_rewrites"] > 0 and amp["optimus_rewrites"] > 0
    assert fp32["optimus_rewrites"] <= sum(fp32["optimus_rules"].values())  # dead-code removal not counted
    assert rows["dlrm/train/eager"]["optimus_rewrites"] is None
    share = f"{amp['optimus_rewrites']} ({100 * amp['optimus_rewrites'] / fp32['optimus_rewrites']:.0f}% of fp32)"
    table = results.format_table(paired_json)
    assert "precision" in table.splitlines()[0] and share in table
    text = report.render(results.merge(results.empty(), paired_json["rows"].values()))
    assert "### Training (forward + backward + SGD step), fp32 (TF32 off)" in text
    assert "### Training (forward + backward + SGD step), amp-bf16 (forward and loss under torch.autocast" in text
    assert f"| {share} | ok (" in text and "the same configuration's fp32 count" in text
    assert "eager fp32 is eager in that precision" in text


def test_inference_of_a_bf16_model() -> None:
    """``bf16``: the model and its floating inputs cast (the ids stay integers), no autocast;
    the fp64 reference is the bf16 model's copy; the compiled output is bf16."""
    opts = harness.BenchOptions(device="cpu", size="small", iters=1, warmup=0, cold=False, precisions=("bf16",))
    rows = harness.run(["dlrm"], ["infer"], ["inductor"], opts)
    assert [r["config"] for r in rows] == ["inductor"]
    for row in rows:
        assert row["status"] == "ok", row["error"]
        assert row["precision"] == "bf16" and row["model_dtype"] == "bfloat16" and row["autocast"] is None
        assert row["output_dtype"] == "bfloat16"
        assert row["parity"]["ok"] and row["parity"]["tol"] == 1e-4, row["parity"]


def test_eager_reference_under_autocast_keeps_fp64_exact() -> None:
    ref = accuracy.eager_reference("towers32", "train", precision="amp-bf16")
    assert ref.output.dtype == torch.bfloat16 and ref.output64.dtype == torch.float64
    assert all(g is None or g.dtype == torch.float32 for g in ref.grads)  # fp32 parameters under autocast
    assert all(g is None or g.dtype == torch.float64 for g in ref.grads64)
    fp32 = accuracy.eager_reference("towers32", "train")
    assert torch.equal(fp32.output64, ref.output64)  # the same exact answer, whatever the precision
    assert not torch.equal(fp32.output, ref.output.float())


def test_precision_definitions() -> None:
    assert precision.parse("fp32,amp-bf16,fp32") == ["fp32", "amp-bf16"]
    assert precision.parse("all") == precision.PRECISION_NAMES
    amp, bf16 = precision.get("amp-bf16"), precision.get("bf16")
    with amp.autocast("cpu"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with precision.get("fp32").autocast("cpu"):
        assert not torch.is_autocast_enabled("cpu")
    assert amp.tolerance("cuda", "infer") == 1e-3 and amp.tolerance("cpu", "train") == 1e-3
    assert bf16.tolerance("cpu", "infer") == 1e-4 and bf16.tolerance("cuda", "train") == 1e-3
    assert precision.get("fp32").tolerance("cuda", "train") == accuracy.accuracy_tolerance("cuda", "train") == 1e-3
    model = torch.nn.Embedding(4, 2)
    ids, dense = torch.tensor([1, 2]), torch.ones(2)
    cast = bf16.cast(model, (ids, dense, "other"))
    assert model.weight.dtype == torch.bfloat16
    assert cast[0] is ids and cast[1].dtype == torch.bfloat16 and cast[2] == "other"
    assert amp.cast(model, (dense,))[0] is dense  # autocast casts nothing ahead of the step


def test_keys_of_rows_written_before_precisions() -> None:
    """Old rows have no precision: their keys stay ``model/mode/config``; a ``--tf32`` row reads as tf32."""
    old = {"model": "dlrm", "mode": "train", "config": "inductor", "tf32": True}
    assert results.row_key(old) == "dlrm/train/inductor" and precision.row_precision(old) == "tf32"
    assert results.key("dlrm", "train", "inductor", "amp-bf16") == "dlrm/train/inductor/amp-bf16"
    assert results.key("dlrm", "train", "inductor", "fp32") == "dlrm/train/inductor"


def test_plan_pairs_a_models_precisions() -> None:
    plan = harness.plan(["dlrm", "towers32"], ["train"], ["inductor", "optimus"], ("fp32", "amp-bf16"))
    assert plan[:4] == [("dlrm", "train", "inductor", "fp32"), ("dlrm", "train", "optimus", "fp32"),
                        ("dlrm", "train", "inductor", "amp-bf16"), ("dlrm", "train", "optimus", "amp-bf16")]
    tasks = parallel.schedule(plan)
    assert {t.key for t in tasks} == {results.key(*p) for p in plan}
    assert parallel.Task("dlrm", "train", "optimus", 1.0, "bf16").key == "dlrm/train/optimus/bf16"


def test_bad_precision(capsys) -> None:
    assert cli.main(["--model", "dlrm", "--precision", "fp8", *FAST]) == 2
    err = capsys.readouterr().err
    assert "unknown precision 'fp8'" in err and "amp-bf16" in err and "tf32" in err
    assert cli.main(["--model", "dlrm", "--precision", ",", *FAST]) == 2
    assert "no precision" in capsys.readouterr().err
    assert cli.main(["--model", "dlrm", "--tf32", "--precision", "amp-bf16", *FAST]) == 2
    assert "--tf32 is --precision tf32" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown precision 'bf8'"):
        precision.get("bf8")


@pytest.mark.slow
def test_workers_keep_one_reference_per_precision() -> None:
    opts = harness.BenchOptions(device="cpu", size="small", iters=1, warmup=0, cold=False,
                                precisions=("fp32", "amp-bf16"))
    rows = parallel.run_parallel(["dlrm"], ["infer"], ["eager"], opts, workers=2)
    assert [results.row_key(r) for r in rows] == ["dlrm/infer/eager", "dlrm/infer/eager/amp-bf16"]
    assert [r["output_dtype"] for r in rows] == ["float32", "bfloat16"]
    assert all(r["status"] == "ok" and r["parity"]["ok"] and r["reference"] == "computed" for r in rows)


def _results_script(name: str):
    """A script of docs/results, imported from its path (it is not part of the package)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "docs" / "results" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_headline_table_pairs_precisions_and_states_the_targets() -> None:
    """docs/results/precision_table.py on gpu-paired.py rows: a line per model and precision, the
    rewrites' share of fp32's, Optimus against Inductor in its own precision, and the targets."""
    table = _results_script("precision_table")

    def row(config, precision, speed=None, rewrites=None, ok=True, ms=None, vs_fp32=None):
        r = {"config": config, "mode": "train", "precision": precision, "kernels": 10, "parity": {"ok": ok}}
        if speed is not None:
            r["speedup_vs_inductor"] = {"median": speed, "min": speed - 0.01, "max": speed + 0.01}
        if rewrites is not None:
            r["optimus_rewrites"] = rewrites
        if ms is not None:
            r["step_ms"] = ms
        if vs_fp32 is not None:
            r["speedup_vs_fp32"] = {"median": vs_fp32, "min": vs_fp32, "max": vs_fp32}
        return r

    rows = {
        "dlrm/train/inductor": row("inductor", "fp32", ms=10.0),
        "dlrm/train/optimus-auto": row("optimus-auto", "fp32", speed=1.5, rewrites=20),
        "dlrm/train/inductor/amp-bf16": row("inductor", "amp-bf16", ms=5.0, vs_fp32=2.0),
        "dlrm/train/optimus-auto/amp-bf16": row("optimus-auto", "amp-bf16", speed=0.9, rewrites=17, ok=False),
        "hstu/train/inductor": row("inductor", "fp32", ms=20.0),
        "hstu/train/optimus-auto": {"config": "optimus-auto", "mode": "train", "error": "RuntimeError: boom"},
        "hstu/train/inductor/amp-bf16": row("inductor", "amp-bf16", ms=10.0),  # timed in another process
    }
    text = table.render(rows, {"device": "H100", "torch": "2.11", "rounds": 3, "iters": 15})
    assert "| dlrm | fp32 | k10 10.00 ms | 1.50x [1.49-1.51] k10 r20 |" in text
    assert "| dlrm | amp-bf16 | k10 5.00 ms (2.00x fp32) | 0.90x [0.89-0.91] k10 r17 (85%) **FAIL** |" in text
    assert "| hstu | fp32 | k10 20.00 ms | error: RuntimeError: boom |" in text
    assert "| hstu | amp-bf16 | k10 10.00 ms (~2.00x fp32) | - |" in text
    assert "under 0.98x: dlrm" in text and "rewrites under 90% of fp32: dlrm 85%" in text
    assert "accuracy: 2/3 rows pass (FAIL: dlrm optimus-auto)" in text and "errors: hstu optimus-auto" in text
