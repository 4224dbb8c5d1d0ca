"""Embedding rules: independent lookups on different tables become one grouped lookup.

Recommendation models look up tens of tables per step, each its own kernels (an index copy,
the gather, and in training a gradient zero-fill plus an accumulation per table). The
``group_embedding_lookups`` group rule turns N independent ``embedding`` / ``embedding_bag``
lookups (any mix: different table sizes and dims, sum / mean / plain embedding, padding rows,
per-sample weights) into one ``torch.ops.optimus.grouped_embedding_bag`` call
(``optimus.kernels``, see docs/kernels.md): the indices (and offsets, per-sample weights) are
packed once, the pooled outputs come back side by side in one ``[B, sum D_t]`` buffer and each
member's result is a chunk of one ``split`` of it, so a following ``cat`` of the pooled outputs
is removed by the split/cat rules (``split_cat_to_identity``, ``cat_adjacent_segments``).

Levels:

* **Torch-IR** (pre-grad): the custom op carries its own autograd (one grouped backward that
  writes every table's dense gradient), so training graphs get a grouped forward *and*
  backward from AOTAutograd.
* **Aten-IR**: the training graphs are already split into forward and backward. A forward
  lookup whose backward reads only the indices (``aten.embedding``: the backward is
  ``embedding_dense_backward(grad, indices, ...)``) is grouped in training forward graphs too;
  the backward graph stays as it was. ``aten._embedding_bag`` in a training forward graph
  returns offset2bag / bag sizes that its backward reads, so it is declined there;
  ``aten._embedding_bag_forward_only`` (inference) is grouped.

Declined, with the reason in the report (lookups that share a reason are grouped only with
each other, and the group declines): ``max_norm`` (renormalises the weight in place during
the lookup), ``sparse=True`` and ``scale_grad_by_freq`` where a gradient flows (the grouped
op's sparse mode runs in eager only; frequency scaling is not implemented), mode ``"max"``,
weights of a dtype the op does not take, offsets-form lookups whose index count is symbolic
(data-dependent: the packed offsets need each table's count), and groups whose launches would
not drop. Tables of different dtypes or devices never share a group (the key separates them).
A table shared by two lookups is handled: it appears twice in the op's table list and
autograd adds its two gradients.

Symbolic sizes (``torch.compile(dynamic=True)``): the batch and the bag length L of [B, L]
indices are symbols. The op's ``bag_sizes`` are ``SymInt[]``: a symbolic L is passed as a
graph value (``aten.sym_size.int(indices, 1)`` at Torch-IR; Aten-IR's iota step, which is
already one), so nothing is specialized; lookups are keyed by their bag count with exact
floor divisions folded (Aten-IR's ``ceil(B*L / L)`` is ``B`` for every L). Mixed int32 / int64 index tensors are handled: packing them
with one ``cat`` promotes them to int64.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Hashable

import torch
import torch.fx as fx

from ..core.group import Group, group_rule
from ..core.symbolic import concrete_int, fold_exact_floordiv, is_symbolic, known_eq, known_lt, known_nonneg, known_sizes_eq, size_hint, sym_key
from ..core.view import GraphView, getitem_users, is_int
from ..core.vocab import Call, ParamRef, register_extern_op
from ..kernels.embedding_bag import MODES, table_pieces
from ._facts import emittable_shape, kernel_op_device_problem

GROUPED_OP = "grouped_embedding_bag"
register_extern_op(GROUPED_OP, torch.ops.optimus.grouped_embedding_bag.default)
# A symbolic bag size reaches the grouped op's ``SymInt[] bag_sizes`` as a graph value:
# ``aten.sym_size.int(indices, 1)`` (an FX graph holds a SymInt only as a node's value).
SYM_SIZE_OP = "sym_size"
register_extern_op(SYM_SIZE_OP, torch.ops.aten.sym_size.int)

_WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INDEX_DTYPES = (torch.int32, torch.int64)

# Launch estimates behind the profitability check (lower bounds, per step):
# a lookup's backward is at least a gradient zero-fill and one accumulation; the grouped
# backward (deterministic) is a memset, a key fill, a walk, a sort and a segment reduction.
BACKWARD_LAUNCHES_PER_LOOKUP = 2
BACKWARD_LAUNCHES_GROUPED = 5


@dataclasses.dataclass(frozen=True)
class Lookup:
    """One member read as an ``F.embedding_bag`` call over the grouped op's conventions."""

    call: Call
    weight: Any  # fx.Node or ParamRef
    indices: fx.Node
    offsets: fx.Node | None  # None: fixed bags (2-D indices, or plain embedding: bag size 1)
    per_sample_weights: fx.Node | None
    bags: Any  # number of bags (int or SymInt)
    bag_size: Any  # fixed bags only: int, or SymInt (dim 1 of 2-D indices, or an iota's step)
    bag_size_node: fx.Node | None  # the graph value holding a symbolic bag size, when there is one
    mode: int  # MODES code
    padding_idx: int  # non-negative row, or -1
    rows: int
    dim: int
    out_shape: tuple[Any, ...]
    blocker: str | None  # why this lookup cannot be grouped


def _weight_val(view: GraphView, weight: Any) -> Any:
    if isinstance(weight, ParamRef):
        return view.gm.get_parameter(weight.target)
    return view.tensor_val(weight)


def _pooled_nodes(call: Call, view: GraphView) -> list[fx.Node] | None:
    """The nodes holding the lookup's result: the node itself, or (Aten-IR's tuple-valued
    ``_embedding_bag``) its item-0 getitems; ``None`` when other items are read."""
    v = view.val(call.node)
    if isinstance(v, torch.Tensor):
        return [call.node]
    users = getitem_users(call.node)
    if users is None or set(users) - {0}:
        return None
    return users.get(0, [])


def _grad_flows(view: GraphView, w: Any) -> bool:
    """Does a gradient flow to the table through this graph (Torch-IR training)? Aten-IR
    graphs run without autograd: their backward is a separate graph."""
    return view.level == "torch_ir" and isinstance(w, torch.Tensor) and w.requires_grad


def _fixed_bag_size(view: GraphView, offsets: Any, idx: torch.Tensor, args: dict[str, Any]) -> tuple[Any, fx.Node | None] | None:
    """(L, the node holding L when it is symbolic) when ``offsets`` is ``iota(B, start=0,
    step=L)`` over B * L indices: how Aten-IR spells ``F.embedding_bag`` of 2-D ``[B, L]``
    indices (flattened, with generated offsets). Under ``dynamic=True`` L is a graph value
    (a ``sym_size`` node) whose value is a ``SymInt``."""
    if not isinstance(offsets, fx.Node) or offsets.target is not torch.ops.prims.iota.default or args.get("include_last_offset"):
        return None
    length = offsets.args[0] if offsets.args else None
    if isinstance(length, fx.Node):  # a symbolic length: its value
        length = view.val(length)
    start, step = offsets.kwargs.get("start"), offsets.kwargs.get("step")
    step_node = step if isinstance(step, fx.Node) else None
    if step_node is not None:
        step = view.val(step_node)
        if not isinstance(step, torch.SymInt):
            return None
        if not is_symbolic(step):  # a size Dynamo specialized: its number
            step, step_node = concrete_int(step), None
    if start != 0 or idx.dim() != 1 or not isinstance(length, (int, torch.SymInt)):
        return None
    if is_int(step):
        if step <= 0:
            return None
    elif not known_nonneg(step - 1):  # a symbolic step: provably >= 1 (a size's range)
        return None
    return (step, step_node) if known_eq(idx.shape[0], length * step) else None


def lookup_of(call: Call, view: GraphView) -> Lookup | None:
    """``call`` as a ``Lookup``, or ``None`` when its shapes are unknown (not a candidate)."""
    a = call.args
    weight, indices = a["weight"], a["input"]
    w, idx = _weight_val(view, weight), view.tensor_val(indices)
    if w is None or idx is None or not isinstance(indices, fx.Node) or w.dim() != 2:
        return None
    rows, dim = w.shape
    out = view.tensor_val(call.node) if call.op == "embedding" else None
    blocker = None
    grad = _grad_flows(view, w)
    if not is_int(rows) or not is_int(dim):
        blocker = "a table of symbolic size"
    elif w.dtype not in _WEIGHT_DTYPES:
        blocker = f"table dtype {w.dtype}: the grouped op takes float16, bfloat16, float32, float64"
    elif idx.dtype not in _INDEX_DTYPES:
        blocker = f"index dtype {idx.dtype}: the grouped op takes int32 / int64"
    elif a.get("max_norm") is not None:
        blocker = "max_norm: the lookup renormalises the table's rows in place"
    elif a.get("sparse") and grad:
        blocker = "sparse=True: the grouped op's sparse gradients run in eager only, not in a compiled graph"
    elif a.get("scale_grad_by_freq") and grad:
        blocker = "scale_grad_by_freq: the grouped op does not scale gradients by index frequency"
    pad = a.get("padding_idx")
    pad = -1 if pad is None else (pad + rows if is_int(pad) and is_int(rows) and pad < 0 else pad)
    if not is_int(pad) and blocker is None:
        blocker = "a padding_idx that is not a constant"
    psw = a.get("per_sample_weights")
    offsets = a.get("offsets")
    if call.op == "embedding":
        shape = tuple(idx.shape)
        bags = idx.numel()
        mode, bag_size, out_shape = MODES["embedding"], 1, shape + (dim,)
        bag_size_node = None
    else:
        mode_name = a.get("mode")
        if mode_name not in ("sum", "mean") and blocker is None:
            blocker = f"mode {mode_name!r}: the grouped op pools by sum or mean"
        mode = MODES.get(mode_name, -1)
        bag_size_node = None
        fixed = _fixed_bag_size(view, offsets, idx, a) if offsets is not None else None
        if offsets is None:
            if idx.dim() != 2:
                return None
            # a symbolic L is passed on as it is (the op takes SymInt[] bag sizes): emitted
            # as sym_size(indices, 1), never specialized
            bags, bag_size = view.shape(indices)
        elif fixed is not None:
            bag_size, bag_size_node = fixed
            bags, offsets = view.shape(offsets)[0], None
        else:
            off = view.tensor_val(offsets)
            if off is None or off.dim() != 1 or idx.dim() != 1:
                return None
            bags = off.shape[0] - 1 if a.get("include_last_offset") else off.shape[0]
            bag_size = 0
            if a.get("include_last_offset") and not is_int(bags) and blocker is None:
                blocker = "include_last_offset with a symbolic number of bags"
            if not is_int(idx.shape[0]) and blocker is None:
                blocker = "indices of symbolic (data-dependent) length: the packed offsets need each table's index count"
            if off.dtype not in _INDEX_DTYPES and blocker is None:
                blocker = f"offsets dtype {off.dtype}: the grouped op takes int32 / int64"
        out_shape = (bags, dim)
        if _pooled_nodes(call, view) is None and blocker is None:
            blocker = "the backward graph reads this lookup's offset2bag / bag-size outputs (training forward graph)"
    if psw is not None:
        p = view.tensor_val(psw)
        if p is None or p.dtype != w.dtype:
            if blocker is None:
                blocker = "per-sample weights of unknown or other dtype than the table"
    if out is not None and not known_sizes_eq(tuple(out.shape), out_shape):
        return None
    return Lookup(call, weight, indices, offsets, psw, bags, bag_size, bag_size_node, mode, pad, rows, dim, out_shape, blocker)


def _lookup_key(call: Call, view: GraphView) -> Hashable:
    """Lookups that may share one grouped op: same number of bags, same form (fixed bags or
    offsets), per-sample weights on all or none, one table dtype and device; a lookup that
    cannot be grouped keys with the others that cannot, for the same reason."""
    lk = lookup_of(call, view)
    if lk is None:
        return None
    w = _weight_val(view, lk.weight)
    form = "fixed" if lk.offsets is None else "offsets"
    return ("embedding", _bags_key(lk.bags), form, lk.per_sample_weights is not None, str(w.dtype), str(w.device), lk.blocker)


def _bags_key(bags: Any) -> Any:
    """The number of bags as a key: lookups whose counts are provably equal share it. At
    Aten-IR the bags of [B, L] ids count ``ceil(B*L / L) = (B*L + L - 1) // L`` (the iota's
    length), one expression per symbolic L; exact floor divisions are folded, so every
    L gives ``B`` (no guard: pure simplification, see ``core.symbolic.fold_exact_floordiv``)."""
    if not is_symbolic(bags):
        return concrete_int(bags) if isinstance(bags, torch.SymInt) else bags
    env = bags.node.shape_env
    try:
        return str(fold_exact_floordiv(env, env.simplify(bags.node.expr)))
    except Exception:  # an expression the folding does not take: the size as it is
        return str(sym_key(bags))


# ------------------------------------------------------------------------- conditions
def _on_a_gpu(g: Group) -> str | None:
    return kernel_op_device_problem(g.view, lookup_of(g.members[0], g.view).indices)


def _every_lookup_supported(g: Group) -> str | None:
    """a lookup the grouped op cannot take"""
    return g.key[-1]


def _launch_counts(g: Group) -> tuple[int, int]:
    """(kernels before, kernels after) per step, forward and (Torch-IR, when a table needs
    a gradient) backward: the packing copies of indices, offsets, per-sample weights count."""
    lks = [lookup_of(c, g.view) for c in g.members]
    n = len(lks)
    copies = 1 + (lks[0].offsets is not None) + (lks[0].per_sample_weights is not None)
    before, after = n, 1 + copies
    if any(_grad_flows(g.view, _weight_val(g.view, lk.weight)) for lk in lks):
        before += n * BACKWARD_LAUNCHES_PER_LOOKUP
        after += BACKWARD_LAUNCHES_GROUPED
    return before, after


def _fewer_launches(g: Group) -> str | None:
    """not profitable: the grouped lookup would not launch fewer kernels"""
    before, after = _launch_counts(g)
    if after >= before:
        return f"not profitable: {before} kernels would become {after} (index packing included)"
    return None


# ------------------------------------------------------------------------ replacement
def _bag_size_args(lks: list[Lookup], b: Any) -> list[Any]:
    """The op's ``bag_sizes``: ints, and for a symbolic L a graph value holding it (the
    lookup's own ``sym_size`` / iota step node, else ``sym_size(indices, 1)``, one node per
    distinct size). No size is ever evaluated, so nothing is specialized."""
    nodes: dict[Any, Any] = {}
    out: list[Any] = []
    for lk in lks:
        if not is_symbolic(lk.bag_size):
            out.append(concrete_int(lk.bag_size))
            continue
        key = sym_key(lk.bag_size)
        if key not in nodes:
            nodes[key] = lk.bag_size_node if lk.bag_size_node is not None else b.emit(SYM_SIZE_OP, lk.indices, 1)
        out.append(nodes[key])
    return out


def _packed_indices(g: Group) -> list[list[Any]]:
    """What the replacement concatenates each step (a rule's ``copies``, for the planner's
    memory estimate): the indices, and the offsets and per-sample weights where given."""
    lks = [lookup_of(c, g.view) for c in g.members]
    lists = [[lk.indices for lk in lks]]
    if lks[0].offsets is not None:
        lists.append([lk.offsets for lk in lks])
    if lks[0].per_sample_weights is not None:
        lists.append([lk.per_sample_weights for lk in lks])
    return lists


# What the op's backward allocates (kernels/embedding_bag/kernel.py): per index entry, the
# deterministic backward's keys, bag ids and scales (4 bytes each), the sorted keys (4), the
# permutation (8) and the sort's own buffers (about 20); fixed bags in pieces of whole tables.
_KEY_BYTES_PER_ENTRY = 44


def _largest_piece(entries: list[int], fixed: bool) -> int:
    """The most entries the deterministic backward sorts at once (its runs of tables: ``table_pieces``)."""
    if not fixed:
        return sum(entries)
    return max(sum(entries[a:b]) for a, b in table_pieces(entries))


def _output_gradient_in_place(g: Group, lks: list[Lookup]) -> bool:
    """A cat along dim 1 takes every member's output, in member order, next to each other, and
    nothing else reads them: the members' gradients were slices of the cat's gradient, and the
    op's output (the cat's input once ``split_cat_to_identity`` runs) gets that slice, which its
    backward reads where it lies."""
    view = g.view
    outs = [_pooled_nodes(lk.call, view) for lk in lks]
    if any(o is None or len(o) != 1 or len(o[0].users) != 1 for o in outs):
        return False
    cat = next(iter(outs[0][0].users))
    c = view.classify(cat)
    if c is None or c.op != "cat" or any(next(iter(o[0].users)) is not cat for o in outs):
        return False
    tensors, dim = list(c.args.get("tensors") or []), c.args.get("dim", 0)
    if not is_int(dim) or dim % 2 != 1 or any(view.rank(o[0]) != 2 for o in outs):
        return False
    first = tensors.index(outs[0][0]) if outs[0][0] in tensors else -1
    return first >= 0 and tensors[first:first + len(outs)] == [o[0] for o in outs]


def _backward_held(g: Group, n: int) -> int:
    """What the grouped lookup's backward over the first ``n`` members holds beyond the
    lookups' own backwards (the planner's ``GroupRule.backward_held``): the deterministic
    backward's key and sort buffers for its largest piece, or the atomic one's fp32 workspace
    for 16-bit tables; and the output gradient less one member's, unless a cat hands the op a
    slice of its own gradient (``_output_gradient_in_place``)."""
    view = g.view
    lks = [lookup_of(c, view) for c in g.members[:n]]
    weights = [_weight_val(view, lk.weight) for lk in lks]
    if not any(_grad_flows(view, w) for w in weights):
        return 0
    if g.options["deterministic"]:
        entries = [size_hint(view.tensor_val(lk.indices).numel()) for lk in lks]
        held = _largest_piece(entries, lks[0].offsets is None) * _KEY_BYTES_PER_ENTRY
    else:
        w0 = weights[0]
        held = 0 if w0.dtype == torch.float32 else sum(size_hint(w.numel()) for w in weights) * 4
    if not _output_gradient_in_place(g, lks):  # a gradient flows: Torch-IR, where a lookup's node is its output
        outs = [g.nbytes(lk.call.node) for lk in lks]
        held += sum(outs) - max(outs)
    return held


@group_rule(
    ("embedding", "embedding_bag"),
    key=_lookup_key,
    where=[_every_lookup_supported, _on_a_gpu, _fewer_launches],
    stage="batch_lookups",
    options={"deterministic": True},
    copies=_packed_indices,
    custom_op=True,
    backward_held=_backward_held,
    # Not yet run under CUDA graph capture. There an op's cached device tables must not stay
    # alive in the graph's pool (cudagraph trees refuse the first replay: "tensors in the
    # cudagraph pool not tracked as outputs"); the grouped-linear and layer-norm ops allocate
    # theirs off the routed thread (kernels/runtime/tables.py) and run under capture, this op
    # has not been run there.
    cudagraph_safe=False,
)
def group_embedding_lookups(g: Group, b: Any) -> dict[fx.Node, fx.Node]:
    """Independent embedding lookups on different tables become one grouped lookup.

    [embedding_bag(x_t, W_t, mode_t, padding_idx_t, psw_t)]  (and embedding(x_t, W_t) as bags of one)
      -> split(optimus.grouped_embedding_bag([W_t], cat(x_t.flatten()), packed offsets,
                                              cat(psw_t), modes, pads, ...), [D_t], 1)
    Fixed bags (2-D indices, plain embeddings) pass bag sizes; jagged bags pass one offsets
    vector: cat(offsets_t + count_0 + ... + count_{t-1}, [total]). A following cat of the
    pooled outputs then is the op's output (split_cat_to_identity).

    Torch-IR: the op's autograd gives one grouped backward for every table. Aten-IR:
    inference graphs, and plain embeddings in training forward graphs (their backward
    graph is left as it was). Declined with the reason: max_norm, sparse=True and
    scale_grad_by_freq where a gradient flows, mode "max", training-graph _embedding_bag
    (its backward reads offset2bag), offsets of data-dependent length, unprofitable groups.
    """
    view = g.view
    lks = [lookup_of(c, view) for c in g.members]
    for lk in lks:
        if _pooled_nodes(lk.call, view) is None:
            g.decline("the backward graph reads a lookup's offset2bag / bag-size outputs")
    fixed = lks[0].offsets is None
    if fixed and not known_lt(0, sum(lk.bag_size for lk in lks)):
        # the op sizes its batch as len(indices) // sum(L_t): it needs the sum positive
        g.decline("fixed bag sizes whose sum is not provably positive")
    flat = [lk.indices if view.rank(lk.indices) == 1 else b.reshape(lk.indices, [-1]) for lk in lks]
    indices = b.cat(flat, 0)
    offsets = None
    if not fixed:
        parts, base = [], 0
        for lk in lks:
            off = lk.offsets
            if lk.call.args.get("include_last_offset"):
                off = b.slice(off, 0, 0, lk.bags)  # the last entry is the index count (torch's contract)
            parts.append(off if base == 0 else b.add(off, base))
            base += view.shape(lk.indices)[0]
        device = view.device(lks[0].indices)
        parts.append(b.constant([base], [1], torch.int64, device))
        offsets = b.cat(parts, 0)
    psw = None
    if lks[0].per_sample_weights is not None:
        psw = b.cat([p if view.rank(p) == 1 else b.reshape(p, [-1]) for p in (lk.per_sample_weights for lk in lks)], 0)
    out = b.emit(
        GROUPED_OP,
        weights=[b.value(lk.weight) for lk in lks],
        indices=indices,
        offsets=offsets,
        per_sample_weights=psw,
        modes=[lk.mode for lk in lks],
        padding_idx=[lk.padding_idx for lk in lks],
        bag_sizes=_bag_size_args(lks, b) if fixed else [],
        sparse=[False] * len(lks),
        deterministic=bool(g.options["deterministic"]),
        index_counts=[],
    )
    chunks = b.split(out, [lk.dim for lk in lks], 1)
    result: dict[fx.Node, fx.Node] = {}
    for lk, chunk in zip(lks, chunks):
        if len(lk.out_shape) != 2:  # an embedding of N-D indices: [numel, D] -> [*idx.shape, D]
            shape = emittable_shape(lk.out_shape)
            if shape is None:
                g.decline("an embedding of indices with more than one symbolic size")
            chunk = b.view(chunk, shape)
        for node in _pooled_nodes(lk.call, view) or []:
            # a graph output may not alias another output: that one gets its own copy
            result[node] = b.clone(chunk) if any(u.op == "output" for u in node.users) else chunk
    return result

