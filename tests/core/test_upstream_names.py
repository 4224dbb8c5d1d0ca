"""Upstream PyTorch's Optimus pass and option names as aliases (docs/upstream-names.md)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
import torch.fx as fx

import optimus
from optimus.core import upstream_names
from optimus.core.registry import REGISTRY, resolve
from optimus.core.upstream_names import POST_GRAD, PRE_GRAD, UPSTREAM_PASSES

ROOT = Path(__file__).resolve().parents[2]


def selected(config) -> dict[str, tuple[str, ...]]:
    return {level: rules for level, rules in config.rules.items() if rules}


def installed_upstream_names() -> dict[str, str]:
    """Every pass name the installed torch accepts in its fusion options."""
    from torch._inductor.fx_passes import group_batch_fusion as gbf
    from torch._inductor.fx_passes import split_cat

    names = {n: PRE_GRAD for n in list(gbf.PRE_GRAD_FUSIONS) + list(split_cat.PRE_GRAD_PATTERNS)}
    names.update({n: POST_GRAD for n in list(gbf.POST_GRAD_FUSIONS) + list(split_cat.POST_GRAD_PATTERNS)})
    return names


def test_every_upstream_name_of_this_torch_is_in_the_table():
    missing = {n: opt for n, opt in installed_upstream_names().items() if n not in UPSTREAM_PASSES}
    assert not missing, f"add to optimus/core/upstream_names.py (and docs/upstream-names.md): {missing}"
    for name, option in installed_upstream_names().items():
        assert UPSTREAM_PASSES[name].option == option, name


def test_every_alias_names_rules_that_run_at_its_level():
    resolve("none")  # loads the built-in rules
    for alias in UPSTREAM_PASSES.values():
        assert alias.implemented or not alias.rules
        for rule in alias.rules:
            assert rule in REGISTRY, (alias.name, rule)
            assert alias.level in REGISTRY.get(rule).levels, (alias.name, rule)


def test_issue_names_are_accepted():
    # the three names of the issue: a ValueError, a "did you mean", a rejected option
    assert selected(resolve("split_cat_pass")) == {
        "torch_ir": ("split_cat_to_identity", "cat_adjacent_segments", "split_cat_other_dim_to_view", "split_squeeze_to_unbind")
    }
    assert selected(resolve(["batch_layernorm"])) == {"torch_ir": ("batch_layer_norm",)}
    config = resolve({"batch_linear": {"min_fuse_set_size": 3}})
    assert selected(config) == {"torch_ir": ("batch_linear",)}
    assert config.options[("torch_ir", "batch_linear")] == {"min_group": 3}


def test_upstream_option_dicts():
    config = resolve({
        PRE_GRAD: {"split_cat_pass": {}, "batch_tanh": {"min_fuse_set_size": 4, "max_fuse_search_depth": 9}},
        POST_GRAD: {"split_cat_aten_pass": {"threshold_to_cat": 6}, "batch_linear_post_grad": {}},
    })
    assert "split_cat_to_identity" in config.rules["torch_ir"] and "batch_pointwise" in config.rules["torch_ir"]
    assert set(config.rules["aten_ir"]) == {"split_cat_to_identity", "cat_adjacent_segments", "batch_mm"}
    assert config.rules["inductor_ir"] == ()  # only what the dict names runs, as upstream
    assert config.options[("torch_ir", "batch_pointwise")] == {"min_group": 4}
    assert config.options[("aten_ir", "cat_adjacent_segments")] == {"min_run": 6}
    notes = "\n".join(config.notes)
    assert "max_fuse_search_depth=9 ignored" in notes
    assert "'batch_tanh' -> Optimus batch_pointwise" in notes and "tanh among them" in notes


def test_a_flat_upstream_dict_mixes_with_optimus_keys():
    config = resolve({"inductor_ir": "none", "aten_ir": ["merge_splits"], "batch_layernorm": {}, "options": {"lint": "each"}})
    assert selected(config) == {"torch_ir": ("batch_layer_norm",), "aten_ir": ("merge_splits",)}
    assert config.driver.lint == "each"


def test_upstream_option_names_on_optimus_rules():
    config = resolve({"torch_ir": {"batch_linear": {"min_fuse_set_size": 2, "max_fuse_set_size": 64}}})
    assert config.options[("torch_ir", "batch_linear")] == {"min_group": 2, "max_group": 64}


def test_optimus_names_win_where_both_exist():
    # batch_linear is both; in a list it is Optimus's rule, at every level it runs
    assert set(selected(resolve(["batch_linear"]))) == {"torch_ir", "aten_ir"}
    assert resolve(["batch_linear"]).notes == ()


def test_not_implemented_names_say_why_and_what_instead():
    with pytest.raises(ValueError, match=r"upstream pass 'decompose_mm_pass' \(post_grad_fusion_options\) has no Optimus equivalent.*batch_mm"):
        resolve("decompose_mm_pass")
    with pytest.raises(ValueError, match=r"'group_linear'.*fbgemm"):
        resolve({POST_GRAD: {"group_linear": {}}})


def test_bad_upstream_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"'split_cat_pass' is upstream's pre-grad pass \(torch_ir\); it cannot be given for aten_ir"):
        resolve({"aten_ir": ["split_cat_pass"]})
    with pytest.raises(ValueError, match=r"'split_cat_aten_pass' is one of upstream's post_grad_fusion_options"):
        resolve({PRE_GRAD: {"split_cat_aten_pass": {}}})
    with pytest.raises(ValueError, match=r"not one of upstream's pre_grad_fusion_options names. Did you mean: split_cat_pass"):
        resolve({PRE_GRAD: {"split_cat_passs": {}}})
    with pytest.raises(ValueError, match=r"'split_cat_pass' has no option 'foo'; it takes min_run \(upstream's threshold_to_cat\)"):
        resolve({"split_cat_pass": {"foo": 1}})
    with pytest.raises(ValueError, match=r"different 'min_group': 2 and 4"):
        resolve({"batch_tanh": {"min_fuse_set_size": 2}, "batch_relu": {"min_fuse_set_size": 4}})
    with pytest.raises(TypeError, match=r"takes a dict of options"):
        resolve({"split_cat_pass": 3})


def test_what_resolves_without_upstream_names_is_unchanged():
    for passes in ("all", ["vertical", "merge_splits"], {"torch_ir": "vertical", "aten_ir": {"batch_mm": {"min_group": 3}}}):
        config = resolve(passes)
        assert config.notes == ()
    assert resolve({"torch_ir": "vertical"}).spec == resolve({"torch_ir": "vertical"}).spec


def test_an_alias_rewrites_like_its_rules():
    def f(x):
        a, b = torch.split(x, [4, 4], dim=1)
        return torch.cat([a, b], dim=1) * 2

    gm = optimus.optimize(fx.symbolic_trace(f), passes={PRE_GRAD: {"split_cat_pass": {}}}, example_inputs=[torch.randn(2, 8)])
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.cat not in ops and torch.split not in ops
    assert optimus.last_report().graphs[0].rules["split_cat_to_identity"].matched == 1
    x = torch.randn(2, 8)
    torch.testing.assert_close(gm(x), f(x))


def test_notes_on_inductor_settings_of_the_users_own():
    class MyPass:
        pass

    config = types.SimpleNamespace(
        pre_grad_fusion_options={"split_cat_pass": {}, "batch_linear": {}},
        post_grad_fusion_options={},
        pre_grad_custom_pass=None,
        post_grad_custom_pre_pass=MyPass(),
        _pre_fusion_custom_pass=None,
        _post_fusion_custom_pass=None,
    )
    notes = upstream_names.user_fusion_notes(config)
    assert len(notes) == 1  # the custom pass is reported by optimus.compile (tests/core/test_safety_net.py)
    assert notes[0].startswith("your torch._inductor.config.pre_grad_fusion_options ran too, before Optimus's torch_ir rules: ")
    assert "split_cat_pass (Optimus: split_cat_to_identity" in notes[0] and "batch_linear (Optimus: batch_linear)" in notes[0]


def test_no_notes_for_default_inductor_settings():
    from torch._inductor import config

    with config.patch(pre_grad_fusion_options={}, post_grad_fusion_options={}, pre_grad_custom_pass=None, post_grad_custom_pre_pass=None):
        assert upstream_names.user_fusion_notes() == []


def test_the_docs_table_is_generated_from_the_code():
    doc = (ROOT / "docs" / "upstream-names.md").read_text()
    assert upstream_names.markdown() in doc, "regenerate: python -c 'from optimus.core.upstream_names import markdown; print(markdown())'"
