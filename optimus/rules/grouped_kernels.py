"""Heterogeneous horizontal rules: ops of *different* shapes become one call of our kernels.

The stack-and-bmm rules of ``horizontal.py`` need members of identical shapes. Towers of
different widths (DHEN-, Wukong-, InterFormer-like models) have linears of different
(K, N) and LayerNorms of different widths; these rules merge them into one call of the
project's grouped kernels, ``torch.ops.optimus.grouped_linear`` and
``torch.ops.optimus.batched_layer_norm`` (``kernels/``: Triton on CUDA, plain torch on
the CPU; registered with fake implementations and autograd).

The custom ops take their operands *packed*: every member flattened and concatenated into
one 1-D buffer per operand, the shapes as int lists (``kernels/linear/op.py``). So a
rewrite is::

    [act(linear(x_i, w_i, b_i))] ->
        y = grouped_linear(cat(x_i.reshape(-1)), cat(w_i.reshape(-1)), cat(b_i), ms, ks, ns, act)[0]
        [view(chunk_i, (..., n_i)) for chunk_i in split(y, [m_i * n_i])]

When the members' inputs are the chunks of one ``split(x, sizes, -1)``, each read by one member
(per-feature towers over one input), the rules use the ops' column layout instead: the op
reads ``x`` where it lies and writes the results side by side in one (M, sum N) buffer, whose
column blocks are the members' results (``_column_layout``; not where a result is a graph
output, which keeps eager's contiguous strides). A batched LayerNorm over those blocks reads
the buffer in place the same way, and a following ``cat`` of the blocks in order is the buffer
itself (``split_cat_to_identity``, after ``hoist_pointwise_through_split`` has moved a shared
ReLU before the split)::

    [ln_i(linear_i(split(x)[i]))] ->
        y = grouped_linear(x, pack(w_i), pack(b_i), ..., "columns")[0]              # (M, sum N)
        z = batched_layer_norm(y, pack(lw_i), pack(lb_i), ..., "columns")[0]        # (M, sum N)
        [split(z, ns, -1)[i]]

Where the parameters lie concatenated in one buffer (``optimus.pack_parameters`` packs
sibling parameters of different shapes that way), the Torch-IR rules hand them to the
parameter-list ops (``grouped_linear_params``, ``batched_layer_norm_params``: the ``op.py``
of ``kernels/linear``, ``kernels/layer_norm``) as lists, which read that buffer in place: no pack of the weights.

Levels:

* Torch-IR, training and inference: the op's registered autograd gives the backward
  (``grouped_linear_backward``: grouped dX and dW GEMMs), so AOTAutograd partitions it
  like any op.
* Aten-IR: the graph is already partitioned. In a training forward graph the matmuls
  have their backward in another graph that this rewrite cannot see, so emitting the op
  there would leave the backward as it was while changing what the forward saves: the
  Aten-IR rule declines in partitioned forward graphs (``primals`` and no ``tangents``)
  with that reason. It runs on inference graphs, and, with its option
  ``backward_graphs=True`` (off by default until measured on the GPU), on backward graphs
  (``tangents``), where the independent dX / dW matmuls of different shapes of layers the
  Torch-IR rule did not group become one grouped GEMM; their results, the gradients, are
  disjoint chunks of one buffer. Members whose reduction is long against their outputs (a
  weight gradient over many tokens: ``horizontal.long_reduction``) form a group of their own,
  which declines: the grouped forward kernel does not split its reduction, one mm per member
  does. LayerNorm
  is decomposed at Aten-IR (var_mean, sub, mul, ...): there is no layer_norm op to anchor
  on, so the LayerNorm rule is Torch-IR only.

Uniform groups (every member of one shape) are left to the bmm / stack rules, which run
first (same stage, family imported earlier); a uniform group that reaches these rules is declined.
The packs are copies (one kernel each) unless the operands already lie packed; the
profitability check counts them, as ``horizontal._profitable`` counts stacks.
"""

from __future__ import annotations

import math
from typing import Any, Hashable, Sequence

import torch
import torch.fx as fx
from .. import kernels  # noqa: F401  (importing registers the optimus:: custom ops)
from ..kernels.runtime.params import lies_concatenated
from ..core.dtypes import compute_dtype
from ..core.group import Group, group_rule
from ..core.rule import Builder
from ..core.symbolic import is_symbolic, size_hint, sym_key
from ..core.view import GraphView, is_int, num_outputs
from ..core.vocab import Call, ParamRef, register_extern_op
from ._facts import kernel_op_device_problem
from .horizontal import long_reduction

MAX_PACK_BYTES = 256 * 2**20

# What the kernels accept (float64 only on their plain-torch path: not on CUDA).
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_KERNEL_DTYPE_NAMES = tuple(str(d) for d in _KERNEL_DTYPES)

# Epilogues the grouped-linear kernel fuses: canonical op -> the kernel's activation name.
_EPILOGUES = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "silu": "silu", "gelu": "gelu"}

UNIFORM_LINEAR = "uniform shapes over separate inputs: batch_linear (bmm) handles them"
UNIFORM_MM = "uniform shapes: batch_mm (bmm) handles them"
UNIFORM_LAYER_NORM = "uniform shapes over separate inputs: batch_layer_norm (stack) handles them"
TRAINING_GRAPH = (
    "training graph at Aten-IR: the forward is already partitioned and the grouped op's backward "
    "cannot be placed in the separate backward graph (the Torch-IR rule covers training)"
)
BACKWARD_OPT_IN = (
    "backward graph: grouping its matmuls is opt-in until measured on the GPU "
    "(passes={'aten_ir': {'grouped_mm': {'backward_graphs': True}}, ...})"
)
LONG_REDUCTION = (
    "a member's reduction is long against its outputs ({m}x{k} @ {k}x{n}): the grouped kernel "
    "would loop over it in few tiles, one mm per member splits it"
)


# The kernels' custom ops, emitted through the builder like any op of the vocabulary
# (their fake implementations give the new nodes' metadata).
register_extern_op("grouped_linear", torch.ops.optimus.grouped_linear.default)
register_extern_op("batched_layer_norm", torch.ops.optimus.batched_layer_norm.default)
register_extern_op("grouped_linear_params", torch.ops.optimus.grouped_linear_params.default)
register_extern_op("batched_layer_norm_params", torch.ops.optimus.batched_layer_norm_params.default)
SYM_SIZE_OP = "sym_size"  # a symbolic row count as a graph value (also registered by embedding.py)
register_extern_op(SYM_SIZE_OP, torch.ops.aten.sym_size.int)


# ------------------------------------------------------------------------ helpers
def _static_shape(view: GraphView, value: Any) -> tuple[int, ...] | None:
    """The value's shape if every size is a plain, non-zero int (the ops take int lists;
    empty members are left to the ops they are)."""
    if isinstance(value, ParamRef):
        shape = tuple(view.gm.get_parameter(value.target).shape)
    else:
        shape = view.shape(value)
    if shape is None or not all(is_int(s) and s > 0 for s in shape):
        return None
    return tuple(int(s) for s in shape)


def _input_shape(view: GraphView, value: Any) -> tuple[Any, ...] | None:
    """A member input's shape where its row count may be symbolic: a static, non-zero last
    dim (the kernels' K or width) and either static leading dims, or one symbolic leading
    dim (a 2-D input under dynamic shapes). The column layout takes such rows as a
    ``SymInt`` (``_rows``); the packed layout needs them static (``_static_rows``)."""
    shape = view.shape(value) if isinstance(value, fx.Node) else None
    if shape is None:
        return _static_shape(view, value)
    if not shape or not is_int(shape[-1]) or shape[-1] <= 0:
        return None
    lead = shape[:-1]
    if all(is_int(s) and s > 0 for s in lead):
        return tuple(int(s) for s in shape)
    if len(lead) == 1 and is_symbolic(lead[0]):
        return tuple(shape)
    return None


def _shape_key(shape: Sequence[Any] | None) -> Any:
    """A hashable form of a shape whose sizes may be symbolic (equal keys: provably equal)."""
    return None if shape is None else tuple(sym_key(s) for s in shape)


def _static_rows(g: Group) -> str | None:
    """a member's row count is symbolic: the packed layout needs it as a constant (the column layout, towers over one split, takes it symbolic)"""
    if _column_layout(g) is not None:
        return None
    if all(_static_shape(g.view, c.input) is not None for c in g.members):
        return None
    return _static_rows.__doc__


def _rows(b: Builder, base: fx.Node, rows: Any) -> Any:
    """The row count for the op's ``SymInt[]``: the int, or a symbolic one as the graph value
    ``sym_size(base, 0)`` (an FX graph holds a ``SymInt`` only as a node's value)."""
    return b.emit(SYM_SIZE_OP, base, 0) if is_symbolic(rows) else int(rows)


def _meta(view: GraphView, value: Any) -> tuple[str, str, bool] | None:
    """(dtype, device, requires_grad) of a node or parameter."""
    if isinstance(value, ParamRef):
        p = view.gm.get_parameter(value.target)
        return str(p.dtype), str(p.device), bool(p.requires_grad)
    v = view.tensor_val(value)
    if v is None:
        return None
    return str(v.dtype), str(v.device), bool(v.requires_grad)


def _kernel_dtype(view: GraphView, value: Any) -> torch.dtype | None:
    if isinstance(value, ParamRef):
        dt = view.gm.get_parameter(value.target).dtype
    else:
        dt = view.dtype(value)
    return dt if dt in _KERNEL_DTYPES else None


def _flat(b: Builder, value: Any) -> fx.Node:
    return b.reshape(b.value(value), [-1])


def _pack(b: Builder, values: Sequence[Any]) -> fx.Node:
    """The packed convention's operand: every member flattened, concatenated in order."""
    return b.cat([_flat(b, v) for v in values], 0)


def _pack_is_free(view: GraphView, values: Sequence[Any]) -> bool:
    """A single member's operand needs no concatenation (its flat view is the pack)."""
    return len(values) == 1


def _tensor_of(view: GraphView, value: Any) -> torch.Tensor | None:
    if isinstance(value, ParamRef):
        return view.gm.get_parameter(value.target)
    return view.tensor_val(value) if isinstance(value, fx.Node) else None


def _lie_concatenated(view: GraphView, values: Sequence[Any]) -> bool:
    """The values (parameters; at compile time Dynamo's fake parameters keep their storage
    and offsets) lie as ``cat`` of their flat views would lay them out
    (``optimus.pack_parameters``): the parameter-list ops then read them in place."""
    ts = [_tensor_of(view, v) for v in values]
    return all(t is not None for t in ts) and lies_concatenated(ts)


def _param_copies(view: GraphView, param_lists: Sequence[Sequence[Any] | None]) -> list[Sequence[Any]]:
    """The parameter lists a rewrite copies: none when every list lies concatenated (the
    parameter-list ops read them in place), else all of them (packed by cats in the graph)."""
    lists = [vs for vs in param_lists if vs is not None]
    return [] if lists and all(_lie_concatenated(view, vs) for vs in lists) else lists


def _pack_count(view: GraphView, operand_lists: Sequence[Sequence[Any]]) -> int:
    return sum(0 if _pack_is_free(view, vs) else 1 for vs in operand_lists)


def _nbytes(view: GraphView, value: Any) -> int:
    if isinstance(value, ParamRef):
        p = view.gm.get_parameter(value.target)
        return p.numel() * p.element_size()
    v = view.tensor_val(value)
    return 0 if v is None else math.prod(size_hint(s) for s in v.shape) * v.element_size()


def _check_profitable(g: Group, kernels_before: int, operand_lists: Sequence[Sequence[Any]], extra: int = 0) -> None:
    """The rules' own heuristic (fewer launches, bounded packed bytes), as
    ``horizontal._profitable``; under ``passes="auto"`` the planner then prices what it
    accepts (``optimus/planner/estimate.py`` charges the custom op its members' arithmetic).
    ``extra``: other kernels the rewrite adds (dtype casts)."""
    after = 1 + _pack_count(g.view, operand_lists) + extra
    if after >= kernels_before:
        casts = f", {extra} casts" if extra else ""
        g.decline(f"not profitable: {kernels_before} kernels would become {after} (packing copies{casts} included)")
    limit = g.options.get("max_pack_bytes", MAX_PACK_BYTES)
    size = sum(_nbytes(g.view, v) for vs in operand_lists if not _pack_is_free(g.view, vs) for v in vs)
    if size > limit:
        g.decline(f"not profitable: would pack {size} bytes (> max_pack_bytes={limit})")


def _columns_of(view: GraphView, xs: Sequence[Any]) -> tuple[fx.Node, list[int]] | None:
    """``(x, order)`` when the members' inputs are the chunks of one ``split(x, sizes, -1)``,
    or the features of one ``unbind(x, -2)`` (a ``(rows, T, d)`` tensor whose feature ``j`` is
    the column block ``j`` of ``x.reshape(rows, T * d)``), every chunk read by exactly one
    member (member ``order[j]`` reads chunk ``j``): the column layout then reads ``x`` where it
    lies, with no pack. ``None`` otherwise."""
    source, chunk_of = None, {}
    for i, v in enumerate(xs):
        call = view.classify(v) if isinstance(v, fx.Node) else None
        if call is None or call.op != "getitem" or not is_int(call.args["index"]):
            return None
        src = call.input
        if source is None:
            sc = view.classify(src) if isinstance(src, fx.Node) else None
            rank = view.rank(sc.input) if sc is not None else None
            if sc is None or rank is None:
                return None
            if sc.op == "split":
                if sc.args["dim"] != rank - 1 or not isinstance(sc.args["sizes"], list) or not all(is_int(z) for z in sc.args["sizes"]):
                    return None
            elif sc.op != "unbind" or rank != 3 or sc.args["dim"] != 1:
                return None
            source = src
        elif src is not source:
            return None
        chunk_of[int(call.args["index"])] = i
    if source is None or len(chunk_of) != len(xs) or sorted(chunk_of) != list(range(num_outputs(view, source) or -1)):
        return None
    base = view.classify(source).input
    if _input_shape(view, base) is None:
        return None
    return base, [chunk_of[j] for j in range(len(xs))]


def _needs_eager_strides(view: GraphView, nodes: Sequence[fx.Node]) -> bool:
    """Some node is a graph output, or is read by a ``view`` (the column layout's results are
    strided column blocks: an output must keep the contiguous strides eager gives it, and a
    ``view`` that merges the rows with the columns would not apply to a block)."""
    for n in nodes:
        for u in n.users:
            if u.op == "output":
                return True
            call = view.classify(u)
            if (call is not None and call.op == "view") or u.target == "view" or u.target is torch.Tensor.view:
                return True
    return False


def _packed_copies(view: GraphView, operand_lists: Sequence[Sequence[Any] | None]) -> list[list[Any]]:
    """The operand lists a pack copies (a rule's ``copies``, for the planner's memory estimate)."""
    return [list(vs) for vs in operand_lists if vs is not None and not _pack_is_free(view, vs)]


def _column_layout(g: Group) -> tuple[fx.Node, list[int]] | None:
    """``_columns_of`` the group's inputs, unless a result (or the activation fused after it)
    needs eager's contiguous strides (``_needs_eager_strides``)."""
    found = _columns_of(g.view, [c.input for c in g.members])
    if found is None:
        return None
    users = [u for n in g.nodes for u in n.users]
    return None if _needs_eager_strides(g.view, list(g.nodes) + users) else found


def _input_copies(g: Group) -> list[Any] | None:
    """The members' inputs, when packing them copies (not when they lie in the column layout)."""
    return None if _column_layout(g) is not None else [c.input for c in g.members]


def _in_chunk_order(order: Sequence[int], *lists: Sequence[Any] | None) -> list[list[Any] | None]:
    """Each list (None stays None) reordered to the split's chunk order (``_columns_of``)."""
    return [[vs[i] for i in order] if vs is not None else None for vs in lists]


def _emit_input(b: Builder, columns: tuple[fx.Node, list[int]] | None, xs: Sequence[Any],
                shapes: Sequence[Sequence[int]], dtype: torch.dtype | None = None) -> tuple[fx.Node, str]:
    """The op's x and its layout: with ``columns``, the split's input where it lies, as the
    kernels' (M, sum widths) matrix (a view of a contiguous base; the op makes it contiguous
    where it is not); otherwise the pack of ``xs``. ``dtype``: cast to it (one cast of the
    whole, where autocast casts each member's input)."""
    if columns is None:
        return _cast(b, _pack(b, xs), dtype), "packed"
    lead, width = tuple(shapes[0][:-1]), sum(s[-1] for s in shapes)
    base = _cast(b, b.value(columns[0]), dtype)
    if len(lead) == 1 and b.graph_view.rank(base) == 3:  # unbind(x, 1)'s features: x as (rows, T * d)
        return b.reshape(base, [-1, width]), "columns"
    return (base if len(lead) == 1 else b.reshape(base, [math.prod(lead), width])), "columns"


def _cast(b: Builder, value: Any, dtype: torch.dtype | None) -> Any:
    return value if dtype is None else b.cast(value, dtype)


def _result_dtype(g: Group) -> torch.dtype | None:
    """The dtype the members compute in, when it is not their operands': a linear under
    autocast runs in the autocast dtype (its fp32 operands cast first), a LayerNorm of bf16
    input and fp32 weights in fp32 (as eager's mixed-dtype layer_norm), rounded to its result."""
    return g.view.dtype(g.members[0].node)


def _emit_results(b: Builder, y: fx.Node, columns: tuple[fx.Node, list[int]] | None,
                  shapes: Sequence[Sequence[int]]) -> list[fx.Node]:
    """The members' results (``shapes``) from the op's y: column blocks of the (M, sum widths)
    result (strided views) with ``columns``, else the unpack of the packed y."""
    if columns is None:
        return _unpack(b, y, shapes)
    lead, widths = tuple(shapes[0][:-1]), [s[-1] for s in shapes]
    out = y if len(lead) == 1 else b.reshape(y, list(lead) + [sum(widths)])
    return b.split(out, widths, len(lead)) if len(widths) > 1 else [out]


def _linear_copies(g: Group) -> list[list[Any]]:
    bs = [c.args["bias"] for c in g.members] if g.members[0].args.get("bias") is not None else None
    return _packed_copies(g.view, [_input_copies(g)] + _param_copies(g.view, [[c.args["weight"] for c in g.members], bs]))


def _mm_copies(g: Group) -> list[list[Any]]:
    bs = [c.args["bias"] for c in g.members] if g.op == "addmm" else None
    return _packed_copies(g.view, [_input_copies(g), [c.args["mat2"] for c in g.members], bs])


def _layer_norm_copies(g: Group) -> list[list[Any]]:
    a0 = g.members[0].args
    params = [[c.args[k] for c in g.members] if a0[k] is not None else None for k in ("weight", "bias")]
    return _packed_copies(g.view, [_input_copies(g)] + _param_copies(g.view, params))


def _unpack(b: Builder, packed: fx.Node, shapes: Sequence[Sequence[int]]) -> list[fx.Node]:
    """Views of the packed result in the members' shapes."""
    sizes = [math.prod(s) for s in shapes]
    chunks = b.split(packed, sizes, 0) if len(shapes) > 1 else [packed]
    return [b.view(c, list(s)) for c, s in zip(chunks, shapes)]


def _epilogue(view: GraphView, node: fx.Node) -> tuple[str, fx.Node] | None:
    """(kernel activation, activation node) when the node's only user is an activation
    the kernel fuses, applied to it alone."""
    if len(node.users) != 1:
        return None
    user = next(iter(node.users))
    call = view.classify(user)
    if call is None or call.op not in _EPILOGUES or call.input is not node:
        return None
    if call.op == "gelu" and call.args.get("approximate", "none") != "none":
        return None  # the kernel's gelu is the exact (erf) one
    if any(k != "input" and isinstance(v, fx.Node) for k, v in call.args.items()):
        return None
    return _EPILOGUES[call.op], user


def _shared_epilogue(g: Group) -> tuple[str | None, list[fx.Node] | None]:
    """The activation every member's result goes through alone (fused), else none."""
    found = [_epilogue(g.view, n) for n in g.nodes]
    if all(f is not None for f in found) and len({f[0] for f in found}) == 1:  # type: ignore[index]
        return found[0][0], [f[1] for f in found]  # type: ignore[index]
    return None, None


def _emit_grouped_linear(g: Group, b: Builder, xs: list[Any], ws_nk: list[Any], bs: list[Any] | None,
                         x_shapes: list[tuple[int, ...]], ns: list[int], params: bool = False) -> dict[fx.Node, fx.Node]:
    """The grouped-linear rewrite of ``g``: ``ws_nk`` in ``F.linear``'s (N, K) layout.

    When the inputs are the chunks of one split along the last dim (``_column_layout``), the
    op reads that split's input in place and writes the results side by side, in the column
    layout (no pack of x; the results are the column blocks a following cat or
    batched_layer_norm reads in place); otherwise every operand is packed. ``params``: the
    weights and biases are parameters; where every list of them lies concatenated
    (``optimus.pack_parameters``) they go to ``grouped_linear_params`` as lists, read in
    place, instead of being packed by a cat in the graph."""
    act, act_nodes = _shared_epilogue(g)
    olds = list(act_nodes if act_nodes is not None else g.nodes)
    columns = _column_layout(g)
    if columns is not None:
        xs, ws_nk, x_shapes, ns, olds, bs = _in_chunk_order(columns[1], xs, ws_nk, x_shapes, ns, olds, bs)
    ks = [s[-1] for s in x_shapes]
    # under autocast a linear of fp32 operands computes in bf16/fp16: the op runs on casts of
    # them (their gradients flow back through the casts to the fp32 parameters, as autograd's)
    want = _result_dtype(g)
    cast = want if want is not None and want != _kernel_dtype(g.view, xs[0]) else None
    param_lists = [ws_nk] + ([bs] if bs is not None else [])
    casts = 0 if cast is None else 1 + len(param_lists)  # one per operand, where autocast casts each member's
    before = len(g.members) * ((2 if act is not None else 1) + casts)
    params = params and cast is None and not _param_copies(g.view, param_lists)  # every list lies concatenated
    _check_profitable(g, before, ([] if columns is not None else [xs]) + ([] if params else param_lists), extra=casts)
    x, layout = _emit_input(b, columns, xs, x_shapes, cast)
    if columns is not None:  # one row count for every member, symbolic or not
        ms = [_rows(b, x, x_shapes[0][0] if len(x_shapes[0]) == 2 else math.prod(x_shapes[0][:-1]))] * len(xs)
    else:
        ms = [math.prod(s[:-1]) for s in x_shapes]
    if params:
        out = b.emit("grouped_linear_params", x, [b.value(v) for v in ws_nk], [b.value(v) for v in bs or []],
                     ms, ks, ns, act or "none", layout)
    else:
        packed_b = b.cat([b.value(v) for v in bs], 0) if bs is not None and len(bs) > 1 else (b.value(bs[0]) if bs else None)
        packed_b = _cast(b, packed_b, cast) if packed_b is not None else None
        out = b.emit("grouped_linear", x, _cast(b, _pack(b, ws_nk), cast), packed_b, ms, ks, ns, act or "none", layout)
    results = _emit_results(b, b.getitem(out, 0), columns, [tuple(s[:-1]) + (n,) for s, n in zip(x_shapes, ns)])
    return dict(zip(olds, results))


# ------------------------------------------------------------------- Torch-IR linear
def _linear_key(call: Call, view: GraphView) -> Hashable:
    x, w, bias = call.args["input"], call.args["weight"], call.args.get("bias")
    if not isinstance(x, fx.Node) or not isinstance(w, (fx.Node, ParamRef)):
        return None
    xs, ws = _input_shape(view, x), _static_shape(view, w)
    if xs is None or ws is None or len(xs) < 1 or len(ws) != 2 or ws[1] != xs[-1]:
        return None
    if bias is not None and (not isinstance(bias, (fx.Node, ParamRef)) or _static_shape(view, bias) != (ws[0],)):
        return None
    dt = _kernel_dtype(view, x)
    metas = [_meta(view, v) for v in (x, w) + ((bias,) if bias is not None else ())]
    if dt is None or any(m is None for m in metas) or len({m[:2] for m in metas}) != 1:  # type: ignore[index]
        return None  # mixed dtypes / devices stay apart (and F.linear would reject them)
    out = _kernel_dtype(view, call.node)
    if out is None:
        return None
    return ("grouped_linear", metas[0][:2], bias is not None, str(out))  # type: ignore[index]


def _on_a_gpu(g: Group) -> str | None:
    return kernel_op_device_problem(g.view, g.members[0].input)


def _linear_shapes_differ(g: Group) -> str | None:
    """Uniform groups are batch_linear's (one bmm; it runs first), except over the chunks of
    one split (the column layout): there the bmm's stack copies the input where this op
    reads it in place, so a group batch_linear left (the planner declined its stack on
    memory) is taken here."""
    shapes = {(_shape_key(_input_shape(g.view, c.input)), _static_shape(g.view, c.args["weight"])) for c in g.members}
    return UNIFORM_LINEAR if len(shapes) == 1 and _column_layout(g) is None else None


@group_rule(
    "linear",
    key=_linear_key,
    levels=("torch_ir",),
    where=[_on_a_gpu, _linear_shapes_differ, _static_rows],
    stage="batch_matmuls",
    options={"max_pack_bytes": MAX_PACK_BYTES},
    copies=_linear_copies,
    custom_op=True,
    reads_packed_parameters=True,  # optimus::grouped_linear_params reads concatenated weights in place
)
def grouped_linear(g: Group, b: Builder) -> dict[fx.Node, fx.Node]:
    """Independent linears of different (K, N) become one grouped-linear kernel call,
    with the members' shared activation fused into its epilogue.

    [act(linear(x_i, w_i, b_i))] -> unpack(optimus.grouped_linear(pack(x_i), pack(w_i), pack(b_i), act))
    [act(linear(split(x, ks, -1)[i], w_i, b_i))] -> split(optimus.grouped_linear(x, pack(w_i), pack(b_i), act, "columns"), ns, -1)
    (the second where the inputs are every chunk of one split: read in place, results side by side)
    """
    xs = [c.input for c in g.members]
    ws = [c.args["weight"] for c in g.members]
    bs = [c.args["bias"] for c in g.members] if g.members[0].args.get("bias") is not None else None
    x_shapes = [_input_shape(g.view, x) for x in xs]
    ns = [_static_shape(g.view, w)[0] for w in ws]  # type: ignore[index]
    return _emit_grouped_linear(g, b, xs, ws, bs, x_shapes, ns, params=True)  # type: ignore[arg-type]


# -------------------------------------------------------------- Aten-IR mm / addmm
def _mm_key(call: Call, view: GraphView) -> Hashable:
    a = call.args
    x, m2 = a["input"], a["mat2"]
    if not isinstance(x, fx.Node) or not isinstance(m2, fx.Node):
        return None
    xs, ms = _static_shape(view, x), _static_shape(view, m2)
    if xs is None or ms is None or len(xs) != 2 or len(ms) != 2 or xs[1] != ms[0]:
        return None
    has_bias = call.op == "addmm"
    if has_bias:
        if a.get("beta", 1) != 1 or a.get("alpha", 1) != 1:
            return None
        bias = a["bias"]
        if not isinstance(bias, fx.Node) or _static_shape(view, bias) != (ms[1],):
            return None  # a row-broadcast bias is what the kernel adds
    dt = _kernel_dtype(view, x)
    nodes = [x, m2] + ([a["bias"]] if has_bias else [])
    metas = [_meta(view, v) for v in nodes]
    if dt is None or any(m is None for m in metas) or len({m[:2] for m in metas}) != 1:  # type: ignore[index]
        return None
    return ("grouped_mm", metas[0][:2], has_bias, long_reduction(1, xs[0], xs[1], ms[1]))  # type: ignore[index]


def _graph_allows_grouping(g: Group) -> str | None:
    kind = g.view.graph_kind()
    if kind == "forward":
        return TRAINING_GRAPH
    if kind == "backward" and not g.options.get("backward_graphs", False):
        return BACKWARD_OPT_IN
    return None


def _no_long_reduction(g: Group) -> str | None:
    """Long-reduction members share a key (``_mm_key``), so they decline together and the
    other members still group."""
    if not g.key[-1]:
        return None
    (m, k), n = _static_shape(g.view, g.members[0].input), _static_shape(g.view, g.members[0].args["mat2"])[1]  # type: ignore[misc,index]
    return LONG_REDUCTION.format(m=m, k=k, n=n)


def _mm_shapes_differ(g: Group) -> str | None:
    shapes = {(_static_shape(g.view, c.input), _static_shape(g.view, c.args["mat2"])) for c in g.members}
    return UNIFORM_MM if len(shapes) == 1 else None


@group_rule(
    ("mm", "addmm"),
    key=_mm_key,
    levels=("aten_ir",),
    where=[_on_a_gpu, _graph_allows_grouping, _mm_shapes_differ, _no_long_reduction],
    stage="batch_matmuls",
    options={"max_pack_bytes": MAX_PACK_BYTES, "backward_graphs": False},
    copies=_mm_copies,
    custom_op=True,
)
def grouped_mm(g: Group, b: Builder) -> dict[fx.Node, fx.Node]:
    """Independent matmuls of different shapes in an inference graph (or, opt-in, a backward
    graph) become one grouped-linear kernel call (activation epilogue fused where the
    members share one).

    [act(addmm(b_i, x_i, m_i))] -> unpack(optimus.grouped_linear(pack(x_i), pack(m_i.T), pack(b_i), act))
    A linear's ``m_i`` is ``permute(w_i)``: ``m_i.T`` is ``w_i`` again once the vertical
    rules fold the two permutes, so packing reads the weight where it lies.
    """
    xs = [c.input for c in g.members]
    ws = [b.permute(c.args["mat2"], [1, 0]) for c in g.members]
    bs = [c.args["bias"] for c in g.members] if g.op == "addmm" else None
    x_shapes = [_static_shape(g.view, x) for x in xs]
    ns = [_static_shape(g.view, c.args["mat2"])[1] for c in g.members]  # type: ignore[index]
    return _emit_grouped_linear(g, b, xs, ws, bs, x_shapes, ns)  # type: ignore[arg-type]


# ---------------------------------------------------------------- Torch-IR layer_norm
def _layer_norm_key(call: Call, view: GraphView) -> Hashable:
    a = call.args
    x = a["input"]
    if not isinstance(x, fx.Node):
        return None
    shape = _input_shape(view, x)
    norm = list(a["normalized_shape"])
    if shape is None or len(shape) < 1 or len(norm) != 1 or norm[0] != shape[-1] or not isinstance(a["eps"], (int, float)):
        return None  # the kernel normalizes over the last dim only, with a constant eps
    dt = _kernel_dtype(view, x)
    w, bias = a["weight"], a["bias"]
    for p in (w, bias):
        if p is not None and (not isinstance(p, (fx.Node, ParamRef)) or _static_shape(view, p) != (shape[-1],)):
            return None
    metas = [_meta(view, v) for v in (x, w, bias) if v is not None]
    out = _kernel_dtype(view, call.node)
    if dt is None or out is None or any(m is None for m in metas) or len({m[1] for m in metas}) != 1:  # type: ignore[index]
        return None
    if any(m[0] not in _KERNEL_DTYPE_NAMES for m in metas):  # type: ignore[index]
        return None
    # dtypes may differ (bf16 input, fp32 weights under autocast): members group by all of them
    return ("batched_layer_norm", tuple(m[:2] for m in metas), str(out), float(a["eps"]), w is not None, bias is not None)  # type: ignore[index]


def _norm_epilogue(g: Group) -> tuple[str | None, list[fx.Node] | None]:
    """The activation every norm's result goes through alone, where the kernel's epilogue
    computes it as eager does. Where the norm's result is rounded to a narrower dtype than it is
    computed in (a bf16 input with fp32 affines: eager computes in fp32 and rounds), eager
    applies the activation to the rounded value: relu only, which commutes with the rounding,
    is fused."""
    act, nodes = _shared_epilogue(g)
    if act is None:
        return None, None
    a0 = g.members[0].args
    dtypes = {_kernel_dtype(g.view, v) for v in (g.members[0].input, a0["weight"], a0["bias"]) if v is not None}
    rounded = len(dtypes) > 1 and _result_dtype(g) != compute_dtype(*dtypes)
    if rounded and act != "relu":
        return None, None
    return act, nodes


def _layer_norm_shapes_differ(g: Group) -> str | None:
    """Uniform groups are batch_layer_norm's, except in the column layout (read in place; see
    ``_linear_shapes_differ``)."""
    uniform = len({_shape_key(_input_shape(g.view, c.input)) for c in g.members}) == 1
    return UNIFORM_LAYER_NORM if uniform and _column_layout(g) is None else None


@group_rule(
    "layer_norm",
    key=_layer_norm_key,
    levels=("torch_ir",),
    where=[_on_a_gpu, _layer_norm_shapes_differ, _static_rows],
    stage="batch_norms",
    options={"max_pack_bytes": MAX_PACK_BYTES},
    copies=_layer_norm_copies,
    custom_op=True,
    reads_packed_parameters=True,  # optimus::batched_layer_norm_params reads concatenated affines in place
)
def batched_layer_norm(g: Group, b: Builder) -> dict[fx.Node, fx.Node]:
    """Independent LayerNorms of different widths become one batched-layer-norm kernel call.

    [layer_norm(x_i, (d_i,), w_i, b_i, eps)] -> unpack(optimus.batched_layer_norm(pack(x_i), pack(w_i), pack(b_i), rows, widths, eps))
    [layer_norm(split(x, ds, -1)[i], ...)] -> split(optimus.batched_layer_norm(x, ..., "columns"), ds, -1)
    [relu(layer_norm(x_i, ...))] -> the same with the kernel's relu epilogue (also gelu, silu,
    sigmoid, tanh)

    The epilogue's backward recomputes the pre-activation from what the norm saves anyway (x,
    its statistics, w, b): the activation's own kernels, what it saved, and the full-group
    gradient buffer between its backward and the norm's are gone.
    """
    a0 = g.members[0].args
    act, act_nodes = _norm_epilogue(g)
    olds = list(act_nodes if act_nodes is not None else g.nodes)
    xs = [c.input for c in g.members]
    ws = [c.args["weight"] for c in g.members] if a0["weight"] is not None else None
    bs = [c.args["bias"] for c in g.members] if a0["bias"] is not None else None
    columns = _column_layout(g)
    if columns is not None:  # the inputs side by side in one matrix: read in place (see grouped_linear)
        xs, olds, ws, bs = _in_chunk_order(columns[1], xs, olds, ws, bs)
    shapes = [_input_shape(g.view, x) for x in xs]
    widths = [s[-1] for s in shapes]  # type: ignore[index]
    param_lists = [p for p in (ws, bs) if p is not None]
    # mixed dtypes (bf16 input, fp32 weights under autocast): the op runs in the widest, as
    # eager's mixed-dtype layer_norm computes in fp32, and its result is rounded once to the members'
    dtypes = {_kernel_dtype(g.view, v) for v in [xs[0]] + [p[0] for p in param_lists]}
    compute = compute_dtype(*dtypes) if len(dtypes) > 1 else None
    x_cast = compute if compute is not None and compute != _kernel_dtype(g.view, xs[0]) else None
    p_cast = compute if compute is not None and any(_kernel_dtype(g.view, p[0]) != compute for p in param_lists) else None
    casts = (x_cast is not None) + (p_cast is not None) * len(param_lists) + (compute is not None)
    in_place = bool(param_lists) and p_cast is None and not _param_copies(g.view, param_lists)  # packed by pack_parameters
    before = len(g.members) * (2 if act is not None else 1)
    _check_profitable(g, before, ([] if columns is not None else [xs]) + ([] if in_place else param_lists), extra=casts)
    eps = float(a0["eps"])
    x, layout = _emit_input(b, columns, xs, shapes, x_cast)  # type: ignore[arg-type]
    if columns is not None:  # one row count for every member, symbolic or not
        rows = [_rows(b, x, shapes[0][0] if len(shapes[0]) == 2 else math.prod(shapes[0][:-1]))] * len(xs)  # type: ignore[index]
    else:
        rows = [math.prod(s[:-1]) for s in shapes]  # type: ignore[index]
    if in_place:
        out = b.emit("batched_layer_norm_params", x, [b.value(v) for v in ws or []], [b.value(v) for v in bs or []],
                     rows, widths, eps, layout, act or "none")
    else:
        out = b.emit("batched_layer_norm", x, _cast(b, _pack(b, ws), p_cast) if ws is not None else None,
                     _cast(b, _pack(b, bs), p_cast) if bs is not None else None, rows, widths, eps, layout,
                     act or "none")
    y = b.getitem(out, 0)
    results = _emit_results(b, _cast(b, y, _result_dtype(g)) if compute is not None else y, columns, shapes)  # type: ignore[arg-type]
    return dict(zip(olds, results))


