"""``tune=True``: the candidate plans compiled and measured on a graph's real inputs.

``measure_plans`` compiles a Dynamo graph under each of ``TUNE_CANDIDATES`` and keeps the
fastest, cached on disk by the graph's structure (``decisions``), so the next compile of
the same graph measures nothing. Timing runs the compiled graph several times on the
inputs Dynamo gave the backend, so it must leave no trace: the random-number state is
restored afterwards, a training graph's backward runs through ``torch.autograd.grad``
(gradients are returned, never accumulated into ``.grad``), and a graph that writes its
inputs in place or has data-dependent shapes is not tuned at all (``why_not_tunable``
says so).
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx as fx

from .. import safety_net, torch_api
from . import decisions

TUNE_CANDIDATES = ("auto", "all", "vertical", "none")  # what tune=True measures per graph
# Inductor's own autotuning is left out of the trial compiles (it would multiply their cost
# by the GEMM search); the chosen plan compiles with it.
TRIAL_OPTIONS_OFF = ("max_autotune", "max_autotune_gemm", "max_autotune_pointwise", "coordinate_descent_tuning")


def measure_plans(
    gm: fx.GraphModule,
    example_inputs: list[Any],
    inductor_options: dict[str, Any],
    training: bool,
    key_extra: dict[str, Any],
    compile_plan: Callable[[str, fx.GraphModule, list[Any], dict[str, Any]], Callable[..., Any]],
    notes: list[str],
    label: str,
) -> str | None:
    """The fastest of ``TUNE_CANDIDATES`` on this graph, from the decision cache or measured
    (each compiled by ``compile_plan(plan, copy of gm, inputs, options)`` and timed); ``None``
    when the graph cannot be tuned or nothing could be timed. What happened goes to
    ``notes``, each line naming the graph (``label``). ``key_extra``: what besides the
    graph's structure changes the answer (the context, Optimus's sources)."""
    why = why_not_tunable(gm, example_inputs, safety_net.mutates_inputs(gm))
    if why is None and any(isinstance(x, torch.Tensor) and torch._subclasses.fake_tensor.is_fake(x) for x in example_inputs):
        why = "the backend was given fake inputs (nothing to time on)"
    if why is not None:
        notes.append(f"planner: {label} not tuned: {why}; the cost model decides")
        return None
    key = decisions.graph_key(gm, {**key_extra, "candidates": TUNE_CANDIDATES})
    cache = decisions.DecisionCache()
    hit = cache.get(key, set(TUNE_CANDIDATES))
    if hit is not None:
        notes.append(f"planner: {label}: {hit['plan']!r} from the decision cache (measured {_fmt_ms(hit.get('measured_ms', {}))}); nothing re-measured")
        return hit["plan"]
    measured: dict[str, float] = {}
    trial_options = {k: v for k, v in inductor_options.items() if k not in TRIAL_OPTIONS_OFF}
    for candidate in TUNE_CANDIDATES:
        trial_gm = copy.deepcopy(gm)
        try:
            with torch_api.separate_compile_metrics():  # the trial's backward compiles on its first call
                fn = compile_plan(candidate, trial_gm, example_inputs, trial_options)
                measured[candidate] = time_compiled(fn, example_inputs, training)
        except Exception as e:
            if safety_net.passthrough(e):
                raise
            notes.append(f"planner: {label}: candidate {candidate!r} could not be timed ({safety_net.brief(e)})")
    if not measured:
        notes.append(f"planner: {label}: no candidate could be timed; the cost model decides")
        return None
    best = min(measured, key=measured.__getitem__)
    cache.put(key, {"plan": best, "measured_ms": {k: round(v, 4) for k, v in measured.items()}, "torch": torch.__version__})
    notes.append(f"planner: {label}: measured {_fmt_ms(measured)} -> {best!r}")
    return best


def _fmt_ms(measured: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f} ms" for k, v in measured.items()) or "nothing"


def why_not_tunable(gm: fx.GraphModule, example_inputs: Sequence[Any], mutates_inputs: bool) -> str | None:
    """Why timing this graph on its inputs would not be safe or meaningful, if so."""
    if mutates_inputs:
        return "the graph writes its inputs in place (timing it would repeat the writes)"
    for n in gm.graph.nodes:
        val = n.meta.get("example_value", n.meta.get("val"))
        for t in val if isinstance(val, (list, tuple)) else [val]:
            if isinstance(t, torch.Tensor) and any(_unbacked(s) for s in t.shape):
                return f"data-dependent shapes ({n.name}: {tuple(t.shape)}): the inputs cannot be reproduced"
    if not any(isinstance(x, torch.Tensor) for x in example_inputs):
        return "no tensor inputs to time on"
    if any(_symbolic(n.meta.get("example_value", n.meta.get("val"))) for n in gm.graph.nodes if n.op == "placeholder"):
        return ("symbolic sizes (dynamic shapes): the plan serves every size, and a trial compile "
                "outside Dynamo cannot re-create the graph's size symbols")
    return None


def _symbolic(value: Any) -> bool:
    """A symbolic size, or a tensor with one (a graph compiled with dynamic shapes)."""
    if isinstance(value, torch.SymInt):
        return value.node.maybe_as_int() is None if hasattr(value.node, "maybe_as_int") else True
    return isinstance(value, torch.Tensor) and any(_symbolic(s) for s in value.shape)


def _unbacked(s: Any) -> bool:
    if not isinstance(s, torch.SymInt):
        return False
    try:
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

        return bool(free_unbacked_symbols(s))
    except Exception:  # pragma: no cover
        return False


@contextlib.contextmanager
def _no_trace(devices: list[torch.device]) -> Iterator[None]:
    cuda = [d.index if d.index is not None else torch.cuda.current_device() for d in devices if d.type == "cuda"]
    with torch.random.fork_rng(devices=cuda, enabled=True):
        yield


def _tensors(out: Any) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def time_compiled(fn: Callable[..., Any], inputs: Sequence[Any], train: bool, warmup: int = 3, iters: int = 10) -> float:
    """Median milliseconds of one call of ``fn`` (plus its backward when ``train``)."""
    tensors_in = [x for x in inputs if isinstance(x, torch.Tensor)]
    devices = sorted({x.device for x in tensors_in}, key=str)
    cuda = any(d.type == "cuda" for d in devices)
    wrt = [x for x in tensors_in if x.requires_grad]

    def step() -> None:
        out = fn(*inputs)
        if train and wrt:
            outs = [t for t in _tensors(out) if t.requires_grad]
            if outs:
                torch.autograd.grad(outs, wrt, [torch.ones_like(t) for t in outs], allow_unused=True)

    times: list[float] = []
    with _no_trace(devices), torch.enable_grad() if train else torch.no_grad():
        for _ in range(warmup):
            step()
        for _ in range(iters):
            if cuda:
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                step()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                step()
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)
