"""Vertical rules for split -> cat/stack round trips.

Each rule's docstring shows the identity it implements; patterns use the canonical
vocabulary, so every rule runs at Torch-IR and Aten-IR unchanged.
"""

from __future__ import annotations

import torch.fx as fx

from ..core.pattern import Each, ListOf, Op, Var
from ..core.rule import rule
from ..core.symbolic import known_eq
from ..core.safety import MAY_ALIAS_OPS
from ..core.view import is_int, num_outputs
from ..core.segments import segment_of
from ._facts import STACK_SPELLINGS, adjacent_runs, covers, emittable_shape, permute_for_movedim, resolvable, stack_of

X, S, D, I = Var("x"), Var("sizes"), Var("dim"), Var("index")
CHUNKS = ListOf(Op("getitem", Op("split", X, S, D).bind("split"), Each("index")))


def _known_sizes(m):
    """split sizes are not known integers"""
    return isinstance(m.sizes, list) and all(is_int(s) for s in m.sizes)


def _only_getitem_users(m):
    """the split has users other than getitem"""
    return m.getitems(m.split) is not None


def _one_section(m):
    sizes = m.anchor.args["sizes"]
    return isinstance(sizes, list) and len(sizes) == 1


@rule(Op("split", X, S, D).bind("split").such_that(_one_section), where=[_only_getitem_users], stage="remove")
def remove_single_section_split(m, b):
    """A split into one section is its input.

    split(x, [n], d)[0] -> x        (n == x.shape[d])
    """
    return {g: m.x for users in m.getitems(m.split).values() for g in users}


def _chunks_cover_split_in_order(m):
    """the cat does not take every chunk of the split, in order"""
    n = num_outputs(m.view, m.split)
    return n is not None and m.index == list(range(n))


@rule(Op("cat", CHUNKS, D), where=[_chunks_cover_split_in_order], stage="fold")
def split_cat_to_identity(m, b):
    """Concatenating every chunk of a split, in order, along the split dim gives back its input.

    cat(split(x, s, d), d) -> x
    """
    return m.x


def _returned(node: fx.Node) -> bool:
    return any(u.op == "output" for u in node.users)


def _visible_to_the_caller(view, node: fx.Node) -> bool:
    """``node``, or the tensor it is a view of, is a graph input or a graph output."""
    while True:
        if node.op == "placeholder" or _returned(node):
            return True
        call = view.classify(node)
        src = call.args.get("input") if call is not None and call.op in MAY_ALIAS_OPS else None
        if not isinstance(src, fx.Node):
            return False
        node = src


def _returned_beside_its_input(m):
    """the cat is not a graph output returned beside its input (nothing for Inductor to fold into an alias)"""
    return _returned(m.anchor.node) and _visible_to_the_caller(m.view, m.x)


@rule(Op("cat", CHUNKS, D), where=[_chunks_cover_split_in_order, _returned_beside_its_input], levels=("aten_ir",), kind="canonicalize", stage="fold")
def split_cat_to_clone(m, b):
    """A returned cat of every chunk of a split, in order, whose input the caller also sees,
    is a fresh copy of that input.

    cat(split(x, s, d), d) -> clone(x)      (cat returned; x an input or returned too)

    ``split_cat_to_identity`` declines here (two outputs, or an output and an input,
    would share one buffer where eager's do not), but Inductor's own lowering folds
    ``cat(split_with_sizes(x))`` into ``x`` all the same, and in a training forward
    AOTAutograd then gives both outputs the autograd flags of one: a result computed
    under ``no_grad`` takes the gradient of its input away. A clone is the value eager
    returns, and Inductor keeps a clone whose source the caller sees.
    """
    return b.clone(m.x)


def _has_adjacent_run(m):
    tensors, dim = m.anchor.args["tensors"], m.anchor.args["dim"]
    if not isinstance(tensors, list) or not is_int(dim):
        return False
    segs = [segment_of(m.view, t) for t in tensors]
    return any(j - i >= 2 and segs[i] is not None for i, j in adjacent_runs(segs, dim))


@rule(Op("cat", Var("tensors"), D).such_that(_has_adjacent_run), options={"min_run": 2}, stage="fold")
def cat_adjacent_segments(m, b):
    """Adjacent ranges of one tensor inside a cat become one slice (a view, no copy).

    cat([y, x[:, 0:4], x[:, 4:8], z], 1)         -> cat([y, x[:, 0:8], z], 1)
    cat([split(x, s, 1)[2], split(x, s, 1)[3]], 1) -> x[:, s0+s1 : s0+s1+s2+s3]
    cat([x[:, 0:4], x[:, 4:n]], 1)               -> x

    Covers upstream's partial, shuffled and extra-input split->cat cases and cats of
    slices. ``min_run`` is the shortest run turned into a slice (upstream's
    ``threshold_to_cat``, default 10 there; 2 here).
    """
    segs = [segment_of(m.view, t) for t in m.tensors]
    pieces, merged = [], False
    for i, j in adjacent_runs(segs, m.dim):
        if segs[i] is not None and j - i >= m.options["min_run"]:
            first, last = segs[i], segs[j - 1]
            if covers(m.view, first.source, m.dim, first.start, last.end):
                pieces.append(first.source)
            else:
                pieces.append(b.slice(first.source, m.dim, first.start, last.end))
            merged = True
        else:
            pieces.extend(m.tensors[i:j])
    if not merged:
        m.decline(f"no run of at least {m.options['min_run']} adjacent ranges")
    return pieces[0] if len(pieces) == 1 else b.cat(pieces, m.dim)


def _equal_sections(m):
    """the split sections are not all the same known size"""
    return _known_sizes(m) and len(set(m.sizes)) == 1


def _shape_emittable(m):
    """the input shape has more than one symbolic size, or one next to a size 0"""
    return emittable_shape(m.shape(m.x)) is not None


def _cat_dim_differs(m):
    tensors = m.anchor.args["tensors"]
    first = m.call(tensors[0]) if isinstance(tensors, list) and tensors and isinstance(tensors[0], fx.Node) else None
    split = m.call(first.args["input"]) if first is not None and first.op == "getitem" else None
    return split is not None and split.op == "split" and split.args["dim"] != m.anchor.args["dim"]


@rule(
    Op("cat", CHUNKS, Var("cat_dim")).such_that(_cat_dim_differs),
    where=[_chunks_cover_split_in_order, _equal_sections, _shape_emittable],
    stage="fold",
)
def split_cat_other_dim_to_view(m, b):
    """All chunks of an equal split, concatenated along another dim, are one reshape.

    cat(split(x, s, d), e) -> x.unflatten(d, (n, s)).movedim(d, e).flatten(e, e + 1)
    (one copy at most instead of n chunk views and a cat)
    """
    shape = emittable_shape(m.shape(m.x))
    n, s, d, e = len(m.sizes), m.sizes[0], m.dim, m.cat_dim
    unflattened = shape[:d] + [n, s] + shape[d + 1 :]
    out = list(shape)
    out[d] = s
    out[e] = n * out[e] if out[e] != -1 else -1
    if not resolvable(unflattened) or not resolvable(out):
        m.decline("a symbolic size next to a size 0: the reshapes cannot infer it")
    y = b.reshape(m.x, unflattened)
    y = b.permute(y, permute_for_movedim(len(shape) + 1, d, e))
    return b.reshape(y, out)


def _stacked_equal_chunks(call, view):
    """(source, split dim, count, size, stack dim) when the node stacks every chunk of one
    tensor, in order, all of one size."""
    stacked = stack_of(view, call)
    segs = [segment_of(view, t) for t in stacked[0]] if stacked else [None]
    if any(sg is None for sg in segs) or len({id(sg.source) for sg in segs}) != 1:
        return None
    first, sizes = segs[0], [sg.end - sg.start for sg in segs]
    adjacent = all(known_eq(a.end, c.start) and a.dim == first.dim for a, c in zip(segs, segs[1:]))
    if adjacent and len(set(sizes)) == 1 and covers(view, first.source, first.dim, first.start, segs[-1].end):
        return first.source, first.dim, len(segs), sizes[0], stacked[1]
    return None


@rule(Op(STACK_SPELLINGS).such_that(lambda m: _stacked_equal_chunks(m.anchor, m.view) is not None), stage="fold")
def split_stack_to_view(m, b):
    """Stacking every chunk of an equal split is a reshape (and a permute).

    stack(split(x, s, d), e)                      -> x.unflatten(d, (n, s)).movedim(d, e)
    (stack also spelled cat of unsqueezes, or view of a cat, at Aten-IR)
    """
    x, d, n, size, e = _stacked_equal_chunks(m.anchor, m.view)
    shape = emittable_shape(m.shape(x))
    if shape is None:
        m.decline("the input shape has more than one symbolic size, or one next to a size 0")
    unflattened = shape[:d] + [n, size] + shape[d + 1 :]
    if not resolvable(unflattened):
        m.decline("a symbolic size next to a size 0: the reshape cannot infer it")
    y = b.reshape(x, unflattened)
    return y if d == e else b.permute(y, permute_for_movedim(len(shape) + 1, d, e))


def _sizes_all_one(m):
    sizes = m.anchor.args["sizes"]
    return isinstance(sizes, list) and len(sizes) > 1 and all(s == 1 for s in sizes)


def _chunks_only_squeezed(m):
    """a chunk has users other than squeeze along the split dim"""
    getitems = m.getitems(m.split)
    if getitems is None:
        return False
    for users in getitems.values():
        for g in users:
            for u in g.users:
                call = m.call(u)
                if call is None or call.op != "squeeze" or call.args["dims"] != (m.dim,):
                    return False
    return True


@rule(Op("split", X, S, D).bind("split").such_that(_sizes_all_one), where=[_chunks_only_squeezed], stage="convert")
def split_squeeze_to_unbind(m, b):
    """Size-1 chunks squeezed along the split dim are an unbind.

    [c.squeeze(d) for c in split(x, 1, d)] -> unbind(x, d)
    """
    parts = b.unbind(m.x, m.dim)
    return {u: parts[i] for i, users in m.getitems(m.split).items() for g in users for u in g.users}


def _inner_split_sizes_known(m):
    """split sizes are not known integers"""
    return _known_sizes(m) and isinstance(m.inner_sizes, list) and all(is_int(s) for s in m.inner_sizes)


def _chunk_only_feeds_inner_split(m):
    """the split chunk has users besides the inner split"""
    return len(m.chunk.users) == 1 and is_int(m.index) and m.index >= 0


def _outer_only_getitem_users(m):
    """the outer split has users other than getitem"""
    return m.getitems(m.outer) is not None and m.getitems(m.inner) is not None


@rule(
    Op("split", Op("getitem", Op("split", X, S, D).bind("outer"), I).bind("chunk"), Var("inner_sizes"), D).bind("inner"),
    where=[_inner_split_sizes_known, _chunk_only_feeds_inner_split, _outer_only_getitem_users],
    stage="fold",
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
