"""Measuring a compiled graph on its real inputs, without side effects.

The planner's ``tune=True`` compiles a Dynamo graph under a few candidate plans and keeps
the fastest. Timing runs the compiled graph several times on the inputs Dynamo gave the
backend, so it must leave no trace: the random-number state is restored afterwards, a
training graph's backward runs through ``torch.autograd.grad`` (gradients are returned,
never accumulated into ``.grad``), and a graph that writes its inputs in place or has
data-dependent shapes is not tuned at all (``why_not_tunable`` says so).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx as fx


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
