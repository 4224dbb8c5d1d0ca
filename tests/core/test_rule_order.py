"""The order rules run in, per level: at each anchor op (the FX driver tries the pattern
rules anchored at a node's op in this order, and the first that rewrites wins), the group
rules of a level (each round runs them in this order over the whole graph), and the
Inductor-IR rules of each scheduler hook.

``ORDER`` was recorded from the drivers when rules were still ordered by global
hand-numbered priorities; whatever the rules declare to order themselves, the drivers
must see exactly this order (anchors with a single rule are left out: they have no order).
Rules added since join at the place their stage gives them.
"""

from __future__ import annotations

import collections

import torch

from optimus.core.driver import FxDriver
from optimus.core.levels import make_view
from optimus.core.registry import REGISTRY, resolve
from optimus.core.report import GraphReport

ORDER = {
    "torch_ir": {
        "cat": ["canonicalize_split_cat_args", "split_cat_to_identity", "cat_adjacent_segments",
            "split_cat_other_dim_to_view", "split_stack_to_view", "unbind_stack_to_view", "unbind_cat_to_view", "cast_after_concatenation"],
        "permute": ["remove_identity_permute", "fold_permute_chain"],
        "reshape": ["reshape_to_unsqueeze", "remove_identity_reshape", "fold_reshape_chain",
            "split_stack_to_view", "unbind_stack_to_view", "cast_after_concatenation"],
        "select": ["select_of_cat_to_input", "fold_select_of_range", "select_of_stack_to_input"],
        "slice": ["remove_full_slice", "slice_of_cat_to_input", "fold_slice_of_range"],
        "split": ["canonicalize_split_cat_args", "remove_single_section_split", "cat_split_to_inputs",
            "merge_splits", "split_squeeze_to_unbind", "hoist_pointwise_through_split"],
        "stack": ["canonicalize_split_cat_args", "split_stack_to_view", "unbind_stack_to_view", "cast_after_concatenation"],
        "transpose": ["remove_identity_permute", "fold_permute_chain"],
        "unbind": ["canonicalize_split_cat_args", "stack_unbind_to_inputs"],
        "view": ["reshape_to_unsqueeze", "remove_identity_reshape", "fold_reshape_chain",
            "split_stack_to_view", "unbind_stack_to_view", "cast_after_concatenation"],
        "groups": ["group_embedding_lookups", "batch_linear_lhs", "batch_linear", "grouped_linear",
            "batch_layer_norm", "batched_layer_norm", "batch_pointwise"],
    },
    "aten_ir": {
        "cat": ["canonicalize_split_cat_args", "split_cat_to_identity", "split_cat_to_clone",
            "cat_adjacent_segments", "split_cat_other_dim_to_view", "split_stack_to_view",
            "unbind_stack_to_view", "unbind_cat_to_view", "cast_after_concatenation"],
        "permute": ["remove_identity_permute", "fold_permute_chain", "transpose_bmm_for_gradient_layout"],
        "reshape": ["reshape_to_unsqueeze", "remove_identity_reshape", "fold_reshape_chain",
            "split_stack_to_view", "unbind_stack_to_view", "cast_after_concatenation"],
        "select": ["select_of_cat_to_input", "fold_select_of_range", "select_of_stack_to_input"],
        "slice": ["remove_full_slice", "slice_of_cat_to_input", "fold_slice_of_range"],
        "split": ["canonicalize_split_cat_args", "remove_single_section_split", "cat_split_to_inputs",
            "merge_splits", "split_squeeze_to_unbind", "hoist_pointwise_through_split"],
        "stack": ["canonicalize_split_cat_args", "split_stack_to_view", "unbind_stack_to_view", "cast_after_concatenation"],
        "transpose": ["remove_identity_permute", "fold_permute_chain"],
        "unbind": ["canonicalize_split_cat_args", "stack_unbind_to_inputs"],
        "view": ["reshape_to_unsqueeze", "remove_identity_reshape", "fold_reshape_chain",
            "split_stack_to_view", "unbind_stack_to_view", "cast_after_concatenation"],
        "groups": ["group_embedding_lookups", "batch_linear_lhs", "batch_linear", "batch_mm", "grouped_mm",
            "batch_pointwise"],
    },
    "inductor_ir": {
        "hook post_fusion": ["fuse_producer_consumer", "fuse_independent_kernels", "combo_small_kernels"],
    },
}

BUILTIN = {r.name for r in REGISTRY.rules() if r.replace.__module__.startswith("optimus.rules.")}


def _driver_order(level: str) -> dict[str, list[str]]:
    """What the level's driver receives: every rule of the level (also those off by
    default), through ``resolve`` as a compile selects them."""
    config = resolve(REGISTRY.names())
    rules = [(r, config.options_for(level, r)) for r in config.rules_for(level) if r.name in BUILTIN]
    found: dict[str, list[str]] = collections.defaultdict(list)
    if level == "inductor_ir":
        for r, _ in rules:  # the Inductor-IR driver runs a hook's rules in config order
            found[f"hook {r.hook}"].append(r.name)
        return dict(found)
    driver = FxDriver(make_view(level, torch.fx.symbolic_trace(torch.nn.Identity())), rules, GraphReport(level, "order"))
    for anchor, pairs in driver.by_anchor.items():
        found[anchor] = [r.name for r, _ in pairs]
    found["groups"] = [r.name for r, _ in driver.group_rules]
    return dict(found)


def test_rules_run_in_the_recorded_order_at_every_anchor():
    for level, expected in ORDER.items():
        found = _driver_order(level)
        ordered = {k: v for k, v in found.items() if len(v) > 1}
        assert ordered == expected, level

