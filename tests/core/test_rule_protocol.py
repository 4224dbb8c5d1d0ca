"""One rule protocol for every level: the base, its three kinds, conditions, filters,
options, fingerprints, and the order rules run in."""

import pytest
import torch

import optimus
from optimus import Op, Var
from optimus.core.group import GroupRule, group_rule
from optimus.core.registry import REGISTRY, STAGES, resolve
from optimus.core.rule import PatternRule, Rule, rule, unmet
from optimus.inductor_ir.rule import FusionRule, fusion_rule

def test_rules_list_by_stage():
    """The registry lists a level's rules stage by stage (the order at each anchor, which
    is what the drivers use, is recorded in ``test_rule_order.py``)."""
    for level in ("torch_ir", "aten_ir", "inductor_ir"):
        ranks = [list(STAGES).index(r.stage) for r in REGISTRY.rules(level)]
        assert ranks == sorted(ranks), level


def test_three_kinds_one_base_one_catalogue():
    kinds = {type(r) for r in REGISTRY.rules()}
    assert {PatternRule, GroupRule, FusionRule} <= kinds
    for r in REGISTRY.rules():
        assert isinstance(r, Rule)
        assert r.anchors and r.doc and len(r.fingerprint()) == 16
        assert set(r.class_options()) <= set(r.option_defaults()) == set(r.options)
    assert isinstance(REGISTRY.get("merge_splits"), PatternRule)
    assert isinstance(REGISTRY.get("batch_linear"), GroupRule)
    assert isinstance(REGISTRY.get("fuse_independent_kernels"), FusionRule)
    assert isinstance(REGISTRY.get("fuse_independent_kernels"), PatternRule)  # a pattern over node kinds


def test_rule_constructor_still_builds_pattern_rules():
    r = Rule(name="test_direct", pattern=Op("relu", Var("x")), replace=lambda m, b: m.x)
    assert type(r) is PatternRule and r.anchors == ("relu",)
    with pytest.raises(TypeError, match="protocol"):
        Rule(name="test_no_kind", replace=lambda m, b: None)


def test_a_rules_class_gives_it_the_options_its_driver_reads():
    assert GroupRule.CLASS_OPTIONS == {"min_group": 2, "max_group": 256, "max_span": 4096}
    batch = REGISTRY.get("batch_pointwise")
    assert batch.option_defaults() == {"min_group": 3, "max_group": 256, "max_span": 4096, "max_stack_bytes": 256 * 2**20}
    fusion = REGISTRY.get("fuse_producer_consumer")
    assert fusion.option_defaults() == {"max_rounds": 10, "relaxed": False, "max_nodes": 64}
    assert {"max_attempts", "verify_codegen", "benchmark"} <= set(REGISTRY.get("combo_small_kernels").option_defaults())
    key = lambda call, view: None  # noqa: E731
    mine = group_rule("relu", key=key, options={"min_group": 4, "mine": 1}, register=False)(lambda g, b: {})
    assert mine.option_defaults() == {"min_group": 4, "max_group": 256, "max_span": 4096, "mine": 1}
    with pytest.raises(ValueError, match="'min_group' must be >= 2"):
        group_rule("relu", key=key, options={"min_group": 1}, register=False)(lambda g, b: {})
    assert "min_group" not in rule(Op("relu", Var("x")), register=False)(lambda m, b: m.x).option_defaults()
    # users set any of them per rule; all reach the driver's view of the rule
    cfg = resolve({"torch_ir": {"batch_pointwise": {"min_group": 5, "max_stack_bytes": 1024}}})
    opts = cfg.options_for("torch_ir", batch)
    assert opts["min_group"] == 5 and opts["max_stack_bytes"] == 1024 and opts["max_group"] == 256
    with pytest.raises(TypeError, match="sets kind itself"):
        group_rule("relu", key=key, kind="vertical", register=False)


def test_condition_form():
    def requires_positive(m):
        """the value is not positive"""
        return m > 0

    def requires_small(m):
        """never shown"""
        return None if m < 10 else f"{m} is not below 10"

    assert unmet(requires_positive, 3) is None
    assert unmet(requires_positive, -1) == "the value is not positive"
    assert unmet(requires_small, 3) is None
    assert unmet(requires_small, 12) == "12 is not below 10"
    assert unmet(lambda m: "", 0) == "<lambda>"  # an empty reason falls back to the name


def test_conditions_decline_with_their_reason_and_filters_stay_silent():
    def requires_wide_input(m):
        """never shown: the condition returns its own reason"""
        return None if m.shape(m.x)[-1] > 100 else f"the input has only {m.shape(m.x)[-1]} columns"

    def about_tanh_inputs(m):  # runs before the rest of the pattern: the anchor and its own capture
        assert m.sig is m.anchor.node and "x" not in m.bindings
        source = m.call(m.anchor.args["input"])
        return source is not None and source.op == "tanh"

    r1 = optimus.rule(Op("relu", Var("x")), where=[requires_wide_input], name="test_reason_rule")(lambda m, b: m.x)
    r2 = optimus.rule(Op("sigmoid", Var("x")).bind("sig").such_that(about_tanh_inputs), name="test_silent_rule")(lambda m, b: m.x)
    try:
        gm = torch.fx.symbolic_trace(lambda x: (x.relu() + 1).sigmoid() + x.tanh().sigmoid())
        x = torch.randn(3, 4)
        expected = gm(x)
        optimus.optimize(gm, passes=["test_reason_rule", "test_silent_rule"], example_inputs=[x])
        stats = optimus.last_report().graphs[0].rules
        assert dict(stats["test_reason_rule"].declined) == {"the input has only 4 columns": 1}
        assert stats["test_silent_rule"].matched == 1  # sigmoid(tanh(x)): the filter let it through
        assert not stats["test_silent_rule"].declined  # sigmoid(x + 1): turned away silently
        torch.testing.assert_close(gm(x) - expected, (x.tanh() - x.tanh().sigmoid()))
    finally:
        REGISTRY.remove(r1.name)
        REGISTRY.remove(r2.name)


def test_filters_go_on_the_root():
    with pytest.raises(ValueError, match="filters go on the pattern's root"):
        rule(Op("relu", Op("tanh", Var("x")).such_that(lambda m: True)), register=False)(lambda m, b: m.x)


def test_fingerprint_follows_code_options_and_filters():
    def make(filter_fn, options=None, **kw):
        return rule(Op("relu", Var("x")).such_that(filter_fn), name="test_fp", options=options, register=False, **kw)(lambda m, b: m.x)

    def filter_a(m):
        return True

    def filter_b(m):
        return False

    base = make(filter_a)
    assert base.fingerprint() == make(filter_a).fingerprint()
    assert base.fingerprint() != make(filter_b).fingerprint()  # the filter's code is keyed
    assert base.fingerprint() != make(filter_a, {"n": 1}).fingerprint()
    assert base.fingerprint() != make(filter_a, stage="convert").fingerprint()
    g1 = group_rule("relu", key=lambda c, v: 1, register=False)(lambda g, b: {})
    g2 = group_rule("relu", key=lambda c, v: 1, options={"min_group": 3}, register=False)(lambda g, b: {})
    assert g1.fingerprint() != g2.fingerprint()
    f1 = fusion_rule(Op("pointwise"), name="test_f", register=False)(lambda m, b: b.fuse(m.target, m.candidate))
    f2 = fusion_rule(Op("pointwise"), name="test_f", options={"max_attempts": 3}, register=False)(lambda m, b: b.fuse(m.target, m.candidate))
    assert f1.fingerprint() != f2.fingerprint()
