"""The kernel benchmarks (optimus/tools/bench/kernels): each runs as ``python -m``, and the table
printers read their reports. The benchmarks themselves need a GPU (or minutes of the
interpreter: ``--dry-run``), so only their commands and printers are tested here."""

import importlib
import subprocess
import sys

import pytest

from optimus.tools.bench import kernels as kernel_benches


@pytest.mark.parametrize("name", ["grouped", "overhead", "embedding_bag", "aot_check"])
def test_every_kernel_benchmark_parses_its_command_line(name, capsys):
    """The commands docs/kernels.md gives (``python -m optimus.tools.bench.kernels.<name>``) import
    and answer ``--help``; the package docstring lists each."""
    mod = importlib.import_module(f"optimus.tools.bench.kernels.{name}")
    with pytest.raises(SystemExit) as exit_:
        mod.main(["--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out
    assert f"{name}.py" in kernel_benches.__doc__


def test_a_kernel_benchmark_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "optimus.tools.bench.kernels.aot_check", "--help"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "sm_90" in out.stdout


def test_bench_table_printer():
    from optimus.tools.bench.kernels import grouped as bench

    t = {"ms": 1.0}
    report = dict(date="d", gpu="g", torch="t", triton="tr", ceilings=dict(copy_TBps=4.0, bf16_mm_TFLOPs=700.0,
                                                                          fp32_tf32_mm_TFLOPs=350.0),
                  checks=[{"ok": True}], checks_failed=0,
                  grouped_linear=[dict(kind="mixed-small", G=16, act="none", dtype="bfloat16",
                                       times_ms=dict(ours_fwd=t, loop_fwd={"ms": 2.0}, ours_step=t,
                                                     loop_step={"ms": 3.0}, ours_nocache_step={"ms": 1.5}),
                                       rel_err_vs_loop=dict(y=1e-3, grads=2e-3), errors={"ours_graph": "x"}),
                                  dict(kind="mixed", G=4, act="none", dtype="bfloat16", error="boom")],
                  layer_norm=[dict(kind="large", G=8, times_ms=dict(ours_fwd=t), pct_copy_fwd=70.0)],
                  skipped=[["gl", "mixed", 64, "bfloat16"]], stopped="budget")
    out = bench.make_table(report)
    assert "mixed-small" in out and "3.00" in out and "FAILED: boom" in out and "skipped" in out
