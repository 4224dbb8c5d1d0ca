"""Numeric-check mode: does the optimized graph compute what the original computed?

Both graphs run on the same random inputs (drawn from the placeholders' metadata, or the
caller's example inputs). On a mismatch the rewrites are replayed on a fresh copy of the
original with a growing rewrite budget (the driver is deterministic), bisecting for the
first rewrite after which results differ; its rule is the culprit.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx

from .view import GraphView

NUMERIC_SKIPPED = "numeric check skipped"  # how a note starts when the check could not run


def random_inputs(gm: fx.GraphModule, view: GraphView, seed: int = 0) -> list[torch.Tensor] | None:
    """Random tensors matching the placeholders' metadata (``None`` if unknown)."""
    gen = torch.Generator().manual_seed(seed)
    inputs: list[Any] = []
    for node in gm.graph.find_nodes(op="placeholder") if hasattr(gm.graph, "find_nodes") else [n for n in gm.graph.nodes if n.op == "placeholder"]:
        val = view.val(node)
        if isinstance(val, (int, float, bool)):
            inputs.append(val)
            continue
        if not isinstance(val, torch.Tensor):
            return None
        shape = []
        for s in val.shape:
            if isinstance(s, torch.SymInt):
                hint = getattr(s.node, "hint", None)
                if hint is None:
                    return None
                s = int(hint)
            shape.append(int(s))
        if val.dtype.is_floating_point:
            t = torch.randn(shape, generator=gen, dtype=torch.float32).to(val.dtype)
        elif val.dtype == torch.bool:
            t = torch.rand(shape, generator=gen) > 0.5
        else:
            t = torch.randint(0, 3, shape, generator=gen).to(val.dtype)
        inputs.append(t.to(val.device) if val.device.type != "meta" else t)
    return inputs


def _run(gm: fx.GraphModule, inputs: list[Any]) -> Any:
    torch.manual_seed(0)
    with torch.no_grad():
        return gm(*inputs)


def outputs_match(a: Any, b: Any, rtol: float = 1e-4, atol: float = 1e-5) -> bool:
    fa = [x for x in torch.utils._pytree.tree_leaves(a)]
    fb = [x for x in torch.utils._pytree.tree_leaves(b)]
    if len(fa) != len(fb):
        return False
    for x, y in zip(fa, fb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            tol = (1e-2, 1e-2) if x.dtype in (torch.float16, torch.bfloat16) else (rtol, atol)
            if not torch.allclose(x.float(), y.float(), rtol=tol[0], atol=tol[1], equal_nan=True):
                return False
        elif x != y:
            return False
    return True


Replay = Callable[[fx.GraphModule, "int | None"], list[str]]


def find_culprit(
    gm: fx.GraphModule,
    original: Any,
    view: GraphView,
    replay: Replay,
    example_inputs: list[Any] | None,
    max_rewrites: int | None,
) -> tuple[bool, str | None, str]:
    """(results differ?, culprit rule name if found, a note for the report).

    ``original`` is the graph's record from before the rewrites (``GraphRecord``);
    ``replay(trial, budget)`` rewrites the fresh copy ``trial`` of it as the level did,
    stopping after ``budget`` rewrites (``None``: the level's own budget), and returns the
    rule name of each rewrite in order. The driver is deterministic, so the first ``k``
    rewrites of a replay are the first ``k`` of the level's run.
    """
    ref_gm = fx.GraphModule(gm, original.materialize())
    inputs = None
    if example_inputs is not None and all(isinstance(t, torch.Tensor) and not _is_fake(t) for t in example_inputs):
        inputs = list(example_inputs)
    if inputs is None:
        inputs = random_inputs(ref_gm, view)
    if inputs is None:
        return False, None, f"{NUMERIC_SKIPPED}: input shapes unknown"
    try:
        expected = _run(ref_gm, inputs)
    except Exception as e:
        return False, None, f"{NUMERIC_SKIPPED}: the original graph does not run on random inputs ({type(e).__name__})"
    if outputs_match(expected, _run(gm, inputs)):
        return False, None, "numeric check passed"

    def differs_after(k: int) -> bool:
        trial = fx.GraphModule(gm, original.materialize())
        replay(trial, k)
        trial.recompile()
        return not outputs_match(expected, _run(trial, inputs))

    applied = replay(fx.GraphModule(gm, original.materialize()), max_rewrites)
    lo, hi = 0, len(applied)  # results match after lo rewrites, differ after hi
    if not applied:
        return True, None, "numeric check failed, and no single rewrite could be blamed"
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if differs_after(mid):
            hi = mid
        else:
            lo = mid
    return True, applied[hi - 1], f"numeric check failed after rewrite {hi} ({applied[hi - 1]})"


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)
