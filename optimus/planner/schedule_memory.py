"""The peak memory of the Inductor-IR driver's merges: the planner's bound on them.

The rules that merge independent kernels (``Rule.memory_bounded``: they have a
``memory_increase`` option, which ``passes="auto"`` sets) ask ``ScheduleMemory`` before each
merge whether the schedule's estimated peak stays within it. The estimates are Inductor's
own (``torch._inductor.memory``, what its ``reorder_for_peak_memory`` uses), read through
the Inductor-IR level's guarded access to private Inductor APIs (``inductor_ir.inductor_api``),
which the driver hands in as ``ScheduleEstimates``; everything here is the policy on top.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from .memory import MEMORY_SLACK


class ScheduleEstimates(Protocol):
    """Inductor's estimates of a scheduler node list's memory, as the Inductor-IR level
    reads them (``inductor_ir.inductor_api`` is the implementation)."""

    def topo_sort(self, scheduler: Any, nodes: list[Any]) -> list[Any]:
        """``nodes`` in a dependency order."""

    def reorder_for_peak_memory(self, scheduler: Any, nodes: list[Any]) -> list[Any]:
        """``nodes`` in the order Inductor's peak-memory reordering would give them."""

    def schedule_peak_estimator(self, scheduler: Any, nodes: list[Any]) -> tuple[int, Any] | None:
        """``(peak of nodes in this order, estimate)``: ``estimate(order)`` is ``(peak, bytes
        live at each step)`` of another order of them, ``estimate.merged(members, new)``
        follows a merge; ``None`` where unavailable."""

    def planned_alloc_bytes(self, node: Any) -> int:
        """Bytes ``node``'s outputs allocate, as the last estimate priced them."""


class ScheduleMemory:
    """Bounds the peak memory of the driver's node list (a rule's ``memory_increase``).

    A merged kernel runs where its first member ran, so the others' outputs are allocated
    earlier and what they read must be ready earlier. Inductor reorders the final list for
    peak memory after the post-fusion hook (``reorder_for_peak_memory``), so the rules start
    from the list *in that order* (in the order before it, all 32 towers' matmul outputs of
    towers32 are live together and every merge looks free). A merge is
    simulated on the current order without performing it: every member runs where the first
    one ran, and what the others depend on that ran later runs before them (in its own
    order), priced by Inductor's own estimate
    (``ScheduleEstimates.schedule_peak_estimator``: the peak and the bytes live at each step). It must
    keep both

    * the whole schedule's estimated peak within ``base * (1 + increase)`` (``base``: the
      peak of the list the rules started from), and
    * the sum, over accepted merges, of each one's *rise* within ``base * increase`` (plus
      ``MEMORY_SLACK`` for both). A merge's rise is the larger of how much higher the
      estimated live bytes peak over the stretch of the schedule it reorders, and the
      bytes allocated by the nodes it moves ahead (they now run early and their results
      wait for the merged kernel). The second is there because the estimate misses it
      where the members write slices of one concatenated buffer: Inductor allocates that
      buffer whole before the first member, the estimate grows it slice by slice, so each
      tower's input looks freed as its slice appears. On towers32 inference (H200) the
      estimate put the peak at 8.00 MiB with and without merges (it also counts the graph's
      4 MiB input) whose measured peaks were 5.0 and 8.0 MiB against Inductor's 4.1 MiB.
      Summing the rises is conservative (rises at different places need not add up),
      which is the side to err on.

    An accepted merge's simulated order becomes the current one (the merged node in the
    first member's place), so later merges are judged with the earlier ones in place; the
    estimate follows the merge (the estimate's ``merged``) instead of preparing
    Inductor's planning info for the whole list again."""

    update_checks: list[bool] | None = None  # tests: after each merge, is the followed estimate what preparing anew gives?

    def __init__(self, scheduler: Any, live: Any, reaches: Callable[[Any, Any], bool], inductor: ScheduleEstimates) -> None:
        self.scheduler = scheduler
        self.live = live
        self.inductor = inductor  # Inductor's own estimates, read by the level (inductor_ir.inductor_api)
        self.reaches = reaches  # reaches(a, b): a must run before b
        self.base: int | None = None
        self.spent = 0  # the rises of the merges accepted so far
        self.order: list[Any] | None = None  # the current order, once the first merge was judged
        self.curve: list[int] | None = None  # the bytes live at each step of the current order
        self._estimate: Any = None
        self._pending: tuple[list[Any], list[Any], int] | None = None  # (members, simulated order, rise) last judged
        self.last: str | None = None  # the last accepted judgement, for the report's note

    def _prepare(self) -> bool:
        if self._estimate is not None:
            return True
        if self.order is None:
            self.order = self.inductor.reorder_for_peak_memory(self.scheduler, self.inductor.topo_sort(self.scheduler, list(self.live)))
        got = self.inductor.schedule_peak_estimator(self.scheduler, self.order)
        if got is None:
            return False
        peak, self._estimate = got
        if self.base is None:
            self.base = peak
        self.curve = self._estimate(self.order)[1]
        return True

    def merged(self, members: list[Any], new: Any) -> None:
        """``members`` became ``new``: the current order follows (nothing to do before the
        first judgement)."""
        if self.order is None:
            return
        order = self.order
        if self._pending is not None and {id(n) for n in self._pending[0]} == {id(n) for n in members}:
            order = self._pending[1]
            self.spent += self._pending[2]
        gone = {id(n) for n in members}
        first = next((n for n in order if id(n) in gone), None)
        # (a merge of nodes the order does not hold cannot happen; if it did, the next
        # judgement starts again from Inductor's reorder of the live list)
        self.order = None if first is None else [new if n is first else n for n in order if n is first or id(n) not in gone]
        self._pending = None
        # the estimate follows the merge (preparing Inductor's planning info again after each
        # of interformer inference's 134 merges took 3.9 s of its CPU compile, profiled);
        # where it cannot, it is prepared anew at the next judgement
        if self.order is not None and self._estimate is not None and self._estimate.merged(members, new):
            self.curve = self._estimate(self.order)[1]
            if self.update_checks is not None:
                fresh = self.inductor.schedule_peak_estimator(self.scheduler, self.order)
                self.update_checks.append(fresh is not None and fresh[1](self.order)[1] == self.curve)
        else:
            self._estimate, self.curve = None, None

    def why_not(self, members: list[Any], increase: float) -> str | None:
        """Why merging ``members`` (nodes of the current list) would break the budget."""
        if not self._prepare():
            return "no peak-memory estimate for this graph (Inductor's torch._inductor.memory failed on it)"
        assert self.order is not None and self.base is not None and self.curve is not None
        position = {id(n): i for i, n in enumerate(self.order)}
        if any(id(n) not in position for n in members):
            return "no peak-memory estimate for this merge (a member is not in the tracked order)"
        try:
            candidate, ahead = merged_order(self.order, members, self.reaches)
        except KeyError:  # a node the dependency sets do not know
            return "no peak-memory estimate for this merge (a node is not in the tracked dependencies)"
        held = sum(self.inductor.planned_alloc_bytes(n) for n in ahead)  # run early, read at the merged kernel
        allowed = self.base * (1 + increase) + MEMORY_SLACK
        allowance = self.base * increase + MEMORY_SLACK
        if held > 0 and self.spent + held > allowance:  # the rise is at least ``held``: declined without pricing the order
            return (f"memory: the merged kernel would hold at least {held / 2**20:.2f} MiB more at once where it runs, "
                    f"what the nodes it moves ahead allocate ({self.spent / 2**20:.2f} MiB of the {allowance / 2**20:.2f} MiB "
                    f"allowed for this graph's merges already used)")
        peak, curve = self._estimate(candidate)
        rise = max(local_rise(self.order, self.curve, candidate, curve), held)
        if peak > allowed:
            return (f"memory: the merged kernel would raise the schedule's estimated peak to {peak / 2**20:.2f} MiB "
                    f"(from {self.base / 2**20:.2f} MiB; allowed: {increase:.0%} more)")
        if self.spent + rise > allowance:
            return (f"memory: the merged kernel would hold {rise / 2**20:.2f} MiB more at once where it runs "
                    f"({self.spent / 2**20:.2f} MiB of the {allowance / 2**20:.2f} MiB allowed for this graph's merges already used)")
        self._pending = (list(members), list(candidate), rise)
        self.last = (f"estimated peak {peak / 2**20:.2f} MiB of {allowed / 2**20:.2f} MiB allowed, "
                     f"rise {rise / 2**20:.2f} MiB")
        return None

    def take_note(self) -> str:
        """`` (estimated peak ...)`` of the merge just judged, once; empty without a bound."""
        note, self.last = self.last, None
        return f"; {note}" if note else ""


def merged_order(order: list[Any], members: list[Any], reaches: Callable[[Any, Any], bool]) -> tuple[list[Any], list[Any]]:
    """``(order as it runs once members are one kernel at the first member's place, the
    nodes moved ahead of it)``: the nodes after that place which the other members depend
    on move ahead of it (in their own order; what they depend on is among them,
    dependencies being transitive), the members follow together, then the rest. (Not
    re-sorted with Inductor's ``topological_sort_schedule``: that puts each member's
    producer right before it again, so the simulated order would be the original one and no
    merge would ever cost memory.)"""
    position = {id(n): i for i, n in enumerate(order)}
    ranked = sorted(members, key=lambda n: position[id(n)])
    start, others = position[id(ranked[0])], ranked[1:]
    ids = {id(n) for n in ranked}
    later = [n for n in order[start + 1:] if id(n) not in ids]
    ahead = [n for n in later if any(reaches(n, m) for m in others)]
    moved = {id(n) for n in ahead}
    return order[:start] + ahead + ranked + [n for n in later if id(n) not in moved], ahead


def local_rise(order: list[Any], curve: list[int], candidate: list[Any], new_curve: list[int]) -> int:
    """How much higher the live bytes peak over the stretch of the schedule where
    ``candidate`` differs from ``order`` (same nodes, same length; a curve holds the bytes
    live at each step and after the last). Outside that stretch both orders have run the
    same nodes, so their curves agree there."""
    differs = [i for i, (a, b) in enumerate(zip(order, candidate)) if a is not b]
    if not differs:
        return 0
    lo, hi = differs[0], differs[-1] + 2
    return max(0, max(new_curve[lo:hi]) - max(curve[lo:hi]))
