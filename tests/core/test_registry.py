import pytest

import optimus
from optimus.core.registry import PRESETS, REGISTRY, STAGES, resolve


def test_presets_select_kinds():
    none = resolve("none")
    assert not any(none.rules.values())
    everything = resolve("all")
    assert "split_cat_to_identity" in everything.rules["torch_ir"]
    assert "split_cat_to_identity" in everything.rules["aten_ir"]
    vertical = resolve("vertical")
    assert all(REGISTRY.get(n).kind in ("canonicalize", "vertical") for n in vertical.rules["torch_ir"])
    assert set(PRESETS) >= {"none", "vertical", "horizontal", "all"}


def test_list_dict_and_level_forms():
    cfg = resolve(["split_cat_to_identity", "merge_splits"])
    assert cfg.rules["torch_ir"] == cfg.rules["aten_ir"] == ("split_cat_to_identity", "merge_splits")
    cfg = resolve({"torch_ir": "vertical", "aten_ir": ["merge_splits"], "inductor_ir": "none"})
    assert cfg.rules["aten_ir"] == ("merge_splits",)
    assert "split_cat_to_identity" in cfg.rules["torch_ir"]
    assert resolve("aten_ir").rules["torch_ir"] == ()
    assert resolve({"options": {"numeric_check": True}}).driver.numeric_check


def test_unknown_name_lists_close_matches():
    with pytest.raises(ValueError, match="Did you mean: split_cat_to_identity"):
        resolve("split_cat_to_identiy")
    with pytest.raises(ValueError, match="Valid names"):
        resolve(["all", "nonsense"])
    with pytest.raises(ValueError, match="unknown level"):
        resolve({"torchir": "all"})


def test_wrong_types_are_clear():
    with pytest.raises(TypeError, match="passes must be"):
        resolve(42)
    with pytest.raises(TypeError, match="entries must be str"):
        resolve(["all", 3])
    with pytest.raises(TypeError, match="numeric_check"):
        resolve({"options": {"numeric_check": "yes"}})
    with pytest.raises(TypeError, match="valid driver options"):
        resolve({"options": {"bogus": 1}})
    with pytest.raises(ValueError, match="has no option"):
        resolve({"torch_ir": {"merge_splits": {"threshold": 3}}})


def test_order_follows_stages_then_registration():
    names = resolve("all").rules["torch_ir"]
    ranks = [list(STAGES).index(REGISTRY.get(n).stage) for n in names]
    assert ranks == sorted(ranks)
    assert names[0] == "canonicalize_split_cat_args"
    order = list(REGISTRY._order)
    for a, b in zip(names, names[1:]):
        if REGISTRY.get(a).stage == REGISTRY.get(b).stage:
            assert order.index(a) < order.index(b), (a, b)  # within a stage: as registered


def test_families_register_in_the_listed_order():
    """``optimus/rules/__init__.py`` imports the families in the order of ``FAMILIES``
    (within a stage, that order is the rules' order): a family importing another must not
    register it early."""
    from optimus import rules

    first: dict[str, int] = {}
    for i, name in enumerate(REGISTRY._order):
        if name in REGISTRY:
            first.setdefault(REGISTRY.get(name).replace.__module__, i)
    builtin = [m for m in sorted(first, key=first.__getitem__) if m.startswith("optimus.rules.")]
    assert builtin == [f.__name__ for f in rules.FAMILIES]


def test_a_stage_is_named_and_priority_or_knobs_are_refused_with_the_reason():
    from optimus import Op, Var

    with pytest.raises(ValueError, match="stage must be one of"):
        optimus.rule(Op("relu", Var("x")), stage="early", register=False)(lambda m, b: m.x)
    with pytest.raises(TypeError, match="takes no priority: a rule names its stage"):
        optimus.rule(Op("relu", Var("x")), priority=3, register=False)(lambda m, b: m.x)
    with pytest.raises(TypeError, match="takes no knobs: every setting of a rule is an option"):
        optimus.rule(Op("relu", Var("x")), knobs={"min_group": 3}, register=False)(lambda m, b: m.x)


def test_fingerprint_tracks_selection_and_options():
    a = resolve("all").fingerprint()
    assert a == resolve("all").fingerprint()
    assert a != resolve("vertical").fingerprint() or resolve("vertical").rules == resolve("all").rules
    assert resolve(["merge_splits"]).fingerprint() != resolve(["split_cat_to_identity"]).fingerprint()
    assert resolve({"options": {"numeric_check": True}, "torch_ir": "all"}).fingerprint() != resolve({"torch_ir": "all"}).fingerprint()


def test_user_rule_registration_applies_immediately():
    from optimus import Op, Var

    @optimus.rule(Op("relu", Op("relu", Var("x"))), name="test_double_relu")
    def double_relu(m, b):
        """relu(relu(x)) -> relu(x)"""
        return b.relu(m.x)

    try:
        assert "test_double_relu" in resolve("all").rules["torch_ir"]
        assert "test_double_relu" in resolve(["test_double_relu"]).rules["aten_ir"]
    finally:
        REGISTRY.remove("test_double_relu")
    assert "test_double_relu" not in resolve("all").rules["torch_ir"]


def test_reserved_and_duplicate_names():
    from optimus import Op, Var

    with pytest.raises(ValueError, match="preset or level"):
        optimus.rule(Op("relu", Var("x")), name="all")(lambda m, b: None)
    with pytest.raises(ValueError, match="already registered"):
        optimus.rule(Op("relu", Var("x")), name="merge_splits")(lambda m, b: m.x)


@pytest.mark.parametrize(
    "rule, option, value, error, message",
    [
        ("batch_linear", "max_stack_bytes", -1, ValueError, "'max_stack_bytes' must be >= 0, got -1"),
        ("batch_linear", "max_stack_bytes", True, TypeError, "'max_stack_bytes' must be int, got True"),
        ("batch_linear", "min_group", 0, ValueError, "'min_group' must be >= 2, got 0"),
        ("batch_linear", "min_group", -3, ValueError, "'min_group' must be >= 2"),
        ("batch_linear", "max_group", 0, ValueError, "'max_group' must be >= 2"),
        ("batch_linear", "min_group", 2.5, TypeError, "'min_group' must be an int"),
        ("batch_linear", "packed_weights", 1, TypeError, "'packed_weights' must be bool"),
        ("fuse_independent_kernels", "max_nodes", 0, ValueError, "'max_nodes' must be >= 1"),
        ("fuse_independent_kernels", "memory_increase", -0.5, ValueError, "'memory_increase' must be >= 0"),
        ("fuse_independent_kernels", "memory_increase", "lots", TypeError, "'memory_increase' must be a number or None"),
    ],
)
def test_every_rule_option_is_type_and_range_checked(rule, option, value, error, message):
    level = REGISTRY.get(rule).levels[0]
    with pytest.raises(error, match=f"rule '{rule}' option {message}".replace("(", r"\(").replace(")", r"\)")):
        resolve({level: {rule: {option: value}}})


def test_option_ranges_that_depend_on_each_other_and_that_are_fine():
    with pytest.raises(ValueError, match="max_group \\(3\\) is below min_group \\(5\\)"):
        resolve({"torch_ir": {"batch_linear": {"min_group": 5, "max_group": 3}}})
    ok = resolve({"torch_ir": {"batch_linear": {"min_group": 3, "max_group": 8, "max_stack_bytes": 0}}, "inductor_ir": {"fuse_independent_kernels": {"memory_increase": 0.5}}})
    assert ok.options[("torch_ir", "batch_linear")] == {"min_group": 3, "max_group": 8, "max_stack_bytes": 0}


def test_a_rule_declares_ranges_its_defaults_must_obey():
    with pytest.raises(ValueError, match="'min_chunks' must be >= 2"):
        optimus.rule(optimus.Op("relu", optimus.Var("x")), name="test_bad_default", options={"min_chunks": 1})(lambda m, b: m.x)
    declared = optimus.rule(optimus.Op("relu", optimus.Var("x")), name="test_declared_range", options={"min_chunks": 1}, ranges={"min_chunks": (1, 4)})(lambda m, b: m.x)
    try:
        with pytest.raises(ValueError, match=r"must be in \[1, 4\], got 5"):
            resolve({"torch_ir": {"test_declared_range": {"min_chunks": 5}}})
    finally:
        REGISTRY.remove(declared.name)


def test_passes_none_is_the_default():
    assert resolve(None).spec == resolve().spec == "auto"
