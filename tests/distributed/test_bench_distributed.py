"""``python -m optimus.tools.bench.distributed``: the plan and arguments (fast), and one real
run on 2 CPU processes (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from optimus.tools.bench import distributed as bd

HERE = os.path.dirname(__file__)


def test_plan_and_arguments(capsys) -> None:
    assert bd.main(["--nproc", "2", "--device", "cpu", "--plan"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # the default models x DDP x (eager, inductor, optimus), model by model
    assert [line.split()[0] for line in lines] == [f"{m}/ddp/{c}" for m in bd.DEFAULT_MODELS for c in bd.CONFIGS]
    assert all("size=small" in line and "on 2 x cpu" in line for line in lines)

    assert bd.main(["--nproc", "1", "--device", "cpu", "--models", "dcnv2", "--wrappers", "ddp,fsdp2,none",
                    "--configs", "optimus", "--plan"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["dcnv2/ddp/optimus", "dcnv2/fsdp2/optimus", "dcnv2/none/optimus"]

    for bad, message in [
        (["--models", "nosuchmodel"], "unknown model 'nosuchmodel'"),
        (["--configs", "upstream"], "unknown configuration 'upstream'"),
        (["--wrappers", "ddp3"], "unknown wrapper 'ddp3'"),
        (["--wrappers", "none"], "use it with --nproc 1"),
    ]:
        assert bd.main(["--nproc", "2", "--device", "cpu", "--plan", *bad]) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bd.main(["--device", "cpu"])  # --nproc is required


def test_merge_and_table() -> None:
    """Rank results merge into one row: the slowest rank's step, each rank's memory, the
    loss agreement with the 1-process run, whether the ranks' parameters agree."""
    spec = bd.RowSpec("dcnv2", "ddp", "optimus")
    base = {"key": spec.key, "spec": vars(spec), "status": "ok", "error": None, "examples_per_s": 1000.0,
            "optimus": {"rewrites": 5, "graphs": [{"level": "torch_ir", "graph": "graph 0", "notes": []}]}}
    r0 = {**base, "step_ms": 10.0, "peak_memory_bytes": 3 << 20, "param_digest": "a", "losses": [1.0, 0.5],
          "reference": {"losses": [1.0, 0.5 * (1 + 2e-6)]}, "kernels": 42}
    r1 = {**base, "step_ms": 12.5, "peak_memory_bytes": 4 << 20, "param_digest": "a"}
    [row] = bd.merge([{"device": "cpu", "rows": [r0]}, {"device": "cpu", "rows": [r1]}])
    assert row["step_ms"] == 12.5 and row["step_ms_per_rank"] == [10.0, 12.5]
    assert row["examples_per_s"] == pytest.approx(800.0)
    assert row["peak_memory_bytes_per_rank"] == [3 << 20, 4 << 20]
    assert row["ranks_agree"] is True
    assert row["loss_max_rel_err"] == pytest.approx(2e-6, rel=1e-3) and bd.agreement_ok(row)
    text = bd.table([row])
    assert "dcnv2" in text and "12.500" in text and "yes" in text

    r1_bad = {**r1, "param_digest": "b", "status": "error", "error": "RuntimeError: x"}
    [bad] = bd.merge([{"device": "cpu", "rows": [r0]}, {"device": "cpu", "rows": [r1_bad]}])
    assert bad["status"] == "error" and bad["error"] == "rank 1: RuntimeError: x" and bad["ranks_agree"] is False


@pytest.mark.slow
def test_two_cpu_processes_end_to_end(tmp_path) -> None:
    out = tmp_path / "dist.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.path.dirname(os.path.dirname(HERE)), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "optimus.tools.bench.distributed", "--nproc", "2", "--device", "cpu",
           "--models", "dist_models:tiny", "--configs", "eager,optimus", "--wrappers", "ddp,fsdp2",
           "--warm-cache", "--warmup", "1", "--iters", "3", "--timeout-minutes", "15", "--json-out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["nproc"] == 2 and doc["env"]["device"] == "cpu"
    assert [r["key"] for r in doc["rows"]] == [f"dist_models:tiny/{w}/{c}" for w in ("ddp", "fsdp2") for c in ("eager", "optimus")]
    for row in doc["rows"]:
        assert row["status"] == "ok" and row["ranks_agree"]
        assert row["step_ms"] > 0 and row["examples_per_s"] > 0 and row["kernels"] > 0
        assert len(row["peak_memory_bytes_per_rank"]) == 2 and all(p > 0 for p in row["peak_memory_bytes_per_rank"])
        assert row["loss_max_rel_err"] <= 1e-5
    assert all(r["optimus"]["rewrites"] > 0 for r in doc["rows"] if r["spec"]["config"] == "optimus")
    assert "dist_models:tiny" in proc.stdout  # the table
