"""Horizontal rules: N independent, identical ops become one batched op.

Each rule is a ``group_rule``: a ``key`` (what must match for ops to merge: op,
shapes, dtypes, devices, every other argument), a profitability check, and a
replacement that stacks the members' operands, runs one op, and unbinds the result. The
stacks and unbinds it adds are glue that the vertical rules remove where the operands
already lie side by side in one tensor (chunks of a split, parts of an unbind).
See docs/horizontal.md for the grouping algorithm.
"""

from __future__ import annotations

from typing import Any, Hashable

import torch
import torch.fx as fx

from .. import kernels  # noqa: F401  (importing registers the optimus:: custom ops)
from ..core.dtypes import compute_dtype
from ..core.group import Group, group_rule
from ..core.pattern import Alt, Lit, Op, Var
from ..core.rule import rule
from ..core.segments import stack_is_free
from ..core.symbolic import concrete_int, is_symbolic, known_eq, known_sizes_eq, size_hint, sym_key
from ..core.view import GraphView, is_int
from ..core.vocab import POINTWISE, Call, ParamRef, register_extern_op
from ._facts import emittable_shape

MAX_STACK_BYTES = 256 * 2**20

register_extern_op("packed_linear", torch.ops.optimus.packed_linear.default)  # batch_linear on packed weights


# ------------------------------------------------------------------------ helpers
def _sig(view: GraphView, value: Any) -> Hashable:
    """What must agree between members for one operand: its kind, shape, dtype, device."""
    if isinstance(value, ParamRef):
        value = view.gm.get_parameter(value.target)
        return ("param", tuple(value.shape), str(value.dtype), str(value.device))
    if isinstance(value, fx.Node):
        v = view.tensor_val(value)
        if v is None:
            return None
        # sizes by their simplified expressions: equal keys mean provably equal sizes
        return ("tensor", tuple(sym_key(s) for s in v.shape), str(v.dtype), str(v.device))
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(_sig(view, x) for x in value))
    return ("const", repr(value))


def _copied(g: Group, operand_lists: list[list[Any]]) -> list[list[Any]]:
    """The operand lists a stack copies (a rule's ``copies``: what the planner's memory
    estimate counts)."""
    return [vs for vs in operand_lists if not stack_is_free(g.view, vs)]


def _launch_count(g: Group, operand_lists: list[list[Any]]) -> tuple[int, int]:
    """(kernels before, kernels after) for a fusion stacking ``operand_lists``."""
    copies = sum(0 if stack_is_free(g.view, ops) else 1 for ops in operand_lists)
    return len(g.members), 1 + copies


def _stacked_bytes(g: Group, operand_lists: list[list[Any]]) -> int:
    return sum(sum(g.nbytes(o) for o in ops) for ops in operand_lists if not stack_is_free(g.view, ops))


def _profitable(g: Group, operand_lists: list[list[Any]]) -> None:
    """The rules' own heuristic: fewer launches, bounded stacked bytes. Under
    ``passes="auto"`` it still applies: the planner then prices what it accepts (device
    time, memory) and may decline or cut it, never take a group this declines."""
    before, after = _launch_count(g, operand_lists)
    if after >= before:
        g.decline(f"not profitable: {before} kernels would become {after} (stack copies included)")
    limit = g.options.get("max_stack_bytes", MAX_STACK_BYTES)
    size = _stacked_bytes(g, operand_lists)
    if size > limit:
        g.decline(f"not profitable: would stack {size} bytes (> max_stack_bytes={limit})")


def _unbind_results(g: Group, b: Any, stacked_result: fx.Node) -> dict[fx.Node, fx.Node]:
    outs = b.unbind(stacked_result, 0)
    return {c.node: o for c, o in zip(g.members, outs)}


def _broadcast_stack(g: Group, b: Any, values: list[Any], rank: int) -> Any:
    """Members' operand for the batched op: shared as is, else stacked and lined up with
    the stacked input (rank ``rank`` + 1) so it broadcasts per member as before."""
    if all(v is values[0] for v in values):
        return values[0]
    stacked = b.stack([b.value(v) for v in values], 0)
    k = len(g.shape(values[0]) or ())
    for _ in range(rank - k):
        stacked = b.unsqueeze(stacked, 1)
    return stacked


# --------------------------------------------------------------------------- linear
def _linear_lhs_key(call: Call, view: GraphView) -> Hashable:
    x, w, bias = call.args["input"], call.args["weight"], call.args.get("bias")
    if not isinstance(x, fx.Node) or not isinstance(w, (fx.Node, ParamRef)):
        return None
    if len(x.users) < 2:
        return None  # nothing else reads this input
    wsig = _sig(view, w)
    if wsig is None or len(wsig[1]) != 2:
        return None
    return ("linear_lhs", id(x), wsig[1][1], wsig[2], wsig[3], bias is not None)


def _linear_lhs_copies(g: Group) -> list[list[Any]]:
    """The weights (and biases) ``batch_linear_lhs`` concatenates: the input is shared."""
    ws = [c.args["weight"] for c in g.members]
    bs = [c.args.get("bias") for c in g.members]
    return _copied(g, [ws] + ([bs] if bs[0] is not None else []))


@group_rule("linear", key=_linear_lhs_key, stage="batch_matmuls", options={"max_stack_bytes": MAX_STACK_BYTES}, copies=_linear_lhs_copies)
def batch_linear_lhs(g: Group, b: Any) -> dict[fx.Node, fx.Node]:
    """Linears reading the same input become one linear on concatenated weights.

    [linear(x, w_i, b_i)] -> split(linear(x, cat(w_i), cat(b_i)), [n_i], -1)
    """
    x = g.members[0].input
    ws = [b.value(c.args["weight"]) for c in g.members]
    bs = [c.args.get("bias") for c in g.members]
    before, after = len(g.members), 2 + (bs[0] is not None)
    if after >= before:
        g.decline(f"not profitable: {before} kernels would become {after} (weight concatenation included)")
    widths = [g.shape(w)[0] for w in ws]
    if not all(is_int(w) for w in widths):
        g.decline("weights of symbolic size")
    weight = b.cat(ws, 0)
    bias = b.cat([b.value(v) for v in bs], 0) if bs[0] is not None else None
    if g.view.can_emit("linear"):
        y = b.linear(x, weight, bias)
    else:
        y = b.mm(x, b.permute(weight, [1, 0])) if bias is None else b.addmm(bias, x, b.permute(weight, [1, 0]))
    outs = b.split(y, widths, g.view.rank(x) - 1)
    return {c.node: o for c, o in zip(g.members, outs)}


def _lies_packed(view: GraphView, items: list[Any]) -> bool:
    """The members are parameters (graph inputs) lying packed in one storage, member ``i``
    at ``offset_0 + i * slot`` (``optimus.pack_parameters``): Dynamo's fake parameters keep
    their storage and offsets, so this is known at compile time."""
    from ..kernels.packed_linear import packed_slot

    values = []
    for item in items:
        if isinstance(item, ParamRef):
            values.append(view.gm.get_parameter(item.target))
        elif isinstance(item, fx.Node) and item.op in ("placeholder", "get_attr") and view.tensor_val(item) is not None:
            values.append(view.tensor_val(item))
        else:
            return False
    return packed_slot(values) is not None


def _long_weight_gradient(g: Group, xs: list[Any], ws: list[Any]) -> bool:
    """The weights need a gradient whose batched product is a long reduction
    (``long_reduction``: many rows of x per member). Outside ``packed_linear`` Aten-IR's
    ``unbatch_long_reduction_bmm`` splits that product per member; inside the op it could
    not, so such groups keep the stacked form."""
    w0 = g.view.gm.get_parameter(ws[0].target) if isinstance(ws[0], ParamRef) else g.view.tensor_val(ws[0])
    shape = g.shape(xs[0])
    if w0 is None or not w0.requires_grad or not shape:
        return False
    rows = 1
    for s in shape[:-1]:
        rows *= size_hint(s)
    return long_reduction(len(xs), size_hint(w0.shape[0]), rows, size_hint(w0.shape[1]))


def _linear_key(call: Call, view: GraphView) -> Hashable:
    x, w, bias = call.args["input"], call.args["weight"], call.args.get("bias")
    rank = view.rank(x)
    if rank is None or rank < 2 or not isinstance(w, (fx.Node, ParamRef)):
        return None
    if emittable_shape(view.shape(x)) is None:
        return None
    return ("linear", _sig(view, x), _sig(view, w), bias is not None and _sig(view, bias))


def _linear_operands(g: Group) -> tuple[bool, list[list[Any]]]:
    """(weights lie packed, the operand lists ``batch_linear`` stacks)."""
    xs = [c.input for c in g.members]
    ws = [c.args["weight"] for c in g.members]
    bs = [c.args.get("bias") for c in g.members]
    packed = g.options.get("packed_weights", True) and _lies_packed(g.view, ws) and not _long_weight_gradient(g, xs, ws)
    stacked = [xs] + ([] if packed else [ws]) + ([bs] if bs[0] is not None and not (packed and _lies_packed(g.view, bs)) else [])
    return packed, stacked


def _linear_copies(g: Group) -> list[list[Any]]:
    return _copied(g, _linear_operands(g)[1])


@group_rule(
    "linear",
    key=_linear_key,
    stage="batch_matmuls",
    options={"max_stack_bytes": MAX_STACK_BYTES, "packed_weights": True},
    copies=_linear_copies,
    reads_packed_parameters=True,  # packed weights: optimus::packed_linear reads them in place
    # packed_linear runs correctly under CUDA graphs but was not faster there (H200: towers32
    # 1.16x -> 0.99x Inductor's CUDA graphs): there packed weights are stacked
    cudagraph_options={"torch_ir": {"packed_weights": False}},
)
def batch_linear(g: Group, b: Any) -> dict[fx.Node, fx.Node]:
    """Linears of identical shapes on different inputs become one batched matmul.

    [linear(x_i, w_i, b_i)] -> unbind(baddbmm(stack(b_i)[:, None], stack(x_i), stack(w_i).mT))

    When the weights lie packed (``optimus.pack_parameters``) the stacks of weights and
    biases would be copies of what is already one buffer; then the batched matmul is
    ``optimus::packed_linear`` (``kernels/packed_linear/op.py``), which reads them through a
    strided view of that buffer (checked again on every call; a stack if they no longer
    lie packed) and hands back weight gradients in the parameters' own strides:

    [linear(x_i, w_i, b_i)] -> unbind(optimus::packed_linear(stack(x_i), [w_i], [b_i]))
    """
    xs = [c.input for c in g.members]
    ws = [c.args["weight"] for c in g.members]
    bs = [c.args.get("bias") for c in g.members]
    has_bias = bs[0] is not None
    if all(x is xs[0] for x in xs):
        # stack([x] * G) is G copies of x (Inductor materializes it for the bmm)
        g.decline("the members read one input: batch_linear_lhs concatenates their weights instead of stacking copies of it")
    packed, stacked = _linear_operands(g)
    _profitable(g, stacked)
    shape = emittable_shape(g.shape(xs[0]))
    k, n = shape[-1], g.shape(ws[0])[0] if isinstance(ws[0], fx.Node) else g.view.gm.get_parameter(ws[0].target).shape[0]
    if not is_int(n) or k == -1:
        g.decline("weights of symbolic size")
    x = b.stack(xs, 0)
    if len(shape) != 2:
        x = b.reshape(x, [len(xs), -1, k])
    if packed:
        y = b.emit("packed_linear", x, ws, bs if has_bias else [])
        if len(shape) != 2:
            y = b.reshape(y, [len(xs)] + shape[:-1] + [n])
        return _unbind_results(g, b, y)
    wt = b.permute(b.stack([b.value(w) for w in ws], 0), [0, 2, 1])
    if has_bias:
        bias = b.unsqueeze(b.stack([b.value(v) for v in bs], 0), 1)
        # baddbmm's shape function needs concrete sizes; with a symbolic batch: bmm + add
        y = b.baddbmm(bias, x, wt) if -1 not in shape else b.add(b.bmm(x, wt), bias)
    else:
        y = b.bmm(x, wt)
    if len(shape) != 2:
        y = b.reshape(y, [len(xs)] + shape[:-1] + [n])
    return _unbind_results(g, b, y)


# ----------------------------------------------------------------------- layer_norm
def _layer_norm_key(call: Call, view: GraphView) -> Hashable:
    a = call.args
    if view.rank(a["input"]) is None or emittable_shape(view.shape(a["input"])) is None:
        return None
    x = _sig(view, a["input"])
    weights = [_param_dtype_of(view, p) for p in (a["weight"], a["bias"]) if p is not None]
    compute = compute_dtype(view.dtype(a["input"]), *weights)
    if x is None or compute is None:
        return None
    # inputs of different dtypes group by the dtype the batch computes in (under autocast a
    # LayerNorm of a bf16 linear's output beside one of an fp32 residual: both in fp32)
    x = x[:2] + (str(compute),) + x[3:]
    return ("layer_norm", x, tuple(a["normalized_shape"]), a["eps"], _sig(view, a["weight"]), _sig(view, a["bias"]))


def _layer_norm_operands(g: Group) -> list[list[Any]]:
    xs = [c.input for c in g.members]
    ws = [c.args["weight"] for c in g.members]
    bs = [c.args["bias"] for c in g.members]
    return [xs] + ([ws] if ws[0] is not None else []) + ([bs] if bs[0] is not None else [])


def _layer_norm_copies(g: Group) -> list[list[Any]]:
    return _copied(g, _layer_norm_operands(g))


@group_rule("layer_norm", key=_layer_norm_key, levels=("torch_ir",), stage="batch_norms", options={"max_stack_bytes": MAX_STACK_BYTES}, copies=_layer_norm_copies)
def batch_layer_norm(g: Group, b: Any) -> dict[fx.Node, fx.Node]:
    """LayerNorms of one normalized shape become one LayerNorm plus one affine.

    [layer_norm(x_i, s, w_i, b_i, eps)] -> unbind(layer_norm(stack(x_i), s, eps) * stack(w_i) + stack(b_i))

    In reduced precision (bf16/fp16 inputs, also with fp32 weights as under autocast) the
    LayerNorm and the affine run in fp32 and the result is cast once to the members'
    dtype, as eager's layer_norm computes it (fp32 statistics and affine, one rounding);
    members whose inputs differ in dtype (a bf16 linear's output and an fp32 residual) group
    by that compute dtype, each result cast to its own member's dtype:

    [layer_norm(x_i: bf16, s, w_i: fp32, b_i: fp32)]
        -> unbind(cast(layer_norm(cast(stack(x_i), fp32), s) * stack(w_i) + stack(b_i), bf16))
    """
    a0 = g.members[0].args
    xs = [c.input for c in g.members]
    ws = [c.args["weight"] for c in g.members]
    bs = [c.args["bias"] for c in g.members]
    if _saves_symbolic_statistics(g):
        g.decline(
            "training with symbolic sizes and inputs of mixed layouts: the stacked LayerNorm's saved "
            "mean/rstd may get another layout from Inductor, and AOTAutograd restrides the backward's copy "
            "with the example sizes (a guard that specializes the batch)"
        )
    _profitable(g, _layer_norm_operands(g))
    results = [g.view.dtype(c.node) for c in g.members]
    inputs = [g.view.dtype(x) for x in xs]
    compute = compute_dtype(inputs[0], *(_param_dtype_of(g.view, p) for p in (ws[0], bs[0]) if p is not None))
    if None in results or compute is None:
        g.decline("the dtypes of the inputs, weights or results are unknown")
    rank = g.view.rank(xs[0])
    if len(set(inputs)) == 1:
        x = b.cast(b.stack(xs, 0), compute)
    else:  # inputs of several dtypes: each cast to the compute dtype first (exact: it holds them all)
        x = b.stack([b.cast(v, compute) for v in xs], 0)
    y = b.layer_norm(x, list(a0["normalized_shape"]), None, None, a0["eps"])
    norm_rank = len(a0["normalized_shape"])
    if ws[0] is not None:
        y = b.mul(y, b.cast(_affine_stack(g, b, ws, rank, norm_rank), compute))
    if bs[0] is not None:
        y = b.add(y, b.cast(_affine_stack(g, b, bs, rank, norm_rank), compute))
    if len(set(results)) == 1:
        return _unbind_results(g, b, b.cast(y, results[0]))
    return {c.node: b.cast(o, r) for c, o, r in zip(g.members, b.unbind(y, 0), results)}


def _param_dtype_of(view: GraphView, value: Any) -> Any:
    if isinstance(value, ParamRef):
        return view.gm.get_parameter(value.target).dtype
    return view.dtype(value)


def _saves_symbolic_statistics(g: Group) -> bool:
    """A gradient flows through the LayerNorms, their inputs have a symbolic size, and
    the inputs' strides are not provably the same (mixed layouts).

    Then the stacked LayerNorm saves mean/rstd of shape (G, *batch, 1) for the backward,
    and their layout is Inductor's choice. Measured on DHEN (torch 2.13, ``mark_dynamic``
    on the batch; one of each layer's five LayerNorm inputs is a transpose): Inductor
    laid the saved rstd of (5, s0, 8, 1) out as (8*s0, 1, s0, s0); AOTAutograd then
    re-strides the backward graph's placeholder with the forward's strides as ints of
    the example batch (``_aot_stage2b_bw_compile``: "real_stride can't be symbolic"),
    and the fake ``as_strided`` guards ``s0 > 16``: with the model's own ``s0 >= 16``,
    the batch is specialized (ConstraintViolationError; a recompile under
    ``dynamic=True``). That happens after Optimus's levels, where no guard can be
    refused, so the rule declines before it. Members of one layout (splitcat's split
    chunks, towers32's) were measured without a guard: they keep the rewrite."""
    view = g.view
    vals = [(view.tensor_val(c.input), view.tensor_val(c.node)) for c in g.members]
    if any(x is None or out is None for x, out in vals):
        return True
    if not any(out.requires_grad and any(is_symbolic(s) for s in x.shape) for x, out in vals):
        return False
    first = vals[0][0].stride()
    return not all(known_sizes_eq(x.stride(), first) for x, _ in vals[1:])


def _affine_stack(g: Group, b: Any, params: list[Any], rank: int, norm_rank: int) -> Any:
    stacked = b.stack([b.value(p) for p in params], 0)  # (G, *normalized_shape)
    for _ in range(rank - norm_rank):
        stacked = b.unsqueeze(stacked, 1)
    return stacked


# ------------------------------------------------------------------------ pointwise
BATCHABLE_POINTWISE = tuple(sorted(POINTWISE | {"dropout"}))


def _pointwise_key(call: Call, view: GraphView) -> Hashable:
    a = call.args
    x = a.get("input")
    if not isinstance(x, fx.Node) or view.rank(x) is None:
        return None
    if call.op == "dropout" and not (known_eq(a.get("training"), False) or known_eq(a.get("p", 0), 0)):
        # random (or possibly random: ``p`` or ``training`` may be graph inputs under
        # dynamic shapes): batching would draw different numbers than the members did
        return None
    parts = [call.op]
    for name in sorted(a):
        v = a[name]
        sig = _sig(view, v)
        if sig is None:
            return None
        parts.append((name, sig))
    out = view.tensor_val(call.node)
    if out is None or tuple(sym_key(s) for s in out.shape) != _sig(view, x)[1]:
        return None  # the op broadcasts its input: members would not line up
    return tuple(parts)


def _pointwise_operands(g: Group) -> tuple[list[str], list[list[Any]]]:
    """(the tensor arguments' names, their lists over the members)."""
    names = [k for k, v in g.members[0].args.items() if isinstance(v, fx.Node)]
    return names, [[c.args[k] for c in g.members] for k in names]


def _pointwise_copies(g: Group) -> list[list[Any]]:
    return _copied(g, _pointwise_operands(g)[1])


@group_rule(BATCHABLE_POINTWISE, key=_pointwise_key, stage="batch_elementwise", options={"max_stack_bytes": MAX_STACK_BYTES, "min_group": 3}, copies=_pointwise_copies)
def batch_pointwise(g: Group, b: Any) -> dict[fx.Node, fx.Node]:
    """Identical elementwise ops on different tensors become one op on their stack.

    [f(x_i, o_i, alpha=a)] -> unbind(f(stack(x_i), stack(o_i), alpha=a))
    Every argument is kept: scalars and options must agree, tensors are stacked (or
    shared), so alpha, rounding_mode, clamp bounds, nan_to_num values and the like stay.
    """
    names, lists = _pointwise_operands(g)
    if not stack_is_free(g.view, lists[names.index("input")]):
        g.decline("inputs are separate tensors: stacking them is a copy, and Inductor already fuses elementwise ops into their producers")
    _profitable(g, lists)
    rank = g.view.rank(g.members[0].input)
    args = dict(g.members[0].args)
    # one tensor shared by every member (dcnv2's x0 * expert_i) broadcasts against the
    # stacked operands: stacking it would be G copies, and its gradient a (G, ...) buffer
    # (68 MiB in dcnv2's backward) where the broadcast's is reduced inside the kernel
    shared = {k: all(v is vs[0] for v in vs) for k, vs in zip(names, lists)}
    broadcast_input = shared["input"] and not all(shared[k] for k in names if k != "input")
    for k, values in zip(names, lists):
        if k != "input":
            args[k] = _broadcast_stack(g, b, values, rank)
        else:
            args[k] = values[0] if broadcast_input else b.stack(values, 0)
    if g.op == "dropout":
        args["training"] = False  # only non-random dropouts are grouped (see the key)
    return _unbind_results(g, b, b.emit(g.op, **args))


# --------------------------------------------------------------------- mm / addmm
def _mm_key(call: Call, view: GraphView) -> Hashable:
    a = call.args
    if any(not isinstance(a[k], fx.Node) for k in ("input", "mat2")):
        return None
    sigs = tuple(_sig(view, a[k]) for k in ("bias", "input", "mat2") if k in a)
    if any(s is None for s in sigs):
        return None
    return (call.op, sigs, a.get("beta", 1), a.get("alpha", 1))


def _mm_operands(g: Group) -> list[list[Any]]:
    lists = [[c.input for c in g.members], [c.args["mat2"] for c in g.members]]
    return lists + ([[c.args["bias"] for c in g.members]] if g.op == "addmm" else [])


def _mm_copies(g: Group) -> list[list[Any]]:
    return _copied(g, _mm_operands(g))


@group_rule(("mm", "addmm"), key=_mm_key, levels=("aten_ir",), stage="batch_matmuls", options={"max_stack_bytes": MAX_STACK_BYTES}, copies=_mm_copies)
def batch_mm(g: Group, b: Any) -> dict[fx.Node, fx.Node]:
    """Matmuls of identical shapes become one batched matmul (Aten-IR, forward and backward).

    [mm(a_i, b_i)]          -> unbind(bmm(stack(a_i), stack(b_i)))
    [addmm(c_i, a_i, b_i)]  -> unbind(baddbmm(stack(c_i), stack(a_i), stack(b_i)))
    """
    a = [c.input for c in g.members]
    m2 = [c.args["mat2"] for c in g.members]
    p, m = g.shape(a[0]) or (None, None)
    q = (g.shape(m2[0]) or (None, None))[1]
    if None not in (p, m, q) and long_reduction(len(a), size_hint(p), size_hint(m), size_hint(q)):
        g.decline(f"a long reduction (k={size_hint(m)} for {size_hint(p)}x{size_hint(q)} outputs): one batched matmul runs slower than its members (see unbatch_long_reduction_bmm)")
    lists = _mm_operands(g)
    _profitable(g, lists)
    x, w = b.stack(a, 0), b.stack(m2, 0)
    if g.op == "mm":
        return _unbind_results(g, b, b.bmm(x, w))
    bias = b.stack(lists[2], 0)
    if g.view.rank(lists[2][0]) == 1:
        bias = b.unsqueeze(bias, 1)
    a0 = g.members[0].args
    return _unbind_results(g, b, b.baddbmm(bias, x, w, a0.get("beta", 1), a0.get("alpha", 1)))


# ------------------------------------------------------ gradient layout (backward)
def _feeds_gradients_only(m: Any) -> bool:
    """the transposed product is not only a gradient of a backward graph (through views)"""
    view = m.view
    product = m.product.node if isinstance(m.product, Call) else m.product
    if not view.outputs_are_gradients() or len(product.users) != 1:
        return False
    if "cast" in m.bindings and len(m.cast.users) != 1:
        return False
    stack, seen = [m.anchor.node], set()
    while stack:
        node = stack.pop()
        for user in node.users:
            if user.op == "output":
                continue
            call = view.classify(user)
            # views of the product, and casts (autocast's, to the parameters' dtype), which keep its layout
            if call is None or call.op not in ("select", "slice", "squeeze", "unbind", "getitem", "view", "reshape", "cast") or user in seen:
                return False
            seen.add(user)
            stack.append(user)
    return True


_PRODUCT = Op("bmm", Var("a"), Var("b")).bind("product")


@rule(Op("permute", Alt(_PRODUCT, Op("cast", _PRODUCT, Var("target")).bind("cast")), Lit([0, 2, 1])), where=[_feeds_gradients_only], levels=("aten_ir",), stage="convert")
def transpose_bmm_for_gradient_layout(m: Any, b: Any) -> fx.Node:
    """A transposed batched product handed back as gradients is computed transposed, so
    the gradients arrive in row-major layout (each weight's own strides: AccumulateGrad
    takes them as they are instead of copying each).

    bmm(a, b).permute(0, 2, 1)          -> bmm(b.permute(0, 2, 1), a.permute(0, 2, 1))
    cast(bmm(a, b), d).permute(0, 2, 1) -> cast(bmm(b.permute(0, 2, 1), a.permute(0, 2, 1)), d)
    (under autocast the bf16 product is cast to the parameters' fp32; a cast keeps its input's layout)

    This is the weight gradient of ``batch_linear``: its forward ``bmm(x, stack(w).mT)``
    differentiates to ``bmm(x.mT, dy).mT``, whose per-member slices have strides (1, N)
    against the parameters' (K, 1); ``bmm(dy.mT, x)`` gives the same values row-major.
    """
    y = b.bmm(b.permute(m.b, [0, 2, 1]), b.permute(m.a, [0, 2, 1]))
    return b.cast(y, m.target) if "cast" in m.bindings else y


# ------------------------------------------------------- long reductions (backward)
#: A batched matmul whose reduction is this long and this much longer than its outputs'
#: sides is unbatched (below). Measured on the H200 (docs/horizontal.md): the
#: weight gradients of interformer's 8 batched linears, bmm (8, 64..192, 33792) @ (8, 33792,
#: 64..128), ran in cuBLAS's 32x32-tile batched kernel at ~790 us each (4.7 ms per step,
#: 6 calls), where Inductor's 75 per-linear weight-gradient mm's of the same model took
#: 0.8 ms in all; towers32's and splitcat's (32, 64, 512) @ (32, 512, 64) stayed fast
#: (~15 us for what 32 mm's do in ~120 us). One product alone
#: (docs/results/bmm_long_reduction.py): 1177-1187 us batched against 218-266 us as mm's for
#: interformer's, 8470 against 156 us for wukong's, 32-42 against ~840 us for the short ones.
LONG_REDUCTION = 4096
LONG_REDUCTION_RATIO = 64
MAX_UNBATCH = 64


def long_reduction(batch: int, p: int, k: int, q: int) -> bool:
    """Is ``batch`` products of (p x k) @ (k x q) a reduction too long to batch? Each
    output tile of one batched kernel then loops over all of k while few tiles exist
    (batch * p * q is small): the GPU idles where per-product matmuls split k."""
    return batch <= MAX_UNBATCH and k >= LONG_REDUCTION and k >= LONG_REDUCTION_RATIO * max(p, q)


def _is_long_reduction(m: Any) -> bool:
    """the batched product is not a long reduction over few outputs (or its batch is not static)"""
    a, b = m.view.shape(m.a), m.view.shape(m.b)
    if a is None or b is None or len(a) != 3 or len(b) != 3:
        return False
    batch = concrete_int(a[0])
    return batch is not None and long_reduction(batch, size_hint(a[1]), size_hint(a[2]), size_hint(b[2]))


def _not_awaiting_gradient_layout(m: Any) -> bool:
    """transpose_bmm_for_gradient_layout transposes this product first (its result is handed back transposed)"""
    users = list(m.anchor.node.users)
    if len(users) != 1 or not m.view.outputs_are_gradients():
        return True
    call = m.view.classify(users[0])
    return not (call is not None and call.op == "permute" and list(call.args.get("dims", ())) == [0, 2, 1])


@rule(Op("bmm", Var("a"), Var("b")), where=[_is_long_reduction, _not_awaiting_gradient_layout], kind="horizontal", levels=("aten_ir",), stage="convert")
def unbatch_long_reduction_bmm(m: Any, b: Any) -> fx.Node:
    """A batched matmul with a long reduction and small outputs runs as one matmul per
    batch entry: each can split its reduction across the GPU, one batched kernel cannot.

    bmm(a, b) -> stack([mm(a[i], b[i]) for i in range(batch)])

    This is the weight gradient of ``batch_linear`` over many tokens, (G, N, tokens) @
    (G, tokens, K); the stack folds away when its users unbind it (unbind_stack_to_view),
    so each gradient is its own mm's output, in its parameter's layout. ``batch_mm``
    declines groups that this rule would take apart again (the same ``long_reduction``).
    """
    return b.stack([b.mm(x, y) for x, y in zip(b.unbind(m.a, 0), b.unbind(m.b, 0))], 0)
