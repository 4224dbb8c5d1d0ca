"""A small pattern language over the canonical vocabulary.

Patterns are trees that mirror how a value was produced::

    Op("cat", ListOf(Op("getitem", Op("split", X, S, D).bind("split"), Each("i"))), D)

reads "a cat, along dim D, of a list of getitems of one split of X along the same dim D;
collect the getitem indices as ``i``". Matching walks producers through the graph view,
so the same pattern matches ``torch.cat([*x.split(2, -1)], dim=1)`` at Torch-IR and
``aten.cat.default([getitem, ...], 1)`` at Aten-IR.

* ``Op(name_or_names, *args, **kwargs)``: a node whose canonical op is one of the names;
  positional sub-patterns follow ``vocab.SCHEMAS[name]``; unspecified arguments are
  ignored. ``.bind("name")`` captures the node itself.
* ``Var("x")``: any value, captured as ``x``. A name bound twice must bind the same value
  (unification): ``D`` above forces the split dim and the cat dim to agree.
* ``Each("i")``: inside ``ListOf``, collects one value per element into a list.
* ``ListOf(p)``: a list/tuple whose every element matches ``p``.
* ``Lit(v)``: equal to ``v``. ``Alt(p, q)``: the first of ``p``, ``q`` that matches.
* ``ANY``: anything, not captured.

``.such_that(fn)`` on the root ``Op`` adds a silent filter: ``fn(m)`` receives the rule's
``Match`` before the rest of the pattern is matched (``m.anchor``, ``m.view``, the root's
own ``.bind`` capture) and returns what a condition returns; a node turned away by the
filter is not reported (see ``core.rule``).
"""

from __future__ import annotations

from typing import Any, Iterator

import torch.fx as fx

from .symbolic import known_eq
from .vocab import SCHEMAS, Call


class MatchState:
    """Bindings and matched nodes accumulated while matching one anchor."""

    __slots__ = ("view", "bindings", "nodes")

    def __init__(self, view: Any) -> None:
        self.view = view
        self.bindings: dict[str, Any] = {}
        self.nodes: list[fx.Node] = []

    def snapshot(self) -> tuple[dict[str, Any], int]:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.bindings.items()}, len(self.nodes)

    def restore(self, snap: tuple[dict[str, Any], int]) -> None:
        self.bindings, n = snap
        del self.nodes[n:]


def same_value(a: Any, b: Any) -> bool:
    """Unification equality: nodes by identity, sequences elementwise, numbers by value."""
    if isinstance(a, fx.Node) or isinstance(b, fx.Node):
        return a is b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return known_eq(a, b)


class Pattern:
    def match(self, value: Any, state: MatchState) -> bool:
        raise NotImplementedError

    def names(self) -> Iterator[str]:
        return iter(())

    def children(self) -> list["Pattern"]:
        """The sub-patterns this one matches its parts against."""
        return []


class Var(Pattern):
    def __init__(self, name: str) -> None:
        self.name = name

    def match(self, value: Any, state: MatchState) -> bool:
        if self.name in state.bindings:
            return same_value(state.bindings[self.name], value)
        state.bindings[self.name] = value
        return True

    def names(self) -> Iterator[str]:
        yield self.name

    def __repr__(self) -> str:
        return self.name


class _Any(Pattern):
    def match(self, value: Any, state: MatchState) -> bool:
        return True

    def __repr__(self) -> str:
        return "_"


ANY = _Any()


class Lit(Pattern):
    def __init__(self, value: Any) -> None:
        self.value = value

    def match(self, value: Any, state: MatchState) -> bool:
        return same_value(self.value, value)

    def __repr__(self) -> str:
        return repr(self.value)


class Each(Pattern):
    """Collects one value per ``ListOf`` element into a list bound to ``name``."""

    def __init__(self, name: str, inner: Pattern = ANY) -> None:
        self.name = name
        self.inner = inner

    def match(self, value: Any, state: MatchState) -> bool:
        if not self.inner.match(value, state):
            return False
        state.bindings.setdefault(self.name, []).append(value)
        return True

    def children(self) -> list[Pattern]:
        return [self.inner]

    def __repr__(self) -> str:
        return f"each {self.name}"


class ListOf(Pattern):
    def __init__(self, element: Pattern, min_len: int = 1) -> None:
        self.element = element
        self.min_len = min_len

    def match(self, value: Any, state: MatchState) -> bool:
        if not isinstance(value, (list, tuple)) or len(value) < self.min_len:
            return False
        for name in _each_names(self.element):
            state.bindings[name] = []
        return all(self.element.match(v, state) for v in value)

    def names(self) -> Iterator[str]:
        yield from self.element.names()
        yield from _each_names(self.element)

    def children(self) -> list[Pattern]:
        return [self.element]

    def __repr__(self) -> str:
        return f"[{self.element!r}, ...]"


class Alt(Pattern):
    def __init__(self, *options: Pattern) -> None:
        self.options = options

    def match(self, value: Any, state: MatchState) -> bool:
        for option in self.options:
            snap = state.snapshot()
            if option.match(value, state):
                return True
            state.restore(snap)
        return False

    def names(self) -> Iterator[str]:
        for o in self.options:
            yield from o.names()

    def children(self) -> list[Pattern]:
        return list(self.options)

    def __repr__(self) -> str:
        return " | ".join(repr(o) for o in self.options)


class Op(Pattern):
    def __init__(self, op: str | tuple[str, ...], *args: Any, **kwargs: Any) -> None:
        self.ops = (op,) if isinstance(op, str) else tuple(op)
        for name in self.ops:
            if name not in SCHEMAS and name != "getitem":
                raise ValueError(f"unknown canonical op {name!r}; known: {sorted(SCHEMAS)}")
        schema = SCHEMAS.get(self.ops[0], ("input", "index"))
        if len(args) > len(schema):
            raise ValueError(f"{self.ops[0]} takes at most {len(schema)} arguments: {schema}")
        self.args: dict[str, Pattern] = {}
        for name, p in list(zip(schema, args)) + list(kwargs.items()):
            self.args[name] = p if isinstance(p, Pattern) else Lit(p)
        self.capture: str | None = None
        self.test: Any = None

    def bind(self, name: str) -> "Op":
        """Also capture the matched node under ``name``."""
        self.capture = name
        return self

    def such_that(self, test: Any) -> "Op":
        """A silent filter on the root op: the rule matches only where ``test(m)`` is met
        (``m`` is the rule's ``Match``; ``test`` returns what a condition returns). The rule
        evaluates it first, on the anchor alone, before the rest of the pattern; nodes it
        turns away are not reported."""
        self.test = test
        return self

    def match(self, value: Any, state: MatchState) -> bool:
        if not isinstance(value, fx.Node):
            return False
        call = state.view.classify(value)
        return call is not None and self.match_call(call, state)

    def match_call(self, call: Call, state: MatchState) -> bool:
        if call.op not in self.ops:
            return False
        if self.capture is not None:
            if self.capture in state.bindings and state.bindings[self.capture] is not call.node:
                return False
            state.bindings[self.capture] = call.node
        state.nodes.append(call.node)
        for name, pattern in self.args.items():
            if name not in call.args or not pattern.match(call.args[name], state):
                return False
        return True

    def names(self) -> Iterator[str]:
        if self.capture:
            yield self.capture
        for p in self.args.values():
            yield from p.names()

    def children(self) -> list[Pattern]:
        return list(self.args.values())

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        name = self.ops[0] if len(self.ops) == 1 else "|".join(self.ops)
        return f"{name}({inner})"


def _each_names(p: Pattern) -> Iterator[str]:
    if isinstance(p, Each):
        yield p.name
    for child in p.children():
        if not isinstance(child, ListOf):  # nested lists collect their own
            yield from _each_names(child)


