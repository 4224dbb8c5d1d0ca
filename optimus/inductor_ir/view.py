"""The scheduler-node view: Inductor scheduler nodes seen through the canonical vocabulary.

At Inductor-IR a "node" is a scheduler node: one future kernel (or an extern call, or a
no-op). ``SchedulerView.classify`` reads one as a canonical ``Call`` whose op is its
kind, so Inductor-IR rules use the same ``Op``/``Var``/``Lit`` patterns as the FX levels:

=============  ===================================================  ===========================
kind           scheduler nodes                                      arguments
=============  ===================================================  ===========================
``pointwise``  ``SchedulerNode``/``FusedSchedulerNode`` (and the    ``sizes``, ``device``
               CPU backend's outer-loop fused node) without a
               reduction
``reduction``  the same, with a reduction                           ``sizes``, ``reduction_sizes``,
                                                                    ``device``
``template``   a node containing a template (Triton/CUTLASS mm)     ``kernel``, ``device``
``extern``     ``ExternKernelSchedulerNode`` (cuBLAS/mkldnn mm,     ``kernel``, ``device``,
               fallbacks)                                           ``is_matmul``
``nop``        ``NopKernelSchedulerNode``                           --
``combo``      ``ForeachKernelSchedulerNode`` (foreach/combo)       ``members``, ``device``
``composite``  node kinds Inductor manages itself (grouped,         ``type``, ``device``
               mix-order or nested reductions, extern+Triton)
=============  ===================================================  ===========================

``sizes``/``reduction_sizes`` are the backend's iteration space (Triton: ``(numel,)`` and
``(rnumel,)``; C++: the loop ranges), so two kernels with equal ``sizes`` and
``reduction_sizes`` can share one loop nest. Any other node type (new in a torch
version, or backend-specific) classifies as ``None``: rules never see it, the pass
reports it as ``unknown node type <T>`` and leaves it where it is.

The view also answers what rules need beyond one node: reads, writes, producers and
consumers, iteration size, schedule distance, and dependency reachability over the
*current* node list (kept exact as nodes are fused, so legality checks see paths
created by earlier fusions).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import sympy

from ..core.vocab import Call, register_ops
from . import inductor_api

KIND_SCHEMAS: dict[str, tuple[str, ...]] = {
    "pointwise": ("sizes", "device"),
    "reduction": ("sizes", "reduction_sizes", "device"),
    "template": ("kernel", "device"),
    "extern": ("kernel", "device", "is_matmul"),
    "nop": (),
    "combo": ("members", "device"),
    "composite": ("type", "device"),
}
KERNEL_KINDS = ("pointwise", "reduction")
register_ops(KIND_SCHEMAS)

# Node types and how to read them. Exact types only: a subclass is a new node type.
_KERNEL_TYPES = ("SchedulerNode", "FusedSchedulerNode", "OuterLoopFusedSchedulerNode")
_COMPOSITE_TYPES = (
    "GroupedSchedulerNode",
    "FusedMixOrderReductions",
    "FusedNestedReductions",
    "FusedExternTritonKernelSchedulerNode",
)
_MATMUL_WORDS = ("mm", "matmul", "linear", "conv", "gemm", "bmm", "addmm", "baddbmm")


def known_types() -> dict[type, str]:
    """Scheduler node class -> how it is classified (``kernel``, ``extern``, ...)."""
    table: dict[type, str] = {}
    for name in ("SchedulerNode", "FusedSchedulerNode"):
        cls = inductor_api.sched_class(name)
        if cls is not None:
            table[cls] = "kernel"
    cls = inductor_api.cpp_class("OuterLoopFusedSchedulerNode")
    if cls is not None:
        table[cls] = "kernel"
    for name, how in (
        ("ExternKernelSchedulerNode", "extern"),
        ("NopKernelSchedulerNode", "nop"),
        ("ForeachKernelSchedulerNode", "combo"),
    ):
        cls = inductor_api.sched_class(name)
        if cls is not None:
            table[cls] = how
    for name in _COMPOSITE_TYPES:
        cls = inductor_api.sched_class(name)
        if cls is not None:
            table[cls] = "composite"
    return table


def _simplify(x: Any) -> Any:
    if isinstance(x, sympy.Integer):
        return int(x)
    return x


def _tuple(x: Any) -> tuple[Any, ...]:
    if isinstance(x, (tuple, list)):
        return tuple(_simplify(v) for v in x)
    return (_simplify(x),)


def _product(values: Iterable[Any]) -> Any:
    out: Any = 1
    for v in values:
        out = out * v
    return _simplify(out)


def _index_of(dep: Any) -> str:
    """A read's index expression as text; a dependency without one (``StarDep``, whose
    ``index`` raises, ``WeakDep``) reads the whole buffer: ``""``."""
    try:
        return str(dep.index)
    except Exception:
        return ""


def _accessed(node: Any, key: Callable[[Any], Any]) -> int:
    """A node's reads from outside (distinct by ``key``) plus the buffers it writes; a buffer
    written and read inside the node counts once."""
    writes = {d.name for d in node.read_writes.writes}
    return len({key(d) for d in node.read_writes.reads if d.name not in writes}) + len(writes)


class SchedulerView:
    """Reads one scheduler's current node list through the canonical vocabulary."""

    level = "inductor_ir"

    def __init__(self, scheduler: Any, nodes: list[Any]) -> None:
        self.scheduler = scheduler
        self.nodes: list[Any] = list(nodes)
        self._types = known_types()
        self._calls: dict[int, tuple[Any, Call | None]] = {}
        self._span: dict[int, tuple[int, int]] = {id(n): (i, i) for i, n in enumerate(self.nodes)}
        self._alive: list[Any] = list(self.nodes)  # keeps ids in _span/_calls unique
        self._segment: dict[int, int | None] = {}
        self._comm_segment: dict[int, int | None] = {}  # collectives passed (barriers)
        seg = comm = 0
        for n in self.nodes:
            if inductor_api.call_safely(n.is_extern, False) or inductor_api.call_safely(n.is_template, False):
                seg += 1
            if inductor_api.is_communication(n):
                comm += 1
            self._segment[id(n)] = seg
            self._comm_segment[id(n)] = comm
        self.has_communication = comm > 0
        self.reach = Reachability(scheduler, self.nodes)

    # ----------------------------------------------------------------- classify
    def type_name(self, node: Any) -> str:
        return type(node).__name__

    def classify(self, node: Any) -> Call | None:
        """The node as a canonical ``Call`` (op = its kind), or ``None`` if its type is unknown."""
        hit = self._calls.get(id(node))
        if hit is None or hit[0] is not node:  # ids of freed nodes get reused
            hit = self._calls[id(node)] = (node, self._classify(node))
        return hit[1]

    def _classify(self, node: Any) -> Call | None:
        how = self._types.get(type(node))
        if how is None:
            return None
        device = inductor_api.call_safely(node.get_device, None)
        if how == "kernel":
            if inductor_api.call_safely(node.is_template, False):
                return Call("template", node, {"kernel": self.type_name(node), "device": device})
            sizes, red = self.iteration_sizes(node)
            if sizes is None:
                return None
            if inductor_api.call_safely(node.is_reduction, False):
                return Call("reduction", node, {"sizes": sizes, "reduction_sizes": red, "device": device})
            return Call("pointwise", node, {"sizes": sizes, "device": device})
        if how == "extern":
            kernel = self.extern_kernel_name(node)
            if inductor_api.call_safely(node.is_template, False):
                return Call("template", node, {"kernel": kernel, "device": device})
            is_mm = any(w in kernel.lower() for w in _MATMUL_WORDS)
            return Call("extern", node, {"kernel": kernel, "device": device, "is_matmul": is_mm})
        if how == "nop":
            return Call("nop", node, {})
        if how == "combo":
            members = list(getattr(node, "snodes", []) or [])
            return Call("combo", node, {"members": members, "device": device})
        return Call("composite", node, {"type": self.type_name(node), "device": device})

    @staticmethod
    def extern_kernel_name(node: Any) -> str:
        ir_node = getattr(node, "node", None)
        for attr in ("python_kernel_name", "cpp_kernel_name", "op_overload"):
            v = getattr(ir_node, attr, None)
            if v:
                return str(v)
        return type(ir_node).__name__

    # ----------------------------------------------------------- iteration space
    @staticmethod
    def iteration_sizes(node: Any) -> tuple[tuple[Any, ...] | None, tuple[Any, ...]]:
        """(sizes, reduction_sizes) of the backend's iteration space (from ``node.group``)."""
        group = getattr(node, "group", None)
        if not isinstance(group, tuple) or len(group) != 2:
            return None, ()
        spec = group[1]
        if not isinstance(spec, tuple) or len(spec) != 2:
            return None, ()
        sizes, red = _tuple(spec[0]), _tuple(spec[1])
        if red in ((1,), ()):  # Triton spells "no reduction" rnumel == 1
            red = ()
        return sizes, red

    def numel(self, node: Any) -> Any:
        sizes, _ = self.iteration_sizes(node)
        return _product(sizes or ())

    def rnumel(self, node: Any) -> Any:
        _, red = self.iteration_sizes(node)
        return _product(red)

    def iteration_key(self, node: Any) -> tuple[Any, ...]:
        """Kernels with equal keys can share one loop nest: ``(device, numel, rnumel,
        reduction hint)`` on GPUs -- a Triton kernel mixing an inner and an outer
        reduction falls back to a default tiling that is slow for both -- and
        ``(device, loop ranges, reduction ranges)`` on CPU."""
        device = inductor_api.call_safely(node.get_device, None)
        if device is not None and device.type == "cpu":
            # C++: equal loop ranges. Re-tiling one nest to the other's ranges (which the
            # backend can do for 1-D vs N-D) trades the fusion for a shorter inner loop.
            sizes, red = self.iteration_sizes(node)
            return (device, sizes, red)
        key: tuple[Any, ...] = (device, self.numel(node), self.rnumel(node))
        if device is not None and inductor_api.call_safely(node.is_reduction, False):
            key += (self.reduction_hint(node),)
        return key

    @staticmethod
    def reduction_hint(node: Any) -> str:
        """Inductor's reduction hint for a (fused) reduction node, as a string."""
        try:
            from torch._inductor.codegen.simd_kernel_features import SIMDKernelFeatures

            hint_of = SIMDKernelFeatures.reduction_hint
        except Exception:  # pragma: no cover - layout differs across versions
            hint_of = None
        hints = set()
        for n in inductor_api.call_safely(node.get_nodes, [node]):
            if not inductor_api.call_safely(n.is_reduction, False):
                continue
            try:
                hint = hint_of(n) if hint_of is not None else n.node.data.reduction_hint
            except Exception:
                hint = "?"
            hints.add(str(hint))
        return hints.pop() if len(hints) == 1 else "DEFAULT"

    def work(self, node: Any) -> int | None:
        """Iteration points (numel x rnumel) as an int: exact for static sizes, the example
        hint for symbolic ones (for cost caps)."""
        total = self.numel(node) * self.rnumel(node)
        try:
            return int(total)
        except (TypeError, ValueError):
            # a symbolic size: its example hint (a cost estimate only). torch 2.13 has no
            # ``size_hint`` (every symbolic kernel declined the cap); ``optimization_hint``
            # is in 2.11 to 2.15.
            def hint_of(expr: Any) -> Any:
                sizevars = inductor_api.V.graph.sizevars
                return (getattr(sizevars, "optimization_hint", None) or sizevars.size_hint)(expr)

            hint = inductor_api.call_safely(lambda: hint_of(total), None)
            return int(hint) if hint is not None else None

    def members(self, node: Any) -> int:
        """Scheduler nodes (IR operations) inside a possibly fused node."""
        return len(inductor_api.call_safely(node.get_nodes, [node]))

    def accesses(self, node: Any) -> int:
        """Buffers a possibly fused node reads from outside and writes: about the pointer
        arguments of its kernel."""
        return _accessed(node, lambda d: d.name)

    def loads(self, node: Any) -> int:
        """Memory accesses of a possibly fused node: each buffer it reads from outside, once
        per index expression it reads it at, plus the buffers it writes. About the loads and
        stores of its kernel, where ``accesses`` counts pointers: a pointwise ``cat`` reads one
        buffer at a different offset per input (the H200's 31.7 s splitcat kernel: 128 loads
        from 39 buffers)."""
        return _accessed(node, lambda d: (d.name, _index_of(d)))

    def bytes(self, node: Any) -> int | None:
        fn = getattr(node, "get_read_write_buffers_sizes", None)
        return inductor_api.call_safely(fn, None) if fn is not None else None

    # -------------------------------------------------------------- data flow
    @staticmethod
    def reads(node: Any) -> set[str]:
        return {d.name for d in node.read_writes.reads}

    @staticmethod
    def writes(node: Any) -> set[str]:
        return set(inductor_api.call_safely(node.get_buffer_names, ()))

    def producers(self, node: Any) -> list[Any]:
        return self.reach.producers(node)

    def consumers(self, node: Any) -> list[Any]:
        return [n for n in self.nodes if n is not node and node in self.reach.producers(n)]

    def order(self, node: Any) -> tuple[int, int]:
        """(first, last) position of the node's operations in the node list the pass
        started from (a fused node spans its parts)."""
        span = self._span.get(id(node))
        if span is None:
            i = next((k for k, n in enumerate(self.nodes) if n is node), len(self.nodes))
            span = self._span[id(node)] = (i, i)
        return span

    def segment(self, node: Any) -> int | None:
        """Which run of kernels between two extern/template calls the node is in (in the
        list the pass started from). Inductor's C++ backend generates each such run as
        one C++ function with one parallel region; an extern call ends it."""
        return self._segment.get(id(node))

    def comm_segment(self, node: Any) -> int | None:
        """How many collectives (or waits) come before the node in the list the pass
        started from; kernels with different counts lie on two sides of one."""
        return self._comm_segment.get(id(node))

    def distance(self, a: Any, b: Any) -> int:
        """How far apart two nodes are in the schedule the pass started from (Inductor's
        ``are_long_distant_nodes`` measure, on the post-fusion list)."""
        a_lo, a_hi = self.order(a)
        b_lo, b_hi = self.order(b)
        return max(abs(a_lo - b_hi), abs(b_lo - a_hi))

    # ------------------------------------------------------------- reachability
    def independent(self, a: Any, b: Any) -> bool:
        return not self.reach.reaches(a, b) and not self.reach.reaches(b, a)

    def replace(self, old: list[Any], new: Any) -> None:
        """``old`` nodes became ``new`` (a fused or combo node)."""
        self._alive.append(new)
        segments = {self._segment.get(id(o)) for o in old}
        self._segment[id(new)] = segments.pop() if len(segments) == 1 else None
        comms = {self._comm_segment.get(id(o)) for o in old}
        self._comm_segment[id(new)] = comms.pop() if len(comms) == 1 else None
        spans = [self.order(o) for o in old]
        self._span[id(new)] = (min(lo for lo, _ in spans), max(hi for _, hi in spans))
        pos = min(i for i, n in enumerate(self.nodes) if any(n is o for o in old))
        self.nodes = [n for n in self.nodes if all(n is not o for o in old)]
        self.nodes.insert(min(pos, len(self.nodes)), new)
        self.reach.contract(old, new)

class Reachability:
    """Ancestor sets of the current node list as bitsets, kept exact under fusion.

    ``ancestors[n]`` has bit ``i`` set when node ``i`` must run before ``n`` (a chain of
    buffer dependencies, including ordering-only ``WeakDep``s). Fusing (contracting)
    nodes ``G`` into ``c`` makes every descendant of any member a descendant of all the
    members' ancestors, which is the update ``contract`` applies.
    """

    def __init__(self, scheduler: Any, nodes: list[Any]) -> None:
        self.scheduler = scheduler
        self.bit: dict[int, int] = {}
        self.anc: dict[int, int] = {}
        self.by_id: dict[int, Any] = {}
        self._next = 0
        self._owner: dict[str, Any] = {}
        for n in nodes:
            self._register(n)
        self._producers: dict[int, list[Any]] = {}
        for n in nodes:
            self._producers[id(n)] = self._find_producers(n)
        self._compute(nodes)

    def _register(self, n: Any) -> None:
        self.bit[id(n)] = 1 << self._next
        self._next += 1
        self.by_id[id(n)] = n
        names = set(inductor_api.call_safely(n.get_operation_names, ())) | set(inductor_api.call_safely(n.get_buffer_names, ()))
        for name in names:
            self._owner[name] = n

    def _find_producers(self, n: Any) -> list[Any]:
        found: list[Any] = []
        seen: set[int] = set()
        name_to_buf = getattr(self.scheduler, "name_to_buf", {})
        for dep in getattr(n, "unmet_dependencies", ()):
            owner = self._owner.get(dep.name)
            if owner is None:
                buf = name_to_buf.get(dep.name)
                op_name = inductor_api.call_safely(buf.defining_op_name, None) if buf is not None else None
                owner = self._owner.get(op_name) if op_name else None
            if owner is not None and owner is not n and id(owner) not in seen:
                seen.add(id(owner))
                found.append(owner)
        return found

    def producers(self, n: Any) -> list[Any]:
        return list(self._producers.get(id(n), []))

    def _compute(self, nodes: list[Any]) -> None:
        state: dict[int, int] = {}  # 1 = visiting, 2 = done
        for root in nodes:
            if state.get(id(root)) == 2:
                continue
            stack: list[tuple[Any, int]] = [(root, 0)]
            while stack:
                node, i = stack.pop()
                key = id(node)
                prods = self._producers.get(key, [])
                if i == 0:
                    if state.get(key) == 2:
                        continue
                    state[key] = 1
                if i < len(prods):
                    stack.append((node, i + 1))
                    p = prods[i]
                    s = state.get(id(p))
                    if s == 1:
                        raise RuntimeError(f"dependency cycle through {p.get_name()}")
                    if s != 2:
                        stack.append((p, 0))
                    continue
                acc = 0
                for p in prods:
                    acc |= self.anc[id(p)] | self.bit[id(p)]
                self.anc[key] = acc
                state[key] = 2

    def reaches(self, a: Any, b: Any) -> bool:
        """Is there a dependency path from ``a`` to ``b`` (``a`` must run before ``b``)?"""
        return bool(self.anc[id(b)] & self.bit[id(a)])

    def path_avoiding(self, a: Any, b: Any) -> Any:
        """A node other than ``a``/``b`` on a path from ``a`` to ``b``, or None.

        Fusing a producer ``a`` into a consumer ``b`` is only acyclic when every path
        from ``a`` to ``b`` is the direct edge.
        """
        abit = self.bit[id(a)]
        between = self.anc[id(b)] & ~abit
        for key, x_anc in self.anc.items():
            if key in (id(a), id(b)):
                continue
            if (x_anc & abit) and (between & self.bit[key]):
                return self.by_id[key]
        return None

    def contract(self, old: list[Any], new: Any) -> None:
        mask = 0
        anc = 0
        for o in old:
            mask |= self.bit[id(o)]
            anc |= self.anc[id(o)]
        prods: list[Any] = []
        for o in old:
            for p in self._producers.get(id(o), []):
                if all(p is not q for q in old) and all(p is not q for q in prods):
                    prods.append(p)
        for o in old:
            for d in (self.bit, self.anc, self.by_id, self._producers):
                d.pop(id(o), None)
        self._register(new)
        nb = self.bit[id(new)]
        self.anc[id(new)] = anc & ~mask
        self._producers[id(new)] = prods
        for key in list(self.anc):
            if key == id(new):
                continue
            a = self.anc[key]
            if a & mask:
                self.anc[key] = (a & ~mask) | self.anc[id(new)] | nb
        old_ids = {id(o) for o in old}
        for key, prods_of in self._producers.items():
            if key == id(new):
                continue
            if any(id(p) in old_ids for p in prods_of):
                kept = [p for p in prods_of if id(p) not in old_ids]
                self._producers[key] = kept + [new]
