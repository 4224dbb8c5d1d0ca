"""Facts about sizes that may be symbolic (dynamic shapes).

Rules compare sizes with these helpers, which answer ``True`` only when the fact is
provable without adding a guard: with ``SymInt`` sizes a rule that cannot prove what it
needs declines instead of specializing the graph. "Provable" means the shape
environment can decide the expression statically (``statically_known_true``: the
symbols' value ranges, the replacements and axioms Dynamo recorded); it never means
"true for the example sizes".

``refusing_new_guards(shape_env)`` is the driver's safety net around a level: any code
path that would still add a guard while rules run (a ``bool()`` or ``int()`` of a
symbolic size in a rule, a meta function that needs an assumption) raises
``GuardRefused`` instead, so the rewrite is declined and no dim the user marked dynamic
is ever specialized.

Sizes and numbers for cost estimates (never for decisions that change results):
``size_hint`` (the example value) and ``size_bound`` (the example value, or a finite
upper bound of the symbol's range when that is larger).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import torch


class GuardRefused(Exception):
    """A rewrite needed a guard on symbolic sizes (it would specialize them): declined."""


def known_true(value: Any) -> bool:
    """``value`` is a bool, or a ``SymBool`` provably true for every shape (the shape
    environment's static evaluation, then the same after exact floor divisions are
    folded: see ``fold_exact_floordiv``)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, torch.SymBool):
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        try:
            if statically_known_true(value):
                return True
        except Exception:
            return False
        return _known_true_after_folding(value)
    try:
        return bool(value)
    except Exception:
        return False


def _known_true_after_folding(value: torch.SymBool) -> bool:
    import sympy

    node = value.node
    env = getattr(node, "shape_env", None)
    expr = getattr(node, "expr", None)
    if env is None or expr is None:
        return False
    try:
        folded = fold_exact_floordiv(env, env.simplify(expr))
        if folded == expr:
            return False
        return env._maybe_evaluate_static(folded) is sympy.true
    except Exception:
        return False


def fold_exact_floordiv(shape_env: Any, expr: Any) -> Any:
    """``expr`` with every ``FloorDiv(q*d + r, d)`` replaced by ``q`` where that is exact
    for every size: ``d >= 1``, ``q`` a sum of the numerator's terms that ``d`` divides
    as polynomials (integer-valued for integer sizes), and ``0 <= r < d`` provable from
    the shape environment (value ranges, axioms). Then ``floor((q*d + r)/d) = q +
    floor(r/d) = q``. A ceil division of an exact multiple is such a floor division:
    ``ceil(s0*s1 / s1) = (s0*s1 + s1 - 1)//s1 = s0`` for ``s1 >= 1`` (``r = s1 - 1``).

    Pure sympy and static evaluation: it records nothing in the shape environment (no
    guard, no axiom). A division it cannot prove exact is left as it is."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv

    def provable(rel: Any) -> bool:
        return env_static(rel) is sympy.true

    def env_static(rel: Any) -> Any:
        try:
            return shape_env._maybe_evaluate_static(rel)
        except Exception:
            return None

    def fold(div: Any) -> Any:
        base, divisor = div.args
        if not provable(sympy.Ge(divisor, 1)):
            return div
        quotient, rest = sympy.Integer(0), sympy.Integer(0)
        for term in sympy.Add.make_args(sympy.expand(base)):
            q = sympy.cancel(term / divisor)
            if q.is_polynomial() and sympy.fraction(q)[1] == 1 and q.is_integer:
                quotient += q
            else:
                rest += term
        if quotient == 0:
            return div
        for borrow in (0, 1, -1, 2, -2):  # q*d + r = (q - k)*d + (r + k*d): find the k with 0 <= r + k*d < d
            r = rest + borrow * divisor
            if provable(sympy.Ge(r, 0)) and provable(sympy.Lt(r, divisor)):
                return quotient - borrow
        return div

    return expr.replace(lambda e: isinstance(e, FloorDiv), fold)


def _rel(a: Any, b: Any, op: Any) -> bool:
    if a is None or b is None or not _is_number(a) or not _is_number(b):
        return False
    try:
        return known_true(op(a, b))
    except Exception:
        return False


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, torch.SymInt, torch.SymFloat)) and not isinstance(v, bool)


def known_eq(a: Any, b: Any) -> bool:
    """``a == b`` provably (ints, floats, strings, ``SymInt``s, ``None``)."""
    if a is b:
        return True
    if a is None or b is None:
        return False
    try:
        return known_true(a == b)
    except Exception:
        return False


def known_ne(a: Any, b: Any) -> bool:
    """``a != b`` provably (numbers and ``SymInt``s)."""
    import operator

    return _rel(a, b, operator.ne)


def known_le(a: Any, b: Any) -> bool:
    """``a <= b`` provably."""
    import operator

    return _rel(a, b, operator.le)


def known_lt(a: Any, b: Any) -> bool:
    """``a < b`` provably."""
    import operator

    return _rel(a, b, operator.lt)


def known_nonneg(a: Any) -> bool:
    """``a >= 0`` provably (every size is; an expression such as ``s0 - 4`` may not be)."""
    return known_le(0, a)


def known_divisible(a: Any, b: Any) -> bool:
    """``b`` divides ``a`` provably (``b`` non-zero): ``a % b == 0`` for every shape."""
    if not known_ne(b, 0):
        return False
    try:
        return known_eq(a % b, 0)
    except Exception:
        return False


def known_sizes_eq(a: Sequence[Any] | None, b: Sequence[Any] | None) -> bool:
    """Two shapes provably equal."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(known_eq(x, y) for x, y in zip(a, b))


def is_concrete(value: Any) -> bool:
    """An int, or a ``SymInt`` that is a constant (no symbol): usable as a number."""
    return concrete_int(value) is not None


def concrete_int(value: Any) -> int | None:
    """``value`` as an int when it is one (or a ``SymInt`` folded to a constant); ``None``
    for a size that depends on a symbol. Never adds a guard."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt):
        maybe = getattr(value.node, "maybe_as_int", None)
        out = maybe() if maybe is not None else None
        return int(out) if out is not None else None
    return None


def is_symbolic(value: Any) -> bool:
    """A size that depends on a symbol (a ``SymInt`` that is not a constant)."""
    return isinstance(value, torch.SymInt) and concrete_int(value) is None


def sym_key(value: Any) -> Any:
    """A hashable stand-in for a size: the int, or the ``SymInt``'s expression after the
    shape environment's replacements, so that two sizes with one key are provably equal
    (``s0`` and ``s1`` Dynamo unified give one key; ``s0`` and ``s0 + 0`` too)."""
    c = concrete_int(value)
    if c is not None:
        return c
    if isinstance(value, torch.SymInt):
        node = value.node
        try:
            expr = node.shape_env.simplify(node.expr)
        except Exception:
            expr = node.expr
        return ("sym", str(expr))
    return ("?", repr(value))


def size_hint(value: Any) -> int:
    """An int for a size without adding a guard: the value, or a SymInt's example hint
    (for cost estimates only; never for decisions that change results)."""
    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt):
        c = concrete_int(value)
        if c is not None:
            return c
        hint = getattr(value.node, "hint", None)
        if hint is None:
            try:
                hint = value.node.shape_env.size_hint(value.node.expr, allow_none=True)
            except Exception:
                hint = None
        return int(hint) if hint is not None else 0
    return 0


def size_bound(value: Any) -> int:
    """A size for memory caps: the example hint, or the symbol range's upper bound when
    that is finite and larger (a dim marked dynamic has none: the hint it was traced at)."""
    hint = size_hint(value)
    if not isinstance(value, torch.SymInt) or concrete_int(value) is not None:
        return hint
    try:
        node = value.node
        upper = node.shape_env.bound_sympy(node.expr).upper
        if upper.is_finite and int(upper) > hint:
            return int(upper)
    except Exception:
        pass
    return hint


def _forget_stale_static_results(shape_env: Any) -> None:
    """Drop the shape environment's memo of static evaluations.

    ``ShapeEnv._maybe_evaluate_static`` is memoized until the environment's version
    changes, but recording a guard adds its implications to ``axioms`` without a new
    version (torch 2.11 to 2.15). An expression Dynamo evaluated before it guarded on
    it stays "unknown" in the memo although the guard now proves it: DLRM's
    ``Eq((s37*s38 + s38 - 1)//s38, s37)`` (the embedding bags' rows against the dense
    batch), which Dynamo guarded while tracing the model's own cat, was refused as a
    new guard when a rewrite re-emitted that cat. Clearing the memo only forgets
    results; nothing is added to the environment."""
    memo = getattr(type(shape_env), "_maybe_evaluate_static", None)
    clear = getattr(memo, "cache_clear", None)
    if clear is not None:
        clear()


@contextlib.contextmanager
def refusing_new_guards(shape_env: Any) -> Iterator[None]:
    """While active, any attempt to add a guard (or a runtime assert) to ``shape_env``
    raises ``GuardRefused`` before anything is recorded (see the module docstring).

    The shape environment checks every new guard with ``_check_frozen`` first (torch
    2.11 to 2.15); this shadows that check on the instance and restores it after."""
    if shape_env is None or not hasattr(shape_env, "_check_frozen"):
        yield
        return

    def refuse(expr: Any, concrete_val: Any) -> None:
        raise GuardRefused(f"needs a guard on symbolic sizes ({expr} == {concrete_val}), which would specialize them")

    _forget_stale_static_results(shape_env)
    shadowed = "_check_frozen" in vars(shape_env)
    previous = vars(shape_env).get("_check_frozen")
    shape_env._check_frozen = refuse
    try:
        yield
    finally:
        if shadowed:
            shape_env._check_frozen = previous
        else:
            del shape_env._check_frozen
