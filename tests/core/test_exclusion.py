"""Leaving rules out with ``-name``: it composes with every preset, "auto" included, in the
Python API, the registered backend's options and (tests/test_cli_user.py) the command line."""

import pytest
import torch

import optimus
from optimus.core.registry import LEVELS, resolve
from optimus.planner.plan import candidate_config


def _without(config, rule):
    return {lv: tuple(r for r in names if r != rule) for lv, names in config.rules.items()}


@pytest.mark.parametrize("passes", [["auto", "-merge_splits"], "auto,-merge_splits", ("-merge_splits", "auto")])
def test_exclusion_keeps_the_planner_and_drops_the_rule(passes):
    auto, cfg = resolve("auto"), resolve(passes)
    assert cfg.planned and auto.planned
    assert any("merge_splits" in auto.rules[lv] for lv in LEVELS)
    assert cfg.rules == _without(auto, "merge_splits")
    assert set(cfg.excluded) == {(lv, "merge_splits") for lv in LEVELS if "merge_splits" in auto.rules[lv]}
    assert any("excluded: merge_splits" in n for n in cfg.notes)
    assert cfg.fingerprint() != auto.fingerprint()


def test_exclusion_with_presets_levels_kinds_and_upstream_names():
    assert resolve("all,-horizontal").rules == resolve("vertical").rules  # the kind, not the canonicalizations
    assert resolve(["all", "-inductor_ir"]).rules["inductor_ir"] == ()
    assert resolve(["all", "-inductor_ir"]).rules["torch_ir"] == resolve("all").rules["torch_ir"]
    upstream = resolve(["all", "-split_cat_pass"])  # upstream's name removes the rules it stands for (Torch-IR)
    assert "split_cat_to_identity" not in upstream.rules["torch_ir"]
    assert "split_cat_to_identity" in upstream.rules["aten_ir"]
    per_level = resolve({"torch_ir": "all", "aten_ir": ["auto", "-batch_mm"]})
    assert "batch_mm" not in per_level.rules["aten_ir"] and "merge_splits" in per_level.rules["aten_ir"]
    assert per_level.rules["torch_ir"] == resolve("all").rules["torch_ir"]
    assert not per_level.planned  # a dict per level stays what it names, as without exclusions


def test_unknown_excluded_name_raises_like_an_unknown_selected_one():
    with pytest.raises(ValueError) as selected:
        resolve(["auto", "merge_split"])
    with pytest.raises(ValueError) as excluded:
        resolve(["auto", "-merge_split"])
    assert "Did you mean: merge_splits" in str(excluded.value)
    assert str(excluded.value) == str(selected.value)


def test_exclusions_alone_or_empty_are_errors():
    with pytest.raises(ValueError, match="excludes from nothing"):
        resolve(["-merge_splits"])
    with pytest.raises(ValueError, match="alone names nothing"):
        resolve(["auto", "-"])


def test_unknown_name_offers_upstream_names():
    with pytest.raises(ValueError, match="Did you mean: split_cat_pass"):
        resolve("split_cat_pas")


def test_tuned_candidates_keep_the_exclusions():
    base = resolve(["auto", "-merge_splits"])
    assert candidate_config(base, "auto") is base
    for plan in ("all", "vertical"):
        cfg = candidate_config(base, plan)
        assert not any("merge_splits" in cfg.rules[lv] for lv in LEVELS), plan
        assert cfg.rules == _without(resolve(plan), "merge_splits")


def _split_cat(x):
    a, b, c = x.split([2, 3, 3], dim=1)
    return torch.cat([a, b, c], dim=1).relu()


def _fired(report, rule):
    return report.rule_totals().get(rule) is not None and report.rule_totals()[rule].matched > 0


def test_backend_options_and_compile_take_exclusions():
    x = torch.randn(4, 8)
    compiled = torch.compile(_split_cat, backend="optimus", options={"optimus_passes": ["auto", "-split_cat_to_identity"]})
    torch.testing.assert_close(compiled(x), _split_cat(x))
    report = optimus.last_report()
    assert report.passes == "auto,-split_cat_to_identity"
    assert not _fired(report, "split_cat_to_identity")
    torch._dynamo.reset()
    plain = optimus.compile(_split_cat)
    plain(x)
    assert _fired(plain.optimus_report, "split_cat_to_identity")  # it does fire without the exclusion
    torch._dynamo.reset()
    ours = optimus.compile(_split_cat, passes="auto,-split_cat_to_identity")
    torch.testing.assert_close(ours(x), _split_cat(x))
    assert not _fired(ours.optimus_report, "split_cat_to_identity")
