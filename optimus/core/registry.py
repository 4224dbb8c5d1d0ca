"""The rule registry and the ``passes`` option.

Every rule registers here (built-in rules when their module is imported, user rules
through ``@optimus.rule``). ``resolve(passes)`` turns what a user wrote into a
``PassConfig``: which rules run at which level, with which options.

``passes`` may be

* a preset: ``"none"``, ``"vertical"``, ``"horizontal"``, ``"all"`` (``"default"`` is
  ``"all"``); presets include the canonicalization rules the others rely on;
  ``"auto"`` selects what ``"all"`` does and lets the planner gate and size every
  horizontal group and choose the Inductor-IR rules per compile (``optimus.planner``);
* a level name (``"torch_ir"``, ``"aten_ir"``, ``"inductor_ir"``): every rule of that level;
  (presets and level names leave out rules registered with ``default=False``, which run
  only when named;)
* a rule name: that rule, at every level it supports;
* a list of the above (their union);
* any of the above prefixed with ``-`` removes what that name selects, whatever the
  order (``-vertical`` / ``-horizontal``: the rules of that kind, not the
  canonicalizations): ``["auto", "-merge_splits"]``, ``"all,-horizontal"``,
  ``{"aten_ir": ["auto", "-batch_mm"]}`` (the planner stays on where the rest is
  ``"auto"``); a selection of exclusions alone is an error (name what to exclude from);
* a dict per level: ``{"torch_ir": "vertical", "aten_ir": ["split_cat_to_identity"],
  "inductor_ir": "none"}``; a level's value may also be ``{rule_name: {option: value}}``
  to pass per-rule options; the key ``"options"`` holds driver options
  (``numeric_check``, ``max_rewrites``, ``lint``);
* a ``PassConfig``;
* upstream PyTorch's names: its pass names (``split_cat_pass``, ``batch_layernorm``)
  wherever a name goes, a dict in the form of ``pre_grad_fusion_options`` (or
  ``{"pre_grad_fusion_options": ..., "post_grad_fusion_options": ...}``), and its option
  names (``min_fuse_set_size``); see ``upstream_names``.

An unknown name raises ``ValueError`` naming the closest valid names.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from typing import Any, Iterable, Protocol

from . import upstream_names
from .levels import LEVELS

KINDS: tuple[str, ...] = ("canonicalize", "vertical", "horizontal")

#: The stages of a level, in the order their rules run; a rule names its stage
#: (``stage=``). Within a stage, rules run in the order they were registered: the built-in
#: families in the order ``optimus/rules/__init__.py`` imports them, each module's rules in
#: the order it defines them, then rules registered later (a user's). The FX driver tries
#: the pattern rules at one anchor op in this order (the first that rewrites wins) and runs
#: the group rules of a round in it; the Inductor-IR driver runs a hook's rules in it.
STAGES: dict[str, str] = {
    "canonicalize": "respell an op in the canonical form the other rules match",
    "remove": "delete an op that does nothing (a one-section split, an identity view, an inactive dropout)",
    "fold": "fold a producer and its consumer into fewer ops: inverse pairs cancel, chains become one op, "
            "parts of one tensor put back together become that tensor or a view of it",
    "convert": "turn an op into a form that is cheaper or lays its result out better, once the folds are done",
    "move": "move elementwise work across a split or a cat, where the folds then remove more",
    "batch_lookups": "batch independent embedding lookups",
    "batch_matmuls": "batch independent linears and matmuls",
    "batch_norms": "batch independent normalizations",
    "batch_elementwise": "batch independent elementwise ops",
    "fuse_kernels": "Inductor-IR: scheduler nodes become one kernel or one launch",
}
PRESETS: dict[str, tuple[str, ...]] = {
    "none": (),
    "vertical": ("canonicalize", "vertical"),
    "horizontal": ("canonicalize", "horizontal"),
    "all": KINDS,
    "default": KINDS,
    "auto": KINDS,  # every rule, sized and gated per compile by the planner (optimus.planner)
}
AUTO = "auto"
DEFAULT = AUTO  # what optimus.compile, the registered backend and the CLI run when passes is not given


@dataclasses.dataclass(frozen=True)
class DriverOptions:
    """How the greedy driver runs (not which rules)."""

    numeric_check: bool = False  # run original vs optimized on random inputs; bisect culprits
    max_rewrites: int | None = None  # bound on rewrites per graph (default: 4 * nodes + 1000)
    lint: str = "end"  # "end": full lint after each level; "each": after every rewrite (slow)

    def __post_init__(self) -> None:
        if not isinstance(self.numeric_check, bool):
            raise TypeError(f"options.numeric_check must be a bool, got {type(self.numeric_check).__name__}")
        if self.max_rewrites is not None and (not isinstance(self.max_rewrites, int) or self.max_rewrites < 0):
            raise TypeError(f"options.max_rewrites must be a non-negative int or None, got {self.max_rewrites!r}")
        if self.lint not in ("end", "each"):
            raise ValueError(f"options.lint must be 'end' or 'each', got {self.lint!r}")


class RegisteredRule(Protocol):
    """What the registry reads of a rule (``core.rule.Rule`` is the implementation; the
    registry does not import it, the rules import the registry)."""

    name: str
    kind: str
    stage: str
    levels: tuple[str, ...]
    default: bool

    def fingerprint(self) -> str: ...

    def option_defaults(self) -> dict[str, Any]: ...

    def check_setting(self, name: str, value: Any) -> None: ...


class Registry:
    def __init__(self) -> None:
        self._rules: dict[str, RegisteredRule] = {}
        self._order: dict[str, int] = {}
        self._version = 0

    def add(self, rule: RegisteredRule, replace: bool = False) -> RegisteredRule:
        if rule.name in self._rules and not replace and self._rules[rule.name] is not rule:
            old = self._rules[rule.name]
            if old.fingerprint() != rule.fingerprint():
                raise ValueError(
                    f"a rule named {rule.name!r} is already registered; pick another name "
                    "or call optimus.register_rule(rule, replace=True)"
                )
        if rule.name in _RESERVED:
            raise ValueError(f"{rule.name!r} is a preset or level name; pick another rule name")
        self._order.setdefault(rule.name, len(self._order))
        self._rules[rule.name] = rule
        self._version += 1
        return rule

    def remove(self, name: str) -> None:
        self._rules.pop(name, None)
        self._version += 1

    def get(self, name: str) -> RegisteredRule:
        return self._rules[name]

    def __contains__(self, name: str) -> bool:
        return name in self._rules

    def rules(self, level: str | None = None, kinds: Iterable[str] | None = None, defaults_only: bool = False) -> list[RegisteredRule]:
        kinds = tuple(kinds) if kinds is not None else KINDS
        found = [
            r
            for r in self._rules.values()
            if (level is None or level in r.levels) and r.kind in kinds and (r.default or not defaults_only)
        ]
        return sorted(found, key=lambda r: (_STAGE_RANK[r.stage], self._order[r.name]))

    def names(self) -> list[str]:
        return sorted(self._rules)


REGISTRY = Registry()
_STAGE_RANK = {stage: i for i, stage in enumerate(STAGES)}
_RESERVED = set(PRESETS) | set(LEVELS) | {"options"}


@dataclasses.dataclass(frozen=True)
class PassConfig:
    """Resolved selection: level -> rule names in the order they run, and per-rule options."""

    rules: dict[str, tuple[str, ...]]
    options: dict[tuple[str, str], dict[str, Any]]  # (level, rule) -> options
    driver: DriverOptions = DriverOptions()
    spec: str = ""
    notes: tuple[str, ...] = dataclasses.field(default=(), compare=False)  # for the report (upstream names used)
    # (level, rule) pairs a ``-name`` took out; kept so that configurations derived from
    # this one (the planner's tuned candidates) leave them out too
    excluded: tuple[tuple[str, str], ...] = ()
    # passes="auto": the compile attaches its planner (``core.group.GroupPlanner``); the FX
    # driver asks it about every horizontal group. Core never looks inside it.
    planner: Any = dataclasses.field(default=None, compare=False)

    @property
    def planned(self) -> bool:
        """Chosen by the planner (``passes="auto"``, also with ``-name`` exclusions)."""
        return self.spec == AUTO or _auto_with_exclusions(self.spec)

    def rules_for(self, level: str) -> list[RegisteredRule]:
        return [REGISTRY.get(n) for n in self.rules.get(level, ()) if n in REGISTRY]

    def options_for(self, level: str, rule: RegisteredRule) -> dict[str, Any]:
        """The rule's options at ``level``: its defaults, then what the user set."""
        merged = rule.option_defaults()
        merged.update(self.options.get((level, rule.name), {}))
        return merged

    def enabled(self, level: str) -> bool:
        return bool(self.rules.get(level))

    def fingerprint(self, levels: Iterable[str] = LEVELS) -> str:
        """Changes when the selected rules, their code, options or driver options change."""
        h = hashlib.sha256()
        for level in levels:
            for rule in self.rules_for(level):
                h.update(f"{level}:{rule.name}:{rule.fingerprint()}".encode())
                h.update(json.dumps(self.options_for(level, rule), sort_keys=True, default=repr).encode())
        h.update(repr(self.driver).encode())
        if self.planner is not None:
            h.update(f"planner:{self.planner.fingerprint()}".encode())
        return h.hexdigest()[:24]


def resolve(passes: Any = DEFAULT) -> PassConfig:
    """Turn a user's ``passes`` value into a ``PassConfig`` (see module docstring);
    ``None`` is the default, ``"auto"``."""
    if isinstance(passes, PassConfig):
        return passes
    base, excluded, spec = _split_exclusions(passes)
    if excluded:
        return _resolve_excluding(base, excluded, spec)
    if passes is None:  # as for torch.compile's own arguments: None is the default
        passes = DEFAULT
    passes, notes = upstream_names.translate(passes, REGISTRY)
    selected: dict[str, list[str]] = {lv: [] for lv in LEVELS}
    options: dict[tuple[str, str], dict[str, Any]] = {}
    driver = DriverOptions()
    if isinstance(passes, str):
        _select_names([passes], LEVELS, selected)
        spec = passes
    elif isinstance(passes, (list, tuple, set, frozenset)):
        items = list(passes)
        for item in items:
            if not isinstance(item, str):
                raise TypeError(f"passes list entries must be str, got {type(item).__name__}: {item!r}")
        _select_names(items, LEVELS, selected)
        spec = ",".join(items)
    elif isinstance(passes, dict):
        for key, value in passes.items():
            if key == "options":
                if not isinstance(value, dict):
                    raise TypeError(f"passes['options'] must be a dict, got {type(value).__name__}")
                try:
                    driver = DriverOptions(**value)
                except TypeError as e:
                    valid = [f.name for f in dataclasses.fields(DriverOptions)]
                    raise TypeError(f"{e}; valid driver options: {valid}") from None
                continue
            if key not in LEVELS:
                raise ValueError(_unknown("level", key, list(LEVELS) + ["options"]))
            if isinstance(value, str):
                _select_names([value], (key,), selected)
            elif isinstance(value, (list, tuple, set)):
                _select_names(list(value), (key,), selected)
            elif isinstance(value, dict):
                for rule_name, rule_opts in value.items():
                    if rule_opts is False:
                        continue
                    _select_names([rule_name], (key,), selected)
                    if isinstance(rule_opts, dict):
                        if rule_name not in REGISTRY:
                            raise ValueError(f"options can only be given per rule; {rule_name!r} is not a rule")
                        _check_options(REGISTRY.get(rule_name), rule_opts)
                        options[(key, rule_name)] = dict(rule_opts)
                    elif rule_opts is not True:
                        raise TypeError(f"passes[{key!r}][{rule_name!r}] must be True, False or a dict of options, got {rule_opts!r}")
            elif value is None:
                continue
            else:
                raise TypeError(f"passes[{key!r}] must be a str, list or dict, got {type(value).__name__}")
        spec = json.dumps(passes, sort_keys=True, default=repr)
    else:
        raise TypeError(
            f"passes must be a preset name, a list of rule/group names, a dict per level or a PassConfig; "
            f"got {type(passes).__name__}"
        )
    ordered: dict[str, tuple[str, ...]] = {}
    for level in LEVELS:
        chosen = set(selected[level])
        ordered[level] = tuple(r.name for r in REGISTRY.rules(level) if r.name in chosen)
    return PassConfig(ordered, options, driver, spec, tuple(notes))


def _select_names(names: list[str], levels: Iterable[str], selected: dict[str, list[str]]) -> None:
    levels = tuple(levels)
    for name in names:
        if name in PRESETS:
            for level in levels:
                selected[level] += [r.name for r in REGISTRY.rules(level, PRESETS[name], defaults_only=True)]
        elif name in LEVELS:
            if name in levels:
                selected[name] += [r.name for r in REGISTRY.rules(name, defaults_only=True)]
            else:
                raise ValueError(f"level {name!r} given inside passes[{levels[0]!r}]")
        elif name in REGISTRY:
            rule = REGISTRY.get(name)
            usable = [lv for lv in levels if lv in rule.levels]
            if not usable:
                raise ValueError(f"rule {name!r} does not run at {', '.join(levels)} (it runs at {', '.join(rule.levels)})")
            for level in usable:
                selected[level].append(name)
        elif upstream_names.is_upstream_name(name):
            for level, rule_name in upstream_names.expand(name, levels):
                selected[level].append(rule_name)
        else:
            raise ValueError(_unknown("pass", name, list(PRESETS) + list(LEVELS) + REGISTRY.names(),
                                      also=tuple(upstream_names.UPSTREAM_PASSES)))


def _check_options(rule: RegisteredRule, given: dict[str, Any]) -> None:
    settable = rule.option_defaults()  # its own options and the ones its class has
    unknown = [k for k in given if k not in settable]
    if unknown:
        valid = sorted(settable) or "none"
        raise ValueError(f"rule {rule.name!r} has no option(s) {unknown}; valid options: {valid}")
    for k, v in given.items():
        rule.check_setting(k, v)  # type and range, with a message naming rule and option
    merged = {**settable, **given}
    if "min_group" in merged and "max_group" in merged and merged["max_group"] < merged["min_group"]:
        raise ValueError(f"rule {rule.name!r}: max_group ({merged['max_group']}) is below min_group ({merged['min_group']})")


def _unknown(what: str, name: Any, valid: list[str], also: tuple[str, ...] = ()) -> str:
    """The error for an unknown name: the closest of ``valid`` (and of ``also``, names
    accepted but not listed, such as upstream PyTorch's pass names), then ``valid``."""
    close = difflib.get_close_matches(str(name), valid + [a for a in also if a not in valid], n=3, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    more = " (and upstream PyTorch's pass names, docs/upstream-names.md)" if also else ""
    return f"unknown {what} name {name!r}.{hint} Valid names: {', '.join(valid)}{more}"


# ---------------------------------------------------------------- exclusions ("-name")

EXCLUDE_PREFIX = "-"


def _auto_with_exclusions(spec: str) -> bool:
    """``spec`` is ``"auto"`` followed by ``-name`` exclusions only (the planner stays on)."""
    head, _, rest = spec.partition(",")
    return head == AUTO and bool(rest) and all(p.startswith(EXCLUDE_PREFIX) for p in rest.split(","))


def _is_exclusion(item: Any) -> bool:
    return isinstance(item, str) and item.strip().startswith(EXCLUDE_PREFIX)


def _names_of(value: Any) -> list[Any] | None:
    """The names a string (comma list) or a list/tuple holds; None for other values."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()] if "," in value else [value.strip()]
    if isinstance(value, (list, tuple)):
        return list(value)
    return None


def _split_exclusions(passes: Any) -> tuple[Any, list[tuple[tuple[str, ...], str]], str]:
    """``passes`` without its ``-name`` items, the exclusions as (levels, name), and the
    spec naming the whole selection. No exclusion: ``(passes, [], "")`` unchanged."""
    excluded: list[tuple[tuple[str, ...], str]] = []
    names = _names_of(passes)
    if names is not None:
        kept = [n for n in names if not _is_exclusion(n)]
        excluded = [(LEVELS, n.strip()[1:]) for n in names if _is_exclusion(n)]
        if not excluded:
            return passes, [], ""
        spec = ",".join(kept + [EXCLUDE_PREFIX + name for _, name in excluded])
        return kept, excluded, spec
    if isinstance(passes, dict):
        base = dict(passes)
        for level, value in passes.items():
            names = _names_of(value) if level in LEVELS else None
            if names is None or not any(_is_exclusion(n) for n in names):
                continue
            base[level] = [n for n in names if not _is_exclusion(n)]
            excluded += [((level,), n.strip()[1:]) for n in names if _is_exclusion(n)]
        if excluded:
            return base, excluded, json.dumps(passes, sort_keys=True, default=repr)
    return passes, [], ""


def _resolve_excluding(base: Any, excluded: list[tuple[tuple[str, ...], str]], spec: str) -> PassConfig:
    """Resolve ``base`` (what is selected), then take out what each excluded name would
    select at its levels. An unknown excluded name raises as an unknown selected one does."""
    if base == [] or (isinstance(base, dict) and any(v == [] for k, v in base.items() if k in LEVELS)):
        shown = ", ".join(repr(EXCLUDE_PREFIX + n) for _, n in excluded)
        raise ValueError(f"{shown} excludes from nothing: name what to exclude from, e.g. "
                         f"[{AUTO!r}, {EXCLUDE_PREFIX + excluded[0][1]!r}] (a preset, a level or rule names)")
    config = resolve(base)
    removed: dict[str, list[str]] = {lv: [] for lv in LEVELS}
    for levels, name in excluded:
        if not name:
            raise ValueError(f"{EXCLUDE_PREFIX!r} alone names nothing to exclude")
        if name in KINDS[1:]:  # "-horizontal": the horizontal rules, not the canonicalizations the preset adds
            for level in levels:
                removed[level] += [r.name for r in REGISTRY.rules(level, (name,), defaults_only=True)]
            continue
        _select_names([name], levels, removed)
    pairs = tuple((lv, r) for lv in LEVELS for r in config.rules.get(lv, ()) if r in removed[lv])
    config = exclude_rules(config, pairs)
    notes = config.notes + (f"excluded: {', '.join(f'{r} ({lv})' for lv, r in pairs) or 'nothing that was selected'}",)
    return dataclasses.replace(config, spec=spec, notes=notes)


def exclude_rules(config: PassConfig, pairs: Iterable[tuple[str, str]]) -> PassConfig:
    """``config`` without the (level, rule) ``pairs``; they are remembered in ``excluded``."""
    pairs = tuple(pairs)
    if not pairs:
        return config
    out = set(pairs)
    rules = {lv: tuple(r for r in names if (lv, r) not in out) for lv, names in config.rules.items()}
    options = {k: v for k, v in config.options.items() if k not in out}
    excluded = config.excluded + tuple(p for p in pairs if p not in config.excluded)
    return dataclasses.replace(config, rules=rules, options=options, excluded=excluded)

