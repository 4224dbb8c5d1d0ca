"""Rules: a pattern, named conditions and a replacement, written once for every level.

::

    @rule(Op("cat", ListOf(Op("getitem", Op("split", X, S, D), Each("i"))), D),
          where=[chunks_cover_split_in_order])
    def split_cat_to_identity(m, b):
        \"\"\"cat(split(x, s, d)[0..n-1], d) -> x\"\"\"
        return m.x

* The pattern's root op is the **anchor**: the driver tries the rule on nodes of that op.
* ``where`` conditions are plain functions ``(Match) -> bool``; the first that fails
  becomes the decline reason in the report (its docstring's first line, else its name).
  The replacement may also call ``m.decline("why")``.
* The replacement ``(Match, Builder) -> value`` returns the node that replaces the anchor,
  or a ``{old_node: new_node}`` dict for several replacements, building new ops only
  through ``Builder`` (which emits the current level's own form). It never edits the
  graph itself: the driver owns surgery, validation, dead-code removal and rollback.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from typing import Any, Callable, Iterable, Sequence

import torch.fx as fx

from .levels import LEVELS
from .pattern import MatchState, Op, Pattern
from .registry import KINDS, REGISTRY
from .view import GraphView, getitem_users
from .vocab import DEFAULTS, SCHEMAS, Call, ParamRef


class Decline(Exception):
    """Raised (via ``Match.decline``) when a rule cannot prove its rewrite safe."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Match:
    """What a rule's pattern captured on one anchor, plus read-only graph helpers."""

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

    def decline(self, reason: str) -> None:
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


Condition = Callable[[Match], bool]


@dataclasses.dataclass
class Rule:
    """A named rewrite: anchor pattern, conditions, replacement, and where it applies."""

    name: str
    pattern: Op
    replace: Callable[[Match, Builder], Any]
    where: tuple[Condition, ...] = ()
    kind: str = "vertical"
    levels: tuple[str, ...] = ("torch_ir", "aten_ir")
    priority: int = 100
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    doc: str = ""
    default: bool = True  # part of presets and level selections (else only when named)

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, Op):
            raise TypeError(f"rule {self.name!r}: the pattern's root must be an Op (the anchor)")
        if self.kind not in KINDS:
            raise ValueError(f"rule {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        bad = [lv for lv in self.levels if lv not in LEVELS]
        if bad:
            raise ValueError(f"rule {self.name!r}: unknown levels {bad}; valid: {LEVELS}")
        self.where = tuple(self.where)

    @property
    def anchors(self) -> tuple[str, ...]:
        return self.pattern.ops

    def match(self, call: Call, view: GraphView, options: dict[str, Any]) -> Match | None:
        state = MatchState(view)
        if not self.pattern.match_call(call, state):
            return None
        return Match(self, call, state, options)

    def fingerprint(self) -> str:
        """Changes whenever the rule's code, conditions or default options change."""
        h = hashlib.sha256()
        h.update(self.name.encode())
        h.update(repr(self.pattern).encode())
        h.update(repr(sorted(self.options.items())).encode())
        for fn in (self.replace, *self.where):
            h.update(_code_fingerprint(fn).encode())
        return h.hexdigest()[:16]


def condition_reason(cond: Condition) -> str:
    doc = inspect.getdoc(cond)
    return doc.splitlines()[0] if doc else cond.__name__.replace("_", " ")


def _code_fingerprint(fn: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is None:
            return repr(fn)
        return repr((code.co_code, code.co_consts, code.co_names))


def rule(
    pattern: Op,
    *,
    where: Iterable[Condition] = (),
    kind: str = "vertical",
    levels: Sequence[str] = ("torch_ir", "aten_ir"),
    priority: int = 100,
    options: dict[str, Any] | None = None,
    name: str | None = None,
    register: bool = True,
    default: bool = True,
) -> Callable[[Callable[[Match, Builder], Any]], Rule]:
    """Decorator turning a replacement function into a ``Rule`` (and registering it).

    Registered rules join the registry at once: every later ``optimus.compile`` /
    ``optimus.optimize`` whose pass selection includes the rule's kind and level uses
    it, and the compile cache key changes with it.
    """

    def wrap(fn: Callable[[Match, Builder], Any]) -> Rule:
        r = Rule(
            name=name or fn.__name__,
            pattern=pattern,
            replace=fn,
            where=tuple(where),
            kind=kind,
            levels=tuple(levels),
            priority=priority,
            options=dict(options or {}),
            doc=inspect.getdoc(fn) or "",
            default=default,
        )
        if register:
            REGISTRY.add(r)
        return r

    return wrap
