"""The accuracy rule of PyTorch's dynamo benchmarks, as ``optimus bench`` applies it."""

from __future__ import annotations

import math

import pytest
import torch

from optimus.tools.bench import accuracy


def _triple(n: int, ref_noise: float, res_noise: float, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """An fp64 'exact' tensor, an fp32 eager result off by ``ref_noise`` RMS, and a
    result off by ``res_noise`` RMS (independent noise)."""
    g = torch.Generator().manual_seed(seed)
    exact = torch.randn(n, generator=g, dtype=torch.float64)
    ref = (exact + ref_noise * torch.randn(n, generator=g, dtype=torch.float64)).float()
    res = (exact + res_noise * torch.randn(n, generator=g, dtype=torch.float64)).float()
    return ref, res, exact


def test_dynamo_same_is_the_judge() -> None:
    assert accuracy.dynamo_same() is not None, "torch._dynamo.utils.same is missing or changed signature"
    assert accuracy.accuracy_tolerance("cpu", "train") == 1e-4
    assert accuracy.accuracy_tolerance("cuda", "train") == 1e-3
    assert accuracy.accuracy_tolerance("cuda", "infer") == 1e-4


@pytest.mark.parametrize(
    "res_noise, how",
    [(0.0, "allclose"),  # the result is eager itself
     (1.5e-2, "rmse"),  # 1.5x eager's error: beyond allclose, within 2x
     (5e-2, "fail")],  # 5x eager's error
)
def test_rule_on_one_tensor(res_noise: float, how: str) -> None:
    ref, res, exact = _triple(4096, 1e-2, res_noise)
    if res_noise == 0.0:
        res = ref.clone()
    v = accuracy.judge_tensor("t", ref, res, exact, tol=1e-4)
    assert v.how == how and v.ok == (how != "fail")
    assert v.multiplier == 2.0  # fp32, >= 1000 elements
    if how != "allclose":
        assert v.ratio == pytest.approx(res_noise / 1e-2, rel=0.1)
        assert v.res_rmse == pytest.approx(accuracy.rmse(exact, res))


def test_small_tensors_get_multiplier_three() -> None:
    ref, res, exact = _triple(500, 1e-2, 2.5e-2, seed=1)  # 2.5x: fails at 2x, passes at 3x
    v = accuracy.judge_tensor("t", ref, res, exact, tol=1e-4)
    assert v.multiplier == 3.0 and v.how == "rmse" and 2.0 < v.ratio < 3.0


def test_fallback_rule_agrees_with_dynamo_same(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [_triple(n, 1e-2, r, seed=s) for s, (n, r) in enumerate(
        [(4096, 0.0), (4096, 1.2e-2), (4096, 3e-2), (300, 2.5e-2), (300, 4e-2), (2000, 1e-6)])]
    ref, _, exact = cases[0]
    cases.append((ref, ref + 1e-6, exact))
    with_same = [accuracy.judge_tensor("t", *c, tol=1e-4) for c in cases]
    monkeypatch.setattr(accuracy, "_SAME", None)
    monkeypatch.setattr(accuracy, "_SAME_CHECKED", True)
    without = [accuracy.judge_tensor("t", *c, tol=1e-4) for c in cases]
    assert [v.how for v in with_same] == [v.how for v in without]
    assert {v.how for v in with_same} == {"allclose", "rmse", "fail"}


def test_judge_record_outputs_and_gradients() -> None:
    out_ref, out_res, out64 = _triple(64, 1e-3, 1e-3)
    g_ref, g_bad, g64 = _triple(4096, 1e-2, 8e-2, seed=3)
    ref = accuracy.Reference(out_ref, [g_ref, g_ref.clone()], out64, [g64, g64.clone()], ["w", "b"])
    rec = accuracy.judge(ref, out_res, [g_ref.clone(), g_bad], tol=1e-4)
    assert rec["rule"] == accuracy.RULE and rec["tol"] == 1e-4 and rec["tf32"] is False
    assert rec["out_ok"] and not rec["grads_ok"] and not rec["ok"]
    assert rec["worst_tensor"] == "grad b" and rec["worst_rmse_ratio"] == pytest.approx(8.0, rel=0.15)
    assert rec["grad_rmse_ratio"] == rec["worst_rmse_ratio"] and rec["worst_multiplier"] == 2.0
    assert rec["tensors"] == 3 and rec["failed_count"] == 1 and rec["failed"][0].startswith("grad b: RMSE")
    assert rec["passed_allclose"] + rec["passed_rmse"] == 2
    assert "out_max_rel" in rec and "grad_max_abs" in rec
    # a gradient that the result lacks fails the row
    rec = accuracy.judge(ref, out_ref.clone(), [g_ref.clone(), None], tol=1e-4)
    assert not rec["ok"] and not rec["grads_ok"] and rec["grads_missing"] == 1
    assert rec["failed"] == ["grad b: gradient missing"] and rec["worst_rmse_ratio"] is None
    # everything identical: every tensor allclose, no ratio to report
    rec = accuracy.judge(ref, out_ref.clone(), [g_ref.clone(), g_ref.clone()], tol=1e-4)
    assert rec["ok"] and rec["passed_allclose"] == 3 and rec["worst_rmse_ratio"] is None


def test_ratio_edge_cases() -> None:
    v = accuracy.TensorVerdict("t", True, "allclose", 0.0, 0.0, 2.0)
    assert v.ratio == 1.0
    assert math.isinf(accuracy.TensorVerdict("t", False, "fail", 1e-3, 0.0, 2.0).ratio)
    shape = accuracy.judge_tensor("t", torch.zeros(3), torch.zeros(4), torch.zeros(3, dtype=torch.float64), 1e-4)
    assert not shape.ok and "shape" in shape.message


def test_eager_reference_is_fp32_and_fp64_of_the_same_step() -> None:
    ref = accuracy.eager_reference("dlrm", "train", "small", "cpu", seed=0)
    assert ref.output.dtype == torch.float32 and ref.output64.dtype == torch.float64
    assert len(ref.grads) == len(ref.grads64) == len(ref.names) > 0
    assert all(g.dtype == torch.float64 for g in ref.grads64 if g is not None)
    # fp32 is within rounding of fp64, and not equal to it (the copy really is fp64)
    err = (ref.output.double() - ref.output64).abs().max().item()
    assert 0 < err < 1e-4
    infer = accuracy.eager_reference("dlrm", "infer", "small", "cpu", seed=0)
    assert infer.grads == [] and infer.names == [] and torch.equal(infer.output, ref.output)


def test_fp64_copy_keeps_integer_inputs() -> None:
    model = torch.nn.EmbeddingBag(10, 4)
    idx, w = torch.tensor([[1, 2]]), torch.ones(1, 2)
    m64, (idx64, w64) = accuracy.fp64_copy(model, (idx, w))
    assert m64.weight.dtype == torch.float64 and idx64.dtype == torch.int64 and w64.dtype == torch.float64
