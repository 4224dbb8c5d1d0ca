"""The Inductor-IR merges' memory bound (the planner's ``ScheduleMemory``, set by ``passes="auto"``):
the simulated order of a merge, its rise, and the towers case the H200 measured (merges
that doubled towers32's peak while Inductor's estimate of the peak did not move)."""

from __future__ import annotations

import pytest
import torch

from optimus.inductor_ir import inductor_api
from optimus.planner import schedule_memory
from optimus.planner.schedule_memory import local_rise, merged_order

from inductor_ir_support import SCENARIOS, run_compiled

needs_hooks = pytest.mark.skipif(not inductor_api.hooks_supported()[0], reason="torch without scheduler hooks")


def test_merged_order_moves_what_the_later_members_need_ahead_of_the_first():
    a, b, c, d, e, f = "abcdef"
    deps = {("c", "d"), ("e", "f")}  # c must run before d; e before f (f is not a member)
    order, (new, ahead) = [a, b, c, d, e, f], merged_order([a, b, c, d, e, f], [b, d], lambda x, y: (x, y) in deps)
    assert new == [a, c, b, d, e, f] and ahead == [c]
    assert merged_order(order, [a, b], lambda x, y: False) == (order, [])  # adjacent, nothing needed: unchanged


def test_local_rise_is_the_peak_change_over_the_reordered_stretch():
    a, b, c, d = "abcd"
    # the global peak (100, at the end) does not move; where b and c swap, 10 -> 30
    assert local_rise([a, b, c, d], [5, 10, 10, 5, 100], [a, c, b, d], [5, 30, 10, 5, 100]) == 20
    assert local_rise([a, b, c, d], [5, 10, 10, 5, 100], [a, c, b, d], [5, 8, 8, 5, 100]) == 0  # lower: no rise
    assert local_rise([a, b], [1, 2, 3], [a, b], [1, 9, 3]) == 0  # same order: nothing reordered


def towers(x, *ws):
    """towers32 in small: a matmul per tower (an extern kernel), then a normalisation (a
    reduction kernel) writing its slice of one concatenated output."""
    outs = []
    for xi, w in zip(x.split(16, 1), ws):
        h = xi @ w
        outs.append(torch.relu(h - h.mean(-1, keepdim=True)))
    return torch.cat(outs, 1)


def towers_inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1024, 8 * 16, generator=g)] + [torch.randn(16, 16, generator=g) for _ in range(8)]


@needs_hooks
def test_combining_towers_that_wait_for_their_matmuls_counts_the_matmuls_outputs(fake_gpu, monkeypatch):
    """Unbounded, the towers' normalisations become combo launches; bounded, each combo
    would run every member's matmul first and hold their outputs, which the estimate's
    peak does not show (the towers' output grows slice by slice in it): declined, with
    the bytes in the reason."""
    free = run_compiled(towers, towers_inputs(), {"inductor_ir": ["combo_small_kernels"]}, grad=False)
    assert free.matched("combo_small_kernels") >= 1
    monkeypatch.setattr(schedule_memory, "MEMORY_SLACK", 0)
    bounded = run_compiled(towers, towers_inputs(), {"inductor_ir": {"combo_small_kernels": {"memory_increase": 0.0}}}, grad=False)
    assert bounded.matched("combo_small_kernels") == 0
    reasons = list(bounded.declines("combo_small_kernels"))
    # a 1024x16 fp32 matmul output moved ahead: that alone declines it, before the order is priced
    assert any(r.startswith("memory: the merged kernel would hold at least 0.06 MiB more at once") for r in reasons), reasons


@needs_hooks
def test_the_estimate_followed_through_merges_is_the_one_prepared_anew(fake_gpu, monkeypatch):
    """After each accepted merge the estimate is updated in place (``PeakEstimate.merged``)
    instead of re-running Inductor's planning preparation; every updated curve equals the
    one a fresh preparation of the merged list gives, for fused kernels (forward and
    backward) and combo launches."""
    checks: list[bool] = []
    monkeypatch.setattr(schedule_memory.ScheduleMemory, "update_checks", checks)
    fn, make_inputs, grad = SCENARIOS["independent"]
    fused = run_compiled(fn, make_inputs(), {"inductor_ir": {"fuse_independent_kernels": {"memory_increase": 10.0}}}, grad)
    assert fused.matched("fuse_independent_kernels") == 3
    combo = run_compiled(towers, towers_inputs(), {"inductor_ir": {"combo_small_kernels": {"memory_increase": 10.0}}}, grad=False)
    assert combo.matched("combo_small_kernels") >= 1
    assert len(checks) >= 4 and all(checks), checks
