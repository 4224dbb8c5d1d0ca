"""Rules: one protocol for every level (Torch-IR, Aten-IR, Inductor-IR).

Every rule is a ``Rule``: a name, a kind (``canonicalize``, ``vertical``, ``horizontal``),
the levels it runs at, its anchor ops, its stage, options, conditions, a replacement
(``replace(m, b)``), a docstring and a fingerprint. Three kinds of rule share it:

==================  =====================  ====================================  =========================
class               decorator              the match ``m`` the rule receives     built by ``b``
==================  =====================  ====================================  =========================
``PatternRule``     ``rule``               ``Match``: one anchor and captures    ``Builder`` (new FX nodes)
``GroupRule``       ``group.group_rule``   ``Group``: N independent members      ``Builder``
``FusionRule``      ``inductor_ir.rule.    ``FusionMatch``: scheduler nodes to   ``FusionBuilder`` (a
                    fusion_rule``          put in one kernel                     fusion decision)
==================  =====================  ====================================  =========================

::

    @rule(Op("cat", ListOf(Op("getitem", Op("split", X, S, D), Each("i"))), D),
          where=[chunks_cover_split_in_order])
    def split_cat_to_identity(m, b):
        \"\"\"cat(split(x, s, d)[0..n-1], d) -> x\"\"\"
        return m.x

**Conditions** (``where=[...]``) are functions of the match. A condition *names what it
requires* and returns ``True`` (or ``None``) when the rewrite may go ahead; otherwise
``False``, whose decline reason is the condition's docstring (first line: it states the
failure, e.g. "the split has users other than getitem"), or a string, which is the
reason itself. The first unmet condition declines the rewrite and its reason goes to
the report. The replacement may also decline with ``m.decline("why")``.

**Filters** (``Op(...).such_that(fn)`` on the pattern's root) take the same match and
return the same values, but stay silent: they say what a rule is about ("a split into
one section"), not why it declined, so nodes they turn away are not reported. A filter
runs first, on the anchor alone (``m.anchor``, ``m.view``, the helpers, the root's own
``.bind`` capture), to turn nodes away before the rest of the pattern is matched;
conditions run after the whole match and see every capture.

**Order**: a rule names its **stage** (``stage="fold"``; ``registry.STAGES`` lists them,
in the order they run, each with what its rules do): canonical forms first, then removals,
folds, conversions, moves, and the group rules by what they batch. Within a stage, rules
run in the order they were registered: the built-in families in the order
``optimus/rules/__init__.py`` imports them, each module's rules in the order it defines
them. Only rules that can meet compare: the FX driver tries the pattern rules anchored at
one op in that order (the first that rewrites wins), and a round runs the group rules in
it, as tinygrad's rule lists and MLIR's per-root benefit order what competes, with no
numbers shared across files (``tests/core/test_rule_order.py`` holds the order per anchor).

**Options** are a rule's settings, with their defaults (``options={...}``): the ones its
conditions and replacement read (``m.options[...]``), and the ones every rule of its class
has, which its driver reads (``CLASS_OPTIONS``: a group rule's ``min_group``,
``max_group``, ``max_span``; a fusion rule's depend on its pairing: ``max_attempts``,
``max_rounds``, ...); a rule changes such a default in its own ``options=``. Users set any
of them per rule in the same way (``passes={"torch_ir": {"batch_linear": {"min_group":
4}}}``). The driver options (``passes={"options": {...}}``, ``DriverOptions``) are
something else: how the driver runs, for every rule.

The replacement never edits the graph itself: the level's driver owns surgery,
validation, dead-code removal and rollback.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from typing import Any, Callable, ClassVar, Iterable, Mapping, NoReturn, Sequence

import torch.fx as fx

from .levels import LEVELS
from .pattern import MatchState, Op, Pattern
from .registry import KINDS, REGISTRY, STAGES
from .view import GraphView, getitem_users
from .vocab import DEFAULTS, SCHEMAS, Call, ParamRef

__all__ = [
    "Builder",
    "Condition",
    "Decline",
    "KINDS",
    "LEVELS",
    "Match",
    "PatternRule",
    "Rule",
    "STAGES",
    "condition_reason",
    "met",
    "rule",
    "rule_decorator",
    "unmet",
]


class Decline(Exception):
    """Raised (via ``Match.decline``) when a rule cannot prove its rewrite safe."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Match:
    """What a rule matched: the anchor and its pattern's captures, plus read-only graph
    helpers. Conditions, filters and the replacement receive it (``m``).

    Captures read as attributes (``m.x`` for ``Var("x")``); ``m.anchor`` is the anchor's
    ``Call``, ``m.view`` the graph view, ``m.options`` the rule's settings (its options and
    its class's, with what the user set). ``Group`` and ``FusionMatch`` are the matches of
    group and fusion rules.
    """

    def __init__(self, rule: "Rule", anchor: Call, state: MatchState, options: dict[str, Any]) -> None:
        self.rule = rule
        self.anchor = anchor
        self.view: GraphView = state.view
        self.bindings = state.bindings
        self.nodes: list[fx.Node] = state.nodes
        self.options = options

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["bindings"][name]
        except KeyError:
            raise AttributeError(f"rule {self.rule.name!r} captured no {name!r}") from None

    def __getitem__(self, name: str) -> Any:
        return self.bindings[name]

    def decline(self, reason: str) -> NoReturn:
        raise Decline(reason)

    # read-only helpers -------------------------------------------------------
    def call(self, value: Any) -> Call | None:
        return self.view.classify(value) if isinstance(value, fx.Node) else None

    def shape(self, value: Any) -> tuple[Any, ...] | None:
        return self.view.shape(value)

    def rank(self, value: Any) -> int | None:
        return self.view.rank(value)

    def dtype(self, value: Any) -> Any:
        return self.view.dtype(value)

    def getitems(self, node: fx.Node) -> dict[int, list[fx.Node]] | None:
        """Index -> getitem users of a multi-output node (``None`` if used otherwise)."""
        return getitem_users(node)


class Builder:
    """Emits new ops in the current level's form, inserted before the anchor.

    ``b.cat([x, y], 1)`` or ``b.emit("cat", tensors=[x, y], dim=1)``; positional
    arguments follow ``vocab.SCHEMAS``, omitted ones take ``vocab.DEFAULTS``.
    ``b.split`` and ``b.unbind`` return the list of chunk nodes. If an input is defined
    after the anchor, the insertion point moves after it.
    """

    def __init__(self, view: GraphView, anchor: fx.Node) -> None:
        self.graph_view = view  # not "view": b.view(...) emits the view op
        self.graph = view.graph
        self.point = anchor
        self.new_nodes: list[fx.Node] = []

    def emit(self, op: str, *args: Any, **kwargs: Any) -> fx.Node:
        schema = self.graph_view.schema_of(op)
        if len(args) > len(schema):
            raise TypeError(f"{op} takes {len(schema)} arguments {schema}, got {len(args)}")
        canon = dict(DEFAULTS.get(op, {}))
        canon.update(zip(schema, args))
        canon.update(kwargs)
        missing = [name for name in schema if name not in canon]
        if missing:
            raise TypeError(f"{op} missing arguments {missing}")
        canon = {k: self.value(v) for k, v in canon.items()}
        self._place_after_inputs(canon)
        with self.graph.inserting_before(self.point):
            node = self.graph_view.emit(op, canon)
        self.new_nodes.append(node)
        return node

    def respell(self, call: Call, **changes: Any) -> fx.Node:
        """Emit ``call`` again in the level's canonical spelling (same op, same values).

        The metadata of the original node is reused instead of re-running the op on fake
        tensors: a respelling computes exactly what the original computed. Only for
        canonicalization; any other rewrite must go through ``emit``.
        """
        canon = {k: self.value(v) for k, v in {**call.args, **changes}.items()}
        self._place_after_inputs(canon)
        kind, target, pargs, kwargs = self.graph_view._emit_target(call.op, canon)
        with self.graph.inserting_before(self.point):
            node = self.graph.create_node(kind, target, tuple(pargs), kwargs)
        node.meta.update({k: v for k, v in call.node.meta.items() if k in (self.graph_view.meta_key, "stack_trace", "nn_module_stack", "source_fn_stack")})
        self.new_nodes.append(node)
        return node

    def split(self, input: Any, sizes: Sequence[int], dim: int) -> list[fx.Node]:
        node = self.emit("split", input, list(sizes), dim)
        return [self.emit("getitem", node, i) for i in range(len(sizes))]

    def stack(self, tensors: Sequence[Any], dim: int) -> fx.Node:
        """``stack`` where the level has it, else its decomposition ``cat`` of ``unsqueeze``s."""
        if self.graph_view.can_emit("stack"):
            return self.emit("stack", list(tensors), dim)
        return self.emit("cat", [self.emit("unsqueeze", t, dim) for t in tensors], dim)

    def cast(self, input: Any, dtype: Any) -> Any:
        """``input`` converted to ``dtype``; ``input`` itself when it has that dtype already
        (a ``cast`` always changes the dtype: see ``vocab``)."""
        value = self.value(input)
        if self.graph_view.dtype(value) == dtype:
            return value
        return self.emit("cast", value, dtype)

    def unbind(self, input: Any, dim: int) -> list[fx.Node]:
        shape = self.graph_view.shape(input)
        if shape is None or not isinstance(shape[dim], int):
            raise Decline("unbind along a dim of unknown or symbolic size")
        node = self.emit("unbind", input, dim)
        return [self.emit("getitem", node, i) for i in range(shape[dim])]

    def constant(self, values: Sequence[float], shape: Sequence[int], dtype: Any, device: Any) -> fx.Node:
        """A constant tensor as a node of this level (e.g. per-chunk scalars as one vector).

        Built outside any ambient fake-tensor mode (rules can run while one is active)."""
        import torch
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            t = torch.tensor(list(values), dtype=dtype, device=device).reshape(list(shape))
        node = self.graph_view.emit_constant(t, self.point)
        self.new_nodes.append(node)
        return node

    def value(self, v: Any) -> Any:
        """Materialize ``ParamRef``s as ``get_attr`` nodes; everything else unchanged."""
        if isinstance(v, ParamRef):
            first = next(iter(self.graph.nodes))
            with self.graph.inserting_before(first):
                node = self.graph.get_attr(v.target)
            node.meta[self.graph_view.meta_key] = self.graph_view.value_of_tensor(self.graph_view.gm.get_parameter(v.target))
            self.new_nodes.append(node)
            return node
        if isinstance(v, (list, tuple)):
            return type(v)(self.value(x) for x in v)
        return v

    def _place_after_inputs(self, args: dict[str, Any]) -> None:
        inputs: list[fx.Node] = []
        fx.node.map_arg(list(args.values()), inputs.append)
        latest = max(inputs, key=lambda n: n._sort_key, default=None)
        if latest is not None and not latest._sort_key < self.point._sort_key:
            self.point = latest.next

    def __getattr__(self, op: str) -> Callable[..., fx.Node]:
        if op in SCHEMAS:
            return lambda *args, **kwargs: self.emit(op, *args, **kwargs)
        raise AttributeError(op)


Condition = Callable[[Any], "bool | str | None"]


def condition_reason(cond: Callable[..., Any]) -> str:
    """A condition's decline reason: its docstring's first line, else its name."""
    doc = inspect.getdoc(cond)
    return doc.splitlines()[0] if doc else getattr(cond, "__name__", repr(cond)).replace("_", " ")


def met(cond: Callable[[Any], Any], match: Any) -> bool:
    """Does ``cond(match)`` let the rewrite go ahead? (``unmet`` without the reason: filters.)"""
    result = cond(match)
    return result is None or result is True or (not isinstance(result, str) and bool(result))


def unmet(cond: Callable[[Any], Any], match: Any) -> str | None:
    """``None`` when ``cond(match)`` lets the rewrite go ahead, else the decline reason.

    ``True`` or ``None``: met. A non-empty string: unmet, with that reason. ``False`` (or
    any other false value): unmet, with the condition's docstring as the reason.
    """
    result = cond(match)
    if result is None or result is True:
        return None
    if isinstance(result, str):
        return result or condition_reason(cond)
    return None if result else condition_reason(cond)


def setting_range(name: str) -> tuple[Any, Any]:
    """The allowed range of a numeric rule setting, by the naming convention every rule
    follows: a group or run size (``min_group``, ``max_group``, ``min_run``,
    ``min_chunks``) is at least 2; a byte budget (``*_bytes``) or a memory allowance
    (``memory_increase``) at least 0; any other limit or count (``max_*``, ``min_*``) at
    least 1. A rule declares ``ranges=`` where this does not fit."""
    if name in ("min_group", "max_group", "min_run", "min_chunks"):
        return 2, None
    if name.endswith("_bytes") or name == "memory_increase":
        return 0, None
    if name.startswith(("max_", "min_")):
        return 1, None
    return None, None


@dataclasses.dataclass(kw_only=True)
class Rule:
    """The protocol every rule follows, whatever its level (see the module docstring).

    Subclasses add what they match on (``PatternRule.pattern``, ``GroupRule.anchors`` and
    ``key``, ``FusionRule.pairing``) and provide ``anchors``: the canonical ops (or, at
    Inductor-IR, node kinds) the driver tries the rule on.
    """

    name: str
    replace: Callable[..., Any]
    kind: str = "vertical"
    levels: tuple[str, ...] = ("torch_ir", "aten_ir")
    stage: str = "fold"  # where it runs among the level's rules (``registry.STAGES``)
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    conditions: tuple[Condition, ...] = ()
    doc: str = ""
    default: bool = True  # part of presets and level selections (else only when named)

    # Traits: what the compile, the packing and the planner need to know of a rule, declared
    # where it is defined and read through the registry (never by the rule's name).
    #: Its replacement runs under CUDA graph capture. ``False``: left out of compiles under
    #: CUDA graphs (``mode="reduce-overhead"``), said in the report; the environment variable
    #: ``OPTIMUS_CUDAGRAPH_KERNELS=1`` keeps it, to try it there.
    cudagraph_safe: bool = True
    #: Options it takes under CUDA graphs, per level (``{"torch_ir": {"option": value}}``),
    #: over what the user set: a variant that is correct under capture but does not pay there.
    cudagraph_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: It reads parameters that ``optimus.pack_parameters`` laid out in one buffer in place
    #: (instead of stacking them): packing by default pays only where such a rule runs.
    reads_packed_parameters: bool = False
    #: Its only gain is fewer kernel launches: under CUDA graphs a replay launches every
    #: kernel from the device, so the planner (``passes="auto"``) leaves it out there.
    saves_only_launches: bool = False

    #: Allowed ranges of this rule's numeric settings, ``{name: (lowest, highest)}``
    #: (``None``: unbounded), where the naming convention (``setting_range``) does not fit.
    ranges: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)

    #: The options every rule of this class has, read by its driver, with their defaults.
    CLASS_OPTIONS: ClassVar[Mapping[str, Any]] = {}

    def __new__(cls, *args: Any, **kwargs: Any) -> "Rule":
        if cls is Rule:
            if "pattern" not in kwargs:
                raise TypeError("Rule is the protocol; build a PatternRule, GroupRule or FusionRule (or use their decorators)")
            cls = PatternRule  # Rule(pattern=...) built a pattern rule before the kinds shared a base
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"rule {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.stage not in STAGES:
            raise ValueError(f"rule {self.name!r}: stage must be one of {tuple(STAGES)}, got {self.stage!r}")
        self.levels = tuple(self.levels)
        bad = [lv for lv in self.levels if lv not in LEVELS]
        if bad:
            raise ValueError(f"rule {self.name!r}: unknown levels {bad}; valid: {LEVELS}")
        self.conditions = tuple(self.conditions)
        self.options = {**self.class_options(), **dict(self.options or {})}
        for name, value in self.option_defaults().items():
            self.check_setting(name, value)  # a rule's own defaults obey its ranges
        self.cudagraph_options = {lv: dict(opts) for lv, opts in (self.cudagraph_options or {}).items()}
        for level, opts in self.cudagraph_options.items():
            if level not in self.levels:
                raise ValueError(f"rule {self.name!r}: cudagraph_options for {level!r}, where it does not run (it runs at {', '.join(self.levels)})")
            for name, value in opts.items():
                self.check_setting(name, value)

    @property
    def memory_bounded(self) -> bool:
        """Its driver bounds the peak memory of what it merges by its ``memory_increase``
        option (``None``: unbounded); the planner (``passes="auto"``) sets it."""
        return "memory_increase" in self.option_defaults()

    # ``anchors``: defined by each kind of rule (a property of the pattern, or a field).

    def class_options(self) -> dict[str, Any]:
        """The options the level's driver reads for every rule of this class, with their
        defaults (``CLASS_OPTIONS``)."""
        return dict(self.CLASS_OPTIONS)

    def option_defaults(self) -> dict[str, Any]:
        """Every option a user may give this rule, with its defaults."""
        return dict(self.options)

    def check_setting(self, name: str, value: Any) -> None:
        """Raise (``TypeError`` / ``ValueError`` naming the rule, the setting and what it
        accepts) unless ``value`` fits the option ``name``."""
        settable = self.option_defaults()
        if name not in settable:
            raise ValueError(f"rule {self.name!r} has no option {name!r}; valid options: {sorted(settable) or 'none'}")
        default = settable[name]
        where = f"rule {self.name!r} option {name!r}"
        if isinstance(default, bool) or isinstance(value, bool):
            if not isinstance(value, bool) or not isinstance(default, bool):
                raise TypeError(f"{where} must be {type(default).__name__ if default is not None else 'a number or None'}, got {value!r}")
            return
        if default is None and value is None:
            return
        numeric = isinstance(default, (int, float)) or default is None
        if numeric:
            if not isinstance(value, (int, float)) or (isinstance(default, int) and not isinstance(value, int)):
                kind = "an int" if isinstance(default, int) else "a number"
                raise TypeError(f"{where} must be {kind}{' or None' if default is None else ''}, got {type(value).__name__} {value!r}")
            lo, hi = self.ranges.get(name) or setting_range(name)
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                allowed = f">= {lo}" if hi is None else (f"<= {hi}" if lo is None else f"in [{lo}, {hi}]")
                raise ValueError(f"{where} must be {allowed}, got {value!r}")
            return
        if not isinstance(value, type(default)):
            raise TypeError(f"{where} must be {type(default).__name__}, got {type(value).__name__} {value!r}")

    def decline_reason(self, match: Any) -> str | None:
        """The reason of the first unmet condition (``None`` if all are met)."""
        for cond in self.conditions:
            reason = unmet(cond, match)
            if reason is not None:
                return reason
        return None

    def fingerprint(self) -> str:
        """Changes whenever the rule's code (replacement, conditions, filters, keys),
        what it matches, or its default options change."""
        h = hashlib.sha256()
        h.update(f"{type(self).__name__}:{self.name}:{self.kind}:{self.stage}".encode())
        h.update(self.structure().encode())
        h.update(repr(sorted(self.option_defaults().items())).encode())
        for fn in self.code():
            h.update(_code_fingerprint(fn).encode())
        return h.hexdigest()[:16]

    def structure(self) -> str:
        """What the rule matches, as text (part of the fingerprint)."""
        return repr(self.anchors)

    def code(self) -> tuple[Callable[..., Any], ...]:
        """Every function of the rule the driver runs (part of the fingerprint)."""
        return (self.replace, *self.conditions)


@dataclasses.dataclass(kw_only=True)
class PatternRule(Rule):
    """A local rule: a pattern tree over the vocabulary whose root op is the anchor.

    The FX driver tries it on nodes of the anchor op, in stage order; the match is a
    ``Match``, the builder a ``Builder``, the result the node replacing the anchor or an
    ``{old: new}`` dict.
    """

    pattern: Op

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, Op):
            raise TypeError(f"rule {self.name!r}: the pattern's root must be an Op (the anchor)")
        nested = [p for p in _sub_ops(self.pattern) if p.test is not None]
        if nested:
            raise ValueError(
                f"rule {self.name!r}: .such_that() filters go on the pattern's root; bind the sub-pattern "
                f"(.bind(name)) and test m.<name> in the root's filter (found on {nested[0]!r})"
            )
        super().__post_init__()

    @property
    def anchors(self) -> tuple[str, ...]:
        return self.pattern.ops

    def match(self, call: Call, view: Any, options: dict[str, Any]) -> Match | None:
        """The match of the filter and the pattern on ``call``, or ``None`` (silent).

        The filter runs first, on the anchor alone (it sees ``m.anchor``, ``m.view``, the
        helpers and the root's own ``.bind`` capture), so that it turns nodes away before
        the rest of the pattern is matched."""
        pattern = self.pattern
        if call.op not in pattern.ops:
            return None
        state = MatchState(view)
        m = None
        if pattern.test is not None:
            if pattern.capture is not None:
                state.bindings[pattern.capture] = call.node
            m = Match(self, call, state, options)
            if not met(pattern.test, m):
                return None
        if not pattern.match_call(call, state):
            return None
        if m is None:
            return Match(self, call, state, options)
        m.bindings, m.nodes = state.bindings, state.nodes  # an Alt may have replaced them
        return m

    def structure(self) -> str:
        return repr(self.pattern)

    def code(self) -> tuple[Callable[..., Any], ...]:
        test = (self.pattern.test,) if self.pattern.test is not None else ()
        return (*super().code(), *test)


def _sub_ops(pattern: Pattern) -> list[Op]:
    """The ``Op``s strictly below ``pattern``'s root."""
    found: list[Op] = []
    stack = list(pattern.children())
    while stack:
        p = stack.pop()
        if isinstance(p, Op):
            found.append(p)
        stack.extend(p.children())
    return found


def _code_fingerprint(fn: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is None:
            return repr(fn)
        return repr((code.co_code, code.co_consts, code.co_names))


def rule_decorator(cls: type[Rule], subject: str, *, fixed: Mapping[str, Any] | None = None, name: str = "rule", doc: str = "") -> Callable[..., Callable[[Callable[..., Any]], Any]]:
    """The decorator of one kind of rule: ``@decorator(what, where=[...], **fields)``.

    ``what`` (the pattern, or a group rule's anchor ops) becomes the field ``subject``;
    ``where`` the conditions; ``name`` defaults to the function's name and ``doc`` to its
    docstring; every other keyword is a field of ``cls`` (``kind``, ``levels``,
    ``stage``, ``options``, ``default``, the traits, and the kind's own).
    ``fixed`` are fields the kind sets itself. The rule joins the registry at once
    (``register=False`` to build it only): every later ``optimus.compile`` whose passes
    include its kind and level uses it, and the compile-cache key changes with it.
    """
    fixed = dict(fixed or {})

    def decorator(what: Any, /, *, where: Iterable[Condition] = (), name: str | None = None, register: bool = True, **fields: Any) -> Callable[[Callable[..., Any]], Any]:
        clash = sorted(set(fields) & set(fixed))
        if clash:
            raise TypeError(f"{decorator.__name__}() sets {', '.join(clash)} itself")
        if "priority" in fields:
            raise TypeError(
                f"{decorator.__name__}() takes no priority: a rule names its stage (stage=, one of "
                f"{', '.join(STAGES)}) and runs after the rules registered before it in that stage"
            )
        if "knobs" in fields:
            raise TypeError(f"{decorator.__name__}() takes no knobs: every setting of a rule is an option (options=), "
                            f"including the ones its driver reads ({cls.__name__}.CLASS_OPTIONS)")

        def wrap(fn: Callable[..., Any]) -> Any:
            r = cls(name=name or fn.__name__, replace=fn, conditions=tuple(where), doc=inspect.getdoc(fn) or "", **{subject: what}, **fixed, **fields)
            if register:
                REGISTRY.add(r)
            return r

        return wrap

    decorator.__name__ = decorator.__qualname__ = name
    decorator.__doc__ = doc
    return decorator


rule = rule_decorator(
    PatternRule,
    "pattern",
    name="rule",
    doc="""``@rule(pattern, where=[...], kind=..., levels=..., stage=..., options=...)``:
    the replacement ``fn(m, b)`` becomes a registered ``PatternRule`` (see ``rule_decorator``).""",
)
