"""Torch-IR view: Dynamo's pre-grad FX graph (also ``symbolic_trace`` graphs).

Torch-IR spells one op many ways: ``torch.split(x, 2, dim=-1)``, ``x.split(2, -1)``,
``torch.concat`` / ``torch.cat`` / ``torch.concatenate``, ``F.linear`` (which *is*
``torch._C._nn.linear``), ``nn.ReLU`` modules, ``operator.add``. This view binds every
spelling to the canonical vocabulary and emits one canonical ``call_function`` form.
Shapes come from ``node.meta["example_value"]`` (Dynamo's fake tensors).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from ..core.levels import register_view
from ..core.view import REQUIRED, GraphView, bind, is_int
from ..core.regions import current_autocast
from ..core.vocab import EXTERN_OPS, MULTI_OUTPUT, SCHEMAS, UNARY_POINTWISE, ParamRef

R = REQUIRED

# name -> (canonical op, params, keyword aliases, varargs parameter)
# Shared by torch.<fn>, Tensor.<fn> used as a function, and x.<fn>() call_method forms
# (where the first parameter is ``self``).
_SIGNATURES: dict[str, tuple[str, list[tuple[str, Any]], dict[str, str], str | None]] = {
    "split": ("split", [("input", R), ("sizes", R), ("dim", 0)], {"tensor": "input", "self": "input", "split_size_or_sections": "sizes", "split_size": "sizes"}, None),
    "split_with_sizes": ("split", [("input", R), ("sizes", R), ("dim", 0)], {"self": "input", "split_sizes": "sizes"}, None),
    "unbind": ("unbind", [("input", R), ("dim", 0)], {"self": "input"}, None),
    "cat": ("cat", [("tensors", R), ("dim", 0)], {"axis": "dim"}, None),
    "concat": ("cat", [("tensors", R), ("dim", 0)], {"axis": "dim"}, None),
    "concatenate": ("cat", [("tensors", R), ("dim", 0)], {"axis": "dim"}, None),
    "stack": ("stack", [("tensors", R), ("dim", 0)], {}, None),
    "select": ("select", [("input", R), ("dim", R), ("index", R)], {"self": "input"}, None),
    "view": ("view", [("input", R), ("shape", R)], {"self": "input", "size": "shape"}, "shape"),
    "reshape": ("reshape", [("input", R), ("shape", R)], {"self": "input"}, "shape"),
    "permute": ("permute", [("input", R), ("dims", R)], {"self": "input"}, "dims"),
    "transpose": ("transpose", [("input", R), ("dim0", R), ("dim1", R)], {"self": "input"}, None),
    "squeeze": ("squeeze", [("input", R), ("dims", None)], {"self": "input", "dim": "dims"}, None),
    "unsqueeze": ("unsqueeze", [("input", R), ("dim", R)], {"self": "input"}, None),
    "flatten": ("flatten", [("input", R), ("start_dim", 0), ("end_dim", -1)], {"self": "input"}, None),
    "unflatten": ("unflatten", [("input", R), ("dim", R), ("sizes", R)], {"self": "input"}, None),
    "movedim": ("movedim", [("input", R), ("source", R), ("destination", R)], {"self": "input"}, None),
    "expand": ("expand", [("input", R), ("shape", R)], {"self": "input", "size": "shape"}, "shape"),
    "linear": ("linear", [("input", R), ("weight", R), ("bias", None)], {}, None),
    "mm": ("mm", [("input", R), ("mat2", R)], {"self": "input"}, None),
    "bmm": ("bmm", [("input", R), ("mat2", R)], {"self": "input"}, None),
    "matmul": ("matmul", [("input", R), ("other", R)], {"self": "input"}, None),
    "addmm": ("addmm", [("bias", R), ("input", R), ("mat2", R), ("beta", 1), ("alpha", 1)], {"self": "bias", "mat1": "input"}, None),
    "baddbmm": ("baddbmm", [("bias", R), ("input", R), ("mat2", R), ("beta", 1), ("alpha", 1)], {"self": "bias", "batch1": "input", "batch2": "mat2"}, None),
    "layer_norm": ("layer_norm", [("input", R), ("normalized_shape", R), ("weight", None), ("bias", None), ("eps", 1e-5), ("cudnn_enable", True)], {}, None),
    "clamp": ("clamp", [("input", R), ("min", None), ("max", None)], {"self": "input"}, None),
    "clip": ("clamp", [("input", R), ("min", None), ("max", None)], {"self": "input"}, None),
    "nan_to_num": ("nan_to_num", [("input", R), ("nan", 0.0), ("posinf", None), ("neginf", None)], {"self": "input"}, None),
    "detach": ("detach", [("input", R)], {"self": "input"}, None),
    "clone": ("clone", [("input", R), ("memory_format", None)], {"self": "input"}, None),
    "contiguous": ("contiguous", [("input", R), ("memory_format", torch.contiguous_format)], {"self": "input"}, None),
    "gelu": ("gelu", [("input", R), ("approximate", "none")], {"self": "input"}, None),
    "leaky_relu": ("leaky_relu", [("input", R), ("negative_slope", 0.01), ("inplace", False)], {"self": "input"}, None),
    "dropout": ("dropout", [("input", R), ("p", 0.5), ("training", True), ("inplace", False)], {}, None),
    "add": ("add", [("input", R), ("other", R), ("alpha", 1)], {"self": "input"}, None),
    "sub": ("sub", [("input", R), ("other", R), ("alpha", 1)], {"self": "input"}, None),
    "subtract": ("sub", [("input", R), ("other", R), ("alpha", 1)], {"self": "input"}, None),
    "mul": ("mul", [("input", R), ("other", R)], {"self": "input"}, None),
    "multiply": ("mul", [("input", R), ("other", R)], {"self": "input"}, None),
    "div": ("div", [("input", R), ("other", R), ("rounding_mode", None)], {"self": "input"}, None),
    "divide": ("div", [("input", R), ("other", R), ("rounding_mode", None)], {"self": "input"}, None),
    "true_divide": ("div", [("input", R), ("other", R)], {"self": "input"}, None),
    "einsum": ("einsum", [("equation", R), ("operands", R)], {}, "operands"),
    "sum": ("sum", [("input", R), ("dims", None), ("keepdim", False), ("dtype", None)], {"self": "input", "dim": "dims"}, None),
}
for _u in UNARY_POINTWISE:
    _SIGNATURES[_u] = (_u, [("input", R), ("inplace", False)], {"self": "input"}, None)

# Function objects -> signature name.
_FUNCTIONS: dict[Any, str] = {}


def _register_functions() -> None:
    for name in _SIGNATURES:
        for ns in (torch, torch.Tensor, F, torch.functional, torch.special):
            fn = getattr(ns, name, None)
            if fn is not None and callable(fn) and not isinstance(fn, type):
                _FUNCTIONS.setdefault(fn, name)
    _FUNCTIONS[torch._C._nn.linear] = "linear"
    _FUNCTIONS[F.layer_norm] = "layer_norm"
    _FUNCTIONS[torch.layer_norm] = "layer_norm"
    for fn in (torch.chunk, torch.Tensor.chunk):
        _FUNCTIONS[fn] = "chunk"
    for fn in (torch.narrow, torch.Tensor.narrow):
        _FUNCTIONS[fn] = "narrow"


_register_functions()

_OPERATORS: dict[Any, str] = {
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.truediv: "div",
    operator.matmul: "matmul",
    operator.neg: "neg",
}

_MODULE_UNARY: dict[type, str] = {
    nn.ReLU: "relu",
    nn.Tanh: "tanh",
    nn.Sigmoid: "sigmoid",
    nn.SiLU: "silu",
}

# Functions with no in-place mode (no ``inplace`` argument, name not ending in "_").
_NEVER_IN_PLACE = {
    fn
    for fn, name in _FUNCTIONS.items()
    if "inplace" not in [p for p, _ in _SIGNATURES.get(name, ("", [], {}, None))[1]] and not getattr(fn, "__name__", "").endswith("_")
} | {operator.getitem, operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.matmul, torch.tensor}

# F.embedding / F.embedding_bag (registered after _NEVER_IN_PLACE: with max_norm they renormalise
# the weight's rows in place). Keys are not torch names: torch.embedding(weight, input) differs.
_SIGNATURES["F.embedding"] = ("embedding", [("input", R), ("weight", R), ("padding_idx", None), ("max_norm", None), ("norm_type", 2.0), ("scale_grad_by_freq", False), ("sparse", False)], {}, None)
_SIGNATURES["F.embedding_bag"] = (
    "embedding_bag",
    [("input", R), ("weight", R), ("offsets", None), ("max_norm", None), ("norm_type", 2), ("scale_grad_by_freq", False), ("mode", "mean"), ("sparse", False), ("per_sample_weights", None), ("include_last_offset", False), ("padding_idx", None)],
    {},
    None,
)
_FUNCTIONS[F.embedding] = "F.embedding"
_FUNCTIONS[F.embedding_bag] = "F.embedding_bag"

# Conversions to a dtype, by method name (call_method nodes) and as functions.
_CAST_DTYPES: dict[str, torch.dtype] = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}
_CAST_METHODS = frozenset(_CAST_DTYPES) | {"to", "type"}
_CAST_FUNCTIONS: dict[Any, str] = {getattr(torch.Tensor, name): name for name in _CAST_METHODS}

_INPLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imatmul, operator.setitem}


def _split_size_arg(sizes: Any, length: Any) -> Any:
    """How ``torch.split`` is given ``sizes`` for a dim of ``length``: one int where the sizes
    are what that int gives (equal chunks, the last no larger, summing to a known static
    length, so the view reads the same list back), else the list. ``torch.split(x, 64)``
    traces to ``aten.split.Tensor``, which AOTAutograd's partitioner recomputes as a view in
    the backward, and a list to ``aten.split_with_sizes``, which it does not. After a list
    spelling, the partitioner saves every chunk's results as well as the tensor they are
    views of (splitcat training: 1.43x Inductor's peak memory on the H200 with this rule alone)."""
    if isinstance(sizes, list) and sizes and all(is_int(s) for s in sizes) and is_int(length) and sum(sizes) == length:
        step = sizes[0]
        if step > 0 and all(s == step for s in sizes[:-1]) and 0 < sizes[-1] <= step:
            return step
    return sizes


# Canonical op -> the callable emitted for it.
_EMIT_FUNCTIONS: dict[str, Any] = {
    "split": torch.split,
    "unbind": torch.unbind,
    "cat": torch.cat,
    "stack": torch.stack,
    "reshape": torch.reshape,
    "permute": torch.permute,
    "transpose": torch.transpose,
    "unsqueeze": torch.unsqueeze,
    "flatten": torch.flatten,
    "unflatten": torch.unflatten,
    "movedim": torch.movedim,
    "clone": torch.clone,
    "linear": F.linear,
    "mm": torch.mm,
    "bmm": torch.bmm,
    "matmul": torch.matmul,
    "layer_norm": F.layer_norm,
    "detach": torch.detach,
    "nan_to_num": torch.nan_to_num,
    "clamp": torch.clamp,
    "gelu": F.gelu,
    "silu": F.silu,
    "leaky_relu": F.leaky_relu,
    "dropout": F.dropout,
}
for _u in UNARY_POINTWISE:
    if _u not in _EMIT_FUNCTIONS:
        _EMIT_FUNCTIONS[_u] = getattr(torch, _u)


class TorchIRView(GraphView):
    level = "torch_ir"
    autograd = True
    meta_key = "example_value"

    def __init__(self, gm: fx.GraphModule, meta_key: str | None = None) -> None:
        super().__init__(gm)
        if meta_key is None:
            # Dynamo graphs carry "example_value"; FakeTensorProp'd / exported ones "val".
            has = {k for n in gm.graph.nodes for k in ("example_value", "val") if k in n.meta}
            meta_key = "example_value" if "example_value" in has or not has else "val"
        self.meta_key = meta_key

    def ambient_autocast(self) -> tuple[tuple[str, ...], ...]:
        """Dynamo traces a model called inside ``torch.autocast`` without a marker for it, and
        runs the pre-grad pass (and the compiled graph) under it: its ops' dtypes are the
        autocast ones."""
        return current_autocast()

    # ------------------------------------------------------------ classification
    def _classify(self, node: fx.Node) -> tuple[str, dict[str, Any]] | None:
        if node.op == "call_module":
            return self._classify_module(node)
        target = node.target
        if node.op == "call_method" and target in _CAST_METHODS:
            return self._classify_cast(node, target)
        if node.op == "call_function" and target in _CAST_FUNCTIONS:
            return self._classify_cast(node, _CAST_FUNCTIONS[target])
        if node.op == "call_method":
            name = target
            args = node.args
        elif target is operator.getitem:
            return self._classify_getitem(node)
        elif target in _OPERATORS:
            return self._classify_operator(node, _OPERATORS[target])
        else:
            name = _FUNCTIONS.get(target)
            args = node.args
            if name is None:
                return None
        if name == "chunk":
            return self._classify_chunk(node)
        if name == "narrow":
            return self._classify_narrow(node)
        sig = _SIGNATURES.get(name)
        if sig is None:
            return None
        op, params, aliases, varargs = sig
        bound = bind(args, dict(node.kwargs), params, aliases, varargs)
        if bound.pop("inplace", False):
            return None  # an in-place variant: a mutation, not a canonical op
        if "out" in node.kwargs:
            return None
        if op in ("embedding", "embedding_bag"):
            bound.pop("norm_type")
        if op == "layer_norm":
            bound.pop("cudnn_enable", None)
            bound["normalized_shape"] = list(bound["normalized_shape"]) if isinstance(bound["normalized_shape"], (list, tuple, torch.Size)) else [bound["normalized_shape"]]
        if op in ("clone", "contiguous"):
            fmt = bound.pop("memory_format", None)
            if fmt not in (None, torch.preserve_format, torch.contiguous_format):
                return None
            if op == "clone" and fmt is torch.contiguous_format:
                return None
        if op == "view" and not all(is_int(s) or isinstance(s, (fx.Node, torch.SymInt)) for s in bound["shape"]):
            return None  # x.view(dtype)
        if op == "sum":
            if bound.pop("dtype", None) is not None or bound["dims"] is None:
                return None
            dims = bound["dims"]
            bound["dims"] = [dims] if is_int(dims) else list(dims)
        if op == "div" and "rounding_mode" not in bound:
            bound["rounding_mode"] = None
        if op in ("add", "sub", "mul", "div") and not self._is_tensor_result(node):
            return None  # SymInt / Python-number arithmetic
        return op, bound

    def _is_tensor_result(self, node: fx.Node) -> bool:
        v = self.val(node)
        return v is None or isinstance(v, torch.Tensor)

    def _classify_operator(self, node: fx.Node, name: str) -> tuple[str, dict[str, Any]] | None:
        if node.kwargs or not self._is_tensor_result(node):
            return None
        if name == "neg":
            return ("neg", {"input": node.args[0]}) if len(node.args) == 1 else None
        a, b = node.args
        if name == "matmul":
            return "matmul", {"input": a, "other": b}
        if name in ("add", "sub"):
            return name, {"input": a, "other": b, "alpha": 1}
        if name == "div":
            return "div", {"input": a, "other": b, "rounding_mode": None}
        return name, {"input": a, "other": b}

    def _classify_getitem(self, node: fx.Node) -> tuple[str, dict[str, Any]] | None:
        src, index = node.args
        if not isinstance(src, fx.Node):
            return None
        src_val = self.val(src)
        if isinstance(src_val, (tuple, list)) or (src_val is None and self._is_multi_output(src)):
            return ("getitem", {"input": src, "index": index}) if is_int(index) else None
        if not isinstance(src_val, torch.Tensor):
            return None
        return _tensor_index(src, index)

    def _is_multi_output(self, node: fx.Node) -> bool:
        call = self.classify(node)
        return call is not None and call.op in MULTI_OUTPUT

    def _classify_cast(self, node: fx.Node, method: str) -> tuple[str, dict[str, Any]] | None:
        """``x.to(dtype)``, ``x.float()``, ``x.type(dtype)``, ...: a ``cast`` when it changes
        the dtype (else it returns ``x`` itself: no op of the vocabulary)."""
        if method == "to":
            b = bind(node.args, dict(node.kwargs), [("input", R), ("dtype", R), ("non_blocking", False), ("copy", False), ("memory_format", None)], {"self": "input"})
            if b["copy"] is not False or b["memory_format"] not in (None, torch.preserve_format):
                return None
        elif method == "type":
            b = bind(node.args, dict(node.kwargs), [("input", R), ("dtype", R), ("non_blocking", False)], {"self": "input"})
        else:
            b = bind(node.args, dict(node.kwargs), [("input", R), ("memory_format", torch.preserve_format)], {"self": "input"})
            if b["memory_format"] is not torch.preserve_format:
                return None
            b["dtype"] = _CAST_DTYPES[method]
        dtype, x = b["dtype"], b["input"]
        if not isinstance(dtype, torch.dtype) or not isinstance(x, fx.Node):
            return None  # x.to(device), x.to(other), x.type("torch.HalfTensor"), ...
        current = self.dtype(x)
        if current is None or current == dtype:
            return None
        return "cast", {"input": x, "dtype": dtype}

    def _classify_chunk(self, node: fx.Node) -> tuple[str, dict[str, Any]] | None:
        b = bind(node.args, dict(node.kwargs), [("input", R), ("chunks", R), ("dim", 0)], {"self": "input"})
        shape = self.shape(b["input"])
        if shape is None or not is_int(b["chunks"]) or b["chunks"] <= 0 or not is_int(b["dim"]):
            return None
        dim = b["dim"] % len(shape) if -len(shape) <= b["dim"] < len(shape) else None
        if dim is None or not is_int(shape[dim]):
            return None
        size = shape[dim]
        if size == 0:  # torch.chunk of an empty dim returns `chunks` empty chunks
            return "split", {"input": b["input"], "sizes": [0] * b["chunks"], "dim": dim}
        step = max(1, math.ceil(size / b["chunks"]))
        return "split", {"input": b["input"], "sizes": step, "dim": dim}

    def _classify_narrow(self, node: fx.Node) -> tuple[str, dict[str, Any]] | None:
        b = bind(node.args, dict(node.kwargs), [("input", R), ("dim", R), ("start", R), ("length", R)], {"self": "input"})
        if not (is_int(b["start"]) and is_int(b["length"]) and b["start"] >= 0 and b["length"] >= 0):
            return None
        return "slice", {"input": b["input"], "dim": b["dim"], "start": b["start"], "end": b["start"] + b["length"], "step": 1}

    def _classify_module(self, node: fx.Node) -> tuple[str, dict[str, Any]] | None:
        try:
            mod = self.gm.get_submodule(node.target)
        except AttributeError:
            return None
        if node.kwargs or len(node.args) != 1:
            return None
        x = node.args[0]
        if getattr(mod, "inplace", False):
            return None
        if type(mod) in _MODULE_UNARY:
            return _MODULE_UNARY[type(mod)], {"input": x}
        if type(mod) is nn.GELU:
            return "gelu", {"input": x, "approximate": mod.approximate}
        if type(mod) is nn.Dropout:
            return "dropout", {"input": x, "p": mod.p, "training": mod.training}
        if type(mod) is nn.Linear:
            bias = ParamRef(f"{node.target}.bias") if mod.bias is not None else None
            return "linear", {"input": x, "weight": ParamRef(f"{node.target}.weight"), "bias": bias}
        if type(mod) is nn.LayerNorm:
            w = ParamRef(f"{node.target}.weight") if mod.weight is not None else None
            b = ParamRef(f"{node.target}.bias") if mod.bias is not None else None
            return "layer_norm", {"input": x, "normalized_shape": list(mod.normalized_shape), "weight": w, "bias": b, "eps": mod.eps}
        return None

    # ----------------------------------------------------------------- emission
    def _emit_target(self, op: str, a: dict[str, Any]) -> tuple[str, Any, list[Any], dict[str, Any]]:
        cf = "call_function"
        if op == "getitem":
            return cf, operator.getitem, [a["input"], a["index"]], {}
        if op == "slice":
            step = a.get("step", 1)
            idx = (slice(None),) * a["dim"] + (slice(a["start"], a["end"], None if step == 1 else step),)
            return cf, operator.getitem, [a["input"], idx], {}
        if op == "select":
            idx = (slice(None),) * a["dim"] + (a["index"],)
            return cf, operator.getitem, [a["input"], idx], {}
        if op in ("view", "expand"):
            return "call_method", op, [a["input"], list(a["shape"])], {}
        if op == "contiguous":
            return "call_method", "contiguous", [a["input"]], {}
        if op == "cast":
            return "call_method", "to", [a["input"], a["dtype"]], {}
        if op == "split":
            shape = self.shape(a["input"]) if isinstance(a["input"], fx.Node) else None
            length = shape[a["dim"]] if shape is not None and is_int(a["dim"]) and 0 <= a["dim"] < len(shape) else None
            return cf, torch.split, [a["input"], _split_size_arg(a["sizes"], length), a["dim"]], {}
        if op == "squeeze":
            dims = a.get("dims")
            return cf, torch.squeeze, [a["input"]] + ([tuple(dims)] if dims is not None else []), {}
        if op in ("add", "sub"):
            if a.get("alpha", 1) == 1:
                return cf, (operator.add if op == "add" else operator.sub), [a["input"], a["other"]], {}
            return cf, getattr(torch, op), [a["input"], a["other"]], {"alpha": a["alpha"]}
        if op == "mul":
            return cf, operator.mul, [a["input"], a["other"]], {}
        if op == "div":
            if a.get("rounding_mode") is None:
                return cf, operator.truediv, [a["input"], a["other"]], {}
            return cf, torch.div, [a["input"], a["other"]], {"rounding_mode": a["rounding_mode"]}
        if op == "addmm" or op == "baddbmm":
            kw = {k: a[k] for k in ("beta", "alpha") if a.get(k, 1) != 1}
            return cf, getattr(torch, op), [a["bias"], a["input"], a["mat2"]], kw
        if op == "einsum":
            return cf, torch.einsum, [a["equation"], *a["operands"]], {}
        if op == "sum":
            return cf, torch.sum, [a["input"], list(a["dims"]), a["keepdim"]], {}
        if op == "nan_to_num":
            return cf, torch.nan_to_num, [a["input"]], {"nan": a["nan"], "posinf": a["posinf"], "neginf": a["neginf"]}
        if op == "gelu":
            return cf, F.gelu, [a["input"]], ({"approximate": a["approximate"]} if a.get("approximate", "none") != "none" else {})
        if op == "dropout":
            return cf, F.dropout, [a["input"]], {"p": a["p"], "training": a["training"]}
        fn = _EMIT_FUNCTIONS.get(op) or EXTERN_OPS.get(op)
        if fn is None:
            raise KeyError(f"Torch-IR cannot emit {op!r}")
        return cf, fn, [a[name] for name in SCHEMAS[op] if name in a], {}

    def emit_constant(self, t: torch.Tensor, before: fx.Node) -> fx.Node:
        # torch.tensor(...) in the pre-grad graph becomes a lifted constant under AOTAutograd.
        with self.graph.inserting_before(before):
            node = self.graph.call_function(torch.tensor, (t.tolist(),), {"dtype": t.dtype, "device": t.device})
        try:
            self.infer_meta(node)
        except BaseException:
            self.graph.erase_node(node)
            raise
        return node

    # -------------------------------------------------------------- side effects
    def mutated_inputs(self, node: fx.Node) -> list[fx.Node]:
        if node.op == "call_function" and node.target in _NEVER_IN_PLACE and "out" not in node.kwargs:
            return []  # the common case, decided by one lookup
        first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        written: list[fx.Node] = []
        if node.op == "call_method":
            name = node.target
            if isinstance(name, str) and name.endswith("_") and not name.startswith("__") and first is not None:
                written.append(first)
        elif node.op == "call_function":
            target = node.target
            name = getattr(target, "__name__", "") or ""
            if target in _INPLACE_OPERATORS and first is not None:
                written.append(first)
            elif isinstance(target, torch._ops.OpOverload) or isinstance(target, torch._ops.OpOverloadPacket):
                schema = getattr(target, "_schema", None)
                if schema is not None and schema.is_mutable and first is not None:
                    written.append(first)
            elif name.endswith("_") and not name.startswith("__") and first is not None:
                written.append(first)
            elif node.kwargs.get("inplace") is True and first is not None:
                written.append(first)
            elif target in (F.embedding, F.embedding_bag):
                weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
                max_norm = node.args[3] if len(node.args) > 3 else node.kwargs.get("max_norm")
                if max_norm is not None and isinstance(weight, fx.Node):
                    written.append(weight)  # rows renormalised in place
            elif target in _FUNCTIONS and first is not None:
                sig = _SIGNATURES.get(_FUNCTIONS[target])
                if sig is not None:
                    names = [p for p, _ in sig[1]]
                    if "inplace" in names and len(node.args) > names.index("inplace") and node.args[names.index("inplace")] is True:
                        written.append(first)
        elif node.op == "call_module":
            try:
                mod = self.gm.get_submodule(node.target)
            except AttributeError:
                mod = None
            if getattr(mod, "inplace", False) and first is not None:
                written.append(first)
        if "out" in node.kwargs:
            fx.node.map_arg(node.kwargs["out"], written.append)
        return written


def _tensor_index(src: fx.Node, index: Any) -> tuple[str, dict[str, Any]] | None:
    """``x[...]`` with one non-trivial entry: a slice (any step > 0) or an int (select)."""
    if not isinstance(index, tuple):
        index = (index,)
    found: tuple[int, Any] | None = None
    for pos, entry in enumerate(index):
        if isinstance(entry, slice) and entry == slice(None):
            continue
        if found is not None:
            return None
        found = (pos, entry)
    if found is None:
        return None
    dim, entry = found
    if isinstance(entry, slice):
        step = 1 if entry.step is None else entry.step
        if not is_int(step) or step <= 0:
            return None
        if not all(v is None or is_int(v) for v in (entry.start, entry.stop)):
            return None
        return "slice", {"input": src, "dim": dim, "start": entry.start, "end": entry.stop, "step": step}
    if is_int(entry):
        return "select", {"input": src, "dim": dim, "index": entry}
    return None


register_view("torch_ir", TorchIRView)
