"""The driver's guarantees: rollback of broken rules, validation, accounting, budget."""

import collections
import logging

import pytest
import torch

import optimus
from optimus import Op, Var
from optimus.core.levels import make_view
from optimus.core.registry import REGISTRY
from support import check_level, run_level


@pytest.fixture
def temp_rule():
    added = []

    def make(pattern, fn, **kw):
        r = optimus.rule(pattern, **kw)(fn)
        added.append(r.name)
        return r

    yield make
    for name in added:
        REGISTRY.remove(name)


def f_relu_cat(x):
    a, b = x.split(4, 1)
    return torch.cat([a, b], 1).relu() * 2


@pytest.mark.parametrize("level", ["torch_ir", "aten_ir"])
def test_raising_rule_is_rolled_back_and_reported(temp_rule, level, caplog):
    def broken(m, b):
        b.tanh(m.x)  # emits a node, then fails: the node must disappear
        raise RuntimeError("boom")

    temp_rule(Op("relu", Var("x")), broken, name="test_broken_rule")
    optimus_log = logging.getLogger("optimus")  # torch's logging may have stopped it propagating
    optimus_log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="optimus"):
            run = run_level(f_relu_cat, [torch.randn(3, 8)], level)
    finally:
        optimus_log.removeHandler(caplog.handler)
    errors = run.errors()
    assert errors and "boom" in errors[0]
    assert "test_broken_rule" in caplog.text
    assert run.ops(0)["tanh"] == 0  # the emitted node was removed
    assert run.matched("split_cat_to_identity") == 1  # other rules still ran


def test_wrong_shape_replacement_is_rejected(temp_rule):
    temp_rule(Op("relu", Var("x")), lambda m, b: b.sum_placeholder(m.x) if False else b.cat([m.x, m.x], 0), name="test_bad_shape")
    run = run_level(f_relu_cat, [torch.randn(3, 8)], "torch_ir")
    assert any("shape changed" in e for e in run.errors())
    torch.testing.assert_close(run.outputs, f_relu_cat(torch.randn(3, 8)) * 0 + run.outputs)  # ran fine


def test_user_rule_applies_and_compile_succeeds_with_broken_rule(temp_rule):
    temp_rule(Op("relu", Var("x")), lambda m, b: (_ for _ in ()).throw(ValueError("bad rule")), name="test_broken_compile")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(4, 8)
    compiled = optimus.compile(model)
    torch.testing.assert_close(compiled(x), model(x))
    report = compiled.optimus_report
    assert any("bad rule" in e for e in report.errors())
    assert "error (rolled back)" in report.table()


def test_accounting_is_exact():
    def f(x):
        a, b, c = x.split([2, 3, 3], -1)
        b1, b2 = b.split([1, 2], -1)
        y = torch.cat([a, b1, b2, c], -1)
        (z,) = torch.split(y, 8, 1)
        return z.tanh()

    for level in ("torch_ir", "aten_ir"):
        run = check_level(f, [torch.randn(5, 8)], level)
        for rep in run.reports:
            for g in rep.graphs:
                net = sum(s.removed - s.added for s in g.rules.values())
                assert g.nodes_before - g.nodes_after == net, g.to_dict()


def test_rule_cycle_stops_at_budget(temp_rule):
    # relu(x) -> relu(x) again (a fresh node every time): a cycle only the budget stops
    temp_rule(Op("relu", Var("x")), lambda m, b: b.relu(m.x), name="test_cycle")
    run = run_level(lambda x: x.relu() + 1, [torch.randn(4)], "torch_ir", passes=["test_cycle"])
    notes = [n for rep in run.reports for g in rep.graphs for n in g.notes]
    assert any("rewrite budget" in n for n in notes)
    torch.testing.assert_close(run.outputs, torch.randn(4) * 0 + run.outputs)


def test_numeric_check_names_the_culprit(temp_rule):
    # Same shape, wrong values: only the numeric check can catch it.
    temp_rule(Op("tanh", Var("x")), lambda m, b: b.sigmoid(m.x), name="test_wrong_values")
    gm = torch.fx.symbolic_trace(lambda x: torch.cat(x.split(2, 1), 1).tanh() + 1)
    x = torch.randn(3, 4)
    expected = gm(x)
    out = optimus.optimize(gm, passes={"torch_ir": "all", "options": {"numeric_check": True}}, example_inputs=[x])
    report = optimus.last_report()
    notes = report.graphs[0].notes
    assert any("test_wrong_values" in n for n in notes), notes
    torch.testing.assert_close(out(x), expected)  # culprit rolled back, the rest kept
    assert report.graphs[0].rules["split_cat_to_identity"].matched == 1


def test_optimize_rejects_bad_input():
    with pytest.raises(TypeError, match="GraphModule"):
        optimus.optimize(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="torch_ir"):
        optimus.optimize(torch.fx.symbolic_trace(torch.nn.ReLU()), level="inductor_ir")


def test_optimize_without_shapes_declines_shape_rules():
    gm = torch.fx.symbolic_trace(lambda x: torch.cat(torch.split(x, [2, 2], 1), 1) + 1)
    optimus.optimize(gm)  # no example inputs, no metadata: still the identity is provable
    x = torch.randn(3, 4)
    torch.testing.assert_close(gm(x), x + 1)


def test_level_rollback_when_driver_crashes(monkeypatch):
    from optimus.core import driver

    def crash(self):
        self.graph.erase_node  # noqa: B018
        raise RuntimeError("driver bug")

    monkeypatch.setattr(driver.FxDriver, "run", crash)
    gm = torch.fx.symbolic_trace(lambda x: torch.cat(torch.split(x, [2, 2], 1), 1) + 1)
    before = len(gm.graph.nodes)
    optimus.optimize(gm, example_inputs=[torch.randn(2, 4)])
    assert len(gm.graph.nodes) == before
    assert any("rolled back" in n for n in optimus.last_report().graphs[0].notes)


# --------------------------------------------------------------- fixpoint
def _graph_at(level, fn, x):
    """``fn`` traced at ``level`` with shape metadata: symbolic_trace and fake-tensor
    propagation (Torch-IR), make_fx (Aten-IR)."""
    if level == "torch_ir":
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp

        gm = torch.fx.symbolic_trace(fn)
        mode = FakeTensorMode()
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(mode.from_tensor(x))
        return gm
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(x)


def _drive(level, gm, names, reverse):
    from optimus.core.driver import FxDriver
    from optimus.core.registry import resolve
    from optimus.core.report import GraphReport

    config = resolve(names)
    rules = [(r, config.options_for(level, r)) for r in config.rules_for(level)]
    driver = FxDriver(make_view(level, gm), rules, GraphReport(level, "test"), reverse=reverse)
    driver.run()
    gm.graph.lint()
    gm.recompile()
    return driver


def _patterns_made_by_rewrites(x):
    # cat(split(relu(x))) -> relu(x) leaves relu(relu(x)) behind
    y = torch.relu(torch.cat(torch.split(torch.relu(x), 4, 1), 1))
    # neg(neg(chunk)) -> chunk leaves cat(split(x * 3)) behind
    a, b = torch.split(x * 3, 4, 1)
    z = torch.cat([torch.neg(torch.neg(a)), b], 1)
    return y + z


@pytest.mark.parametrize("reverse", [False, True], ids=["graph_order", "reversed"])
@pytest.mark.parametrize("level", ["torch_ir", "aten_ir"])
def test_the_driver_reaches_its_fixpoint_whichever_rule_goes_first(temp_rule, level, reverse):
    """A rewrite that creates another rule's pattern (in either direction) is followed by
    that rule, whatever order the worklist visits the graph in: the replacement's users
    and the erased nodes' surviving producers are visited again."""
    temp_rule(Op("relu", Op("relu", Var("x")).bind("inner")), lambda m, b: m.inner, name="test_relu_relu")
    temp_rule(Op("neg", Op("neg", Var("x"))), lambda m, b: m.x, name="test_neg_neg")
    x = torch.randn(3, 8)
    gm = _graph_at(level, _patterns_made_by_rewrites, x)
    driver = _drive(level, gm, ["canonicalize_split_cat_args", "split_cat_to_identity", "test_relu_relu", "test_neg_neg"], reverse)
    view = make_view(level, gm)
    ops = collections.Counter(c.op for c in map(view.classify, gm.graph.nodes) if c is not None)
    assert (ops["neg"], ops["cat"], ops["split"], ops["relu"]) == (0, 0, 0, 1), ops
    rewrites = [name for name in driver.applied if not name.startswith("canonicalize")]
    assert sorted(rewrites) == ["split_cat_to_identity", "split_cat_to_identity", "test_neg_neg", "test_relu_relu"]
    torch.testing.assert_close(gm(x), _patterns_made_by_rewrites(x))
