"""Vertical rules for split/cat round trips (the first of the library).

Each rule's docstring shows the identity it implements; patterns use the canonical
vocabulary, so every rule runs at Torch-IR and Aten-IR unchanged.
"""

from __future__ import annotations

from ..core.pattern import Each, ListOf, Op, Var
from ..core.rule import rule
from ..core.view import is_int, num_outputs

X, S, D, I = Var("x"), Var("sizes"), Var("dim"), Var("index")


def _known_sizes(m):
    """split sizes are not known integers"""
    return isinstance(m.sizes, list) and all(is_int(s) for s in m.sizes)


def _only_getitem_users(m):
    """the split has users other than getitem"""
    return m.getitems(m.split) is not None


def _one_section(call, view):
    sizes = call.args["sizes"]
    return isinstance(sizes, list) and len(sizes) == 1


@rule(Op("split", X, S, D).bind("split").such_that(_one_section), where=[_only_getitem_users], priority=10)
def remove_single_section_split(m, b):
    """A split into one section is its input.

    split(x, [n], d)[0] -> x        (n == x.shape[d])
    """
    return {g: m.x for users in m.getitems(m.split).values() for g in users}


def _chunks_cover_split_in_order(m):
    """the cat does not take every chunk of the split, in order"""
    n = num_outputs(m.view, m.split)
    return n is not None and m.index == list(range(n))


@rule(
    Op("cat", ListOf(Op("getitem", Op("split", X, S, D).bind("split"), Each("index"))), D),
    where=[_chunks_cover_split_in_order],
    priority=20,
)
def split_cat_to_identity(m, b):
    """Concatenating every chunk of a split, in order, along the split dim gives back its input.

    cat(split(x, s, d), d) -> x
    """
    return m.x


def _inner_split_sizes_known(m):
    """split sizes are not known integers"""
    return _known_sizes(m) and isinstance(m.inner_sizes, list) and all(is_int(s) for s in m.inner_sizes)


def _chunk_only_feeds_inner_split(m):
    """the split chunk has users besides the inner split"""
    return len(m.chunk.users) == 1


def _outer_only_getitem_users(m):
    """the outer split has users other than getitem"""
    return m.getitems(m.outer) is not None and m.getitems(m.inner) is not None


@rule(
    Op("split", Op("getitem", Op("split", X, S, D).bind("outer"), I).bind("chunk"), Var("inner_sizes"), D).bind("inner"),
    where=[_inner_split_sizes_known, _chunk_only_feeds_inner_split, _outer_only_getitem_users],
    priority=30,
)
def merge_splits(m, b):
    """A split of one chunk of a split, along the same dim, is one split.

    a, b = split(x, [4, 6], d); b1, b2 = split(b, [2, 4], d)
      -> a, b1, b2 = split(x, [4, 2, 4], d)
    """
    i, inner = m.index, m.inner_sizes
    merged = m.sizes[:i] + inner + m.sizes[i + 1 :]
    parts = b.split(m.x, merged, m.dim)
    out = {}
    for k, users in m.getitems(m.outer).items():
        if k != i:
            for g in users:
                out[g] = parts[k if k < i else k + len(inner) - 1]
    for j, users in m.getitems(m.inner).items():
        for g in users:
            out[g] = parts[i + j]
    return out
