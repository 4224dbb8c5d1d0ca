"""What Optimus did to each graph: nodes before/after, per-rule matches, declines with
reasons, errors (rolled back), node accounting and time.

Accounting is exact: for every graph, ``nodes_before - nodes_after`` equals the sum over
rules of ``removed - added`` (dead code the driver removes after a rewrite is charged to
the rule whose rewrite made it dead).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from typing import Any

from .table import format_table

log = logging.getLogger("optimus")

__all__ = ["GraphReport", "Report", "RuleStats", "format_table"]  # format_table: core.table's, used here


@dataclasses.dataclass
class RuleStats:
    matched: int = 0
    declined: Counter = dataclasses.field(default_factory=Counter)
    errors: list[str] = dataclasses.field(default_factory=list)
    removed: int = 0
    added: int = 0
    time_s: float = 0.0
    _seen_declines: set = dataclasses.field(default_factory=set, repr=False)
    where: str = dataclasses.field(default="", repr=False, compare=False)  # "level graph: rule", for log lines

    def decline(self, node_name: str, reason: str) -> None:
        key = (node_name, reason)
        if key not in self._seen_declines:  # a re-queued node declining again is one decline
            self._seen_declines.add(key)
            self.declined[reason] += 1
            if log.isEnabledFor(logging.DEBUG):
                log.debug("optimus: %s declined at %s: %s", self.where or "a rule", node_name, reason)

    def log_rewrite(self, anchor: str, removed: int, added: int) -> None:
        """One DEBUG line per rewrite (``TORCH_LOGS="+optimus"``); counts are the caller's."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug("optimus: %s rewrote %s (-%d +%d nodes)", self.where or "a rule", anchor, removed, added)

    def to_dict(self) -> dict[str, Any]:
        return {
            "matched": self.matched,
            "declined": dict(self.declined),
            "errors": list(self.errors),
            "removed": self.removed,
            "added": self.added,
            "time_s": round(self.time_s, 6),
        }


@dataclasses.dataclass
class GraphReport:
    level: str
    graph: str
    nodes_before: int = 0
    nodes_after: int = 0
    time_s: float = 0.0
    rules: dict[str, RuleStats] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    # Set when the compile this graph's rewrites went into failed and the graph was
    # compiled again without them (the safety net): the rewrites did not reach the program.
    discarded: str | None = None
    # passes="auto": one entry per horizontal group the planner judged (optimus.planner.plan)
    decisions: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def stats(self, rule_name: str) -> RuleStats:
        if rule_name not in self.rules:
            self.rules[rule_name] = RuleStats()
        stats = self.rules[rule_name]
        if not stats.where:
            stats.where = f"{self.level} {self.graph}: {rule_name}"
        return stats

    def summary(self) -> str:
        """One line: nodes before -> after, rewrites per rule (most first), declines,
        errors, notes, time. What ``TORCH_LOGS="optimus"`` prints per graph."""
        done = sorted(((s.matched, name) for name, s in self.rules.items() if s.matched), reverse=True)
        shown = ", ".join(f"{name} x{n}" for n, name in done[:4]) + (f", +{len(done) - 4} more rules" if len(done) > 4 else "")
        declined = sum(sum(s.declined.values()) for s in self.rules.values())
        errors = sum(len(s.errors) for s in self.rules.values())
        line = f"{self.level} {self.graph}: {self.nodes_before} -> {self.nodes_after} nodes, {self.matched} rewrites"
        line += f" ({shown})" if shown else ""
        line += f", {declined} declined" if declined else ""
        line += f", {errors} errors rolled back" if errors else ""
        line += f", {self.time_s * 1e3:.1f} ms"
        return line + "".join(f"; {note}" for note in self.notes)

    @property
    def matched(self) -> int:
        return sum(s.matched for s in self.rules.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "graph": self.graph,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "time_s": round(self.time_s, 6),
            "rules": {k: v.to_dict() for k, v in self.rules.items()},
            "notes": list(self.notes),
            "discarded": self.discarded,
            "decisions": list(self.decisions),
        }

    def planner_line(self) -> str | None:
        """The planner's decisions on this graph in one line, if it made any."""
        if not self.decisions:
            return None
        took = [d for d in self.decisions if d["accepted"]]
        left = [d for d in self.decisions if not d["accepted"]]
        gain = sum(d["before_us"] - d["after_us"] for d in took)
        line = f"planner: {len(took)} group(s) taken (est. {gain:.1f} µs saved, {sum(d['before_kernels'] for d in took)} -> {sum(d['after_kernels'] for d in took)} kernels)"
        if left:
            line += f", {len(left)} declined as slower (est. {sum(d['after_us'] - d['before_us'] for d in left):.1f} µs lost had they run)"
        return line


class Report:
    """All graphs one ``optimus.compile``/``optimize`` call rewrote."""

    def __init__(self, passes: str = "") -> None:
        self.passes = passes
        self.graphs: list[GraphReport] = []
        self.notes: list[str] = []

    def note_once(self, note: str) -> None:
        """Add a report-wide note unless it is there already (per-compile hooks repeat)."""
        if note not in self.notes:
            self.notes.append(note)

    def new_graph(self, level: str, graph: str) -> GraphReport:
        g = GraphReport(level, graph)
        self.graphs.append(g)
        return g

    def rule_totals(self) -> dict[str, RuleStats]:
        out: dict[str, RuleStats] = {}
        for g in self.graphs:
            if g.discarded:
                continue  # those rewrites never reached the compiled program
            for name, s in g.rules.items():
                t = out.setdefault(name, RuleStats())
                t.matched += s.matched
                t.declined.update(s.declined)
                t.errors.extend(s.errors)
                t.removed += s.removed
                t.added += s.added
                t.time_s += s.time_s
        return out

    def errors(self) -> list[str]:
        return [e for g in self.graphs for s in g.rules.values() for e in s.errors]

    def to_dict(self) -> dict[str, Any]:
        return {"passes": self.passes, "graphs": [g.to_dict() for g in self.graphs], "notes": list(self.notes)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def table(self, max_reasons: int = 3) -> str:
        lines = [f"Optimus report (passes: {self.passes})"]
        if not self.graphs:
            lines.append("  no graph was rewritten" + (f" ({'; '.join(self.notes)})" if self.notes else ""))
            return "\n".join(lines)
        graphs: list[Any] = []
        for g in self.graphs:
            graphs.append([g.level, g.graph, g.nodes_before, g.nodes_after, g.matched, f"{g.time_s * 1e3:.1f}"])
            graphs += [f"    DISCARDED: {g.discarded}"] if g.discarded else []
            graphs += [f"    note: {note}" for note in g.notes]
            planned = g.planner_line()
            graphs += [f"    {planned}"] if planned else []
        rules: list[Any] = []
        for g in self.graphs:
            for name, s in sorted(g.rules.items()):
                rules.append([name, g.level, g.graph, s.matched, sum(s.declined.values()), len(s.errors), s.removed,
                              s.added, f"{s.time_s * 1e3:.1f}"])
                rules += [f"    declined x{count}: {reason}" for reason, count in s.declined.most_common(max_reasons)]
                rules += [f"    error (rolled back): {err}" for err in s.errors[:max_reasons]]
        lines += ["", format_table(["level", "graph", "nodes before", "after", "rewrites", "ms"], graphs,
                                   [False, False, True, True, True, True])]
        if rules:
            lines += ["", format_table(["rule", "level", "graph", "matched", "declined", "errors", "-nodes", "+nodes", "ms"],
                                       rules, [False, False, False] + [True] * 6)]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
