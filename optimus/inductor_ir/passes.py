"""The Inductor-IR driver: runs fusion rules inside Inductor's scheduler hooks.

Inductor calls ``config._pre_fusion_custom_pass(nodes)`` right before its fusion loop
and ``config._post_fusion_custom_pass(nodes)`` right after it. Optimus installs one
``InductorIRPass`` object in each; both return a node list and never raise:

* every node is classified through ``SchedulerView``; unknown node types are left
  untouched and reported (``unknown node type <T>``);
* each enabled ``FusionRule`` for that hook runs in registry order; the driver owns the
  legality checks (same device, no dependency path, no cycle, Inductor's own
  ``can_fuse``, and for combo kernels ``legality``'s member checks and a trial codegen)
  and the fusion itself (Inductor's ``fuse_two_nodes`` / combo nodes), records matches,
  declines (with reasons) and errors in the report; nodes Inductor generates no kernel
  for (``legality.generates_no_kernel``) are no rule's candidates;
* at the end the node list is re-sorted topologically and verified (every original
  IR operation present exactly once, every dependency before its user, and no read
  that Inductor's codegen of the list would fail on: ``legality.new_problems``); if
  anything raised or the check fails, the scheduler's bookkeeping is restored and the
  original list is returned unchanged (a failed legality check is reported as
  ``plan refused by the legality check (PlanRefused: <reads>)``).

Fusion rules run after Inductor's fusion (``post_fusion``): Inductor re-sorts nodes and
redoes its own fusion decisions, so merging before it would only constrain it. The
pre-fusion hook records the unfused node count (the report's baseline) and runs any
``pre_fusion`` rules users register.

Cache keys: both pass objects are ``CustomSchedulerPass`` (2.13) and ``CustomGraphPass``
(2.11) instances whose ``uuid()`` is the session fingerprint, which hashes every level's
selected rules, their code and options; they pickle as that uuid alone (torch 2.11
pickles ``_post_fusion_custom_pass`` as part of the Inductor config in the key).
"""

from __future__ import annotations

import collections
import logging
import time
import weakref
from typing import Any

from ..core import logs
from ..core.passkey import UuidKeyed
from ..core.report import GraphReport, RuleStats
from ..core.rule import Decline
from ..planner.schedule_memory import ScheduleMemory
from . import inductor_api, legality
from .rule import ComboAction, FuseAction, FusionBuilder, FusionMatch, FusionRule
from .view import SchedulerView

log = logging.getLogger("optimus")

MAX_NOTES_PER_RULE = 12
LEFT_ALONE = (
    "Inductor's combo codegen would launch it on its own (it partitions pointwise kernels, "
    "short and long reductions and tilings into separate launches)"
)

SPLIT_SIZES = (
    "both hold reductions Inductor split in two stages, of different original sizes; Inductor's own "
    "fusion check assumes one size per kernel and fails on such a kernel (inductor_api.split_sizes_disagree)"
)


# ----------------------------------------------------------------------- pass objects
class InductorIRPass(UuidKeyed, *inductor_api.PASS_BASES):  # type: ignore[misc]
    """One scheduler hook of one Optimus session (pickled as its uuid: ``core.passkey``)."""

    def __init__(self, session: Any, hook: str) -> None:
        self.session = session
        self.hook = hook

    def __call__(self, nodes: list[Any]) -> list[Any]:  # type: ignore[override]
        return run_hook(self.session, self.hook, nodes)

    def uuid(self) -> str:
        return f"inductor_ir:{self.hook}:{self.session.fingerprint()}"

    def __repr__(self) -> str:
        return f"InductorIRPass({self.hook}, {self.uuid()})"


# ----------------------------------------------------------------------- report state
class _SessionState:
    def __init__(self) -> None:
        self.counter: collections.Counter[str] = collections.Counter()
        self.graphs: "weakref.WeakKeyDictionary[Any, GraphReport]" = weakref.WeakKeyDictionary()
        self.notes: collections.Counter[str] = collections.Counter()


_STATES: "weakref.WeakKeyDictionary[Any, _SessionState]" = weakref.WeakKeyDictionary()


def _state(session: Any) -> _SessionState:
    st = _STATES.get(session)
    if st is None:
        st = _STATES[session] = _SessionState()
    return st


def _graph_report(session: Any, scheduler: Any) -> GraphReport:
    st = _state(session)
    gr = st.graphs.get(scheduler)
    if gr is None:
        # named like the graph's other levels when the compile names it (optimus.compile)
        name = getattr(session, "current_graph", lambda: None)()
        if name is None:
            kind = inductor_api.graph_kind()
            name = f"{kind} {st.counter[kind]}"
            st.counter[kind] += 1
        gr = session.report.new_graph("inductor_ir", name)
        st.graphs[scheduler] = gr
    return gr


def _session_note(session: Any, note: str) -> None:
    st = _state(session)
    if not st.notes[note]:
        session.report.notes.append(note)
    st.notes[note] += 1


# ------------------------------------------------------------------------ the hook
def run_hook(session: Any, hook: str, nodes: list[Any]) -> list[Any]:
    """Run the session's Inductor-IR rules for ``hook`` on ``nodes``; never raises."""
    nodes = list(nodes)
    try:
        scheduler = inductor_api.current_scheduler()
    except Exception as e:
        _session_note(session, f"inductor_ir: no scheduler in the {hook} hook ({e}); nothing done")
        return nodes
    try:
        gr = _graph_report(session, scheduler)
    except Exception as e:  # pragma: no cover - report bookkeeping
        log.warning("optimus: inductor_ir report unavailable: %s", e)
        return nodes
    all_rules = session.config.rules_for("inductor_ir")
    for r in all_rules:
        if not isinstance(r, FusionRule):
            _session_note(session, f"inductor_ir: rule {r.name!r} is not a FusionRule (optimus.inductor_ir.fusion_rule); skipped")
    rules = [(r, session.config.options_for("inductor_ir", r)) for r in all_rules if isinstance(r, FusionRule) and r.hook == hook]
    if hook == "pre_fusion":
        gr.notes.append(f"{len(nodes)} scheduler nodes before Inductor's fusion")
    if hook == "post_fusion":
        gr.nodes_before = len(nodes)
        gr.nodes_after = len(nodes)
    if not rules:
        return nodes
    t0 = time.perf_counter()
    saved = None
    try:
        saved = inductor_api.save_state(scheduler)
        driver = FusionDriver(scheduler, nodes, rules, gr, session.config.driver.max_rewrites)
        out = driver.run()
        driver.verify(out, nodes)
    except Exception as e:  # never break the compile
        if saved is not None:
            try:
                inductor_api.restore_state(scheduler, saved)
            except Exception:  # pragma: no cover
                log.exception("optimus: could not restore the scheduler state")
        what = "plan refused by the legality check" if isinstance(e, PlanRefused) else "pass rolled back"
        log.warning("optimus: inductor_ir %s %s: %s: %s", hook, what, type(e).__name__, e)
        gr.notes.append(f"{hook} {what} ({type(e).__name__}: {e}); Inductor's own node list is used")
        for r, _ in rules:
            gr.stats(r.name)  # make the rules visible in the report
        first = rules[0][0].name
        gr.stats(first).errors.append(f"{hook} pass: {type(e).__name__}: {e}")
        out = nodes
    gr.time_s += time.perf_counter() - t0
    if hook == "post_fusion":
        gr.nodes_after = len(out)
        logs.graph_finished(gr)
    return out


# ------------------------------------------------------------------------ the driver
class _StateError(RuntimeError):
    """A fusion failed half-way: the scheduler's bookkeeping may be inconsistent."""


class PlanRefused(RuntimeError):
    """The final node list breaks an invariant Inductor's codegen relies on (``legality``)."""


class FusionDriver:
    """Applies fusion rules to one scheduler's node list."""

    def __init__(self, scheduler: Any, nodes: list[Any], rules: list[tuple[FusionRule, dict[str, Any]]], report: GraphReport, max_actions: int | None) -> None:
        self.scheduler = scheduler
        self.view = SchedulerView(scheduler, nodes)
        self.rules = rules
        self.report = report
        self.live = inductor_api.ordered_set(list(nodes))
        self.original = list(nodes)
        self.created: list[Any] = []
        self.max_actions = max_actions
        self.actions = 0
        self.notes: collections.Counter[str] = collections.Counter()
        self._facts: legality.CodegenFacts | None = None
        self.memory = ScheduleMemory(scheduler, self.live, lambda a, b: self.view.reach.reaches(a, b), inductor_api)

    @property
    def facts(self) -> legality.CodegenFacts:
        """What Inductor's codegen of the original list will drop (computed once)."""
        if self._facts is None:
            self._facts = legality.CodegenFacts.collect(self.original)
        return self._facts

    # ------------------------------------------------------------------- top level
    def run(self) -> list[Any]:
        unknown = [n for n in self.view.nodes if self.view.classify(n) is None]
        if unknown:
            types = sorted({self.view.type_name(n) for n in unknown})
            self.report.notes.append(f"left {len(unknown)} node(s) of unknown type untouched: {', '.join(types)}")
            for rule, _ in self.rules:
                stats = self.report.stats(rule.name)
                for n in unknown:
                    stats.decline(n.get_name(), f"unknown node type {self.view.type_name(n)}")
        with inductor_api.catch_fusion_reasons():
            self._run_rules()
        if not self.created:
            return list(self.original)
        return inductor_api.topo_sort(self.scheduler, list(self.live))

    def _run_rules(self) -> None:
        for rule, options in self.rules:
            stats = self.report.stats(rule.name)
            t0 = time.perf_counter()
            try:
                if rule.pairing == "producer_consumer":
                    self._producer_consumer(rule, options, stats)
                else:
                    self._groups(rule, options, stats)
            except _StateError:
                raise  # the scheduler may be half-updated: the whole pass is rolled back
            except Exception as e:
                # Completed fusions stay (each was checked and applied whole); the rest of
                # this rule is skipped and the final verification decides.
                stats.errors.append(f"{type(e).__name__}: {e}")
                log.warning("optimus: inductor_ir rule %s failed: %s: %s", rule.name, type(e).__name__, e)
            finally:
                stats.time_s += time.perf_counter() - t0

    def verify(self, out: list[Any], original: list[Any]) -> None:
        """Every original operation appears once; every dependency precedes its user; and
        no kernel reads a buffer that Inductor's codegen of the list before it drops, nor
        is a combo kernel of members that are not independent or not plainly generated
        (``legality.new_problems``: only problems Inductor's own list does not have).
        Raises ``PlanRefused`` (or RuntimeError) naming the first problems."""
        if not self.created:
            return

        def ops(nodes: list[Any]) -> list[str]:
            return [s.get_name() for n in nodes for s in n.get_nodes()]

        before, after = ops(original), ops(out)
        if sorted(before) != sorted(after):
            raise RuntimeError(f"operations changed: {len(before)} before, {len(after)} after")
        created = {id(n) for n in self.created}
        for n in out:
            if id(n) in created:
                for s in n.get_nodes():
                    if self.scheduler.name_to_fused_node.get(s.get_name()) is not n:
                        raise RuntimeError(f"{s.get_name()} is not mapped to its fused node")
        index = {id(n): i for i, n in enumerate(out)}
        reach = SchedulerView(self.scheduler, out).reach
        for i, n in enumerate(out):
            for p in reach.producers(n):
                j = index.get(id(p))
                if j is None or j >= i:
                    raise RuntimeError(f"{n.get_name()} runs before its producer {p.get_name()}")
        problems = legality.new_problems(self.scheduler, original, out, self.facts)
        if problems:
            more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
            raise PlanRefused("; ".join(p.detail for p in problems[:3]) + more)

    # ----------------------------------------------------------------- helpers
    def _budget_left(self) -> bool:
        return self.max_actions is None or self.actions < self.max_actions

    def _note(self, rule: FusionRule, text: str) -> None:
        self.notes[rule.name] += 1
        n = self.notes[rule.name]
        if n <= MAX_NOTES_PER_RULE:
            self.report.notes.append(f"{rule.name}: {text}")
        elif n == MAX_NOTES_PER_RULE + 1:
            self.report.notes.append(f"{rule.name}: ... (further fusions not listed)")

    def _describe(self, node: Any) -> str:
        call = self.view.classify(node)
        if call is None:
            return node.get_name()
        if call.op == "reduction":
            return f"reduction {self.view.numel(node)}x{self.view.rnumel(node)}"
        if call.op == "pointwise":
            return f"pointwise {self.view.numel(node)}"
        return call.op

    def _conditions(self, rule: FusionRule, m: FusionMatch) -> None:
        reason = rule.decline_reason(m)
        if reason is not None:
            raise Decline(reason)

    def _candidates(self, rule: FusionRule, options: dict[str, Any], stats: RuleStats) -> list[Any]:
        out = []
        for n in self.view.nodes:
            if not rule.candidate(self.view.classify(n), self.view, options):
                continue
            if legality.generates_no_kernel(n, self.facts):
                stats.decline(n.get_name(), legality.NO_KERNEL)
                continue
            out.append(n)
        return out

    def _common_checks(self, a: Any, b: Any) -> None:
        """What every pairing requires of ``a`` and ``b``: one device, no collective between
        them, split reductions of one original size."""
        if inductor_api.call_safely(a.get_device, None) != inductor_api.call_safely(b.get_device, None):
            raise Decline("different device")
        self._comm_check(a, b)
        if inductor_api.split_sizes_disagree([a, b]):
            raise Decline(SPLIT_SIZES)

    def _pair_check(self, a: Any, b: Any) -> None:
        """Structural legality of putting independent ``a`` and ``b`` in one launch."""
        self._common_checks(a, b)
        reach = self.view.reach
        for x, y in ((a, b), (b, a)):
            if reach.reaches(x, y):
                if any(p is x for p in reach.producers(y)):
                    raise Decline("depends on the other kernel's output (a producer/consumer pair)")
                raise Decline("would create a cycle (a dependency path connects them)")

    def _comm_check(self, a: Any, b: Any) -> None:
        """Collectives are barriers: no kernel moves across one (``core/collectives.py``)."""
        if not self.view.has_communication:
            return
        sa, sb = self.view.comm_segment(a), self.view.comm_segment(b)
        if sa is None or sa != sb:
            raise Decline("a collective lies between them; fusing would move a kernel across it (collectives are barriers)")

    # ------------------------------------------------------------ independent / combo
    def _groups(self, rule: FusionRule, options: dict[str, Any], stats: RuleStats) -> None:
        combo = rule.pairing == "combo"
        if combo and not self._combo_possible(rule, stats):
            return
        buckets: dict[Any, list[Any]] = {}
        for n in self._candidates(rule, options, stats):
            if combo:
                problem = legality.combo_member_problem(n, self.facts)
                if problem is not None:
                    stats.decline(n.get_name(), problem.reason)
                    continue
            try:
                key = rule.bucket(self.view.classify(n), self.view)  # type: ignore[misc]
            except Exception:
                key = None
            if key is None:
                continue
            buckets.setdefault(key, []).append(n)
        max_attempts = int(options.get("max_attempts", 64) or 64)
        for members in buckets.values():
            reasons: dict[str, str] = {}
            fused_names: set[str] = set()
            if len(members) < 2:
                for n in members:
                    stats.decline(n.get_name(), "no independent kernel with the same iteration space" if not combo else "no other candidate of its kind on its device")
                continue
            pending = sorted(members, key=lambda n: self.view.order(n))
            while len(pending) > 1 and self._budget_left():
                seed = pending.pop(0)
                group = [seed]
                target = seed
                rest: list[Any] = []
                attempts = 0
                for x in pending:
                    if attempts >= max_attempts or not self._budget_left():
                        rest.append(x)
                        continue
                    attempts += 1
                    m = FusionMatch(rule, self.view, group, x, options, target=None if combo else target)
                    try:
                        for g in group if combo else [target]:
                            self._pair_check(g, x)
                        self._conditions(rule, m)
                        action = rule.replace(m, FusionBuilder())
                        if action is None:
                            raise Decline("the replacement declined")
                        if combo:
                            if not isinstance(action, ComboAction):
                                raise TypeError(f"a combo rule must return b.combo(...), got {type(action).__name__}")
                            self._memory_check(options, group + [x])
                            group.append(x)
                        else:
                            if not isinstance(action, FuseAction):
                                raise TypeError(f"rule must return b.fuse(...), got {type(action).__name__}")
                            first, second = sorted((target, x), key=lambda n: self.view.order(n))
                            ok, why = inductor_api.inductor_can_fuse(self.scheduler, first, second, relaxed=True)
                            if not ok:
                                raise Decline(f"Inductor cannot fuse them: {why}")
                            self._memory_check(options, [first, second])
                            target = self._fuse(first, second)
                            group.append(x)
                            self.actions += 1
                            stats.matched += 1
                            stats.removed += 2
                            stats.added += 1
                    except Decline as d:
                        reasons.setdefault(x.get_name(), d.reason)
                        rest.append(x)
                    except _StateError:
                        raise
                    except Exception as e:
                        stats.errors.append(f"{x.get_name()}: {type(e).__name__}: {e}")
                        log.warning("optimus: inductor_ir rule %s failed on %s: %s", rule.name, x.get_name(), e)
                        rest.append(x)
                if len(group) > 1:
                    if not combo:
                        fused_names.update(n.get_name() for n in group)
                        self._note(rule, f"{' + '.join(n.get_name() for n in group)} -> one kernel ({self._describe(target)}{self.memory.take_note()})")
                    else:
                        fused_names.update(n.get_name() for n in self._make_combo(rule, group, stats, reasons, options))
                pending = rest
            for name, reason in reasons.items():
                if name not in fused_names:
                    stats.decline(name, reason)

    def _memory_check(self, options: dict[str, Any], members: list[Any]) -> None:
        """A rule with ``memory_increase`` (set by ``passes="auto"``) declines a merge that
        would raise the schedule's estimated peak by more (the planner's ``ScheduleMemory``)."""
        increase = options.get("memory_increase")
        if increase is None:
            return
        why = self.memory.why_not(members, float(increase))
        if why is not None:
            raise Decline(why)

    def _fuse(self, first: Any, second: Any) -> Any:
        try:
            new = inductor_api.fuse_two(self.scheduler, first, second, self.live)
            self.memory.merged([first, second], new)
            self.created.append(new)
            self.view.replace([first, second], new)
        except Exception as e:
            raise _StateError(f"fusing {first.get_name()} and {second.get_name()}: {type(e).__name__}: {e}") from e
        return new

    def _combo_possible(self, rule: FusionRule, stats: RuleStats) -> bool:
        devices = {inductor_api.call_safely(n.get_device, None) for n in self.view.nodes}
        if not any(inductor_api.combo_backend(self.scheduler, d) is not None for d in devices if d is not None):
            kinds = ", ".join(sorted({d.type for d in devices if d is not None})) or "no device"
            stats.decline("graph", f"combo kernels need a GPU (Triton) backend; this graph runs on {kinds}")
            return False
        return True

    def _make_combo(self, rule: FusionRule, group: list[Any], stats: RuleStats, reasons: dict[str, str], options: dict[str, Any]) -> list[Any]:
        """Make ``group`` (or the part of it Inductor launches as one kernel) one combo
        node; returns the members combined (none if declined, with reasons)."""
        problems = legality.combo_problems(group, self.facts)
        if problems:
            for n in group:
                reasons[n.get_name()] = f"combo kernel refused: {problems[0].reason}"
            return []
        if options.get("verify_codegen", True):
            try:
                partitions = inductor_api.trial_combo_codegen(self.scheduler, group, removed_later=self.facts.dropped)
            except Exception as e:
                for n in group:
                    reasons[n.get_name()] = f"combo kernel codegen failed: {type(e).__name__}: {str(e)[:120]}"
                return []
            # Inductor launches each partition separately and skips single ones in the
            # trial: keep the largest launch, the others stay as they were
            launch = max(partitions, key=len)
            kept = {id(n) for n in launch} if len(launch) > 1 else set()
            for n in group:
                if id(n) not in kept:
                    reasons[n.get_name()] = LEFT_ALONE
            group = [n for n in group if id(n) in kept]
            if not group:
                return []
        if options.get("benchmark", False):
            fn = getattr(self.scheduler, "speedup_by_combo_kernel", None)
            if fn is not None:
                with inductor_api.inductor_config.patch(benchmark_combo_kernel=True):
                    faster = fn(group)
                if not faster:
                    for n in group:
                        reasons[n.get_name()] = "benchmark: the combo kernel is not faster"
                    return []
        try:
            node = inductor_api.make_combo(self.scheduler, group)
            self.memory.merged(group, node)
            self.created.append(node)
            for n in group:
                self.live.remove(n)
            self.live.add(node)
            self.view.replace(group, node)
        except Exception as e:
            raise _StateError(f"combo of {[n.get_name() for n in group]}: {type(e).__name__}: {e}") from e
        self.actions += 1
        stats.matched += 1
        stats.removed += len(group)
        stats.added += 1
        self._note(rule, f"{' + '.join(n.get_name() for n in group)} -> one combo launch ({', '.join(self._describe(n) for n in group)}{self.memory.take_note()})")
        return group

    # ------------------------------------------------------------ producer/consumer
    def _producer_consumer(self, rule: FusionRule, options: dict[str, Any], stats: RuleStats) -> None:
        rounds = int(options.get("max_rounds", 10) or 10)
        last_reason: dict[tuple[str, str], str] = {}
        refused: dict[tuple[int, int], str] = {}  # Inductor's answer only depends on the two nodes
        scores: dict[tuple[int, int], Any] = {}
        for _ in range(rounds):
            cands = {id(n) for n in self._candidates(rule, options, stats)}
            pairs = []
            for b in self.view.nodes:
                if id(b) not in cands:
                    continue
                for a in self.view.producers(b):
                    if id(a) in cands:
                        pairs.append((a, b))
            scored = []
            for i, (a, b) in enumerate(pairs):
                key2 = (id(a), id(b))
                if key2 not in scores:
                    scores[key2] = inductor_api.inductor_score(self.scheduler, a, b)
                scored.append((scores[key2], i, a, b))
            try:
                scored.sort(key=lambda t: (t[0] is not None, t[0], -t[1]), reverse=True)
            except TypeError:  # scores not comparable: keep schedule order
                scored.sort(key=lambda t: t[1])
            touched: set[int] = set()
            progress = False
            for _, _, a, b in scored:
                if not self._budget_left():
                    return
                if id(a) in touched or id(b) in touched:
                    continue
                key = (a.get_name(), b.get_name())
                m = FusionMatch(rule, self.view, [a], b, options, target=a)
                try:
                    self._common_checks(a, b)
                    self._conditions(rule, m)
                    action = rule.replace(m, FusionBuilder())
                    if action is None:
                        raise Decline("the replacement declined")
                    if not isinstance(action, FuseAction):
                        raise TypeError(f"rule must return b.fuse(...), got {type(action).__name__}")
                    why = refused.get((id(a), id(b)))
                    if why is None:
                        ok, why = inductor_api.inductor_can_fuse(self.scheduler, a, b, relaxed=bool(options.get("relaxed", False)))
                        if not ok and why != "would create a cycle":
                            refused[(id(a), id(b))] = why
                    else:
                        ok = False
                    if not ok:
                        raise Decline(f"Inductor's fusion check refuses: {why}")
                    # Inductor's check covers paths through other nodes; ours is exact
                    # on the current graph (a safety net, run only for accepted pairs)
                    if self.view.reach.path_avoiding(a, b) is not None:
                        raise Decline("would create a cycle (another dependency path connects them)")
                    desc = f"{a.get_name()} ({self._describe(a)}) -> {b.get_name()} ({self._describe(b)})"
                    new = self._fuse(a, b)
                    touched.update((id(a), id(b), id(new)))
                    self.actions += 1
                    stats.matched += 1
                    stats.removed += 2
                    stats.added += 1
                    progress = True
                    last_reason.pop(key, None)
                    self._note(rule, f"{desc} fused into {new.get_name()}")
                except Decline as d:
                    last_reason[key] = d.reason
                except _StateError:
                    raise
                except Exception as e:
                    stats.errors.append(f"{a.get_name()} -> {b.get_name()}: {type(e).__name__}: {e}")
                    log.warning("optimus: inductor_ir rule %s failed on %s -> %s: %s", rule.name, a.get_name(), b.get_name(), e)
                    refused[(id(a), id(b))] = f"error: {type(e).__name__}"  # not retried
            if not progress:
                break
        live_names = {n.get_name() for n in self.view.nodes}
        for (pa, pb), reason in last_reason.items():
            if pa in live_names and pb in live_names:
                stats.decline(f"{pa}->{pb}", reason)
