"""Upstream PyTorch's Optimus pass and option names, accepted as aliases.

A user coming from ``torch._inductor.config.pre_grad_fusion_options`` /
``post_grad_fusion_options`` can keep the names they know::

    optimus.compile(model, passes=["split_cat_pass", "batch_layernorm"])
    optimus.compile(model, passes={"split_cat_pass": {}, "batch_linear": {"min_fuse_set_size": 2}})
    optimus.compile(model, passes={"pre_grad_fusion_options": {...}, "post_grad_fusion_options": {...}})

Each upstream pass maps to the Optimus rules doing its job, at the level upstream runs
it (pre-grad = Torch-IR, post-grad = Aten-IR); a dict in upstream's form selects only
what it names, as upstream does. Option names map too (``min_fuse_set_size`` ->
``min_group``, ``threshold_to_cat`` -> ``min_run``); options that steer upstream's own
search and have no meaning here (``max_fuse_search_depth``, ``counter``) are accepted
and reported as ignored. A pass Optimus does not implement is a ``ValueError`` naming
it, why, and what Optimus offers instead. ``docs/upstream-names.md`` is
:func:`markdown` of this table.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from .levels import LEVELS

PRE_GRAD = "pre_grad_fusion_options"
POST_GRAD = "post_grad_fusion_options"
LEVEL_OF = {PRE_GRAD: "torch_ir", POST_GRAD: "aten_ir"}


@dataclasses.dataclass(frozen=True)
class UpstreamPass:
    """One upstream pass name and what Optimus runs for it."""

    name: str
    option: str  # PRE_GRAD or POST_GRAD: where upstream takes the name
    rules: tuple[str, ...]  # Optimus rules, at LEVEL_OF[option]; () with `instead`: not implemented
    note: str = ""  # a difference worth knowing (reported when the alias is used)
    instead: str = ""  # not implemented: why, and what Optimus offers

    @property
    def level(self) -> str:
        return LEVEL_OF[self.option]

    @property
    def implemented(self) -> bool:
        return not self.instead


def _p(name: str, option: str, *rules: str, note: str = "", instead: str = "") -> UpstreamPass:
    return UpstreamPass(name, option, tuple(rules), note, instead)


_POINTWISE_NOTE = "batch_pointwise batches every elementwise op it supports, {op} among them"

UPSTREAM_PASSES: dict[str, UpstreamPass] = {
    p.name: p
    for p in [
        # --- pre-grad pattern passes (torch/_inductor/fx_passes/split_cat.py)
        _p("normalization_pass", PRE_GRAD, "canonicalize_split_cat_args",
           note="every Optimus view also normalizes arguments before matching"),
        _p("remove_split_with_size_one_pass", PRE_GRAD, "remove_single_section_split"),
        _p("merge_getitem_cat_pass", PRE_GRAD, "cat_adjacent_segments"),
        _p("merge_stack_tahn_unbind_pass", PRE_GRAD,
           note="upstream registers no pattern under this name (torch 2.11 to 2.15), so it does nothing there; nothing to run"),
        _p("merge_splits_pass", PRE_GRAD, "merge_splits"),
        _p("mutate_cat_pass", PRE_GRAD, "cat_adjacent_segments"),
        _p("split_cat_pass", PRE_GRAD, "split_cat_to_identity", "cat_adjacent_segments",
           "split_cat_other_dim_to_view", "split_squeeze_to_unbind"),
        _p("unbind_stack_pass", PRE_GRAD, "unbind_stack_to_view"),
        _p("split_cat_to_slices_pass", PRE_GRAD, "cat_adjacent_segments"),
        _p("unbind_cat_to_view_pass", PRE_GRAD, "unbind_cat_to_view"),
        _p("split_stack_to_cats_pass", PRE_GRAD, "split_stack_to_view"),
        _p("unbind_stack_to_slices_pass", PRE_GRAD, "unbind_stack_to_view"),
        _p("move_reshape_out_of_split_stack_pass", PRE_GRAD, "reshape_to_unsqueeze", "split_stack_to_view"),
        _p("einsum_to_pointwise_pass", PRE_GRAD, "einsum_to_pointwise"),
        _p("sink_cat_after_pointwise", PRE_GRAD, "sink_pointwise_into_cat",
           note="always on upstream (not an option there); off by default in Optimus, which hoists instead"),
        # --- pre-grad group/batch fusions (group_batch_fusion.py)
        _p("batch_linear", PRE_GRAD, "batch_linear"),
        _p("batch_linear_lhs", PRE_GRAD, "batch_linear_lhs"),
        _p("batch_layernorm", PRE_GRAD, "batch_layer_norm"),
        *[
            _p(f"batch_{op}", PRE_GRAD, "batch_pointwise", note=_POINTWISE_NOTE.format(op=op))
            for op in ("tanh", "sigmoid", "relu", "detach", "nan_to_num", "clamp", "dropout")
        ],
        _p("cat_linear", PRE_GRAD, instead=(
            "it splits linear(cat(xs)) into a sum of per-piece linears (torch 2.15); no Optimus rule splits a "
            "linear. Optimus's batch_linear_lhs goes the other way: linears sharing an input become one")),
        # --- post-grad pattern passes
        _p("normalization_aten_pass", POST_GRAD, "canonicalize_split_cat_args",
           note="every Optimus view also normalizes arguments before matching"),
        _p("split_cat_aten_pass", POST_GRAD, "split_cat_to_identity", "cat_adjacent_segments"),
        _p("select_cat_aten_pass", POST_GRAD, "unbind_cat_to_view", "unbind_stack_to_view"),
        _p("unbind_stack_aten_pass", POST_GRAD, "unbind_stack_to_view"),
        _p("move_view_after_cat_aten_pass", POST_GRAD, "reshape_to_unsqueeze", "split_stack_to_view"),
        _p("decompose_mm_pass", POST_GRAD, instead=(
            "it rewrites memory-bound matmuls into multiply + sum, a per-device cost heuristic, not a graph "
            "cleanup; Optimus batches small matmuls instead (batch_mm at aten_ir, batch_linear at torch_ir)")),
        _p("pad_aten_mm_pass", POST_GRAD, instead=(
            "it pads matmul shapes; Inductor does that itself (torch._inductor.config.shape_padding)")),
        _p("shape_padding_multiplier", POST_GRAD, instead=(
            "it is pad_aten_mm_pass's setting; Inductor pads matmul shapes itself (torch._inductor.config.shape_padding)")),
        # --- post-grad group/batch fusions
        _p("batch_linear_post_grad", POST_GRAD, "batch_mm"),
        _p("group_linear", POST_GRAD, instead=(
            "it needs fbgemm's grouped GEMM (not in open-source PyTorch); Optimus batches matmuls of identical "
            "shapes (batch_mm at aten_ir, batch_linear and batch_linear_lhs at torch_ir)")),
        *[
            _p(f"batch_aten_{op}", POST_GRAD, "batch_pointwise", note=_POINTWISE_NOTE.format(op=op))
            for op in ("add", "sub", "mul", "div", "tanh", "sigmoid", "relu")
        ],
    ]
}

OPTION_RENAMES: dict[str, str] = {
    "min_fuse_set_size": "min_group",  # upstream default 5; Optimus 2 (3 for batch_pointwise)
    "max_fuse_set_size": "max_group",  # upstream default 300; Optimus 256
    "threshold_to_cat": "min_run",  # upstream default 10; Optimus 2
}
"""Upstream option -> the Optimus rule option with the same meaning."""

IGNORED_OPTIONS: dict[str, str] = {
    "max_fuse_search_depth": "Optimus groups candidates over the whole graph (by depth), with no search radius",
    "fuse_nodes_with_same_parent": "Optimus groups by operand shapes and arguments, not by a common producer",
    "fuse_nodes_with_same_users": "Optimus groups by operand shapes and arguments, not by common users",
    "shape_broadcast_batch_linear": "Optimus batches linears of identical shapes only",
    "max_fuse_tensor_size_group_linear": "group_linear's own limit",
    "require_fbgemm": "no Optimus rule needs fbgemm",
    "counter": "Optimus applies rules until nothing matches, not a fixed number of times",
}
"""Upstream options that steer upstream's own search: accepted, reported as ignored."""


def is_upstream_name(name: Any) -> bool:
    return isinstance(name, str) and name in UPSTREAM_PASSES


def lookup(name: str) -> UpstreamPass:
    """The alias, or ``ValueError`` when upstream has the name but Optimus does not
    implement it."""
    alias = UPSTREAM_PASSES[name]
    if not alias.implemented:
        raise ValueError(
            f"upstream pass {name!r} ({alias.option}) has no Optimus equivalent: {alias.instead}. "
            "See docs/upstream-names.md for every upstream name"
        )
    return alias


def expand(name: str, levels: Iterable[str]) -> list[tuple[str, str]]:
    """``(level, rule)`` pairs an upstream name selects, when asked for at ``levels``."""
    levels = tuple(levels)
    alias = lookup(name)
    if alias.level not in levels:
        raise ValueError(
            f"{name!r} is upstream's {alias.option.split('_fusion')[0].replace('_', '-')} pass ({alias.level}); "
            f"it cannot be given for {', '.join(levels)}"
            + (f". Its Optimus rules run at more levels by name: {', '.join(alias.rules)}" if alias.rules else "")
        )
    return [(alias.level, rule) for rule in alias.rules]


def alias_notes(names: Iterable[Any], registry: Any) -> list[str]:
    """Report lines for the upstream names among ``names``: what each runs (``registry``:
    the rule registry, whose names win over upstream's)."""
    notes = []
    for name in dict.fromkeys(n for n in names if isinstance(n, str)):
        if name in registry or not is_upstream_name(name):
            continue  # an Optimus name (batch_linear is both: Optimus's wins)
        alias = lookup(name)
        ran = ", ".join(alias.rules) if alias.rules else "nothing"
        notes.append(f"upstream name {name!r} -> Optimus {ran} ({alias.level})" + (f"; {alias.note}" if alias.note else ""))
    return notes


def translate_options(owner: str, rules: tuple[str, ...], given: dict[str, Any], notes: list[str], registry: Any) -> dict[str, dict[str, Any]]:
    """Upstream (or Optimus) option names given for ``owner`` -> options per Optimus rule.

    Renamed options go to the rules that have them; ignored ones add a note; an
    option none of the rules has is a ``ValueError`` listing what is understood. A rule
    "has" its own options and the ones its class has (``min_group``: every group rule's).
    """
    per_rule: dict[str, dict[str, Any]] = {r: {} for r in rules}
    for key, value in given.items():
        ours = OPTION_RENAMES.get(key, key)
        targets = [r for r in rules if r in registry and ours in registry.get(r).option_defaults()]
        if targets:
            for r in targets:
                per_rule[r][ours] = value
        elif key in IGNORED_OPTIONS:
            notes.append(f"{owner}: upstream option {key}={value!r} ignored: {IGNORED_OPTIONS[key]}")
        else:
            valid = sorted({o for r in rules if r in registry for o in registry.get(r).option_defaults()})
            upstream = sorted(k for k, v in OPTION_RENAMES.items() if v in valid)
            raise ValueError(
                f"{owner!r} has no option {key!r}; it takes {', '.join(valid) or 'no options'}"
                + (f" (upstream's {', '.join(upstream)})" if upstream else "")
                + f", and accepts and ignores upstream's {', '.join(sorted(IGNORED_OPTIONS))}"
            )
    return per_rule


def translate(passes: Any, registry: Any) -> tuple[Any, list[str]]:
    """``passes`` with every upstream-form part in Optimus's form, and report notes.

    Returns ``passes`` itself when it holds nothing of upstream's. Names in strings and
    lists stay (``registry`` expands them where it resolves names); dicts are rewritten:
    upstream keys (pass names, ``pre_grad_fusion_options``, ``post_grad_fusion_options``)
    become per-level entries, and options are renamed.
    """
    if isinstance(passes, str):
        return passes, alias_notes([passes], registry)
    if isinstance(passes, (list, tuple, set, frozenset)):
        return passes, alias_notes(passes, registry)
    if not isinstance(passes, dict):
        return passes, []

    notes: list[str] = []
    out: dict[str, Any] = {}
    changed = False

    def add(level: str, name: str, opts: Any) -> None:
        slot = out.setdefault(level, {})
        old = slot.get(name)
        if isinstance(old, dict) and isinstance(opts, dict):
            for k, v in opts.items():
                if k in old and old[k] != v:
                    raise ValueError(f"two names map to Optimus rule {name!r} at {level} with different {k!r}: {old[k]!r} and {v!r}")
            old.update(opts)
        elif isinstance(opts, dict) and opts:
            slot[name] = dict(opts)
        elif old is None:
            slot[name] = opts if opts is not None else True

    def add_upstream(name: str, opts: Any, option: str | None) -> None:
        alias = lookup(name)
        if option is not None and alias.option != option:
            raise ValueError(f"{name!r} is one of upstream's {alias.option}, not {option}")
        if opts is False or opts is None:
            return
        if opts is not True and not isinstance(opts, dict):
            raise TypeError(f"upstream pass {name!r} takes a dict of options (or {{}}), got {opts!r}")
        per_rule = translate_options(name, alias.rules, opts if isinstance(opts, dict) else {}, notes, registry)
        for rule in alias.rules:
            add(alias.level, rule, per_rule[rule] or True)
        ran = ", ".join(alias.rules) if alias.rules else "nothing"
        notes.append(f"upstream name {name!r} -> Optimus {ran} ({alias.level})" + (f"; {alias.note}" if alias.note else ""))

    for key, value in passes.items():
        if key == "options":
            out["options"] = value
        elif key in LEVELS:
            if value is None or value is False:
                continue
            items = [(value, True)] if isinstance(value, str) else (
                [(v, True) for v in value] if isinstance(value, (list, tuple, set)) else (
                    list(value.items()) if isinstance(value, dict) else None))
            if items is None:
                out[key] = value  # resolve() reports the bad type
                continue
            for name, opts in items:
                if isinstance(name, str) and name not in registry and is_upstream_name(name):
                    changed = True
                    expand(name, (key,))  # the level must be upstream's own for the name
                    add_upstream(name, opts, None)
                elif isinstance(opts, dict) and isinstance(name, str) and name in registry and any(k in OPTION_RENAMES or k in IGNORED_OPTIONS for k in opts):
                    changed = True
                    add(key, name, translate_options(name, (name,), opts, notes, registry)[name] or True)
                else:
                    add(key, name, opts)
        elif key in LEVEL_OF:
            changed = True
            if not isinstance(value, dict):
                raise TypeError(f"passes[{key!r}] must be a dict of upstream pass names, as in torch._inductor.config.{key}")
            for name, opts in value.items():
                if not is_upstream_name(name):
                    raise ValueError(_not_upstream(name, key))
                add_upstream(name, opts, key)
        elif is_upstream_name(key):
            changed = True
            add_upstream(key, value, None)
        else:
            out[key] = value  # resolve() reports the unknown key
    return (out, notes) if changed else (passes, [])


def _not_upstream(name: Any, option: str) -> str:
    import difflib

    known = sorted(n for n, p in UPSTREAM_PASSES.items() if p.option == option)
    close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return f"{name!r} is not one of upstream's {option} names.{hint} Known: {', '.join(known)}"


def user_fusion_notes(config: Any = None) -> list[str]:
    """Report lines for upstream's Optimus options the user turned on themselves.

    Upstream's Optimus options (``pre_grad_fusion_options`` / ``post_grad_fusion_options``)
    run in Inductor as usual: pre-grad before Optimus's Torch-IR pass, post-grad after
    Optimus's Aten-IR pass. (Custom passes in the hooks Optimus also installs are chained
    with Optimus's and reported by ``optimus.compile``.) Read ``config`` (default
    ``torch._inductor.config``) before Optimus patches it: the values there are the user's.
    """
    if config is None:
        try:
            from torch._inductor import config
        except ImportError:  # pragma: no cover
            return []
    notes = []
    order = {PRE_GRAD: "before Optimus's torch_ir rules", POST_GRAD: "after Optimus's aten_ir rules"}
    for option in (PRE_GRAD, POST_GRAD):
        chosen = getattr(config, option, None)
        if not chosen:
            continue
        parts = []
        for name in chosen:
            alias = UPSTREAM_PASSES.get(name)
            overlap = f" (Optimus: {', '.join(alias.rules)})" if alias is not None and alias.rules else ""
            parts.append(f"{name}{overlap}")
        notes.append(f"your torch._inductor.config.{option} ran too, {order[option]}: {', '.join(parts)}")
    return notes


def markdown() -> str:
    """The table of docs/upstream-names.md."""
    lines = ["| upstream name | where upstream takes it | Optimus rule(s) | notes |", "|---|---|---|---|"]
    for p in UPSTREAM_PASSES.values():
        rules = ", ".join(f"`{r}`" for r in p.rules) if p.rules else ("—" if p.implemented else "**not implemented**")
        lines.append(f"| `{p.name}` | `{p.option}` ({p.level}) | {rules} | {p.instead or p.note} |")
    lines += ["", "| upstream option | Optimus |", "|---|---|"]
    for k, v in OPTION_RENAMES.items():
        lines.append(f"| `{k}` | `{v}` |")
    for k, v in IGNORED_OPTIONS.items():
        lines.append(f"| `{k}` | accepted and ignored (reported): {v} |")
    return "\n".join(lines)
