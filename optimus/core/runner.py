"""The level runner: one FX level's rules on one graph, with rollback and the numeric check.

``optimize_graph`` is what ``optimus.compile`` calls from Inductor's hooks (and
``optimus.optimize`` on a bare graph). Around the fixpoint loop (``driver.FxDriver``) it

1. records the graph (``snapshot``) before any rewrite;
2. runs the driver; if the driver itself fails or the final ``graph.lint()`` does, the
   graph is restored from the record and the level leaves it untouched;
3. with ``numeric_check``, runs the original and the rewritten graph on the same inputs
   (``numeric.find_culprit``); on a mismatch it restores the graph, disables the rule the
   bisection blames and runs the level again (at most 4 attempts), or restores the graph
   when no single rule can be blamed.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
import warnings
from typing import Any, Iterator

import torch.fx as fx

from . import logs
from .driver import FxDriver
from .levels import make_view
from .numeric import NUMERIC_SKIPPED, find_culprit
from .registry import PassConfig
from .report import GraphReport, Report, RuleStats
from .rule import Rule
from .snapshot import restore, snapshot
from .symbolic import refusing_new_guards
from .view import GraphView

log = logging.getLogger("optimus")

MAX_ATTEMPTS = 4  # level runs: the first, plus one per rule the numeric check disables


def optimize_graph(  # the caller recompiles gm if it runs it as Python (Inductor does not)
    gm: fx.GraphModule,
    level: str,
    config: PassConfig,
    report: Report,
    graph_name: str,
    view: GraphView | None = None,
    example_inputs: list[Any] | None = None,
) -> GraphReport | None:
    """Run the level's selected rules on ``gm`` in place; record what happened."""
    rules = [(r, config.options_for(level, r)) for r in config.rules_for(level)]
    if not rules:
        return None
    view = view or make_view(level, gm)
    graph = gm.graph
    gr = report.new_graph(level, graph_name)
    gr.nodes_before = len(graph.nodes)
    watch = logs.level_started(level, graph_name, gm)  # TORCH_LOGS / TORCH_TRACE / graph pictures
    t0 = time.perf_counter()
    with _gc_paused():
        _run_with_rollback(gm, view, rules, config, gr, example_inputs)
    gr.nodes_after = len(graph.nodes)
    gr.time_s = time.perf_counter() - t0
    logs.level_finished(watch, gr, gm)
    return gr


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Rewriting allocates many short-lived objects (nodes, fake tensors); Python's cyclic
    collector would rescan the whole graph repeatedly. Pause it, then restore its state."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _replay(level: str, rules: list[tuple[Rule, dict[str, Any]]], planner: Any = None) -> Any:
    """The numeric check's replay: the same driver on a fresh copy, with a rewrite budget."""

    def replay(trial: fx.GraphModule, max_rewrites: int | None) -> list[str]:
        driver = FxDriver(make_view(level, trial), rules, GraphReport(level, "bisect"), max_rewrites, planner=planner)
        driver.run()
        return driver.applied

    return replay


def _shape_env(view: GraphView) -> Any:
    """The graph's shape environment (``None`` for graphs without symbolic sizes)."""
    mode = view.fake_mode()
    return getattr(mode, "shape_env", None) if mode is not None else None


def _run_with_rollback(gm: fx.GraphModule, view: GraphView, rules: list[tuple[Rule, dict[str, Any]]], config: PassConfig, gr: GraphReport, example_inputs: list[Any] | None) -> None:
    graph = gm.graph
    level, graph_name = gr.level, gr.graph
    backup = snapshot(graph)
    disabled: set[str] = set()
    for _attempt in range(MAX_ATTEMPTS):
        active = [(r, o) for r, o in rules if r.name not in disabled]
        driver = FxDriver(view, active, gr, config.driver.max_rewrites, config.driver.lint == "each", config.planner)
        try:
            with refusing_new_guards(_shape_env(view)):
                driver.run()
            graph.lint()
        except Exception as e:  # the driver itself failed: leave the level untouched
            restore(graph, backup)
            gr.notes.append(f"level rolled back: {type(e).__name__}: {e}")
            log.warning("optimus: %s pass on %s rolled back: %s", level, graph_name, e)
            break
        if not config.driver.numeric_check or driver.rewrites == 0:
            break
        gm.recompile()
        differs, culprit, note = find_culprit(gm, backup, view, _replay(view.level, active, config.planner), example_inputs, config.driver.max_rewrites)
        if not differs:
            gr.notes.append(note)
            if note.startswith(NUMERIC_SKIPPED):
                # asked for, but could not run: the rewrites went through unchecked
                msg = f"optimus: numeric_check=True could not run on {level} {graph_name} ({note}); its {driver.rewrites} rewrite(s) were NOT verified. Pass example_inputs (optimus.optimize(gm, example_inputs=...)) or shape metadata."
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
                log.warning(msg)
            break
        if culprit is None:
            restore(graph, backup)
            gr.notes.append(f"{note}; the level was rolled back")
            break
        gr.notes.append(f"numeric check: rule {culprit!r} changed results; rolled back and disabled for this graph")
        gr.stats(culprit).errors.append("changed numeric results (numeric check)")
        log.warning("optimus: rule %s changed numeric results on %s; disabled", culprit, graph_name)
        restore(graph, backup)
        gr.rules = {name: RuleStats(errors=list(s.errors)) for name, s in gr.rules.items()}  # recount on retry
        disabled.add(culprit)
