"""Test support: run a function's graphs through Optimus at one level, compare with eager.

* Torch-IR: Dynamo captures the pre-grad graph; Optimus rewrites it; the rewritten graph
  runs eagerly (autograd provides gradients).
* Aten-IR: AOTAutograd produces functional forward and backward graphs (with Inductor's
  decompositions, as Inductor would see them); Optimus rewrites both; they run eagerly.

``autocast=torch.bfloat16`` (or float16) calls the function inside ``torch.autocast("cpu",
dtype=...)``, eager and compiled alike (the loss and backward outside it, as autocast's
documentation recommends); ``check_level`` then judges the result as PyTorch's benchmark
harness judges a low-precision run: against an fp64 eager reference, with the 16-bit
multiplier, and with every result and gradient in eager's dtype.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
from typing import Any, Callable

import torch
import torch.fx as fx

import optimus
from optimus.core.levels import make_view
from optimus.core.report import Report


@dataclasses.dataclass
class LevelRun:
    outputs: Any
    grads: list[torch.Tensor | None]
    graphs: list[fx.GraphModule]
    reports: list[Report]

    def ops(self, which: int | None = None) -> collections.Counter:
        """Canonical op counts over the rewritten graphs (or one of them)."""
        graphs = self.graphs if which is None else [self.graphs[which]]
        c: collections.Counter = collections.Counter()
        for gm in graphs:
            view = make_view(self.level, gm)
            for n in gm.graph.nodes:
                call = view.classify(n)
                if call is not None:
                    c[call.op] += 1
        return c

    def matched(self, rule: str) -> int:
        return sum(g.rules[rule].matched for r in self.reports for g in r.graphs if rule in g.rules)

    def errors(self) -> list[str]:
        return [e for r in self.reports for e in r.errors()]

    level: str = "torch_ir"


def run_level(fn: Callable[..., Any], inputs: list[torch.Tensor], level: str, passes: Any = "all", dynamic: bool | str = False, grad: bool = True, autocast: torch.dtype | None = None) -> LevelRun:
    """``dynamic``: False (static), True (every size symbolic), "batch" (first input's dim 0)."""
    torch._dynamo.reset()
    graphs: list[fx.GraphModule] = []
    reports: list[Report] = []

    def rewrite(gm: fx.GraphModule, lv: str) -> fx.GraphModule:
        optimus.optimize(gm, passes=passes, level=lv)
        reports.append(optimus.last_report())
        graphs.append(gm)
        return gm

    if level == "torch_ir":

        def backend(gm, example_inputs):
            return rewrite(gm, "torch_ir").forward

    elif level == "aten_ir":
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd
        from torch._inductor.decomposition import select_decomp_table

        def compiler(gm, example_inputs):
            return make_boxed_func(rewrite(gm, "aten_ir").forward)

        from torch._functorch.partitioners import min_cut_rematerialization_partition

        # Inductor's decompositions and partitioner, so the graphs look like Inductor's.
        backend = aot_autograd(
            fw_compiler=compiler,
            bw_compiler=compiler,
            decompositions=select_decomp_table(),
            partition_fn=min_cut_rematerialization_partition,
        )
    else:
        raise ValueError(level)
    compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=True if dynamic is True else None)
    outputs, grads = _run(compiled, inputs, grad, batch_dynamic=dynamic == "batch", autocast=autocast)
    run = LevelRun(outputs, grads, graphs, reports)
    run.level = level
    return run


def _autocast(dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


def _run(fn: Callable[..., Any], inputs: list[torch.Tensor], grad: bool = True, batch_dynamic: bool = False, autocast: torch.dtype | None = None) -> tuple[Any, list[torch.Tensor | None]]:
    args = [t.detach().clone().requires_grad_(grad and t.is_floating_point()) for t in inputs]
    if batch_dynamic:  # only the first input's leading dim is symbolic
        torch._dynamo.mark_dynamic(args[0], 0)
    with _autocast(autocast):
        out = fn(*args)
    leaves = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    if leaves:
        g = torch.Generator().manual_seed(1)
        loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in leaves)
        loss.backward()
    return out, [a.grad for a in args]


def assert_close_tree(a: Any, b: Any, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    la, lb = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            assert x is not None and y is not None, (x, y)
            torch.testing.assert_close(x, y, rtol=rtol, atol=atol)
        else:
            assert x == y


def check_level(fn: Callable[..., Any], inputs: list[torch.Tensor], level: str, passes: Any = "all", dynamic: bool | str = False, grad: bool = True, autocast: torch.dtype | None = None) -> LevelRun:
    """Run at ``level`` and assert outputs and input gradients equal eager's (under
    ``autocast``: eager's under the same autocast, judged as the module docstring says)."""
    expected_out, expected_grads = _run(fn, inputs, grad, autocast=autocast)
    run = run_level(fn, inputs, level, passes, dynamic, grad, autocast)
    if autocast is not None:
        assert_same_dtypes(run.outputs, expected_out)
        assert_same_dtypes(run.grads, expected_grads)
        ref_out, ref_grads = _run(_double(fn), [t.double() if t.is_floating_point() else t for t in inputs], grad)
        assert_accurate_tree(run.outputs, expected_out, ref_out)
        assert_accurate_tree(run.grads, expected_grads, ref_grads)
        assert not run.errors(), run.errors()
        return run
    try:
        assert_close_tree(run.outputs, expected_out)
        assert_close_tree(run.grads, expected_grads)
    except AssertionError:
        # fp32 results differ by summation order (the CPU's vector width moves Inductor's);
        # then judge as PyTorch's benchmark harness does: against an fp64 eager reference,
        # the compiled error may be at most a few times eager fp32's own
        ref_out, ref_grads = _run(_double(fn), [t.double() if t.is_floating_point() else t for t in inputs], grad)
        assert_accurate_tree(run.outputs, expected_out, ref_out)
        assert_accurate_tree(run.grads, expected_grads, ref_grads)
    assert not run.errors(), run.errors()
    return run


def _double(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` in fp64: a module's copy with fp64 parameters; a function as it is (its tensors
    are its inputs)."""
    return copy.deepcopy(fn).double() if isinstance(fn, torch.nn.Module) else fn


def assert_same_dtypes(got: Any, eager: Any) -> None:
    """Every tensor of ``got`` has the dtype of eager's (a rewrite never changes one)."""
    lg, le = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(eager)
    assert len(lg) == len(le)
    for i, (x, y) in enumerate(zip(lg, le)):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            assert x.dtype == y.dtype, f"leaf {i}: {x.dtype}, eager {y.dtype}"
        else:
            assert (x is None) == (y is None), (i, x, y)


def assert_accurate_tree(got: Any, eager: Any, ref64: Any, tol: float = 1e-4) -> None:
    """Each tensor of ``got`` passes the benchmark harness's accuracy rule against eager fp32
    and fp64 eager (``optimus.tools.bench.accuracy.judge_tensor``, CPU tolerance)."""
    from optimus.tools.bench.accuracy import judge_tensor

    lg, le, lr = (torch.utils._pytree.tree_leaves(t) for t in (got, eager, ref64))
    assert len(lg) == len(le) == len(lr)
    for i, (x, y, r) in enumerate(zip(lg, le, lr)):
        if not isinstance(x, torch.Tensor) and not isinstance(y, torch.Tensor):
            assert x == y
            continue
        assert x is not None and y is not None and r is not None, (x, y, r)
        verdict = judge_tensor(f"leaf {i}", y, x, r, tol)
        assert verdict.ok, verdict.message


LEVELS = ["torch_ir", "aten_ir"]


@contextlib.contextmanager
def float32_matmul_precision(value: str) -> Any:
    """``torch.set_float32_matmul_precision(value)`` inside; every related flag restored after
    (the legacy precision and the new ``fp32_precision`` API, which it sets too)."""
    matmul = torch.backends.cuda.matmul
    saved = (torch.get_float32_matmul_precision(), torch.backends.fp32_precision, matmul.fp32_precision)
    torch.set_float32_matmul_precision(value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.fp32_precision = saved[1]
        matmul.fp32_precision = saved[2]
