"""Fusion rules: the Inductor-IR kind of rule, in the protocol every level shares.

A rule at Torch-IR or Aten-IR rewrites one anchor node into new nodes. At Inductor-IR
the unit of change is a *decision*: which scheduler nodes become one kernel. A
``FusionRule`` is a ``PatternRule`` (``optimus.core.rule``) -- a name, a pattern over the
canonical vocabulary (here the scheduler-node kinds of ``view.KIND_SCHEMAS``), conditions
whose docstrings become decline reasons, a silent ``.such_that`` filter, a replacement
that builds through a builder, kind, stage, options -- and adds how
candidates pair up:

``pairing="independent"``
    Candidates matching the pattern are bucketed (default: by iteration space,
    ``(device, numel, rnumel)``); within a bucket the driver grows groups greedily in
    schedule order. ``m.group`` is the group so far, ``m.candidate`` the node to add.
    Knob: ``max_attempts`` (candidates tried per group).
``pairing="producer_consumer"``
    Pairs ``(m.producer, m.consumer)`` where the consumer reads a buffer the producer
    writes, best pairs first (Inductor's own fusion score), repeated to a fixpoint.
    Knobs: ``max_rounds``, ``relaxed`` (waive Inductor's fusion heuristics).
``pairing="combo"``
    Like ``independent`` but the group becomes one combo (foreach) launch of separate
    sub-kernels instead of one fused loop nest (GPU backends only). Default buckets:
    ``(device, kind)``, since Inductor launches pointwise kernels and reductions apart.
    Knobs: ``max_attempts``, ``verify_codegen``, ``benchmark``.

The replacement ``replace(m, b)`` returns ``b.fuse(*nodes)`` (one kernel) or
``b.combo(*nodes)`` (one launch), or ``None``/``m.decline(...)`` to keep them apart.
The driver (``optimus.inductor_ir.passes``) owns every legality check -- same device,
no dependency path between independent nodes, no cycle, Inductor's own ``can_fuse``
(node kinds, templates, loop shapes, tiling) -- and performs the fusion with
Inductor's own primitives; a rule only decides what is worth fusing. The built-in
rules are in ``optimus/rules/kernel_fusion.py``::

    @fusion_rule(Op(("pointwise", "reduction")), pairing="independent", kind="horizontal",
                 where=[_within_max_kernels], options={"max_kernels": 8})
    def fuse_independent_kernels(m, b):
        \"\"\"k1: for i in I: a[i] = f(x[i]);  k2: for i in I: c[i] = g(y[i])
              -> k: for i in I: a[i] = f(x[i]); c[i] = g(y[i])\"\"\"
        return b.fuse(m.target, m.candidate)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable, Iterable, Sequence

from ..core.pattern import MatchState
from ..core.rule import Decline, Match, PatternRule, rule_decorator
from ..core.vocab import Call
from . import view as _view  # noqa: F401  (registers the scheduler-node kinds)

PAIRINGS = ("independent", "producer_consumer", "combo")
HOOKS = ("pre_fusion", "post_fusion")


@dataclasses.dataclass(frozen=True)
class FuseAction:
    """Fuse ``nodes`` into one kernel (Inductor ``FusedSchedulerNode``)."""

    nodes: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class ComboAction:
    """Launch ``nodes`` as one combo kernel (Inductor ``ForeachKernelSchedulerNode``)."""

    nodes: tuple[Any, ...]


class FusionBuilder:
    """What a fusion rule's replacement may ask for. Nothing happens until the driver
    has checked legality; the builder only records the decision."""

    def fuse(self, *nodes: Any) -> FuseAction:
        return FuseAction(tuple(_flatten(nodes)))

    def combo(self, *nodes: Any) -> ComboAction:
        return ComboAction(tuple(_flatten(nodes)))


def _flatten(nodes: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for n in nodes:
        if isinstance(n, (list, tuple)):
            out.extend(_flatten(n))
        else:
            out.append(n)
    return out


class FusionMatch(Match):
    """A fusion candidate: the group chosen so far and the node to add.

    ``m.group`` (list), ``m.candidate``, ``m.nodes`` (group + candidate),
    ``m.producer``/``m.consumer`` (producer_consumer pairing), ``m.target`` (the node
    the candidate would join: the fused group node, or the producer), ``m.view``,
    ``m.options``, ``m.call(node)``; pattern captures of the candidate as attributes.
    """

    def __init__(
        self,
        rule: "FusionRule",
        view: Any,
        group: Sequence[Any],
        candidate: Any,
        options: dict[str, Any],
        target: Any = None,
    ) -> None:
        state = MatchState(view)
        call = view.classify(candidate)
        if call is not None:
            rule.pattern.match_call(call, state)
        d = self.__dict__
        d["rule"] = rule
        d["anchor"] = call if call is not None else Call("?", candidate, {})
        d["view"] = view
        d["bindings"] = state.bindings
        d["options"] = options
        d["group"] = list(group)
        d["candidate"] = candidate
        d["target"] = target

    @property
    def nodes(self) -> list[Any]:  # type: ignore[override]
        return [*self.group, self.candidate]

    @property
    def producer(self) -> Any:
        return self.group[0]

    @property
    def consumer(self) -> Any:
        return self.candidate

    def call(self, value: Any) -> Call | None:
        return self.view.classify(value)

    def work(self, node: Any) -> int | None:
        return self.view.work(node)

    def _over_parts(self, measure: Callable[[Any], int]) -> int:
        """``measure`` summed over the kernels the fusion would put into one."""
        parts = [self.target] if self.target is not None else list(self.group)
        return sum(measure(n) for n in parts) + measure(self.candidate)

    def members(self) -> int:
        """IR operations in the kernel the fusion would produce."""
        return self._over_parts(self.view.members)

    def accesses(self) -> int:
        """Buffers the kernel the fusion would produce reads or writes (about its pointer
        arguments)."""
        return self._over_parts(self.view.accesses)

    def loads(self) -> int:
        """Memory accesses of the kernel the fusion would produce, a buffer once per index it
        is read at (``SchedulerView.loads``: about its loads and stores)."""
        return self._over_parts(self.view.loads)


def _default_bucket(pairing: str) -> Callable[[Call, Any], Hashable]:
    if pairing == "independent":
        return lambda call, view: view.iteration_key(call.node)
    if pairing == "combo":
        # Inductor's combo codegen launches pointwise kernels and reductions separately
        return lambda call, view: (call.get("device"), call.op)
    return lambda call, view: None


_PAIRING_OPTIONS: dict[str, dict[str, Any]] = {
    "independent": {"max_attempts": 64},
    "producer_consumer": {"max_rounds": 10, "relaxed": False},
    "combo": {"max_attempts": 64, "verify_codegen": True, "benchmark": False},
}


@dataclasses.dataclass(kw_only=True)
class FusionRule(PatternRule):
    """A rule deciding which scheduler nodes become one kernel (or one launch)."""

    kind: str = "horizontal"
    stage: str = "fuse_kernels"
    levels: tuple[str, ...] = ("inductor_ir",)
    pairing: str = "independent"
    hook: str = "post_fusion"
    bucket: Callable[[Call, Any], Hashable] | None = None

    def __post_init__(self) -> None:
        if self.pairing not in PAIRINGS:
            raise ValueError(f"fusion rule {self.name!r}: pairing must be one of {PAIRINGS}, got {self.pairing!r}")
        if self.hook not in HOOKS:
            raise ValueError(f"fusion rule {self.name!r}: hook must be one of {HOOKS}, got {self.hook!r}")
        super().__post_init__()
        if tuple(self.levels) != ("inductor_ir",):
            raise ValueError(f"fusion rule {self.name!r} runs at inductor_ir only, not {self.levels}")
        if self.bucket is None:
            self.bucket = _default_bucket(self.pairing)

    def class_options(self) -> dict[str, Any]:
        """The options its driver reads for its pairing."""
        return dict(_PAIRING_OPTIONS[self.pairing])

    def candidate(self, call: Call | None, view: Any, options: dict[str, Any]) -> bool:
        """Does this node's call match the rule's pattern (anchor kind and filter)?"""
        if call is None:
            return False
        return self.match(call, view, options) is not None

    def structure(self) -> str:
        return f"{super().structure()} pairing={self.pairing} hook={self.hook}"

    def code(self) -> tuple[Callable[..., Any], ...]:
        return (*super().code(), self.bucket)


fusion_rule = rule_decorator(
    FusionRule,
    "pattern",
    fixed={"levels": ("inductor_ir",)},
    name="fusion_rule",
    doc="""``@fusion_rule(pattern, pairing=..., where=[...], kind=..., hook=..., stage=...,
    options=..., bucket=...)``: the replacement ``fn(m, b)`` becomes a registered
    Inductor-IR ``FusionRule`` (see ``optimus.core.rule.rule_decorator``).""",
)


__all__ = ["ComboAction", "Decline", "FuseAction", "FusionBuilder", "FusionMatch", "FusionRule", "fusion_rule"]
