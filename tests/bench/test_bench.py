"""``optimus bench`` on CPU: the JSON it writes, the table, the report, and bad input."""

from __future__ import annotations

import json

import pytest
import torch

from optimus.bench import cli, configs, harness, report, results

# Bench runs compile every configuration; keep them on the smallest graph and few steps.
MODEL = "dlrm"
FAST = ["--device", "cpu", "--size", "small", "--iters", "3", "--warmup", "1", "--quiet"]

try:
    import optimus

    HAVE_OPTIMUS_COMPILE = callable(getattr(optimus, "compile", None))
except ImportError:  # pragma: no cover
    HAVE_OPTIMUS_COMPILE = False


@pytest.fixture(scope="module")
def infer_json(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One bench run over every configuration (inference), shared by the checks below."""
    if not HAVE_OPTIMUS_COMPILE:
        pytest.skip("optimus.compile is not available yet")
    path = tmp_path_factory.mktemp("bench") / "results.json"
    # --warm-cache: every graph is still compiled with its configuration's passes, but
    # compiled C++ kernels and headers are reused (cold caches cost minutes on CI's CPU).
    rc = cli.main(["--model", MODEL, "--mode", "infer", "--json", str(path), "--warm-cache", *FAST])
    data = json.loads(path.read_text())
    data["_rc"] = rc
    return data


def test_every_configuration_present_and_valid(infer_json: dict) -> None:
    assert results.validate(infer_json) == []
    keys = set(infer_json["rows"])
    assert keys == {f"{MODEL}/infer/{c}" for c in configs.CONFIG_NAMES}
    for row in infer_json["rows"].values():
        assert row["status"] == "ok", row["error"]
        assert isinstance(row["kernels"], int) and row["kernels"] > 0
        assert row["step_ms"] > 0 and row["examples_per_s"] > 0
        assert row["peak_memory_bytes"] > 0
        assert row["batch_size"] == 32
        assert row["env"]["torch"] == torch.__version__ and row["env"]["device"] == "cpu"
        assert row["command"].startswith("optimus bench") and "--warm-cache" in row["command"]
        assert row["cold_compile"] is False
    assert infer_json["_rc"] == 0
    assert infer_json["commands"]


def test_parity_and_compile_times(infer_json: dict) -> None:
    rows = infer_json["rows"]
    for config, row in ((k.split("/")[-1], v) for k, v in rows.items()):
        assert row["parity"]["ok"], (config, row["parity"])
        if config == "eager":
            assert row["parity"]["out_max_abs"] == 0.0
            assert row["compile_s"] == 0.0
        else:
            assert row["compile_s"] > 0.0
    assert isinstance(rows[f"{MODEL}/infer/optimus"].get("optimus_rules"), dict)
    up = rows[f"{MODEL}/infer/upstream"]["upstream_options"]
    assert "batch_linear" in up["pre_grad"] and "split_cat_pass" in up["pre_grad"]
    assert "group_linear" not in up["post_grad"]  # needs fbgemm


def test_report_renders(infer_json: dict, tmp_path) -> None:
    data = {k: v for k, v in infer_json.items() if k != "_rc"}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    text = report.render(results.load(str(path)))
    assert "### Inference" in text and "| dlrm | optimus |" in text
    assert torch.__version__ in text
    table = results.format_table(data)
    assert all(c in table for c in configs.CONFIG_NAMES)


def test_plot(infer_json: dict, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from optimus.bench import plot

    out = tmp_path / "bench.png"
    plot.plot({k: v for k, v in infer_json.items() if k != "_rc"}, str(out))
    assert out.stat().st_size > 1000


def test_train_rows_merge_into_existing_file(tmp_path) -> None:
    """A second, partial run (training, two configurations) merges into the same JSON."""
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(results.merge(results.empty(), [_fake_row("towers32", "infer", "eager")], "x")))
    cfgs = "eager,optimus" if HAVE_OPTIMUS_COMPILE else "eager,inductor"
    rc = cli.main(["--model", MODEL, "--mode", "train", "--configs", cfgs, "--json", str(path), *FAST])
    data = json.loads(path.read_text())
    assert rc == 0
    assert set(data["rows"]) == {"towers32/infer/eager", f"{MODEL}/train/eager", f"{MODEL}/train/{cfgs.split(',')[1]}"}
    row = data["rows"][f"{MODEL}/train/{cfgs.split(',')[1]}"]
    assert row["cold_compile"] is True  # this run used fresh cache dirs
    assert row["parity"]["ok"] and "grad_max_rel" in row["parity"]
    assert row["kernels"] > 0
    # Resuming a piece: rows already measured are not run again.
    before = path.read_text()
    rc = cli.main(["--model", MODEL, "--mode", "train", "--configs", cfgs, "--json", str(path), "--skip-existing",
                   *FAST])
    assert rc == 0 and json.loads(path.read_text())["rows"] == json.loads(before)["rows"]


def test_failing_configuration_keeps_other_rows(monkeypatch, tmp_path) -> None:
    def broken(model):
        raise RuntimeError("deliberately broken configuration")

    bad = configs.BenchConfig("broken", "raises", True, broken, configs._nothing)
    monkeypatch.setitem(configs.CONFIGS, "broken", bad)
    opts = harness.BenchOptions(device="cpu", size="small", iters=2, warmup=0)
    rows = harness.run(["towers32"], ["infer"], ["broken", "eager"], opts)
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert "deliberately broken" in rows[0]["error"]
    data = results.merge(results.empty(), rows)
    assert "error: RuntimeError: deliberately broken" in results.format_table(data)
    assert "error: RuntimeError" in report.render(data)


def test_bad_input(capsys) -> None:
    assert cli.main(["--model", "resnet", *FAST]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'resnet'" in err and "dlrm" in err and "splitcat" in err
    assert cli.main(["--model", MODEL, "--mode", "fly", *FAST]) == 2
    err = capsys.readouterr().err
    assert "unknown mode 'fly'" in err and "train, infer" in err
    assert cli.main(["--model", MODEL, "--configs", "magic", *FAST]) == 2
    assert "optimus-horizontal" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_without_gpu(capsys) -> None:
    assert cli.main(["--model", MODEL, "--device", "cuda", "--quiet"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_register_adds_bench_subcommand() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli.register(sub)
    args = parser.parse_args(["bench", "--model", "dlrm", "--mode", "infer", "--json", "x.json"])
    assert args.func is cli.run_command and args.model == "dlrm" and args.json == "x.json"


def test_validate_catches_malformed_rows() -> None:
    data = results.merge(results.empty(), [_fake_row("dlrm", "train", "eager")])
    assert results.validate(data) == []
    data["rows"]["dlrm/train/eager"]["kernels"] = "many"
    data["rows"]["dlrm/train/eager"].pop("env")
    problems = results.validate(data)
    assert any("kernels" in p for p in problems) and any("env" in p for p in problems)


def test_upstream_options_discovery() -> None:
    opts = configs.upstream_fusion_options()
    assert set(opts) == {"pre_grad", "post_grad"}
    assert opts["pre_grad"] and opts["post_grad"]
    assert "group_linear" not in opts["post_grad"]
    assert all(v == {} for v in opts["pre_grad"].values())


def _fake_row(model: str, mode: str, config: str) -> dict:
    return {
        "model": model, "mode": mode, "config": config, "size": "small", "device": "cpu", "status": "ok",
        "error": None, "batch_size": 4, "kernels": 10, "step_ms": 1.0, "examples_per_s": 4000.0,
        "peak_memory_bytes": 1 << 20, "compile_s": 0.0, "first_step_s": 0.01,
        "parity": {"ok": True, "out_max_abs": 0.0, "out_max_rel": 0.0, "tol": 1e-3},
        "env": {"torch": torch.__version__, "device": "cpu", "device_name": "cpu", "date": "2025-01-01 00:00 UTC"},
    }


def test_budget_and_skip_stop_before_running(tmp_path) -> None:
    import time

    opts = harness.BenchOptions(device="cpu", size="small", iters=1, warmup=0)
    assert harness.run(["dlrm"], ["infer"], ["eager"], opts, deadline=time.perf_counter() - 1) == []
    assert harness.run(["dlrm"], ["infer"], ["eager"], opts, skip={"dlrm/infer/eager"}) == []
