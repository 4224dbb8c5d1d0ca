"""Pointwise ops across split/cat boundaries.

``hoist_pointwise_through_split`` is the rule that makes rounds of
"split -> per-feature elementwise -> cat" collapse: when every chunk of a split goes
through the same elementwise op, the op runs once on the whole input and the split moves
after it. Repeated, it lifts a whole per-chunk chain above the split, and the split/cat
round trip left behind is removed by ``split_cat_to_identity``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx

from ..core.pattern import ANY, Op, Var
from ..core.rule import rule
from ..core.symbolic import known_sizes_eq
from ..core.view import is_int, num_outputs
from ..core.pattern import same_value
from ..core.vocab import BINARY_POINTWISE, is_pointwise
from ._facts import same_shape_except

X, S, D = Var("x"), Var("sizes"), Var("dim")


@dataclasses.dataclass
class _Site:
    """One chunk's use: ``node`` computes the op with the chunk as the arguments named in
    ``positions`` (``x * x`` holds it twice); ``others`` are its remaining arguments."""

    node: fx.Node
    positions: tuple[str, ...]
    others: dict[str, Any]

    def signature(self) -> tuple[Any, ...]:
        """Which arguments hold the chunk, and the constant ones (to pair sites across chunks)."""
        consts = tuple(sorted((k, repr(v)) for k, v in self.others.items() if not isinstance(v, fx.Node)))
        return self.positions, consts


def _site(view: Any, chunk: fx.Node, user: fx.Node, op: str) -> _Site | None:
    call = view.classify(user)
    if call is None or call.op != op:
        return None
    if any(isinstance(v, (list, tuple)) for v in call.args.values()):
        return None
    positions = tuple(k for k, v in call.args.items() if v is chunk)
    if not positions:
        return None
    others = {k: v for k, v in call.args.items() if k not in positions}
    commutative = op == "mul" or (op == "add" and others.get("alpha", 1) == 1)
    if commutative and positions == ("other",):  # a * c == c * a: read as chunk-first
        positions, others = ("input",), {**{k: v for k, v in others.items() if k != "input"}, "other": others["input"]}
    return _Site(user, positions, others)


def _sites(m) -> tuple[str, list[_Site]] | str:
    """The shared op and one use site per chunk, or a reason why there is none."""
    getitems = m.getitems(m.split)
    n = num_outputs(m.view, m.split)
    if getitems is None or n is None or sorted(getitems) != list(range(n)):
        return "not every chunk of the split is used"
    chunks = []
    for i in range(n):
        if len(getitems[i]) != 1:
            return "a chunk is taken twice"
        chunks.append(getitems[i][0])
    candidates = [c.op for u in chunks[0].users if (c := m.call(u)) is not None and is_pointwise(c.op)]
    if not candidates:
        return "the first chunk goes through no elementwise op"
    reason = "no elementwise op is applied the same way to every chunk"
    for op in dict.fromkeys(candidates):  # each elementwise op the first chunk feeds
        per_chunk = [[s for s in (_site(m.view, c, u, op) for u in c.users) if s is not None] for c in chunks]
        if all(len(found) == 1 for found in per_chunk):
            return op, [found[0] for found in per_chunk]
        # Several uses of the op per chunk (x * x and x * 0.5): pair them by signature.
        for site in per_chunk[0]:
            sig = site.signature()
            paired = [[s for s in found if s.signature() == sig] for found in per_chunk]
            if all(len(p) == 1 for p in paired):
                return op, [p[0] for p in paired]
        reason = f"the chunks do not all go through {op} the same way"
    return reason


def _has_candidate(m) -> bool:
    """Silent filter: a split of at least 2 chunks whose first chunk feeds a pointwise op."""
    n = num_outputs(m.view, m.split)
    if n is None or n < 2:
        return False
    for user in m.split.users:
        for u in user.users:
            c = m.call(u)
            if c is not None and is_pointwise(c.op):
                return True
    return False


@rule(Op("split", X, S, D).bind("split").such_that(_has_candidate), stage="move", options={"min_chunks": 2})
def hoist_pointwise_through_split(m, b):
    """Elementwise work done on every chunk of a split is done once, before the split.

    [f(c_i, o_i) for c_i in split(x, s, d)] -> split(f(x, cat(o_i, d)), s, d)
    [g(c_i) for c_i in split(x, s, d)]      -> split(g(x), s, d)

    Every chunk must go through the same op with the chunk in the same argument; each
    other argument is either the same for all chunks, per-chunk tensors that line up
    along d (concatenated), or per-chunk Python scalars of add/sub/mul/div (one constant
    vector along d; float32/float64 only, where that is exact). Results must be
    chunk-shaped. Repeated, whole per-chunk chains move above the split.
    """
    found = _sites(m)
    if isinstance(found, str):
        m.decline(found)
    op, sites = found
    if len(sites) < m.options["min_chunks"]:
        m.decline("fewer chunks than min_chunks")
    if any(s.positions != sites[0].positions or s.others.keys() != sites[0].others.keys() for s in sites):
        m.decline("the chunk is a different argument of the op in different chunks")
    getitems = m.getitems(m.split)
    for i, site in enumerate(sites):
        if not known_sizes_eq(m.shape(site.node), m.shape(getitems[i][0])):
            m.decline("an op's result is not chunk-shaped (it broadcasts the chunk)")
    args = {name: m.x for name in sites[0].positions}
    for name in sites[0].others:
        values = [s.others[name] for s in sites]
        args[name] = _merge_argument(m, b, op, name, values)
    whole = b.emit(op, **args)
    parts = b.emit("split", whole, m.sizes, m.dim)
    return {site.node: b.emit("getitem", parts, i) for i, site in enumerate(sites)}


def _merge_argument(m, b, op, name, values):
    """One argument for the whole tensor from the per-chunk ones."""
    first = values[0]
    if all(same_value(v, first) for v in values):
        if isinstance(first, fx.Node) and _spans_split_dim(m, first):
            return _concat_operands(m, b, values, m.rank(m.x))  # the same tensor, once per chunk
        return first
    if all(isinstance(v, fx.Node) for v in values):
        return _concat_operands(m, b, values, m.rank(m.x))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        if op not in BINARY_POINTWISE or name not in ("input", "other"):
            m.decline(f"per-chunk values of {name!r}, which has no tensor form")
        if m.dtype(m.x) not in (torch.float32, torch.float64) or len({type(v) for v in values}) != 1:
            m.decline("per-chunk scalars: a constant vector is exact only for float32/64 tensors and one Python type")
        rank = m.rank(m.x)
        sizes = [m.shape(g[0])[m.dim] for _, g in sorted(m.getitems(m.split).items())]
        if not all(is_int(n) for n in sizes):
            m.decline("per-chunk scalars along a dim of symbolic size")
        vec = [float(v) for v, n in zip(values, sizes) for _ in range(n)]
        return b.constant(vec, [len(vec)] + [1] * (rank - 1 - m.dim), m.dtype(m.x), m.view.device(m.x))
    m.decline(f"per-chunk values of {name!r} mix scalars and tensors, or differ")


def _spans_split_dim(m, operand) -> bool:
    """Does ``operand`` have a non-broadcast extent along the split dim (as aligned)?"""
    shape, rank = m.shape(operand), m.rank(m.x)
    if shape is None:
        return True
    d = m.dim - (rank - len(shape))
    return d >= 0 and not (isinstance(shape[d], int) and shape[d] == 1)


def _concat_operands(m, b, operands, rank):
    """Per-chunk tensor operands concatenated along the split dim (as they line up there)."""
    shapes = [m.shape(o) for o in operands]
    dtypes = {m.dtype(o) for o in operands}
    if any(s is None for s in shapes) or len(dtypes) != 1:
        m.decline("per-chunk operands of unknown shape or different dtypes")
    k = len(shapes[0])
    if any(len(s) != k for s in shapes) or k > rank:
        m.decline("per-chunk operands of different ranks")
    d = m.dim - (rank - k)  # the operands' dim that lines up with the split dim
    if d < 0:
        m.decline("per-chunk operands do not span the split dim (and differ)")
    getitems = m.getitems(m.split)
    for i, s in enumerate(shapes):
        chunk_size = m.shape(getitems[i][0])[m.dim]
        if not known_sizes_eq([s[d]], [chunk_size]):
            m.decline("a per-chunk operand does not match its chunk along the split dim")
    if not same_shape_except(shapes, d):
        m.decline("per-chunk operands differ in a dim other than the split dim")
    return b.cat(list(operands), d)


# --------------------------------------------------------------------------- einsum
def _is_bmm_like_einsum(m):
    eq = m.anchor.args.get("equation")
    ops = m.anchor.args.get("operands")
    if not isinstance(eq, str) or not isinstance(ops, list) or len(ops) != 2:
        return False
    return _einsum_letters(eq) is not None


def _einsum_letters(eq: str):
    """'abc,abcd->abd': first operand's last index contracted against the second's
    second-to-last, all other indices shared. Returns the letters or None."""
    eq = eq.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    lhs, out = eq.split("->")
    parts = lhs.split(",")
    if len(parts) != 2:
        return None
    a, b = parts
    if len(b) != len(a) + 1 or len(set(b)) != len(b) or b[:-1] != a or out != a[:-1] + b[-1]:
        return None
    return a, b, out


@rule(Op("einsum", ANY, Var("operands")).such_that(_is_bmm_like_einsum), levels=("torch_ir",), stage="convert")
def einsum_to_pointwise(m, b):
    """A batched vector-matrix einsum is a broadcast multiply and a sum.

    einsum("abc,abcd->abd", x, y) -> (x.unsqueeze(-1) * y).sum(-2)
    (memory-bound in recommendation shapes: one fused kernel instead of a bmm)
    """
    x, y = m.operands
    rx = m.rank(x)
    if rx is None or m.rank(y) != rx + 1:
        m.decline("operand ranks unknown or not matching the equation")
    prod = b.mul(b.unsqueeze(x, rx), y)
    return b.sum(prod, [rx - 1], False)


# ------------------------------------------------------------ pointwise after a cat
def _unary_after_cat(m):
    src = m.anchor.args.get("input")
    c = m.call(src)
    return c is not None and c.op == "cat" and len(src.users) == 1


@rule(Op(("relu", "tanh", "sigmoid"), Op("cat", Var("tensors"), D)).such_that(_unary_after_cat), stage="move", default=False)
def sink_pointwise_into_cat(m, b):
    """Upstream's sink_cat_after_pointwise: a unary op after a cat moves onto its inputs.

    relu(cat([a, b], d)) -> cat([relu(a), relu(b)], d)

    Off by default (name it to enable): it is the inverse of hoisting, which Optimus
    prefers; on its own it only helps when the inputs' producers can fuse the op.
    """
    return b.cat([b.emit(m.anchor.op, t) for t in m.tensors], m.dim)


def _inactive(m):
    return m.anchor.args.get("training") is False or m.anchor.args.get("p") == 0


@rule(Op("dropout", Var("x"), ANY, ANY).such_that(_inactive), stage="remove")
def remove_inactive_dropout(m, b):
    """Dropout that drops nothing (eval mode, or p == 0) is its input.

    dropout(x, p, training=False) -> x
    """
    return m.x
