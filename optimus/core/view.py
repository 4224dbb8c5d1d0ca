"""Graph views: how one IR level is read as, and written from, the canonical vocabulary.

A ``GraphView`` wraps one ``fx.GraphModule`` of a given level and answers three questions
for the rules and the driver:

* ``classify(node)``: the node as a canonical ``Call`` (or ``None`` if it is not an op of
  the vocabulary, or is spelled in a way the view cannot bind safely);
* ``emit(op, args)``: a new node for a canonical op in this level's own form, with its
  shape metadata filled in;
* shape facts: ``shape(node)``, ``dtype(node)``, ``val(node)``.

Subclasses supply per-level tables (``optimus.torch_ir.view``, ``optimus.aten_ir.view``).
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any, Iterator, Sequence

import torch
import torch.fx as fx

from .collectives import is_barrier
from .gradflow import GradFlow
from .regions import Regions, is_marker
from .vocab import SCHEMAS, Call

REQUIRED = object()  # marker: parameter without a default


class BindError(Exception):
    """Arguments that do not fit the expected signature (the node stays unclassified)."""


def bind(
    args: Sequence[Any],
    kwargs: dict[str, Any],
    params: Sequence[tuple[str, Any]],
    aliases: dict[str, str] | None = None,
    varargs: str | None = None,
) -> dict[str, Any]:
    """Bind positional and keyword arguments to canonical parameter names.

    ``params`` lists ``(name, default)`` in positional order (``REQUIRED`` for no default).
    ``aliases`` maps keyword spellings to canonical names (``split_size_or_sections`` ->
    ``sizes``). ``varargs`` names a parameter that may be given as ``*ints`` or as one
    sequence (``x.view(2, 3)`` and ``x.view((2, 3))``), and must then be the last
    positional parameter before keyword-only ones.
    """
    aliases = aliases or {}
    out: dict[str, Any] = {}
    names = [p for p, _ in params]
    positional = list(args)
    if varargs is not None:
        vi = names.index(varargs)
        if len(positional) > vi:
            rest = positional[vi:]
            if len(rest) == 1 and isinstance(rest[0], (list, tuple, torch.Size)):
                value = list(rest[0])
            else:
                value = list(rest)
            positional = positional[:vi] + [value]
    if len(positional) > len(names):
        raise BindError(f"too many positional arguments ({len(positional)} > {len(names)})")
    for name, value in zip(names, positional):
        out[name] = value
    for key, value in kwargs.items():
        name = aliases.get(key, key)
        if name not in names:
            raise BindError(f"unexpected keyword argument {key!r}")
        if name in out:
            raise BindError(f"argument {name!r} given twice")
        if name == varargs and isinstance(value, (tuple, torch.Size)):
            value = list(value)
        out[name] = value
    for name, default in params:
        if name not in out:
            if default is REQUIRED:
                raise BindError(f"missing argument {name!r}")
            out[name] = default
    return out


def normalize_dim(dim: Any, rank: int | None) -> Any:
    """``dim`` as a non-negative int when the rank is known and the dim in range, else as is."""
    if isinstance(dim, int) and not isinstance(dim, bool) and rank is not None:
        if -rank <= dim < rank:
            return dim % rank
    return dim


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class GraphView:
    """Reads and writes one graph through the canonical vocabulary.

    Subclasses set ``level`` and ``meta_key`` and implement ``_classify`` and
    ``_emit_target``.
    """

    level: str = "?"
    meta_key: str = "val"
    # whether values still carry autograd's meaning (requires_grad, cuts): Torch-IR's do;
    # after AOTAutograd nothing requires grad
    autograd: bool = False

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.graph = gm.graph
        self._fake_mode: Any = None
        self._fake_mode_known = False
        self._foreign: dict[int, tuple[Any, Any]] = {}  # id(fake of another mode) -> (it, remade in ours)
        # node -> (args tuple, kwargs dict, Call): valid while the node's arguments are the
        # same objects (FX replaces the tuple whenever an input is rewired).
        self._calls: dict[fx.Node, tuple[Any, Any, Call | None]] = {}
        self._regions: Regions | None = None
        self._grad_flow: GradFlow | None = None
        self._ambient_grad = torch.is_grad_enabled()  # the caller's mode: passes run inside the compile

    def grad_flow(self) -> GradFlow:
        """Where gradients flow (``core.gradflow``; whether the graph trains is read once)."""
        if self._grad_flow is None:
            self._grad_flow = GradFlow(self.graph, self.val, self.regions(), self._ambient_grad, self.autograd)
        return self._grad_flow

    def regions(self) -> Regions:
        """The grad-mode / inference-mode / autocast regions of the graph
        (``core.regions``; read once: rewrites never add, move or remove a marker)."""
        if self._regions is None:
            self._regions = Regions(self.graph, self.ambient_autocast())
        return self._regions

    def ambient_autocast(self) -> tuple[tuple[str, ...], ...]:
        """The autocast the graph runs under without a marker of its own (``Regions``):
        none at levels where casts are explicit ops."""
        return ()

    # ------------------------------------------------------------------ metadata
    def val(self, node: Any) -> Any:
        """The node's example value (FakeTensor, tensor, tuple, SymInt) or ``None``."""
        if isinstance(node, fx.Node):
            return node.meta.get(self.meta_key)
        return None

    def tensor_val(self, node: Any) -> torch.Tensor | None:
        v = self.val(node)
        return v if isinstance(v, torch.Tensor) else None

    def shape(self, node: Any) -> tuple[Any, ...] | None:
        """The node's sizes; a ``SymInt`` the shape environment folded to a constant (a dim
        Dynamo specialized, under ``dynamic=True`` every dim starts symbolic) as an int,
        so rules see ``(s0, 8)``, not ``(s0, SymInt(8))``."""
        v = self.tensor_val(node)
        return tuple(_constant_or_symbol(s) for s in v.shape) if v is not None else None

    def rank(self, node: Any) -> int | None:
        v = self.tensor_val(node)
        return v.dim() if v is not None else None

    def dtype(self, node: Any) -> torch.dtype | None:
        v = self.tensor_val(node)
        return v.dtype if v is not None else None

    def device(self, node: Any) -> torch.device | None:
        v = self.tensor_val(node)
        return v.device if v is not None else None

    # ------------------------------------------------------------ classification
    def classify(self, node: fx.Node) -> Call | None:
        """The node as a canonical ``Call``, or ``None``."""
        if node.op not in ("call_function", "call_method", "call_module"):
            return None
        cached = self._calls.get(node)
        if cached is not None and cached[0] is node.args and cached[1] is node.kwargs:
            return cached[2]
        try:
            found = self._classify(node)
        except BindError:
            found = None
        call = None if found is None else Call(found[0], node, self._normalize(found[0], node, found[1]))
        self._calls[node] = (node.args, node.kwargs, call)
        return call

    def _classify(self, node: fx.Node) -> tuple[str, dict[str, Any]] | None:
        raise NotImplementedError

    def _normalize(self, op: str, node: fx.Node, args: dict[str, Any]) -> dict[str, Any]:
        """Canonical argument values: non-negative dims, split sizes as lists, ..."""
        inp = args.get("input")
        rank = self.rank(inp)
        shape = self.shape(inp)
        if op in ("split", "unbind", "select", "slice", "unsqueeze", "flatten", "unflatten"):
            if op == "unsqueeze":
                args["dim"] = normalize_dim(args["dim"], None if rank is None else rank + 1)
            elif op == "flatten":
                args["start_dim"] = normalize_dim(args["start_dim"], rank)
                args["end_dim"] = normalize_dim(args["end_dim"], rank)
            else:
                args["dim"] = normalize_dim(args["dim"], rank)
        if op in ("cat", "stack"):
            tensors = args["tensors"]
            if isinstance(tensors, (list, tuple)):
                args["tensors"] = list(tensors)
                first = next((t for t in tensors if self.rank(t) is not None), None)
                r = self.rank(first) if first is not None else None
                if op == "stack" and r is not None:
                    r += 1
                args["dim"] = normalize_dim(args["dim"], r)
        if op == "split":
            args["sizes"] = self._split_sizes(args["sizes"], shape, args["dim"])
        if op == "slice" and shape is not None and is_int(args["dim"]) and args["dim"] < len(shape):
            size = shape[args["dim"]]
            args["start"], args["end"] = _clamp_slice(args.get("start"), args.get("end"), size)
        if op == "select" and shape is not None and is_int(args["dim"]) and args["dim"] < len(shape):
            size = shape[args["dim"]]
            if is_int(args["index"]) and is_int(size) and -size <= args["index"] < 0:
                args["index"] += size
        if op == "squeeze":
            dims = args.get("dims")
            if is_int(dims):
                dims = (dims,)
            if dims is not None:
                dims = tuple(normalize_dim(d, rank) for d in dims)
            args["dims"] = dims
        if op == "permute":
            args["dims"] = [normalize_dim(d, rank) for d in args["dims"]]
        if op == "sum" and isinstance(args.get("dims"), list):
            args["dims"] = [normalize_dim(d, rank) for d in args["dims"]]
        if op == "transpose":
            args["dim0"] = normalize_dim(args["dim0"], rank)
            args["dim1"] = normalize_dim(args["dim1"], rank)
        if op in ("view", "reshape", "expand"):
            args["shape"] = list(args["shape"])
        return args

    @staticmethod
    def _split_sizes(sizes: Any, shape: tuple[Any, ...] | None, dim: Any) -> Any:
        if isinstance(sizes, (list, tuple)):
            return list(sizes)
        if is_int(sizes) and sizes >= 0 and shape is not None and is_int(dim) and dim < len(shape):
            total = shape[dim]
            if is_int(total):
                if total == 0:
                    return [0]  # torch returns one empty chunk, whatever the split size
                if sizes == 0:
                    return sizes  # invalid (torch raises): leave it as written
                full, rem = divmod(total, sizes)
                return [sizes] * full + ([rem] if rem else [])
        return sizes

    # ----------------------------------------------------------------- emission
    def schema_of(self, op: str) -> tuple[str, ...]:
        """Canonical argument names of ``op`` (levels may know ops beyond the vocabulary)."""
        if op == "getitem":
            return ("input", "index")
        if op not in SCHEMAS:
            raise KeyError(f"unknown canonical op {op!r}")
        return SCHEMAS[op]

    def can_emit(self, op: str) -> bool:
        """Whether this level has ``op`` as a real op (Aten-IR has no ``stack``: it is decomposed)."""
        return True

    def emit(self, op: str, args: dict[str, Any]) -> fx.Node:
        """Create a node for canonical ``op`` at the graph's insertion point, with metadata."""
        kind, target, pargs, kwargs = self._emit_target(op, args)
        node = self.graph.create_node(kind, target, tuple(pargs), kwargs)
        try:
            self.infer_meta(node)
        except BaseException:
            self.graph.erase_node(node)  # never leave a half-made node behind
            raise
        return node

    def _emit_target(self, op: str, args: dict[str, Any]) -> tuple[str, Any, list[Any], dict[str, Any]]:
        """(fx op kind, target, positional args, kwargs) spelling ``op`` at this level."""
        raise NotImplementedError

    def emit_constant(self, t: torch.Tensor, before: fx.Node) -> fx.Node:
        """A node producing the constant tensor ``t`` (inserted before ``before``)."""
        raise NotImplementedError

    def is_canonical_form(self, node: fx.Node, call: Call) -> bool:
        """Is ``node`` spelled exactly as ``emit`` would spell ``call``?"""
        kind, target, pargs, kwargs = self._emit_target(call.op, call.args)
        return node.op == kind and node.target == target and tuple(node.args) == tuple(pargs) and dict(node.kwargs) == kwargs

    # ---------------------------------------------------------------- fake meta
    def fake_mode(self) -> Any:
        """The graph's own fake mode: the one of its metadata (the first fake value's;
        Dynamo, AOTAutograd, ``torch.export`` and symbolic ``make_fx`` use one per
        graph). New nodes' metadata is computed in it; never in a mode of our own."""
        if not self._fake_mode_known:
            from torch._subclasses.fake_tensor import FakeTensor

            for n in self.graph.nodes:
                v = n.meta.get(self.meta_key)
                if isinstance(v, (tuple, list)):
                    v = next((x for x in v if isinstance(x, FakeTensor)), None)
                if isinstance(v, FakeTensor):
                    self._fake_mode = v.fake_mode
                    break
            self._fake_mode_known = True
        return self._fake_mode

    def _in_graph_mode(self, value: Any) -> Any:
        """``value`` as a fake tensor of the graph's mode.

        ``make_fx`` in its default (real) tracing mode records every node's metadata in a
        fake mode of its own; fake tensors of two modes cannot meet in one op ("Mixing
        fake modes NYI"). A foreign one is remade in the graph's mode with the same
        size, strides, storage offset, dtype and device (cached, so one value stays one
        tensor across evaluations).
        """
        from torch._subclasses.fake_tensor import FakeTensor

        mode = self.fake_mode()
        if not isinstance(value, FakeTensor) or mode is None or value.fake_mode is mode:
            return value
        cached = self._foreign.get(id(value))
        if cached is not None and cached[0] is value:
            return cached[1]
        with mode, torch.no_grad():
            storage = torch.empty(value.untyped_storage().nbytes() // max(value.element_size(), 1), dtype=value.dtype, device=value.device)
            remade = storage.as_strided(value.shape, value.stride(), value.storage_offset())
        remade.requires_grad_(value.requires_grad)
        self._foreign[id(value)] = (value, remade)
        return remade

    def value_of_tensor(self, t: torch.Tensor) -> Any:
        """The metadata value for a real tensor (a fake copy when the graph is fake).

        Static sizes: a constant's sizes are what they are; a mode with a shape
        environment would otherwise give them fresh symbols, and every rule reading them
        would then need a guard to learn them back."""
        mode = self.fake_mode()
        return mode.from_tensor(t, static_shapes=True) if mode is not None else t

    def _run_context(self, node: fx.Node | None = None) -> contextlib.AbstractContextManager[Any]:
        """Fake mode, no guards, no grad; and the autocast contexts ``node`` runs under
        (its region's), so an op's result dtype is the one the program will produce."""
        mode = self.fake_mode()
        stack = contextlib.ExitStack()
        if node is not None:
            for entry in self.regions().autocast_entries(node):
                stack.enter_context(_autocast_from(entry, node))
        if mode is not None:
            stack.enter_context(mode)
            if getattr(mode, "shape_env", None) is not None:
                stack.enter_context(mode.shape_env.suppress_guards())
                # The fake-tensor cache re-creates a view's output with ``set_`` to
                # validate a new entry, and ``set_`` asks ``guard_or_true`` about the
                # storage bounds: a guard the op itself never needs (slicing x[:, 0:3]
                # of an (s0, s1) tensor asked ``Ne(s1, 3)``), refused as a
                # specialization. Without the cache the op's meta runs directly.
                stack.enter_context(_fake_cache_disabled(mode))
        stack.enter_context(torch.no_grad())
        return stack

    def evaluate(self, node: fx.Node, replace: dict[fx.Node, Any] | None = None) -> Any:
        """Run ``node``'s target on its inputs' metadata values (fake tensors when the
        graph is fake), reading ``replace[n]`` instead for the inputs it names.

        Raises if an input's value is unknown or the op rejects the values. Nothing in the
        graph changes: the driver uses this to ask how a user of a replaced node would see
        the replacement (strides), ``infer_meta`` to fill in new nodes' metadata.
        """
        replace = replace or {}

        def value_of(a: Any) -> Any:
            if isinstance(a, fx.Node):
                if a in replace:
                    return replace[a]
                if self.meta_key not in a.meta:
                    raise ValueError(f"no {self.meta_key!r} metadata on {a.name}")
                v = a.meta[self.meta_key]
                if isinstance(v, (tuple, list)):
                    return type(v)(self._in_graph_mode(x) for x in v)
                return self._in_graph_mode(v)
            return a

        if node.target is operator.getitem and isinstance(node.args[0], fx.Node) and is_int(node.args[1]):
            src = value_of(node.args[0])
            if isinstance(src, (tuple, list)):  # fast path: no fake dispatch
                return src[node.args[1]]
        args = fx.node.map_aggregate(node.args, value_of)
        kwargs = fx.node.map_aggregate(node.kwargs, value_of)
        with self._run_context(node):
            if node.op == "call_method":
                self_arg, *rest = args
                return getattr(self_arg, node.target)(*rest, **kwargs)
            if node.op == "call_function":
                return node.target(*args, **kwargs)
        raise ValueError(f"cannot evaluate {node.op} nodes")

    def infer_meta(self, node: fx.Node) -> None:
        """Compute ``node.meta[meta_key]`` by running its target on its inputs' values.

        Raises if an input's value is unknown or the op rejects the values (the driver
        rolls the rewrite back).
        """

        node.meta[self.meta_key] = self.evaluate(node)
        stack_traces = [a.meta.get("stack_trace") for a in node.all_input_nodes]
        if "stack_trace" not in node.meta:
            trace = next((t for t in stack_traces if t), None)
            if trace:
                node.meta["stack_trace"] = trace

    def protected_outputs(self) -> int | None:
        """How many leading graph outputs callers can see (None: all of them).

        Outputs past these (saved activations of a training forward graph) may alias
        inputs or each other after a rewrite; visible ones may not.
        """
        return None

    def graph_kind(self) -> str:
        """What the graph computes: ``"graph"`` at levels that do not tell; at Aten-IR
        ``"inference"``, ``"forward"`` (a partitioned training forward) or ``"backward"``."""
        return "graph"

    def outputs_are_gradients(self) -> bool:
        """Is this a backward graph, whose outputs are gradients handed to autograd?

        Two gradients may then live in disjoint parts of one buffer (autograd and
        optimizers never see the storage they share); two user-visible outputs may not.
        """
        return False

    # -------------------------------------------------------------- side effects
    def mutated_inputs(self, node: fx.Node) -> list[fx.Node]:
        """Nodes this node writes to in place (empty for pure nodes)."""
        raise NotImplementedError

    def has_side_effects(self, node: fx.Node) -> bool:
        """True when erasing the node (once unused) could change behaviour."""
        if node.op in ("placeholder", "output", "get_attr"):
            return node.op != "get_attr"
        if is_barrier(node):  # a collective: other ranks wait for it (core/collectives.py)
            return True
        if is_marker(node):  # sets grad mode / autocast for what follows (core/regions.py)
            return True
        if self.mutated_inputs(node):
            return True
        try:
            return bool(node.is_impure())
        except Exception:  # pragma: no cover - defensive across torch versions
            return True


def _autocast_from(entry: tuple[str, ...], node: fx.Node) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` as a marker recorded it (its arguments as strings: device type,
    dtype, enabled, cache)."""
    device = entry[0] if entry else "cpu"
    dtype = getattr(torch, entry[1].replace("torch.", ""), None) if len(entry) > 1 and entry[1] != "None" else None
    enabled = entry[2] != "False" if len(entry) > 2 else True
    if not isinstance(dtype, torch.dtype):
        dtype = None
    try:
        return torch.autocast(device, dtype=dtype, enabled=enabled)
    except Exception as e:  # a device type this torch has no autocast for
        raise ValueError(f"cannot evaluate {node.name} under autocast{entry}: {e}") from None


def _constant_or_symbol(size: Any) -> Any:
    if isinstance(size, torch.SymInt):
        maybe = getattr(size.node, "maybe_as_int", None)
        out = maybe() if maybe is not None else None
        return int(out) if out is not None else size
    return size


def _clamp_slice(start: Any, end: Any, size: Any) -> tuple[Any, Any]:
    """Python slice bounds clamped to ``[0, size]`` (as tensor slicing does)."""
    if start is None:
        start = 0
    if end is None or (is_int(end) and end >= 2**62):
        end = size
    if is_int(size):
        if is_int(start):
            start = min(max(start + size if start < 0 else start, 0), size)
        if is_int(end):
            end = min(max(end + size if end < 0 else end, 0), size)
    return start, end


def getitem_users(node: fx.Node) -> dict[int, list[fx.Node]] | None:
    """For a multi-output node: index -> getitem users. ``None`` if any other kind of use."""
    out: dict[int, list[fx.Node]] = {}
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem or user.args[0] is not node:
            return None
        idx = user.args[1]
        if not is_int(idx):
            return None
        out.setdefault(idx, []).append(user)
    return out


def num_outputs(view: "GraphView", node: fx.Node) -> int | None:
    """How many values a multi-output node (split, unbind) returns, if known.

    Known from its example value (a tuple; exact even when sizes are symbolic), else
    from integer split sizes.
    """
    v = view.val(node)
    if isinstance(v, (tuple, list)):
        return len(v)
    call = view.classify(node)
    if call is not None and call.op == "split" and isinstance(call.args["sizes"], list):
        return len(call.args["sizes"])
    return None


@contextlib.contextmanager
def _fake_cache_disabled(mode: Any) -> Iterator[None]:
    """``mode``'s fake-tensor dispatch cache off while active (see ``_run_context``)."""
    if not hasattr(mode, "cache_enabled"):
        yield
        return
    previous = mode.cache_enabled
    mode.cache_enabled = False
    try:
        yield
    finally:
        mode.cache_enabled = previous
