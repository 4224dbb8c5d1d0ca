"""Inductor-IR rules: which of Inductor's scheduler nodes become one kernel.

Written like every other rule: a pattern over the scheduler-node kinds
(``optimus.inductor_ir.view``), conditions whose docstrings are the decline reasons, a
replacement that returns a fusion decision through the builder. Three rules, run after
Inductor's own fusion, in the order this module defines them (their stage is
``fuse_kernels``):

* ``fuse_producer_consumer`` (vertical): producer/consumer kernels that Inductor's own
  fusion check accepts but its fusion loop left apart;
* ``fuse_independent_kernels`` (horizontal): independent kernels over the same
  iteration space become one kernel (Inductor only fuses kernels that share data);
* ``combo_small_kernels`` (horizontal, GPU): independent small kernels that cannot
  share a loop nest get one launch (a combo kernel).

The driver (``optimus.inductor_ir.passes``) checks legality (same device, no dependency
path or cycle, Inductor's own ``can_fuse``) and performs the fusion; the conditions below
are the caps, each named for what it requires, and their docstrings are the decline
reasons ``optimus explain`` shows.
"""

from __future__ import annotations

from ..core.pattern import Op
from ..inductor_ir import inductor_api
from ..inductor_ir.rule import FusionBuilder, FusionMatch, fusion_rule

KERNEL = Op(("pointwise", "reduction"))


# ------------------------------------------------------------------------ conditions
def _within_max_kernels(m: FusionMatch) -> bool:
    """size cap: the kernel already holds max_kernels independent kernels"""
    return len(m.group) + 1 <= m.options["max_kernels"]


def _within_max_nodes(m: FusionMatch) -> bool:
    """size cap: the fused kernel would exceed max_nodes IR operations"""
    return m.members() <= m.options["max_nodes"]


def _within_max_accesses(m: FusionMatch) -> bool:
    """compile-time cap: the kernel would read or write more than max_accesses buffers (Triton's compile time grows faster than a kernel's body)"""
    return m.accesses() <= m.options["max_accesses"]


def _within_max_loads(m: FusionMatch) -> bool:
    """compile-time cap: the kernel would make more than max_loads memory accesses (a buffer counts once per index it is read at)"""
    return m.loads() <= m.options["max_loads"]


def _within_max_work(m: FusionMatch) -> bool:
    """cost cap: a kernel has more than max_work iteration points (bandwidth-bound; one launch saved is noise, a worse tiling is not)"""
    cap = m.options["max_work"]
    for n in m.nodes:
        w = m.work(n)
        if w is None or w > cap:
            return False
    return True


def _near_in_schedule(m: FusionMatch) -> bool:
    """too far apart in the schedule (more than max_distance nodes; fusing would extend buffer lifetimes)"""
    limit = m.options["max_distance"]
    return all(m.view.distance(n, m.candidate) <= limit for n in m.group)


def _same_cpu_region(m: FusionMatch) -> bool:
    """CPU: an extern call (matmul) lies between them; fusing would move work across it and split a C++ kernel function in two"""
    device = m.call(m.candidate).get("device") if m.call(m.candidate) is not None else None
    if device is None or device.type != "cpu":
        return True
    seg = m.view.segment(m.candidate)
    return seg is not None and all(m.view.segment(n) == seg for n in m.group)


def _reductions_within_max_rnumel(m: FusionMatch) -> bool:
    """cost cap: a reduction longer than max_rnumel runs long enough to hide its launch"""
    limit = m.options["max_rnumel"]
    for n in m.nodes:
        r = m.view.rnumel(n)
        try:
            if int(r) > limit:
                return False
        except (TypeError, ValueError):
            return False
    return True


# ----------------------------------------------------------------------------- rules
@fusion_rule(
    KERNEL,
    pairing="producer_consumer",
    kind="vertical",
    where=[_within_max_nodes],
    options={"max_nodes": 64, "max_rounds": 10, "relaxed": False},
)
def fuse_producer_consumer(m: FusionMatch, b: FusionBuilder):
    """A producer kernel and its consumer that Inductor's own fusion check accepts, but that
    Inductor's fusion loop left apart, become one kernel.

    k1: for i: t[i] = f(x[i]);  k2: for i: y[i] = g(t[i])   ->   k: for i: y[i] = g(f(x[i]))

    Inductor tries, per round, only the candidate pairs of the backend's best priority
    class and stops when a round fuses nothing: on CPU, outer-loop fusions (a row
    reduction feeding an elementwise consumer, e.g. layer norm's statistics and its
    normalisation) have a lower priority and are never tried when every better-priority
    pair would create a cycle. This rule re-asks Inductor's own ``can_fuse`` (same
    heuristics unless ``relaxed``) for every remaining producer/consumer pair, best
    Inductor score first, until nothing changes.
    """
    return b.fuse(m.producer, m.consumer)


@fusion_rule(
    KERNEL,
    pairing="independent",
    kind="horizontal",
    where=[_within_max_kernels, _within_max_nodes, _within_max_accesses, _within_max_loads, _within_max_work, _near_in_schedule, _same_cpu_region],
    options={"max_kernels": 8, "max_nodes": 64, "max_accesses": 64, "max_loads": 64, "max_work": 1 << 24, "max_distance": 64, "memory_increase": None,
             "max_attempts": 64},
    ranges={"max_distance": (0, None)},  # 0: nothing is near enough (the rule off, by its cap)
)
def fuse_independent_kernels(m: FusionMatch, b: FusionBuilder):
    """Independent kernels over the same iteration space become one kernel.

    k1: for i in I: a[i] = f(x[i])    k2: for i in I: c[i] = g(y[i])
      ->  k: for i in I: { a[i] = f(x[i]); c[i] = g(y[i]) }

    Inductor fuses two kernels only when they share data (a producer/consumer pair or a
    common input); independent ones with the same iteration space stay separate
    launches (GPU) or loop nests (CPU). Candidates are grouped by (device, numel,
    rnumel); Inductor's own ``can_fuse`` decides whether the backend can generate the
    pair as one kernel, with its shared-data, distance and peak-memory heuristics
    replaced by this rule's caps. With ``memory_increase`` (``passes="auto"`` sets it) a
    merge that would raise the schedule's estimated peak memory by more is declined
    (the planner's ``ScheduleMemory``).
    """
    return b.fuse(m.target, m.candidate)


def _combinable(m: FusionMatch) -> bool:
    device = m.anchor.get("device")
    return device is not None and device.type != "cpu" and inductor_api.combinable(m.anchor.node)


@fusion_rule(
    Op(("pointwise", "reduction")).such_that(_combinable),
    pairing="combo",
    kind="horizontal",
    where=[_within_max_kernels, _within_max_accesses, _within_max_loads, _within_max_work, _reductions_within_max_rnumel, _near_in_schedule],
    options={"max_kernels": 8, "max_accesses": 64, "max_loads": 64, "max_work": 1 << 20, "max_rnumel": 2048, "max_distance": 64, "memory_increase": None,
             "max_attempts": 64, "verify_codegen": True, "benchmark": False},
    ranges={"max_distance": (0, None)},  # 0: nothing is near enough (the rule off, by its cap)
    saves_only_launches=True,  # the kernels stay apart, only their launches merge
)
def combo_small_kernels(m: FusionMatch, b: FusionBuilder):
    """Independent small kernels that cannot share a loop nest get one launch (GPU).

    k1<<<g1>>>(x)   k2<<<g2>>>(y)   ->   k<<<g1 + g2>>>: block i < g1 runs k1, else k2

    For kernels whose iteration spaces differ (so fusing them is illegal), a combo
    kernel (Inductor's foreach/combo codegen) still saves the launches; it pays off for
    launch-bound kernels, hence the caps on iteration points and reduction length (a
    combo of 8 small kernels saves ~7 launches of a few microseconds each). Candidates
    are grouped by kind (Inductor launches pointwise kernels and reductions apart); the
    combo's source is generated once before it is accepted (``verify_codegen``), and
    members Inductor's partitioning would launch alone stay as they were;
    ``benchmark=True`` also times it against the separate kernels (slower compiles);
    ``memory_increase`` bounds the peak memory as for ``fuse_independent_kernels``. The
    driver keeps out the second stage of a split mix-order reduction, which Inductor
    computes inside the mix-order kernel (docs/inductor-ir.md, "Combo kernels and split
    mix-order reductions").
    """
    return b.combo(m.group, m.candidate)
