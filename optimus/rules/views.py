"""Chains of view/reshape/permute/squeeze/unsqueeze folded into one op (or none)."""

from __future__ import annotations

from ..core.pattern import ANY, Op, Var
from ..core.rule import rule
from ..core.symbolic import known_eq, known_sizes_eq
from ._facts import emittable_shape

RESHAPES = ("view", "reshape")
PERMUTES = ("permute", "transpose")


def _same_shape_as_input(m):
    return known_sizes_eq(m.shape(m.anchor.node), m.shape(m.anchor.args["input"]))


@rule(Op(RESHAPES, Var("x"), ANY).such_that(_same_shape_as_input), stage="remove")
def remove_identity_reshape(m, b):
    """A view/reshape to the shape the tensor already has is the tensor.

    x.view(x.shape) -> x
    """
    return m.x


def _inner_has_one_user(m):
    """the inner view/reshape has other users"""
    return len(m.inner.users) == 1


@rule(Op(RESHAPES, Op(RESHAPES, Var("x"), ANY).bind("inner"), ANY), where=[_inner_has_one_user], stage="fold")
def fold_reshape_chain(m, b):
    """Two reshapes in a row are one.

    x.view(a).reshape(b) -> x.reshape(b)      (view(view) stays a view)

    The outer op's own shape argument is reused as written (with its symbolic sizes, or
    -1): reshaping x to it is exactly what the chain computes. If the result's shape
    cannot be proven equal to the outer op's (symbolic sizes spelled differently), the
    rule declines.
    """
    both_views = m.anchor.op == "view" and m.call(m.inner).op == "view"
    expected = m.shape(m.anchor.node)
    candidates = [m.anchor.args["shape"]]
    fallback = emittable_shape(expected)
    if fallback is not None and fallback != candidates[0]:
        candidates.append(fallback)
    for shape in candidates:
        try:
            out = b.view(m.x, shape) if both_views else b.reshape(m.x, shape)
        except Exception:  # the shape does not apply to x as spelled (symbolic sizes)
            continue
        if expected is None or known_sizes_eq(m.shape(out), expected):
            return out
    m.decline("the folded reshape's shape cannot be proven equal to the outer op's (symbolic sizes)")


def _as_permutation(call, rank):
    if call.op == "permute":
        return list(call.args["dims"])
    order = list(range(rank))
    d0, d1 = call.args["dim0"], call.args["dim1"]
    order[d0], order[d1] = order[d1], order[d0]
    return order


def _identity_permutation(m):
    rank = m.rank(m.anchor.args["input"])
    if rank is None:
        return False
    try:
        return _as_permutation(m.anchor, rank) == list(range(rank))
    except (TypeError, IndexError):
        return False


@rule(Op(PERMUTES, Var("x")).such_that(_identity_permutation), stage="remove")
def remove_identity_permute(m, b):
    """A permutation that keeps every dim in place is the tensor.

    x.permute(0, 1, 2) -> x;  x.transpose(1, 1) -> x
    """
    return m.x


def _ranks_known(m):
    """the rank is unknown"""
    return m.rank(m.x) is not None


def _composed(m):
    rank = m.rank(m.x)
    first = _as_permutation(m.call(m.inner), rank)
    return [first[i] for i in _as_permutation(m.anchor, rank)]


def _folding_removes_a_node(m):
    """the inner permutation has other users and the two do not cancel (folding would only
    trade one permute for another)"""
    return len(m.inner.users) == 1 or _composed(m) == list(range(m.rank(m.x)))


@rule(Op(PERMUTES, Op(PERMUTES, Var("x")).bind("inner")), where=[_ranks_known, _folding_removes_a_node], stage="fold")
def fold_permute_chain(m, b):
    """Two permutations in a row are one (or none).

    x.permute(p).permute(q) -> x.permute([p[i] for i in q])

    Two that cancel give x even where the inner one has other users (under autocast the
    forward graph transposes a cast weight for its matmul and transposes it back to save it
    for the backward).
    """
    composed = _composed(m)
    return m.x if composed == list(range(m.rank(m.x))) else b.permute(m.x, composed)


def _squeezes_the_unsqueezed_dim(m):
    """the squeeze does not remove exactly the dim the unsqueeze added"""
    return m.dims == (m.dim,)


@rule(Op("squeeze", Op("unsqueeze", Var("x"), Var("dim")), Var("dims")), where=[_squeezes_the_unsqueezed_dim], stage="fold")
def cancel_unsqueeze_squeeze(m, b):
    """Removing the dim just added is the identity.

    x.unsqueeze(d).squeeze(d) -> x
    """
    return m.x


def _unsqueezes_the_squeezed_dim(m):
    """the unsqueeze does not restore the single dim the squeeze removed"""
    shape = m.shape(m.x)
    return m.dims == (m.dim,) and shape is not None and m.dim < len(shape) and known_eq(shape[m.dim], 1)


@rule(Op("unsqueeze", Op("squeeze", Var("x"), Var("dims")), Var("dim")), where=[_unsqueezes_the_squeezed_dim], stage="fold")
def cancel_squeeze_unsqueeze(m, b):
    """Restoring a size-1 dim just removed is the identity.

    x.squeeze(d).unsqueeze(d) -> x      (x.shape[d] == 1)
    """
    return m.x


def _inserted_unit_dim(call, view):
    """Position where a reshape only inserts one size-1 dim, else None."""
    src, out = view.shape(call.args["input"]), view.shape(call.node)
    if src is None or out is None or len(out) != len(src) + 1:
        return None
    for p in range(len(out)):
        if known_eq(out[p], 1) and known_sizes_eq(list(out[:p]) + list(out[p + 1 :]), src):
            return p
    return None


@rule(Op(RESHAPES, Var("x"), ANY).such_that(lambda m: _inserted_unit_dim(m.anchor, m.view) is not None), kind="canonicalize", stage="canonicalize")
def reshape_to_unsqueeze(m, b):
    """A reshape that only inserts a size-1 dim is an unsqueeze (so stack patterns see it).

    x.view(B, 1, W) -> x.unsqueeze(1)      (x: (B, W))
    """
    return b.unsqueeze(m.x, _inserted_unit_dim(m.anchor, m.view))
