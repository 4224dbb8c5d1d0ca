"""The device cost model (optimus/planner/costmodel.py)."""

import json
import logging

import pytest
import torch

from optimus.planner import costmodel as cm

H200ISH = cm.DEFAULTS["cuda"]


def test_small_gemms_batched_beat_the_loop_with_and_without_graphs():
    # 32 linears 512x256 @ 256x256, fp32: each one wave or less of tiles
    m, k, n, g = 512, 256, 256, 32
    one = cm.kernel_us(H200ISH, 4 * (m * k + k * n + m * n), 2 * m * k * n, "fp32", cm.matmul_tiles(m, n))
    batched = cm.kernel_us(H200ISH, g * 4 * (m * k + k * n + m * n), g * 2 * m * k * n, "fp32", cm.matmul_tiles(m, n, g))
    for launched in (True, False):
        loop = g * cm.kernel_us(H200ISH, 4 * (m * k + k * n + m * n), 2 * m * k * n, "fp32", cm.matmul_tiles(m, n), launched=launched)
        fused = cm.kernel_us(H200ISH, g * 4 * (m * k + k * n + m * n), g * 2 * m * k * n, "fp32", cm.matmul_tiles(m, n, g), launched=launched)
        assert fused < loop / 4
    assert batched > one  # but one batched kernel is not free


def test_two_large_copies_for_one_launch_lose_under_graphs_and_win_when_launch_bound_only_if_small():
    # two elementwise kernels of 64 MiB each, batched through a stack copy of their inputs
    nbytes = 64 * 2**20
    for launched in (True, False):
        before = 2 * cm.kernel_us(H200ISH, 2 * nbytes, launched=launched)
        after = cm.copy_us(H200ISH, 2 * nbytes, launched=launched) + cm.kernel_us(H200ISH, 4 * nbytes, launched=launched)
        assert after > before  # the copy moves more bytes than the launch saves
    small = 4096
    before = 2 * cm.kernel_us(H200ISH, 2 * small, launched=True)
    after = cm.copy_us(H200ISH, 2 * small, launched=True) + cm.kernel_us(H200ISH, 4 * small, launched=True)
    assert after == before  # two launches either way: no gain, no loss


def test_a_gemm_of_a_wave_or_more_runs_at_the_large_rate():
    large = H200ISH.matmul_tflops["fp32"]["large"]
    assert cm.matmul_rate(H200ISH, "fp32", 10 * H200ISH.units + 1) == large  # no partial last wave charged
    assert cm.matmul_rate(H200ISH, "fp32", 8) < large / 2  # one wave or less: occupancy


def test_weight_gradients_over_many_tokens_are_no_faster_batched():
    """HF BERT-base's weight gradients (768 x 768 outputs over 4096 tokens): a single
    product splits its long reduction, a batched one does not, so batching four of them
    buys nothing but launches (the planner then declines them; docs/planner.md)."""
    m, n, k, g = 768, 768, 4096, 4
    nbytes = 4 * (m * k + k * n + m * n)
    assert cm.matmul_tiles(m, n, k=k) == 4 * cm.matmul_tiles(m, n)  # split along k
    assert cm.matmul_tiles(m, n, g, k=k) == g * cm.matmul_tiles(m, n)  # batched: no split
    for launched in (True, False):
        loop = g * cm.kernel_us(H200ISH, nbytes, 2 * m * n * k, "fp32", cm.matmul_tiles(m, n, k=k), launched)
        fused = cm.kernel_us(H200ISH, g * nbytes, g * 2 * m * n * k, "fp32", cm.matmul_tiles(m, n, g, k=k), launched)
        assert fused >= loop - g * H200ISH.launch_us  # at best the launches saved
    # a short reduction keeps the occupancy gain of batching small products
    m, n, k = 512, 256, 256
    assert cm.matmul_tiles(m, n, k=k) == cm.matmul_tiles(m, n)


def test_cpu_probe_runs_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTIMUS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("OPTIMUS_DEVICE_PROFILE", raising=False)
    cm._PROFILES.clear()
    p = cm.profile("cpu")
    assert p.source.startswith("measured") and p.bandwidth_gbps > 0 and p.matmul_tflops["fp32"]["large"] > 0
    files = list(tmp_path.glob("profile-*.json"))
    assert len(files) == 1
    cm._PROFILES.clear()
    again = cm.profile("cpu", probe_if_missing=False)
    assert again == p  # read back from the cache, not probed again


def test_corrupt_cache_is_ignored_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("OPTIMUS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("OPTIMUS_DEVICE_PROFILE", raising=False)
    cm._PROFILES.clear()
    cm._cache_file(torch.device("cpu")).parent.mkdir(parents=True, exist_ok=True)
    cm._cache_file(torch.device("cpu")).write_text(json.dumps({"device": "x"}))
    logging.getLogger("optimus").addHandler(caplog.handler)
    try:
        p = cm.profile("cpu", probe_if_missing=False)
    finally:
        logging.getLogger("optimus").removeHandler(caplog.handler)
    assert p.source.startswith("defaults")
    assert any("ignoring the device profile cache" in r.getMessage() for r in caplog.records)
    cm._PROFILES.clear()


def test_the_defaults_variable_skips_the_probe(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTIMUS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OPTIMUS_DEVICE_PROFILE", "defaults")
    cm._PROFILES.clear()
    p = cm.profile("cpu")
    assert p.source.startswith("defaults") and "OPTIMUS_DEVICE_PROFILE" in p.source
    assert p.launch_us == cm.DEFAULTS["cpu"].launch_us
    assert not list(tmp_path.iterdir())  # nothing probed, nothing cached


def test_an_optimus_kernel_op_pays_its_host_call_only_when_launched():
    """A call of an ``optimus::`` op costs launch_us * (4.3 + 0.43 G) of host time when kernels
    are launched one by one (H200: 130 + 13 G µs per call, optimus.tools.bench.kernels.overhead), and
    nothing under CUDA graphs; other ops pay no such term."""
    import torch.fx as fx

    import optimus.kernels  # noqa: F401  (registers torch.ops.optimus.*)
    from optimus.planner import estimate

    g = fx.Graph()
    x = g.placeholder("x")
    op = g.call_function(torch.ops.optimus.grouped_linear.default, (x,))
    relu = g.call_function(torch.relu, (x,))
    p = cm.DEFAULTS["cuda"]
    fixed, per = estimate.CUSTOM_OP_HOST_LAUNCHES
    assert estimate.custom_op_host_us(op, 16, p, launched=True) == pytest.approx(p.launch_us * (fixed + per * 16))
    assert estimate.custom_op_host_us(op, 64, p, True) > estimate.custom_op_host_us(op, 4, p, True)
    assert estimate.custom_op_host_us(op, 16, p, launched=False) == 0.0
    assert estimate.custom_op_host_us(relu, 16, p, launched=True) == 0.0


# ------------------------------------------------------------------ precision
def _mm_group_costs(m, k, n, g, dtype, launched):
    """(members, batched) estimated µs of ``g`` mm's (m x k @ k x n) in ``dtype`` against one
    bmm of their stacks (the ``batch_mm`` rewrite), on the H200's documented profile."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from optimus.aten_ir.view import AtenIRView
    from optimus.planner import estimate

    def members(*ts):
        return [torch.mm(x, w) for x, w in zip(ts[:g], ts[g:])]

    def batched(*ts):
        return torch.bmm(torch.stack(ts[:g]), torch.stack(ts[g:])).unbind(0)

    ins = [torch.empty(m, k, dtype=dtype) for _ in range(g)] + [torch.empty(k, n, dtype=dtype) for _ in range(g)]
    out = []
    for fn in (members, batched):
        gm = make_fx(fn, tracing_mode="fake")(*ins)
        nodes = [nd for nd in gm.graph.nodes if nd.op == "call_function"]
        out.append(estimate.nodes_cost(AtenIRView(gm), nodes, H200ISH, launched).us)
    return out


def test_the_dtype_class_follows_the_tf32_switch():
    from optimus import torch_api as compat

    with compat.tf32(False):
        assert cm.dtype_class(torch.float32) == "fp32"
    with compat.tf32(True):
        assert cm.dtype_class(torch.float32) == "tf32"
        assert cm.dtype_class(torch.bfloat16) == cm.dtype_class(torch.float16) == "half"
    from support import float32_matmul_precision

    with float32_matmul_precision("high"):
        assert cm.dtype_class(torch.float32) == "tf32"
    with float32_matmul_precision("highest"):
        assert cm.dtype_class(torch.float32) == "fp32"


def test_one_matmul_costs_less_in_each_faster_class():
    m = k = n = 4096
    us = {cls: cm.kernel_us(H200ISH, 2 * (m * k + k * n + m * n), 2 * m * k * n, cls, cm.matmul_tiles(m, n)) for cls in cm.DTYPE_CLASSES}
    assert us["fp32"] > 5 * us["tf32"] and us["tf32"] > us["half"]  # 49, 375, 678 TFLOP/s


def test_a_group_that_does_not_pay_in_fp32_pays_in_bf16():
    """Eight 1024^3 matmuls: in fp32 each keeps the H200 busy (~44 µs at the large rate), so a
    batched one saves nothing and its stacks cost; in bf16 each takes a few µs, the launches and
    the small problems' occupancy dominate, and batching pays (with and without CUDA graphs)."""
    for launched in (True, False):
        before, after = _mm_group_costs(1024, 1024, 1024, 8, torch.float32, launched)
        assert after > before
        before, after = _mm_group_costs(1024, 1024, 1024, 8, torch.bfloat16, launched)
        assert after < before


def test_tf32_prices_fp32_matmuls_at_the_tf32_rate():
    from optimus import torch_api as compat

    with compat.tf32(False):
        ieee = _mm_group_costs(1024, 1024, 1024, 8, torch.float32, False)
    with compat.tf32(True):
        tf32 = _mm_group_costs(1024, 1024, 1024, 8, torch.float32, False)
    assert tf32[0] < ieee[0] / 3  # the members: 375 against 49 TFLOP/s (their bytes alike)
    assert tf32[1] < tf32[0]  # and now batching them pays, as in bf16


def test_copies_cost_bytes_per_element():
    """A memory-bound group (stacking large operands) costs half as much in bf16 as in fp32."""
    before32, after32 = _mm_group_costs(8192, 64, 64, 4, torch.float32, False)
    before16, after16 = _mm_group_costs(8192, 64, 64, 4, torch.bfloat16, False)
    assert after16 == pytest.approx(after32 / 2, rel=0.2) and before16 < before32


def test_a_linear_under_autocast_at_torch_ir_pays_the_casts_of_its_operands():
    """At Torch-IR autocast is implicit: F.linear of fp32 operands computes in bf16 on casts of
    them, one kernel each (at Aten-IR those are nodes of their own)."""
    from optimus.planner import estimate
    from optimus.torch_ir.view import TorchIRView

    found = {}

    def capture(tag):
        def backend(gm, ex):
            view = TorchIRView(gm)
            node = next(n for n in gm.graph.nodes if view.classify(n) is not None and view.classify(n).op == "linear")
            found[tag] = estimate.node_cost(view, node, H200ISH, launched=True)
            return gm.forward
        return backend

    x, w = torch.randn(64, 32), torch.randn(16, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.compile(torch.nn.functional.linear, backend=capture("autocast"), fullgraph=True)(x, w)
    torch._dynamo.reset()
    torch.compile(torch.nn.functional.linear, backend=capture("bf16"), fullgraph=True)(x.bfloat16(), w.bfloat16())
    assert found["autocast"].kernels == found["bf16"].kernels + 2  # x and w cast
    assert found["autocast"].us > found["bf16"].us
