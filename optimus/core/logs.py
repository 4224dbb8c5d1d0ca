"""What Optimus tells PyTorch's logging and tracing while it rewrites.

Everything goes through the ``optimus`` logger, registered with ``torch._logging``
(see ``torch_logging``), so the usual switches work::

    TORCH_LOGS="optimus"         one INFO line per graph and level: nodes before -> after,
                                 rewrites per rule, declines, time
    TORCH_LOGS="+optimus"        also a DEBUG line per rewrite and per decline (with its
                                 reason), and the optimus_report table of each graph
    TORCH_LOGS="optimus_graphs"  each FX graph before and after each level (off under
                                 "+optimus" alone: graphs are long)
    TORCH_TRACE=/some/dir        artifacts per graph and level for tlparse:
                                 optimus_<level>_<graph>_before / _after (graph code) and
                                 optimus_<level>_<graph>_report (JSON)
    torch._logging.set_logs(modules={"optimus": logging.DEBUG, "optimus_graphs": True})
                                 the same, in code (TORCH_LOGS, when set, wins)

The driver calls :func:`level_started` / :func:`level_finished` around each level it
runs on a graph; levels without an FX graph (Inductor-IR) call :func:`graph_finished`.
Nothing is computed unless something listens: graph code only when ``optimus_graphs``
is on or a trace is being written, and :func:`listening` lets other modules (the
graph pictures of ``optimus explain --graph``) see each graph before and after.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from typing import TYPE_CHECKING, Any, Iterator, Protocol

from . import torch_logging

if TYPE_CHECKING:
    import torch.fx as fx

    from .report import GraphReport

log = logging.getLogger("optimus")

torch_logging.register()
graphs_log = torch_logging.artifact_logger("optimus_graphs")
report_log = torch_logging.artifact_logger("optimus_report")


class LevelListener(Protocol):
    """Sees each FX graph before and after a level runs on it."""

    def before(self, level: str, graph_name: str, gm: "fx.GraphModule") -> Any:
        """Called before the level's rules run; the result is handed to ``after``."""

    def after(self, state: Any, report: "GraphReport", gm: "fx.GraphModule") -> None:
        """Called after the level ran (``report`` says what it did)."""


_LISTENERS: list[LevelListener] = []


@contextlib.contextmanager
def listening(listener: LevelListener) -> Iterator[LevelListener]:
    """Call ``listener`` around every level run on an FX graph inside the block."""
    _LISTENERS.append(listener)
    try:
        yield listener
    finally:
        _LISTENERS.remove(listener)


@dataclasses.dataclass
class LevelWatch:
    """What was taken from a graph before its level ran (only what someone wants)."""

    level: str
    graph_name: str
    code_before: str | None
    states: list[tuple[LevelListener, Any]]


def artifact_prefix(level: str, graph_name: str) -> str:
    """``optimus_torch_ir_graph_0``: a name tlparse and file systems take as it is."""
    return "optimus_" + "_".join(f"{level} {graph_name}".split())


def graph_code(gm: "fx.GraphModule") -> str:
    """The graph as Python (shapes included where the graph has them)."""
    try:
        return gm.print_readable(print_output=False)
    except Exception:  # noqa: BLE001 - odd graphs: the node list still says it all
        return str(gm.graph)


def level_started(level: str, graph_name: str, gm: "fx.GraphModule") -> LevelWatch | None:
    """Before a level runs on ``gm``: take what the listeners and enabled artifacts need.
    ``None`` (and no work) when nothing listens."""
    want_code = graphs_log.isEnabledFor(logging.DEBUG) or torch_logging.tracing()
    if not want_code and not _LISTENERS:
        return None
    states: list[tuple[LevelListener, Any]] = []
    for listener in list(_LISTENERS):
        try:
            states.append((listener, listener.before(level, graph_name, gm)))
        except Exception:  # noqa: BLE001 - a listener never breaks a compile
            log.warning("optimus: graph listener %r failed before %s %s", listener, level, graph_name, exc_info=True)
    return LevelWatch(level, graph_name, graph_code(gm) if want_code else None, states)


def level_finished(watch: LevelWatch | None, report: "GraphReport", gm: "fx.GraphModule") -> None:
    """After a level ran on ``gm``: the summary line, artifacts, listeners."""
    if watch is not None:
        prefix = artifact_prefix(report.level, report.graph)
        if watch.code_before is not None:
            before = watch.code_before
            after = graph_code(gm)
            if graphs_log.isEnabledFor(logging.DEBUG):
                graphs_log.debug("optimus: %s %s before Optimus:\n%s", report.level, report.graph, before)
                graphs_log.debug("optimus: %s %s after Optimus (%s):\n%s", report.level, report.graph, _counts(report), after)
            if torch_logging.tracing():
                torch_logging.trace_artifact(f"{prefix}_before", lambda: before)
                torch_logging.trace_artifact(f"{prefix}_after", lambda: after)
        for listener, state in watch.states:
            try:
                listener.after(state, report, gm)
            except Exception:  # noqa: BLE001
                log.warning("optimus: graph listener %r failed after %s %s", listener, report.level, report.graph, exc_info=True)
    graph_finished(report)


def graph_finished(report: "GraphReport") -> None:
    """A level finished on one graph: the INFO summary, the ``optimus_report`` table and
    the report artifact of the trace."""
    if log.isEnabledFor(logging.INFO):
        log.info("optimus: %s", report.summary())
    if report_log.isEnabledFor(logging.DEBUG):
        report_log.debug("optimus: %s %s report:\n%s", report.level, report.graph, graph_table(report))
    if torch_logging.tracing():
        torch_logging.trace_artifact(
            f"{artifact_prefix(report.level, report.graph)}_report",
            lambda: json.dumps(report.to_dict(), indent=1, default=str),
            encoding="json",
        )


def graph_table(report: "GraphReport") -> str:
    """Per rule of one graph that did anything: matched, declined, errors, nodes
    removed/added, and the most frequent decline reasons."""
    from .table import format_table

    rows = []
    active = {name: s for name, s in report.rules.items() if s.matched or s.declined or s.errors or s.removed}
    for name, s in sorted(active.items()):
        rows.append([name, s.matched, sum(s.declined.values()), len(s.errors), s.removed, s.added, f"{s.time_s * 1e3:.1f}"])
    lines = [report.summary(), format_table(["rule", "matched", "declined", "errors", "-nodes", "+nodes", "ms"], rows)]
    for name, s in sorted(active.items()):
        for reason, count in s.declined.most_common(3):
            lines.append(f"  {name} declined x{count}: {reason}")
        for err in s.errors[:3]:
            lines.append(f"  {name} error (rolled back): {err}")
    return "\n".join(lines)


def _counts(report: "GraphReport") -> str:
    return f"{report.nodes_before} -> {report.nodes_after} nodes, {report.matched} rewrites"
