"""Everything Optimus touches inside Inductor's scheduler, behind version guards.

Inductor's scheduler IR is private and changes between torch releases. This module is
the only place that imports from it; every lookup is guarded so that a missing or
renamed piece turns into "unsupported on this torch" (reported, nothing rewritten)
instead of an exception. Checked against torch 2.11 and 2.13.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from typing import Any, Callable, Collection, Iterable, Iterator

import torch

log = logging.getLogger("optimus")

try:
    from torch._inductor import config as inductor_config
except ImportError:  # pragma: no cover - torch without Inductor
    inductor_config = None  # type: ignore[assignment]

try:
    from torch._inductor import scheduler as _sched
except ImportError:  # pragma: no cover
    _sched = None  # type: ignore[assignment]

try:
    from torch._inductor.virtualized import V
except ImportError:  # pragma: no cover
    V = None  # type: ignore[assignment]

# --- pass base classes --------------------------------------------------------------
# (see optimus.core.passkey: one class deriving from both is accepted by 2.11 and 2.13)
from ..core.passkey import PASS_BASES, CustomGraphPass, CustomSchedulerPass  # noqa: E402,F401

HOOKS = ("_pre_fusion_custom_pass", "_post_fusion_custom_pass")


def hooks_supported() -> tuple[bool, str]:
    """Can this torch run scheduler passes? ``(ok, why not)``."""
    if inductor_config is None or _sched is None or V is None:
        return False, "torch._inductor is not importable"
    missing = [h for h in HOOKS if not hasattr(inductor_config, h)]
    if missing:
        return False, f"this torch ({torch.__version__}) has no {', '.join(missing)} config hook"
    needed = ("Scheduler", "BaseSchedulerNode", "SchedulerNode", "FusedSchedulerNode")
    missing = [n for n in needed if not hasattr(_sched, n)]
    if missing:
        return False, f"this torch ({torch.__version__}) has no scheduler class(es) {', '.join(missing)}"
    if not hasattr(V, "set_choices_handler"):
        return False, f"this torch ({torch.__version__}) cannot swap InductorChoices (V.set_choices_handler)"
    return True, ""


# --- scheduler node classes -----------------------------------------------------------


def sched_class(name: str) -> type | None:
    cls = getattr(_sched, name, None) if _sched is not None else None
    return cls if isinstance(cls, type) else None


def cpp_class(name: str) -> type | None:
    try:
        from torch._inductor.codegen import cpp
    except Exception:  # pragma: no cover - backend not importable
        return None
    cls = getattr(cpp, name, None)
    return cls if isinstance(cls, type) else None


def current_scheduler() -> Any:
    """The scheduler running the hook (Inductor sets ``V.graph.scheduler`` first thing)."""
    graph = V.graph
    sch = getattr(graph, "scheduler", None)
    if sch is None:
        raise RuntimeError("no scheduler on V.graph")
    return sch


def graph_kind() -> str:
    """``forward``, ``backward`` or ``inference`` for the graph being scheduled."""
    try:
        graph = V.graph
    except Exception:  # pragma: no cover
        return "graph"
    if getattr(graph, "is_backward", False):
        return "backward"
    if getattr(graph, "is_inference", False):
        return "inference"
    return "forward"


# --- fusion primitives ----------------------------------------------------------------


def fuse_two(scheduler: Any, node1: Any, node2: Any, live: Any) -> Any:
    """Fuse two scheduler nodes the way Inductor's own fusion loop does.

    ``live`` is the ordered set of current nodes (updated in place). Uses
    ``Scheduler.fuse_two_nodes`` where it exists (2.11, 2.13: it also keeps stream
    assignments), else the backend's ``fuse`` and the bookkeeping by hand.
    """
    fn = getattr(scheduler, "fuse_two_nodes", None)
    if fn is not None:
        try:
            return fn(node1, node2, live)
        except TypeError:  # a different signature: fall through to the manual path
            pass
    device = node1.get_device()
    node3 = scheduler.get_backend(device).fuse(node1, node2)
    live.remove(node1)
    live.remove(node2)
    live.add(node3)
    scheduler.name_to_fused_node.update({n.get_name(): node3 for n in node3.get_nodes()})
    streams = getattr(scheduler, "node_to_stream", None)
    if isinstance(streams, dict) and node1 in streams:
        streams[node3] = streams[node1]
    return node3


def make_combo(scheduler: Any, members: list[Any]) -> Any:
    """A combo (foreach) kernel node over independent ``members`` (GPU backends only)."""
    cls = sched_class("ForeachKernelSchedulerNode")
    if cls is None:
        raise RuntimeError("this torch has no ForeachKernelSchedulerNode")
    kwargs: dict[str, Any] = {"use_custom_partition_algo": True}
    params = inspect.signature(cls.__init__).parameters
    if "enable_autotune" in params:
        kwargs["enable_autotune"] = getattr(inductor_config, "combo_kernels_autotune", 0) > 0
    if "per_subkernel_blocks" in params:
        kwargs["per_subkernel_blocks"] = bool(getattr(inductor_config, "combo_kernel_per_subkernel_blocks", False))
    node = cls(scheduler, list(members), **kwargs)
    scheduler.name_to_fused_node.update({n.get_name(): node for n in node.get_nodes()})
    streams = getattr(scheduler, "node_to_stream", None)
    if isinstance(streams, dict) and members[0] in streams:
        streams[node] = streams[members[0]]
    return node


def combo_backend(scheduler: Any, device: Any) -> Any:
    """The Triton scheduling object able to generate combo kernels on ``device``, or None."""
    if device is None or device.type == "cpu":
        return None
    try:
        backend = scheduler.get_backend(device)
    except Exception:
        return None
    triton = getattr(backend, "_triton_scheduling", backend)
    if not hasattr(triton, "generate_combo_kernel_code") or not hasattr(backend, "codegen_combo_kernel"):
        return None
    return triton


def trial_combo_codegen(scheduler: Any, members: list[Any], removed_later: Iterable[str] = ()) -> list[list[Any]]:
    """Generate (not compile) the combo kernel's source, as Inductor's combo benchmark
    does, to find out now whether codegen would fail; raises if it would.

    Returns Inductor's partition of ``members`` into launches (``ComboKernel.horizontal_partition``:
    pointwise kernels, short reductions, long reductions and kernels with a different
    number of tiling dimensions get separate launches). Only partitions of two or more
    members are generated here (Inductor's trial skips single ones), so a member left
    alone was not checked and saves no launch.

    ``removed_later`` are buffers that Inductor's codegen of earlier nodes will mark
    removed (``codegen_replacements``); the trial sees them as removed already, so a
    member reading one fails here (``KernelArgs.input``'s assertion) and not in the
    real codegen. Every piece of graph state the trial changes is restored.
    """
    device = members[0].get_device()
    triton = combo_backend(scheduler, device)
    if triton is None:
        raise RuntimeError(f"no combo-kernel backend for {device}")
    graph = V.graph
    removed, inplaced = graph.removed_buffers, graph.inplaced_to_remove
    graph.removed_buffers = type(removed)(removed)
    graph.removed_buffers.update(removed_later)
    graph.inplaced_to_remove = type(inplaced)(inplaced)
    kwargs: dict[str, Any] = {
        "subkernel_nodes": list(members),
        "custom_part_algorithm": True,
        "enable_autotune": False,
        "mixed_sizes": getattr(inductor_config, "combo_kernel_allow_mixed_sizes", 1) > 0,
        "only_gen_src_code": True,
    }
    params = inspect.signature(triton.generate_combo_kernel_code).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in params}
    # Codegen asks for the current device, which Inductor only sets while it generates
    # code (V.graph.current_device; a Scheduler attribute in some versions).
    holders = [h for h in (graph, scheduler) if "current_device" in vars(h)]
    priors = [(h, h.current_device) for h in holders]
    try:
        for h in holders:
            h.current_device = device
        code = triton.generate_combo_kernel_code(**kwargs)
    finally:
        graph.removed_buffers, graph.inplaced_to_remove = removed, inplaced
        for h, prior in priors:
            h.current_device = prior
    partitions = []
    for entry in code or ():
        try:
            partitions.append(list(entry[2]))
        except Exception:  # another return layout: one launch for all, as before
            return [list(members)]
    return partitions or [list(members)]


# --- what Inductor's codegen removes, known before codegen -----------------------------


def _is_kind(node: Any, class_name: str) -> bool:
    return any(c.__name__ == class_name for c in type(node).__mro__)


def codegen_replacements(node: Any) -> tuple[set[str], set[str]]:
    """``(buffers, ops)``: what generating ``node`` removes, and the other nodes' operations
    its code takes over. Empty for every node but split mix-order reductions.

    A mix-order reduction (``FusedMixOrderReductions``: a row reduction and a column
    reduction of one tensor, as in LayerNorm's backward, in one kernel; CUDA/XPU only)
    whose column reduction was split in two stages (``ir.Reduction`` splits long
    reductions: stage 1 writes partial sums ``P``, stage 2 ``F`` sums them) computes
    ``F`` itself after its kernel. Its codegen (``SIMDScheduling._codegen_mix_order_reduction``,
    torch 2.11, 2.13 and 2.15) then adds ``P`` to ``V.graph.removed_buffers`` and ``F`` (the
    first user of ``P``) to ``scheduler.removed_ops``. ``codegen_node`` skips the
    operations in ``removed_ops``; combo-kernel codegen does not, so a combo member
    holding ``F`` reads the removed ``P``: ``AssertionError: P`` in ``KernelArgs.input``.

    When the node's layout is not the one described (another torch), every buffer it
    writes is reported (the exclusion Inductor's own combo grouping applies: no combo
    member reads a mix-order node's output) and no operation.
    """
    if not _is_kind(node, "FusedMixOrderReductions"):
        return set(), set()
    try:
        reductions = [s for s in node.node2.get_nodes() if s.is_reduction()]
        # codegen decides on the first reduction of the column-reduction side
        if not reductions or not getattr(reductions[0].node, "_split_size", None):
            return set(), set()
        buffers: set[str] = set()
        ops: set[str] = set()
        for s in reductions:
            out = s.get_outputs()[0]
            buffers.add(out.get_name())
            if out.users:
                ops.add(out.users[0].node.get_name())
        return buffers, ops
    except Exception:
        return set(call_safely(node.get_buffer_names, ())), set()


def split_reduction_sizes(nodes: Iterable[Any]) -> list[tuple[Any, Any]] | None:
    """The original ``(numel, reduction numel)`` of each split reduction among ``nodes``'
    operations when every reduction among them was split (``ir.Reduction`` splits a long
    reduction in two stages and records the sizes it had: ``_original_ranges``,
    ``_original_reduction_ranges``), else None.

    Inductor reads such a kernel's iteration space off those sizes
    (``MixOrderReduction.get_numel_rnumel``, torch 2.11 to 2.15) and asserts they agree,
    so a kernel holding split reductions of different original sizes makes its own fusion
    check raise (``AssertionError: 64 v.s. 2112``). None also when this torch records
    no such sizes.
    """
    out: list[tuple[Any, Any]] = []
    try:
        from torch._inductor.utils import sympy_product

        for node in nodes:
            for leaf in call_safely(node.get_nodes, [node]) or [node]:
                ir = getattr(leaf, "node", None)
                if not (_is_kind(leaf, "SchedulerNode") and call_safely(leaf.is_reduction, False) and _is_kind(ir, "ComputedBuffer")):
                    continue
                if getattr(ir, "_split_size", None) is None:
                    return None
                ranges = getattr(ir, "_original_ranges", None)
                rranges = getattr(ir, "_original_reduction_ranges", None)
                if ranges is None or rranges is None:
                    return None
                out.append((sympy_product(ranges), sympy_product(rranges)))
    except Exception:
        return None
    return out or None


def split_sizes_disagree(nodes: Iterable[Any]) -> bool:
    """Would one kernel of ``nodes`` hold split reductions of different original sizes?"""
    sizes = split_reduction_sizes(nodes)
    if not sizes:
        return False
    first = sizes[0]

    def same(a: Any, b: Any) -> bool:
        try:
            return bool(V.graph.sizevars.statically_known_equals(a, b))
        except Exception:
            return a == b

    return not all(same(x, first[0]) and same(r, first[1]) for x, r in sizes[1:])


def removed_buffers() -> set[str]:
    """``V.graph.removed_buffers`` now (buffers Inductor already dropped, e.g. dead ones)."""
    return set(call_safely(lambda: V.graph.removed_buffers, ()))


def removable_through_fusion(scheduler: Any, name: str, op_names: Collection[str]) -> bool:
    """Would a kernel made of ``op_names`` drop buffer ``name`` as kernel-local (every user
    inside it; ``Kernel.remove_kernel_local_buffers``)? False when this torch cannot tell."""
    fn = getattr(scheduler, "can_buffer_be_removed_through_fusion", None)
    if fn is None:
        return False
    try:
        return bool(fn(name, op_names))
    except Exception:
        return False


def combinable(node: Any) -> bool:
    """Inductor's own filter for combo-kernel members."""
    cls = sched_class("ForeachKernelSchedulerNode")
    fn = getattr(cls, "combinable_nodes", None)
    if fn is None:
        return False
    try:
        return list(fn([node])) == [node]
    except Exception:
        return False


def topo_sort(scheduler: Any, nodes: list[Any]) -> list[Any]:
    nodes = sorted(nodes, key=lambda n: getattr(n, "min_order", 0))
    return list(scheduler.topological_sort_schedule(nodes))


# --- Inductor's fusion decision, with its profitability heuristics relaxed ------------


class _Relaxed:
    """Delegates to the active ``InductorChoices`` but waives the heuristics that
    Inductor documents as "not needed for correctness" (shared-data score, score
    threshold, node distance, peak-memory guess). Legality stays with the scheduler
    and the backend; Optimus's own conditions (caps) replace the heuristics."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def can_fuse(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def can_fuse_horizontal(self, *args: Any, **kwargs: Any) -> bool:
        return True


class _ReasonCatcher(logging.Filter):
    """Collects Inductor's ``WhyNoFuse`` messages (and keeps them out of the logs)."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []
        self.passthrough = False  # the user asked for fusion logs: let records through

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if type(msg).__name__ == "WhyNoFuse":
            try:
                reason = getattr(msg, "reason", "") % getattr(msg, "args", ())
            except Exception:
                reason = str(getattr(msg, "reason", msg))
            self.reasons.append(str(reason))
        return self.passthrough


_CATCHER: list[_ReasonCatcher] = []


@contextlib.contextmanager
def catch_fusion_reasons() -> Iterator[_ReasonCatcher]:
    """While active, ``inductor_can_fuse`` reports Inductor's own reason for a "no".

    Enabling the fusion logger is costly (``Logger.setLevel`` clears every logger's
    cache), so this wraps a whole pass, not each check.
    """
    catcher = _ReasonCatcher()
    flog = getattr(_sched, "fusion_log", None)
    if not isinstance(flog, logging.Logger):
        yield catcher
        return
    old_level = flog.level
    catcher.passthrough = flog.isEnabledFor(logging.DEBUG)
    flog.addFilter(catcher)
    if not catcher.passthrough:
        flog.setLevel(logging.DEBUG)
    _CATCHER.append(catcher)
    try:
        yield catcher
    finally:
        _CATCHER.remove(catcher)
        if flog.level != old_level:
            flog.setLevel(old_level)
        flog.removeFilter(catcher)


def inductor_can_fuse(scheduler: Any, node1: Any, node2: Any, relaxed: bool) -> tuple[bool, str]:
    """Inductor's ``Scheduler.can_fuse`` (legality: node kinds, templates, devices,
    dependencies, the backend's loop-shape and tiling checks), with its profitability
    heuristics waived when ``relaxed``. Returns ``(ok, Inductor's reason if not)``."""
    caught = _CATCHER[-1].reasons if _CATCHER else []
    del caught[:]
    if relaxed:
        with V.set_choices_handler(_Relaxed(V.choices)):
            ok = bool(scheduler.can_fuse(node1, node2))
    else:
        ok = bool(scheduler.can_fuse(node1, node2))
    if ok and scheduler.will_fusion_create_cycle(node1, node2):
        return False, "would create a cycle"
    if ok:
        return True, ""
    reason = caught[-1] if caught else "the backend cannot generate them as one kernel"
    return False, reason


def inductor_score(scheduler: Any, node1: Any, node2: Any) -> Any:
    """Inductor's fusion priority for a pair (higher first), or None if unavailable."""
    fn = getattr(scheduler, "score_fusion_key", None)
    if fn is None:
        return None
    try:
        return fn((node1, node2))
    except Exception:
        return None


def restore_state(scheduler: Any, saved: dict[str, Any]) -> None:
    scheduler.name_to_fused_node.clear()
    scheduler.name_to_fused_node.update(saved["name_to_fused_node"])
    streams = getattr(scheduler, "node_to_stream", None)
    if isinstance(streams, dict) and saved.get("node_to_stream") is not None:
        streams.clear()
        streams.update(saved["node_to_stream"])


def save_state(scheduler: Any) -> dict[str, Any]:
    streams = getattr(scheduler, "node_to_stream", None)
    return {
        "name_to_fused_node": dict(scheduler.name_to_fused_node),
        "node_to_stream": dict(streams) if isinstance(streams, dict) else None,
    }


def _graph_io() -> tuple[Any, Any]:
    """(graph inputs, graph outputs) of the graph Inductor is lowering, as name sets."""
    from torch._inductor.virtualized import V

    return ordered_set(list(V.graph.graph_inputs.keys())), ordered_set(list(V.graph.get_output_names()))


class PeakEstimate:
    """Inductor's estimate of the peak memory of orders of one node list (what
    ``schedule_peak_estimator`` returns): ``self(order)`` is ``(peak, bytes live at each
    step)``. ``merged(members, new)`` follows a merge without preparing the list again."""

    SUCCESSORS = ("succ_nodes", "succ_nodes_for_ordering")

    def __init__(self, imem: Any, freeable: Any, outputs: Any, name_to_buf: Any) -> None:
        self._imem, self._freeable, self._outputs, self._name_to_buf = imem, freeable, outputs, name_to_buf
        self._naming: dict[int, dict[tuple[int, str], tuple[Any, str]]] | None = None  # id(node) -> the successor sets naming it

    def __call__(self, order: list[Any]) -> tuple[int, list[int]]:
        top, curve = self._imem.estimate_peak_memory(list(order), self._freeable, self._outputs)
        return int(top), [int(x) for x in curve]

    def merged(self, members: list[Any], new: Any) -> bool:
        """``members`` became the one node ``new``: every buffer's successors name ``new``
        where they named a member. That is what preparing the merged list again gives the
        estimate: ``new`` writes its members' buffers and reads what they read, and a buffer
        one member writes and another reads (no longer a successor in the merged list) is
        freed at its own node either way. False (nothing changed) where this torch's
        planning info is not the one this was written against."""
        try:
            naming = self._successor_sets()
            gone = {id(m) for m in members}
            touched: dict[tuple[int, str], tuple[Any, str]] = {}
            for m in members:
                touched.update(naming.pop(id(m), {}))
            for info, attr in touched.values():
                nodes = getattr(info, attr)
                setattr(info, attr, ordered_set(list(dict.fromkeys(new if id(n) in gone else n for n in nodes))))
            naming.setdefault(id(new), {}).update(touched)
            return True
        except Exception:
            return False

    def _successor_sets(self) -> dict[int, dict[tuple[int, str], tuple[Any, str]]]:
        """For each node, the buffers' successor sets that name it (built at the first
        merge, then kept up to date by ``merged``), so a merge rewrites only those instead
        of scanning every buffer."""
        if self._naming is None:
            naming: dict[int, dict[tuple[int, str], tuple[Any, str]]] = {}
            for buf in list(self._name_to_buf.values()) + list(self._freeable.values()):
                info = buf.mpi_buffer
                for attr in self.SUCCESSORS:
                    for n in getattr(info, attr):
                        naming.setdefault(id(n), {})[(id(info), attr)] = (info, attr)
            self._naming = naming
        return self._naming


def schedule_peak_estimator(scheduler: Any, nodes: list[Any]) -> tuple[int, PeakEstimate] | None:
    """Inductor's own estimate of a node order's peak memory (``torch._inductor.memory``,
    what its ``reorder_for_peak_memory`` uses): ``(peak of nodes in this order, estimate)``
    where ``estimate(order)`` prices another order of the same nodes as ``(peak, bytes live
    at each step)``. ``None`` where this torch lacks it or it fails on these nodes."""
    try:
        from torch._inductor import memory as imem

        inputs, outputs = _graph_io()
        peak, freeable = imem.prepare_planning_info(list(nodes), scheduler.name_to_buf, scheduler.name_to_fused_node, inputs, outputs)
        return int(peak), PeakEstimate(imem, freeable, outputs, scheduler.name_to_buf)
    except Exception:
        return None


def planned_alloc_bytes(node: Any) -> int:
    """Bytes ``node``'s outputs allocate, as the last ``schedule_peak_estimator`` call
    priced them (their ``mpi_buffer.size_alloc``, set by ``prepare_planning_info``; what
    it sums into the node's ``mpi_node.size``, here also for a node merged since); 0
    where that is missing."""
    total = 0
    for buf in call_safely(node.get_outputs, []) or []:
        size = getattr(getattr(buf, "mpi_buffer", None), "size_alloc", 0)
        total += size if isinstance(size, int) else 0
    return total


def reorder_for_peak_memory(scheduler: Any, nodes: list[Any]) -> list[Any]:
    """``nodes`` in the order Inductor's ``reorder_for_peak_memory`` (which runs after the
    post-fusion hook when ``config.reorder_for_peak_memory`` is on) would give them; as they
    are where that is off, missing, or fails."""
    try:
        from torch._inductor import config as iconf
        from torch._inductor import memory as imem

        if not getattr(iconf, "reorder_for_peak_memory", False):
            return list(nodes)
        inputs, outputs = _graph_io()
        return list(imem.reorder_for_peak_memory(list(nodes), scheduler.name_to_buf, scheduler.name_to_fused_node, inputs, outputs))
    except Exception:
        return list(nodes)


def ordered_set(items: list[Any]) -> Any:
    try:
        from torch.utils._ordered_set import OrderedSet
    except ImportError:  # pragma: no cover
        return _ListSet(items)
    return OrderedSet(items)


class _ListSet(list):  # pragma: no cover - fallback for torch without OrderedSet
    def add(self, x: Any) -> None:
        if x not in self:
            self.append(x)


def call_safely(fn: Callable[[], Any], default: Any) -> Any:
    try:
        return fn()
    except Exception:
        return default


def is_communication(snode: Any) -> bool:
    """Is the scheduler node a collective or a wait on one (``_CollectiveKernel`` /
    ``_WaitKernel``; also inside a grouped node)? Collectives are barriers: no fusion moves
    a kernel across one (see ``optimus.core.collectives``)."""
    try:
        from torch._inductor.utils import contains_collective, contains_wait
    except ImportError:  # pragma: no cover - other layouts: nothing is treated as one
        return False
    return bool(call_safely(lambda: contains_collective(snode) or contains_wait(snode), False))
