"""Device time of FX nodes, by the cost model: what a horizontal rewrite saves or costs.

A group rewrite replaces its members (N kernels) by the nodes its replacement built
(stacks, one batched op, views). The planner prices both sides with ``node_cost`` and
keeps the rewrite only when the new side is cheaper. Each node is one of:

* a view (``VIEW_OPS``: reshape, permute, unbind, getitem, ...): free in the forward;
* a copy (``stack``, ``cat``, ``clone``): reads and writes its output's bytes once, except
  a stack or cat of consecutive parts of one tensor, which the vertical rules turn back
  into a view of it (``core.segments.stack_is_free``): free;
* a matmul (``linear``, ``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``): its bytes and
  ``2 * M * N * K`` FLOPs at the rate its tiles achieve in its dtype's class
  (``costmodel.matmul_rate``: fp32, TF32 where torch allows it, bf16/fp16), plus one cast
  kernel per operand of another dtype (Torch-IR under autocast, where the casts are implicit);
* an op outside the vocabulary that a rule emitted (a custom op such as
  ``optimus::grouped_linear``): one kernel moving its bytes and doing the arithmetic of
  the members it replaces (``Work``), at the occupancy of all their tiles together; when
  launched (not under CUDA graphs) an ``optimus::`` op also pays its host call, several
  launches' worth (``custom_op_host_us``: Python argument handling, tables, the launch);
* anything else: one kernel moving its inputs' and outputs' bytes.

Every kernel costs at least the kernel floor; when kernels are launched one by one (not
under CUDA graphs) at least the host's launch time too (``costmodel.kernel_us``).

In a training graph at Torch-IR (before AOTAutograd makes the backward), a node whose
result needs a gradient also costs its backward: a matmul two more matmuls (dX, dW), a
copy nothing (its backward is views), a view of many parts (``unbind``/``split``) one
copy (the backward stacks the parts' gradients), anything else one more kernel like its
forward. Aten-IR graphs are priced as they are (forward and backward are separate).

These are estimates, good for ordering a rewrite against its alternative, not for
predicting step times; ``tune=True`` measures where it matters (docs/planner.md).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable

import torch
import torch.fx as fx

from ..core.symbolic import size_hint
from ..core.view import GraphView
from ..core.vocab import VIEW_OPS
from ..core.segments import stack_is_free
from . import costmodel
from .costmodel import DeviceProfile
from .memory import tensors_of

MATMUL_OPS = frozenset({"linear", "mm", "addmm", "bmm", "baddbmm", "matmul"})
COPY_OPS = frozenset({"stack", "cat", "clone"})
MULTI_PART_VIEWS = frozenset({"unbind", "split"})


@dataclasses.dataclass
class Work:
    """Matmul arithmetic of some nodes: what an opaque replacement must still do."""

    flops: float = 0.0
    tiles: int = 0
    dtype: str = "fp32"
    members: int = 0


@dataclasses.dataclass
class Cost:
    """Estimated device time (µs) and kernels of some nodes."""

    us: float = 0.0
    kernels: int = 0

    def add(self, us: float, kernels: int = 1) -> None:
        self.us += us
        self.kernels += kernels

    def __str__(self) -> str:
        return f"{self.kernels} kernel{'s' if self.kernels != 1 else ''} {self.us:.1f} µs"


def _value(view: GraphView, node: fx.Node) -> Any:
    val = view.val(node)
    if val is None and node.op == "get_attr":
        try:
            val = view.gm.get_parameter(node.target)  # type: ignore[arg-type]
        except AttributeError:
            try:
                val = view.gm.get_buffer(node.target)  # type: ignore[arg-type]
            except AttributeError:
                val = None
    return val


def _nbytes(values: Iterable[torch.Tensor]) -> int:
    return sum(size_hint(t.numel()) * t.element_size() for t in values)


def _needs_grad(value: Any) -> bool:
    return any(getattr(t, "requires_grad", False) for t in tensors_of(value))


def _matmul_shape(view: GraphView, call: Any, out: torch.Tensor) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a matmul-like call producing ``out``."""
    a = call.get("input")  # canonical schemas name the operand whose last dim is contracted "input"
    av = view.tensor_val(a) if isinstance(a, fx.Node) else None
    k = size_hint(av.shape[-1]) if av is not None and av.dim() else 1
    shape = [size_hint(s) for s in out.shape] or [1]
    n = shape[-1]
    if call.op in ("bmm", "baddbmm") and len(shape) == 3:
        return shape[0], shape[1], n, k
    m = math.prod(shape[:-1]) if len(shape) > 1 else 1
    return 1, m, n, k


def _autocast_casts(view: GraphView, node: fx.Node, dtype: torch.dtype) -> list[torch.Tensor]:
    """The floating operands of a matmul that are not in its result's dtype: at Torch-IR under
    autocast a linear of fp32 operands runs on bf16/fp16 casts of them, one kernel each (at
    Aten-IR those casts are nodes of their own and its operands have its dtype already)."""
    return [t for i in node.all_input_nodes for t in tensors_of(_value(view, i)) if t.is_floating_point() and t.dtype != dtype]


def work(view: GraphView, nodes: Iterable[fx.Node]) -> Work:
    """The matmul FLOPs and output tiles of ``nodes`` (the members of a group)."""
    total = Work()
    for node in nodes:
        total.members += 1
        call = view.classify(node)
        outs = tensors_of(_value(view, node))
        if call is None or call.op not in MATMUL_OPS or not outs:
            continue
        batch, m, n, k = _matmul_shape(view, call, outs[0])
        total.flops += 2.0 * batch * m * n * k
        total.tiles += costmodel.matmul_tiles(m, n, batch)
        total.dtype = costmodel.dtype_class(outs[0].dtype)
    return total


# Host time of one call of an ``optimus::`` kernel op from a compiled graph, launched one
# by one, in kernel launches of that graph (the profile's ``launch_us``): a fixed part and
# a part per member (argument lists, pointer tables). On the H200's host (torch 2.11) the
# op's eager forward takes 130 + 13 * G µs (optimus.tools.bench.kernels.overhead:
# grouped linear G=4 0.18 ms, G=16 0.33 ms, G=64 0.97 ms; its device time a few µs), and
# Inductor's generated code spends about 30 µs per kernel in launch-bound graphs
# (hetero_towers inference 2.0 ms for 62 kernels, towers32 2.3 ms for 66), which the
# cost model charges as one launch (11.5 µs probed): so one call counts as
# 130 / 30 + 13 / 30 * G launches. The backward op costs as much again. Under CUDA graphs
# a replay launches from the device: nothing.
CUSTOM_OP_HOST_LAUNCHES = (4.3, 0.43)


def custom_op_host_us(node: fx.Node, members: int, p: DeviceProfile, launched: bool) -> float:
    """The host time of one call of an ``optimus::`` op (0 for anything else or under CUDA graphs)."""
    if not launched or node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return 0.0
    if not node.target.name().startswith("optimus::"):
        return 0.0
    fixed, per_member = CUSTOM_OP_HOST_LAUNCHES
    return p.launch_us * (fixed + per_member * max(members, 1))


def node_cost(view: GraphView, node: fx.Node, p: DeviceProfile, launched: bool, training: bool = False, opaque: Work | None = None) -> Cost:
    """The forward (and, when ``training``, backward) cost of one node (module docstring);
    ``opaque``: the arithmetic an op outside the vocabulary does (a rule's custom op)."""
    cost = Cost()
    call = view.classify(node)
    op = call.op if call is not None else None
    out = _value(view, node)
    outs = tensors_of(out)
    if node.op in ("placeholder", "output", "get_attr") or not outs:
        return cost
    grad = training and _needs_grad(out)
    out_bytes = _nbytes(outs)
    if op in VIEW_OPS:
        if grad and op in MULTI_PART_VIEWS:
            cost.add(costmodel.copy_us(p, out_bytes, launched))  # its backward stacks the parts
        return cost
    in_bytes = _nbytes(t for i in node.all_input_nodes for t in tensors_of(_value(view, i)))
    dtype = costmodel.dtype_class(outs[0].dtype)
    if op in COPY_OPS:
        parts = call.get("tensors") if call is not None else None
        if op in ("stack", "cat") and isinstance(parts, (list, tuple)) and len(parts) > 1 and stack_is_free(view, list(parts)):
            return cost  # consecutive parts of one tensor: a view once the vertical rules run
        cost.add(costmodel.copy_us(p, out_bytes, launched))
        return cost  # backward: views of the gradient
    if op in MATMUL_OPS and call is not None:
        batch, m, n, k = _matmul_shape(view, call, outs[0])
        flops = 2.0 * batch * m * n * k
        casts = _autocast_casts(view, node, outs[0].dtype)
        in_bytes = sum(size_hint(t.numel()) * outs[0].element_size() for t in casts) + _nbytes(t for i in node.all_input_nodes for t in tensors_of(_value(view, i)) if not any(t is c for c in casts))
        one = costmodel.kernel_us(p, in_bytes + out_bytes, flops, dtype, costmodel.matmul_tiles(m, n, batch, k=k), launched)
        cost.add(one)
        for t in casts:  # read in its dtype, written in the matmul's; its backward casts the gradient back
            cast = costmodel.kernel_us(p, size_hint(t.numel()) * (t.element_size() + outs[0].element_size()), launched=launched)
            cost.add(cast, 1)
            if grad and t.requires_grad:
                cost.add(cast, 1)
        if grad:
            cost.add(2 * one, 2)  # dX and dW: about the same work each
        return cost
    host = custom_op_host_us(node, opaque.members if opaque is not None else 1, p, launched)
    if call is None and opaque is not None and opaque.flops:
        one = costmodel.kernel_us(p, in_bytes + out_bytes, opaque.flops, opaque.dtype, opaque.tiles or None, launched)
        cost.add(one + host)
        if grad:
            cost.add(2 * one + host, 2)
        return cost
    one = costmodel.kernel_us(p, in_bytes + out_bytes, launched=launched)
    cost.add(one + host)
    if grad:
        cost.add(one + host)
    return cost


def nodes_cost(view: GraphView, nodes: Iterable[fx.Node], p: DeviceProfile, launched: bool, training: bool = False, opaque: Work | None = None) -> Cost:
    total = Cost()
    for n in nodes:
        c = node_cost(view, n, p, launched, training, opaque)
        total.add(c.us, c.kernels)
    return total
