"""The FX levels' fixpoint loop: the greedy, anchor-driven rewrite driver.

For one graph at one level (Torch-IR or Aten-IR; the Inductor-IR driver is
``optimus.inductor_ir.passes``):

1. A worklist holds every node (in graph order). For a node, the rules anchored at its
   canonical op are tried in their stage order; the first that rewrites wins.
2. A rewrite is a transaction: the rule's pattern matches, the driver refuses regions
   that touch tensors mutated in place, the rule's conditions run, the replacement emits
   new nodes through a ``Builder``; then ``transaction.Surgery`` validates (shapes and
   dtypes equal, definitions before uses, mutation, no new aliasing of graph outputs,
   memory layout) and only then redirects uses and removes what became dead. Any
   exception or failed check erases the new nodes and leaves the graph as it was; the
   error is reported and the driver goes on.
3. The neighbours of what changed (new nodes, their users, the surviving producers of
   removed nodes and their users) are re-queued, so rules interplay to a fixpoint.
   A rewrite budget (default ``4 * nodes + 1000``) bounds rule cycles.
4. Group (horizontal) rules then run over the whole graph (``group.find_groups``), each
   round followed by the local rules again, which remove the glue they add.

The level runner (``runner.optimize_graph``) wraps that with a whole-graph snapshot and
the numeric check.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any, Iterable

import torch.fx as fx

from .group import Cut, Group, GroupPlanner, GroupRule, classify_all, find_groups
from .report import GraphReport, RuleStats
from .rule import Builder, Decline, PatternRule, Rule
from .safety import AliasAnalysis
from .symbolic import GuardRefused
from .transaction import Checked, Surgery
from .view import GraphView

log = logging.getLogger("optimus")

DEAD_CODE = "dead_code_elimination"
_FAILED = object()  # a group rule's key raised on a node


class FxDriver:
    def __init__(
        self,
        view: GraphView,
        rules: list[tuple[Rule, dict[str, Any]]],
        report: GraphReport,
        max_rewrites: int | None = None,
        lint_each: bool = False,
        planner: GroupPlanner | None = None,
        reverse: bool = False,
    ) -> None:
        self.view = view
        self.reverse = reverse  # visit the graph last node first (the fixpoint must not depend on it)
        self.graph = view.graph
        self.report = report
        self.by_anchor: dict[str, list[tuple[Rule, dict[str, Any]]]] = collections.defaultdict(list)
        self.group_rules: list[tuple[GroupRule, dict[str, Any]]] = []
        for rule, options in rules:
            if isinstance(rule, GroupRule):
                self.group_rules.append((rule, options))
                continue
            for anchor in rule.anchors:
                self.by_anchor[anchor].append((rule, options))
        n = len(self.graph.nodes)
        self.max_rewrites = max_rewrites if max_rewrites is not None else 4 * n + 1000
        self.lint_each = lint_each
        self.planner = planner  # passes="auto": gates and sizes every group
        self.rewrites = 0
        self.applied: list[str] = []  # rule name of each rewrite, in order (for bisection)
        self.failed: set[tuple[str, fx.Node]] = set()
        self.alias = AliasAnalysis(view)
        self.surgery = Surgery(view, self.alias)
        self._queue: collections.deque[fx.Node] = collections.deque()
        self._queued: set[fx.Node] = set()

    # ------------------------------------------------------------------ main loop
    def run(self) -> None:
        """Local rules to a fixpoint; then group (horizontal) rules over the whole graph,
        each round followed by local rules again, which remove the glue they add."""
        self._remove_dead_code_upfront()
        self._enqueue(reversed(list(self.graph.nodes)) if self.reverse else self.graph.nodes)
        self._fixpoint()
        for _round in range(8):
            if not self.group_rules or self.rewrites >= self.max_rewrites:
                break
            fused = 0
            if self.planner is not None:
                self.planner.round_started(self.view, self.report)
            for rule, options in self.group_rules:
                fused += self._run_group_rule(rule, options)
            if not fused:
                break
            self._fixpoint()

    def _run_group_rule(self, rule: GroupRule, options: dict[str, Any]) -> int:
        stats = self.report.stats(rule.name)

        def excluded(node: fx.Node) -> str | None:
            for n in [node, *node.all_input_nodes]:
                if self.alias.is_mutated(n):
                    return f"touches {n.name}, which aliases a tensor mutated in place"
            return None

        fused = 0
        calls = [c for c in classify_all(self.view) if c.op in rule.anchors and self._safe_key(rule, c, stats) is not _FAILED]
        if not calls:
            return 0
        for group in find_groups(self.view, rule, options, excluded, lambda n, r: stats.decline(n.name, r), calls):
            if self.rewrites >= self.max_rewrites:
                break
            fused += self._try_group(rule, group, stats)
        return fused

    def _safe_key(self, rule: GroupRule, call: Any, stats: RuleStats) -> Any:
        """The rule's ``key`` of ``call``, or ``_FAILED``: a key that raises (a broken
        rule, or an argument it did not expect, such as a graph node where it compares
        numbers) is that rule's error on that node: reported, the node left out, the
        level goes on."""
        if (rule.name, call.node) in self.failed:
            return _FAILED
        try:
            return rule.key(call, self.view)
        except Exception as e:
            self.failed.add((rule.name, call.node))
            stats.errors.append(f"{call.node.name}: key: {type(e).__name__}: {e}")
            log.warning("optimus: the key of rule %s failed on %s; the node is left out: %s", rule.name, call.node.name, e)
            return _FAILED

    def _try_group(self, rule: GroupRule, group: Any, stats: RuleStats) -> bool:
        if any(n._erased for n in group.nodes):
            return False
        # Earlier fusions this round may have rewired the members' inputs: read them again.
        fresh = [self.view.classify(n) for n in group.nodes]
        if any(c is None or self._safe_key(rule, c, stats) != group.key for c in fresh):
            return False
        group.members = fresh
        anchor = max(group.nodes, key=lambda n: n._sort_key)
        t0 = time.perf_counter()
        builder: Builder | None = None
        try:
            reason = rule.decline_reason(group)
            if reason is not None:
                raise Decline(reason)
            if self.planner is not None:
                order = self.planner.order(self.view, group.nodes)
                if order != list(range(len(group.members))):
                    group = Group(rule, [group.members[i] for i in order], group.key, self.view, group.options)
                cut = self.planner.chunk(self.view, group.nodes, group.options["min_group"], rule.copied_operands(group), rule.custom_op,
                                         rule.held_in_backward(group))
                if cut is not None:
                    return self._try_parts(rule, group, stats, cut)
            builder = Builder(self.view, anchor)
            pairs = self.surgery.pairs(rule.replace(group, builder), anchor)
            checked = self.surgery.validate(pairs, builder, group=True)
            if self.planner is not None:
                why = self.planner.judge(self.view, rule.name, anchor, group.nodes, builder.new_nodes)
                if why is not None:
                    raise Decline(why)
            members = group.nodes
            self._commit(rule, anchor, pairs, builder, stats, checked)
            if self.planner is not None:
                self.planner.accepted(self.view, members)
            return True
        except (Decline, GuardRefused) as d:
            self.surgery.discard(builder)
            for n in group.nodes:
                stats.decline(n.name, _reason(d))
            return False
        except Exception as e:  # a broken rule never takes the compile down
            self.surgery.discard(builder)
            stats.errors.append(f"group of {len(group.nodes)} at {anchor.name}: {type(e).__name__}: {e}")
            log.warning("optimus: rule %s failed on a group at %s and was rolled back: %s", rule.name, anchor.name, e)
            return False
        finally:
            stats.time_s += time.perf_counter() - t0

    def _try_parts(self, rule: GroupRule, group: Group, stats: RuleStats, cut: Cut) -> bool:
        """The planner cut ``group``: try each of its parts as a group of its own (cut again
        if it must be), or decline every member when none fits."""
        if cut.declined:
            for n in group.nodes:
                stats.decline(n.name, cut.declined)
            return False
        self.report.notes.append(f"{rule.name}: {cut.note}")
        fused = False
        for part in cut.parts:
            fused |= self._try_group(rule, Group(rule, [group.members[i] for i in part], group.key, self.view, group.options), stats)
        return fused

    def _fixpoint(self) -> None:
        while self._queue:
            node = self._queue.popleft()
            self._queued.discard(node)
            if node._erased:
                continue
            call = self.view.classify(node)
            if call is None:
                continue
            for rule, options in self.by_anchor.get(call.op, ()):
                if (rule.name, node) in self.failed:
                    continue
                if self._try(rule, options, call):
                    break
            if self.rewrites >= self.max_rewrites:
                if self._queue:
                    self.report.notes.append(f"stopped at the rewrite budget ({self.max_rewrites}); {len(self._queue)} nodes not revisited")
                break

    def _enqueue(self, nodes: Iterable[fx.Node]) -> None:
        for n in nodes:
            if n not in self._queued and not n._erased:
                self._queued.add(n)
                self._queue.append(n)

    # ------------------------------------------------------------- one rewrite
    def _try(self, rule: PatternRule, options: dict[str, Any], call: Any) -> bool:
        anchor = call.node
        try:
            match = rule.match(call, self.view, options)
        except GuardRefused as g:  # a filter asked for a guard: silent, like an unmet filter
            self.failed.add((rule.name, anchor))
            log.debug("optimus: rule %s at %s: %s", rule.name, anchor.name, g)
            return False
        except Exception as e:  # a filter or a sub-pattern that raised: this rule's error here
            self.failed.add((rule.name, anchor))
            self.report.stats(rule.name).errors.append(f"{anchor.name}: match: {type(e).__name__}: {e}")
            log.warning("optimus: rule %s failed to match %s: %s", rule.name, anchor.name, e)
            return False
        if match is None:
            return False
        stats = self.report.stats(rule.name)
        t0 = time.perf_counter()
        builder: Builder | None = None
        try:
            self.surgery.check_region(match)
            reason = rule.decline_reason(match)
            if reason is not None:
                raise Decline(reason)
            builder = Builder(self.view, anchor)
            result = rule.replace(match, builder)
            pairs = self.surgery.pairs(result, anchor)
            checked = self.surgery.validate(pairs, builder)
            self._commit(rule, anchor, pairs, builder, stats, checked)
            return True
        except (Decline, GuardRefused) as d:
            self.surgery.discard(builder)
            stats.decline(anchor.name, _reason(d))
            return False
        except Exception as e:  # a broken rule never takes the compile down
            self.surgery.discard(builder)
            self.failed.add((rule.name, anchor))
            msg = f"{anchor.name}: {type(e).__name__}: {e}"
            stats.errors.append(msg)
            log.warning("optimus: rule %s failed on %s and was rolled back: %s", rule.name, anchor.name, e)
            return False
        finally:
            stats.time_s += time.perf_counter() - t0

    def _commit(
        self,
        rule: Rule,
        anchor: fx.Node,
        pairs: list[tuple[fx.Node, fx.Node]],
        builder: Builder,
        stats: RuleStats,
        checked: Checked,
    ) -> None:
        new_set = set(builder.new_nodes)
        producers: set[fx.Node] = set()  # inputs of erased nodes, read before FX clears them
        erased = self.surgery.commit(pairs, builder, checked, producers)
        erased_new = sum(1 for n in erased if n in new_set)
        stats.matched += 1
        stats.added += len(builder.new_nodes) - erased_new
        stats.removed += len(erased) - erased_new
        stats.log_rewrite(anchor.name, len(erased) - erased_new, len(builder.new_nodes) - erased_new)
        self.rewrites += 1
        self.applied.append(rule.name)
        if self.lint_each:
            self.graph.lint()
        # Re-queue the neighbourhood of the change: a surviving anchor; every node the
        # rewrite built; each replacement, old or new, with its users (they now read it:
        # a pattern through them may have formed) and its inputs; and the surviving
        # producers of what was erased, with their users (they lost a user).
        touched: list[fx.Node] = [anchor]
        for node in builder.new_nodes:
            if not node._erased:
                touched.append(node)
                touched.extend(node.users)
        for _, new in pairs:
            if not new._erased:
                touched.append(new)
                touched.extend(new.users)
                touched.extend(new.all_input_nodes)
        for node in producers:
            if not node._erased:
                touched.append(node)
                touched.extend(node.users)
        self._enqueue(touched)

    def _remove_dead_code_upfront(self) -> None:
        erased = self.surgery.dead_code(reversed(list(self.graph.nodes)))
        if erased:
            self.report.stats(DEAD_CODE).removed += len(erased)
            self.report.stats(DEAD_CODE).matched += len(erased)


def _reason(d: Exception) -> str:
    """A decline's reason; a refused guard is reported with its expression's shape only,
    so that the report counts one reason, not one per symbol."""
    if isinstance(d, Decline):
        return d.reason
    return "a symbolic size would need a guard (it would specialize the graph)"
