"""The planner's decision cache and side-effect-free timing (optimus/planner/decisions.py, tune.py)."""

import logging

import torch

from optimus.planner.decisions import DecisionCache, graph_key
from optimus.planner.tune import time_compiled, why_not_tunable


def _gm(fn, *args):
    seen = {}

    def backend(gm, inputs):
        seen["gm"] = gm
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend)(*args)
    return seen["gm"]


def test_key_follows_structure_and_context_not_names_or_values():
    a = _gm(lambda x: torch.relu(x) * 2, torch.randn(4, 3))
    b = _gm(lambda y: torch.relu(y) * 2, torch.ones(4, 3))
    c = _gm(lambda x: torch.relu(x) * 2, torch.randn(5, 3))
    d = _gm(lambda x: torch.tanh(x) * 2, torch.randn(4, 3))
    ka = graph_key(a, {"device": "cpu"})
    assert ka == graph_key(b, {"device": "cpu"})
    assert ka != graph_key(c, {"device": "cpu"}) and ka != graph_key(d, {"device": "cpu"})
    assert ka != graph_key(a, {"device": "cpu", "cudagraphs": True})


def test_cache_round_trip_stale_and_corrupt(tmp_path, caplog):
    cache = DecisionCache(tmp_path / "d.json")
    assert cache.get("k", {"all"}) is None
    cache.put("k", {"plan": "all", "measured_ms": {"all": 1.0}})
    assert DecisionCache(tmp_path / "d.json").get("k", {"all", "none"})["plan"] == "all"
    logging.getLogger("optimus").addHandler(caplog.handler)
    try:
        assert cache.get("k", {"none"}) is None  # names a plan that no longer exists
        (tmp_path / "d.json").write_text("{not json")
        assert cache.get("k", {"all"}) is None
    finally:
        logging.getLogger("optimus").removeHandler(caplog.handler)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "stale planner decision" in messages and "ignoring the planner's decision cache" in messages
    cache.put("k2", {"plan": "none"})  # a corrupt file is replaced, not fatal
    assert cache.get("k2", {"none"})["plan"] == "none"


def test_timing_leaves_no_trace():
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4)

    def fn(w, x):
        return (torch.nn.functional.dropout(x @ w, 0.5, training=True),)

    torch.manual_seed(7)
    before = torch.rand(1)
    torch.manual_seed(7)
    ms = time_compiled(fn, [w, x], train=True, warmup=1, iters=3)
    assert ms > 0
    assert w.grad is None  # gradients computed, never accumulated
    assert torch.equal(torch.rand(1), before)  # the RNG state is as it was


def test_graphs_that_write_inputs_or_have_data_dependent_shapes_are_not_tuned():
    gm = _gm(lambda x: x * 2, torch.randn(3))
    assert why_not_tunable(gm, [torch.randn(3)], mutates_inputs=True).startswith("the graph writes its inputs")
    assert why_not_tunable(gm, [torch.randn(3)], mutates_inputs=False) is None
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    try:
        nz = _gm(lambda x: torch.nonzero(x).float().sum() + x.sum(), torch.randn(5))
    finally:
        torch._dynamo.config.capture_dynamic_output_shape_ops = False
    assert "data-dependent shapes" in (why_not_tunable(nz, [torch.randn(5)], mutates_inputs=False) or "")


def test_a_graph_with_symbolic_sizes_is_not_tuned():
    """Tuning under dynamic shapes declines with its reason (the trial compiles cannot
    re-create Dynamo's size symbols); the cost model plans, and nothing is said to fall back."""
    import optimus

    class Towers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.towers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))

        def forward(self, x):
            return torch.cat([t(p) for t, p in zip(self.towers, torch.split(x, 8, 1))], 1)

    torch._dynamo.reset()
    model = Towers()
    compiled = optimus.compile(model, dynamic=True, tune=True)
    for batch in (16, 24):
        x = torch.randn(batch, 32, requires_grad=True)
        out = compiled(x)
        torch.testing.assert_close(out, model(x))
        out.sum().backward()
    notes = compiled.optimus_report.notes
    assert any("not tuned: symbolic sizes" in n for n in notes), notes
    assert not any("could not be timed" in n or "compiled again" in n for n in notes), notes
    assert not any(g.discarded for g in compiled.optimus_report.graphs)
