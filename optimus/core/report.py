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
from typing import Any, Sequence

log = logging.getLogger("optimus")


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
        head = f"{'level':<12}{'graph':<22}{'nodes before':>13}{'after':>8}{'rewrites':>10}{'ms':>9}"
        lines += ["", head, "-" * len(head)]
        for g in self.graphs:
            lines.append(f"{g.level:<12}{g.graph:<22}{g.nodes_before:>13}{g.nodes_after:>8}{g.matched:>10}{g.time_s * 1e3:>9.1f}")
            if g.discarded:
                lines.append(f"{'':<12}DISCARDED: {g.discarded}")
            for note in g.notes:
                lines.append(f"{'':<12}note: {note}")
            planned = g.planner_line()
            if planned:
                lines.append(f"{'':<12}{planned}")
        rhead = f"{'rule':<36}{'level':<12}{'graph':<22}{'matched':>8}{'declined':>9}{'errors':>7}{'-nodes':>7}{'+nodes':>7}{'ms':>8}"
        lines += ["", rhead, "-" * len(rhead)]
        for g in self.graphs:
            for name, s in sorted(g.rules.items()):
                lines.append(
                    f"{name:<36}{g.level:<12}{g.graph:<22}{s.matched:>8}{sum(s.declined.values()):>9}"
                    f"{len(s.errors):>7}{s.removed:>7}{s.added:>7}{s.time_s * 1e3:>8.1f}"
                )
                for reason, count in s.declined.most_common(max_reasons):
                    lines.append(f"{'':<4}declined x{count}: {reason}")
                for err in s.errors[:max_reasons]:
                    lines.append(f"{'':<4}error (rolled back): {err}")
        for note in self.notes:
            lines.append(f"note: {note}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[bool] | None = None) -> str:
    """Plain-text table: a header, a rule, one line per row; numeric columns right-aligned.

    Columns are as wide as their widest cell; cells are ``str()``-ed. Plain text on
    purpose: the same bytes in a terminal, a pipe, a log and a test.
    """
    cells = [[str(c) for c in row] for row in rows]
    if numeric is None:
        numeric = [bool(cells) and all(_is_number(r[i]) for r in cells) for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(list(headers)), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True
