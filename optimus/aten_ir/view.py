"""Aten-IR view: functional post-grad forward and backward graphs (also ``make_fx`` and
``torch.export`` graphs of aten ops).

Ops are ``OpOverload``s (``aten.split.Tensor``, ``aten.split_with_sizes.default``,
``aten.slice.Tensor``, ...); arguments are bound through each overload's schema, so
positional and keyword spellings read the same. Shapes come from ``node.meta["val"]``.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from ..core.levels import register_view
from ..core.view import BindError, GraphView, is_int
from ..core.vocab import EXTERN_OPS, UNARY_POINTWISE

aten = torch.ops.aten

# overload -> (canonical op, schema-name -> canonical-name renames)
_SELF = {"self": "input"}
_TABLE: dict[Any, tuple[str, dict[str, str]]] = {
    aten.split.Tensor: ("split", {**_SELF, "split_size": "sizes"}),
    aten.split_with_sizes.default: ("split", {**_SELF, "split_sizes": "sizes"}),
    aten.unbind.int: ("unbind", _SELF),
    aten.cat.default: ("cat", {}),
    aten.stack.default: ("stack", {}),
    aten.slice.Tensor: ("slice", _SELF),
    aten.select.int: ("select", _SELF),
    aten.view.default: ("view", {**_SELF, "size": "shape"}),
    aten._unsafe_view.default: ("view", {**_SELF, "size": "shape"}),
    aten.reshape.default: ("reshape", _SELF),
    aten.permute.default: ("permute", _SELF),
    aten.transpose.int: ("transpose", _SELF),
    aten.squeeze.dim: ("squeeze", {**_SELF, "dim": "dims"}),
    aten.squeeze.dims: ("squeeze", {**_SELF, "dim": "dims"}),
    aten.squeeze.default: ("squeeze", _SELF),
    aten.unsqueeze.default: ("unsqueeze", _SELF),
    aten.expand.default: ("expand", {**_SELF, "size": "shape"}),
    aten.clone.default: ("clone", _SELF),
    aten.mm.default: ("mm", _SELF),
    aten.bmm.default: ("bmm", _SELF),
    aten.addmm.default: ("addmm", {"self": "bias", "mat1": "input"}),
    aten.baddbmm.default: ("baddbmm", {"self": "bias", "batch1": "input", "batch2": "mat2"}),
    aten.sum.dim_IntList: ("sum", {**_SELF, "dim": "dims"}),
    aten.clamp.default: ("clamp", _SELF),
    aten.nan_to_num.default: ("nan_to_num", _SELF),
    aten.gelu.default: ("gelu", _SELF),
    aten.leaky_relu.default: ("leaky_relu", _SELF),
    aten.add.Tensor: ("add", _SELF),
    aten.add.Scalar: ("add", _SELF),
    aten.sub.Tensor: ("sub", _SELF),
    aten.sub.Scalar: ("sub", _SELF),
    aten.mul.Tensor: ("mul", _SELF),
    aten.mul.Scalar: ("mul", _SELF),
    aten.div.Tensor: ("div", _SELF),
    aten.div.Scalar: ("div", _SELF),
    aten.div.Tensor_mode: ("div", _SELF),
    aten.div.Scalar_mode: ("div", _SELF),
    torch.ops.prims.convert_element_type.default: ("cast", {"a": "input"}),
    aten._to_copy.default: ("cast", _SELF),
    aten.embedding.default: ("embedding", {"indices": "input"}),
    aten._embedding_bag.default: ("embedding_bag", {"indices": "input"}),
    aten._embedding_bag_forward_only.default: ("embedding_bag", {"indices": "input"}),
}
_EMBEDDING_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}
for _u in UNARY_POINTWISE:
    _packet = getattr(aten, _u, None)
    if _packet is not None and hasattr(_packet, "default"):
        _TABLE[_packet.default] = (_u, _SELF)

_EMIT: dict[str, Any] = {
    "unbind": aten.unbind.int,
    "cat": aten.cat.default,
    "stack": aten.stack.default,
    "slice": aten.slice.Tensor,
    "select": aten.select.int,
    "view": aten.view.default,
    "reshape": aten.reshape.default,
    "permute": aten.permute.default,
    "transpose": aten.transpose.int,
    "unsqueeze": aten.unsqueeze.default,
    "expand": aten.expand.default,
    "clone": aten.clone.default,
    "mm": aten.mm.default,
    "bmm": aten.bmm.default,
    "addmm": aten.addmm.default,
    "baddbmm": aten.baddbmm.default,
    "clamp": aten.clamp.default,
    "nan_to_num": aten.nan_to_num.default,
    "gelu": aten.gelu.default,
    "leaky_relu": aten.leaky_relu.default,
    "add": aten.add.Tensor,
    "sub": aten.sub.Tensor,
    "mul": aten.mul.Tensor,
    "div": aten.div.Tensor,
}
for _u in UNARY_POINTWISE:
    _packet = getattr(aten, _u, None)
    if _packet is not None and hasattr(_packet, "default"):
        _EMIT.setdefault(_u, _packet.default)


# Elementwise aten ops outside the named vocabulary ("pointwise:aten.ge.Scalar" ...),
# read through their schemas: lets rules such as hoisting see the comparison, masking and
# clamping ops that decompositions and backward graphs are full of.
GENERIC_POINTWISE: dict[str, Any] = {}


def _generic_pointwise_name(op: Any) -> str | None:
    if not isinstance(op, torch._ops.OpOverload):
        return None
    tags = getattr(op, "tags", ())
    if torch.Tag.pointwise not in tags or torch.Tag.nondeterministic_seeded in tags or op._schema.is_mutable:
        return None
    if len(op._schema.returns) != 1:
        return None
    name = f"pointwise:{op}"
    GENERIC_POINTWISE[name] = op
    return name


def bind_schema(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Bind a call of an ``OpOverload`` to its schema's argument names (with defaults)."""
    schema = op._schema
    out: dict[str, Any] = {}
    params = schema.arguments
    if len(args) > len(params):
        raise BindError("too many positional arguments")
    for p, v in zip(params, args):
        out[p.name] = v
    for k, v in kwargs.items():
        if k in out:
            raise BindError(f"argument {k!r} given twice")
        if not any(p.name == k for p in params):
            raise BindError(f"unexpected keyword argument {k!r}")
        out[k] = v
    for p in params:
        if p.name not in out:
            if p.has_default_value():
                out[p.name] = p.default_value
            elif p.type.kind() == "OptionalType":
                out[p.name] = None
            else:
                raise BindError(f"missing argument {p.name!r}")
    return out


def graph_kind(graph: fx.Graph) -> str:
    """Which graph AOTAutograd handed over, by its placeholder names: ``"backward"`` (it takes
    ``tangents``), ``"forward"`` (a partitioned training forward: ``primals``, no
    ``tangents``) or ``"inference"``."""
    names = [n.name for n in graph.nodes if n.op == "placeholder"]
    if any(n.startswith("tangents") for n in names):
        return "backward"
    return "forward" if any(n.startswith("primals") for n in names) else "inference"


class AtenIRView(GraphView):
    level = "aten_ir"
    meta_key = "val"

    def _classify(self, node: fx.Node) -> tuple[str, dict[str, Any]] | None:
        if node.op != "call_function":
            return None
        target = node.target
        if target is operator.getitem:
            src, index = node.args
            if isinstance(src, fx.Node) and is_int(index):
                return "getitem", {"input": src, "index": index}
            return None
        entry = _TABLE.get(target)
        if entry is None:
            generic = _generic_pointwise_name(target)
            if generic is None:
                return None
            entry = (generic, _SELF)
        op, renames = entry
        bound = bind_schema(target, node.args, dict(node.kwargs))
        args = {renames.get(k, k): v for k, v in bound.items()}
        if op == "squeeze" and "dims" not in args:
            args["dims"] = None
        if op == "sum":
            if args.pop("dtype", None) is not None or args.get("dims") is None:
                return None
            args["dims"] = list(args["dims"])
        if op == "clone":
            fmt = args.pop("memory_format", None)
            if fmt not in (None, torch.preserve_format):
                return None
        if op == "div":
            args.setdefault("rounding_mode", None)
        if op in ("add", "sub"):
            args.setdefault("alpha", 1)
        if op == "slice":
            args.setdefault("step", 1)
        if op in ("embedding", "embedding_bag"):
            args["max_norm"] = None  # F.embedding's renorm is a separate (mutating) op here
            if is_int(args["padding_idx"]) and args["padding_idx"] < 0:
                args["padding_idx"] = None  # aten's -1: no padding row
            if op == "embedding_bag":
                args["mode"] = _EMBEDDING_BAG_MODES.get(args["mode"], args["mode"])
        if op == "cast":
            return self._cast(args)
        if op == "select" and not is_int(args.get("index")) and not isinstance(args.get("index"), torch.SymInt):
            return None
        return op, args

    def _cast(self, args: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        """A conversion that changes only the dtype (``_to_copy`` may change the device,
        layout or memory format too: then it is no ``cast``)."""
        dtype, x = args["dtype"], args["input"]
        if not isinstance(dtype, torch.dtype) or not isinstance(x, fx.Node) or self.dtype(x) in (None, dtype):
            return None
        device = args.get("device")
        if device is not None and torch.device(device) != self.device(x):
            return None
        if args.get("layout") not in (None, torch.strided) or args.get("pin_memory") or args.get("non_blocking", False):
            return None
        if args.get("memory_format") not in (None, torch.preserve_format):
            return None
        return "cast", {"input": x, "dtype": dtype}

    def _emit_target(self, op: str, a: dict[str, Any]) -> tuple[str, Any, list[Any], dict[str, Any]]:
        cf = "call_function"
        if op == "getitem":
            return cf, operator.getitem, [a["input"], a["index"]], {}
        if op == "split":
            if isinstance(a["sizes"], (list, tuple)):
                return cf, aten.split_with_sizes.default, [a["input"], list(a["sizes"]), a["dim"]], {}
            return cf, aten.split.Tensor, [a["input"], a["sizes"], a["dim"]], {}
        if op == "squeeze":
            dims = a.get("dims")
            if dims is None:
                return cf, aten.squeeze.default, [a["input"]], {}
            return cf, aten.squeeze.dims, [a["input"], list(dims)], {}
        if op == "slice":
            return cf, aten.slice.Tensor, [a["input"], a["dim"], a["start"], a["end"], a.get("step", 1)], {}
        if op == "div" and a.get("rounding_mode") is not None:
            return cf, aten.div.Tensor_mode, [a["input"], a["other"]], {"rounding_mode": a["rounding_mode"]}
        if op in ("add", "sub"):
            kw = {"alpha": a["alpha"]} if a.get("alpha", 1) != 1 else {}
            return cf, _EMIT[op], [a["input"], a["other"]], kw
        if op == "div":
            return cf, aten.div.Tensor, [a["input"], a["other"]], {}
        if op in ("addmm", "baddbmm"):
            kw = {k: a[k] for k in ("beta", "alpha") if a.get(k, 1) != 1}
            return cf, _EMIT[op], [a["bias"], a["input"], a["mat2"]], kw
        if op == "gelu":
            kw = {"approximate": a["approximate"]} if a.get("approximate", "none") != "none" else {}
            return cf, aten.gelu.default, [a["input"]], kw
        if op == "nan_to_num":
            return cf, aten.nan_to_num.default, [a["input"], a["nan"], a["posinf"], a["neginf"]], {}
        if op in ("view", "reshape", "expand"):
            return cf, _EMIT[op], [a["input"], list(a["shape"])], {}
        if op == "permute":
            return cf, aten.permute.default, [a["input"], list(a["dims"])], {}
        if op == "sum":
            return cf, aten.sum.dim_IntList, [a["input"], list(a["dims"]), a["keepdim"]], {}
        if op == "cast":
            return cf, torch.ops.prims.convert_element_type.default, [a["input"], a["dtype"]], {}
        if op in EXTERN_OPS:
            target = EXTERN_OPS[op]
            return cf, target, [a[p.name] for p in target._schema.arguments], {}
        target = _EMIT.get(op) or GENERIC_POINTWISE.get(op)
        if target is None:
            raise KeyError(f"Aten-IR cannot emit {op!r}")
        names = [p.name for p in target._schema.arguments]
        canon = {"self": "input", "mat1": "input", "batch1": "input", "batch2": "mat2"}
        return cf, target, [a[canon.get(n, n)] for n in names if canon.get(n, n) in a], {}

    def emit_constant(self, t: torch.Tensor, before: fx.Node) -> fx.Node:
        # A buffer on the graph module; Inductor lowers get_attr tensors as constants.
        k = 0
        while hasattr(self.gm, f"_optimus_constant_{k}"):
            k += 1
        name = f"_optimus_constant_{k}"
        self.gm.register_buffer(name, t)
        with self.graph.inserting_before(before):
            node = self.graph.get_attr(name)
        node.meta[self.meta_key] = self.value_of_tensor(t)
        return node

    def can_emit(self, op: str) -> bool:
        # Inductor decomposes these before post-grad passes and has no lowering for them.
        return op not in ("stack", "linear", "layer_norm", "matmul", "einsum", "unflatten", "movedim", "flatten")

    def schema_of(self, op: str) -> tuple[str, ...]:
        target = GENERIC_POINTWISE.get(op)
        if target is not None:
            return tuple(_SELF.get(a.name, a.name) for a in target._schema.arguments)
        return super().schema_of(op)

    def protected_outputs(self) -> int | None:
        # A training forward graph returns (tokens, mutated inputs, user outputs,
        # intermediate bases, rng offset) and then the activations saved for backward.
        if self.graph_kind() != "forward":
            return None
        try:
            ctx = torch._guards.TracingContext.try_get()
            meta = getattr(ctx, "fw_metadata", None)
            return len(getattr(meta, "tokens", None) or ()) + int(meta.num_forward)
        except Exception:
            return None

    def graph_kind(self) -> str:
        return graph_kind(self.graph)

    def outputs_are_gradients(self) -> bool:
        return self.graph_kind() == "backward"

    def mutated_inputs(self, node: fx.Node) -> list[fx.Node]:
        target = node.target
        schema = getattr(target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable:
            return []
        try:
            bound = bind_schema(target, node.args, dict(node.kwargs))
        except BindError:
            return [a for a in node.all_input_nodes]
        written: list[fx.Node] = []
        for p in schema.arguments:
            if p.alias_info is not None and p.alias_info.is_write:
                fx.node.map_arg(bound.get(p.name), written.append)
        return written


register_view("aten_ir", AtenIRView)
