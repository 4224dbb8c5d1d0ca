"""Shared helpers for the Inductor-IR tests: compile once, count loop nests, compare with eager.

Every scenario is a tiny function compiled on the CPU with ``optimus.compile`` and the
FX graph / AOT autograd caches off, so the scheduler passes really run. Results are
memoized per (scenario, passes) for the whole test session: several tests look at the
same compilation (C++ compiles dominate the run time on small machines).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any, Callable, Iterator

import torch

import optimus
from optimus.tools import measure

_CPP_BODY = re.compile(r"async_compile\.cpp(?:_pybinding)?\([^\n]*r'''(.*?)'''", re.S)


def loop_nests(source: str) -> int:
    """Outermost C++ loop nests (one per CPU kernel) in one generated wrapper."""
    return sum(measure.cpu_loop_nests(body) for body in _CPP_BODY.findall(source))


@dataclasses.dataclass
class Run:
    outputs: Any
    grads: list[Any]
    codes: list[str]
    report: Any

    @property
    def nests(self) -> list[int]:
        """Loop nests per compiled graph (forward first, then backward)."""
        return [loop_nests(c) for c in self.codes]

    @property
    def kernels(self) -> int:
        return measure.generated_kernel_count(self.codes)

    def graphs(self, level: str = "inductor_ir") -> list[Any]:
        return [g for g in self.report.graphs if g.level == level]

    def matched(self, rule: str) -> int:
        return sum(g.rules[rule].matched for g in self.graphs() if rule in g.rules)

    def declines(self, rule: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.graphs():
            if rule in g.rules:
                for reason, n in g.rules[rule].declined.items():
                    out[reason] = out.get(reason, 0) + n
        return out


def _loss_weights(outputs: Any) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    leaves = [o for o in torch.utils._pytree.tree_leaves(outputs) if isinstance(o, torch.Tensor)]
    return [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in leaves]


def run_eager(fn: Callable[..., Any], inputs: list[torch.Tensor], grad: bool) -> tuple[Any, list[Any]]:
    args = [t.detach().clone().requires_grad_(grad and t.is_floating_point()) for t in inputs]
    if not grad:
        with torch.no_grad():
            return fn(*args), []
    out = fn(*args)
    leaves = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    sum((o * w).sum() for o, w in zip(leaves, _loss_weights(out))).backward()
    return out, [a.grad for a in args]


def run_compiled(fn: Callable[..., Any], inputs: list[torch.Tensor], passes: Any, grad: bool) -> Run:
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    args = [t.detach().clone().requires_grad_(grad and t.is_floating_point()) for t in inputs]
    compiled = optimus.compile(fn, passes=passes, fullgraph=True)

    def step() -> Any:
        if not grad:
            with torch.no_grad():
                return compiled(*args)
        out = compiled(*args)
        leaves = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        sum((o * w).sum() for o, w in zip(leaves, _loss_weights(out))).backward()
        return out

    fc = torch._functorch.config
    fc_patch = {"enable_autograd_cache": False} if hasattr(fc, "enable_autograd_cache") else {}
    with inductor_config.patch(fx_graph_cache=False), fc.patch(fc_patch):
        out, codes = run_and_get_code(step)
    return Run(out, [a.grad for a in args] if grad else [], list(codes), compiled.optimus_report)


def assert_close_tree(a: Any, b: Any) -> None:
    la, lb = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        if x is None or y is None:
            assert x is None and y is None
            continue
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------- scenarios
def independent(a, b, c, d):
    """Two row sums and two elementwise chains, all independent: four CPU loop nests
    in the forward graph; the backward has two independent elementwise kernels."""
    return a.sum(1), b.sum(1), (c * 2).relu(), (d + 1).sigmoid()


def independent_inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(8, 16, generator=g) for _ in range(4)]


def starved(x1, x2, pos, w):
    """Two layer-norm-like stages per input, with a matmul between them and a broadcast
    ``pos`` read everywhere: Inductor leaves three reduction -> elementwise (outer-loop)
    fusions undone (see docs/inductor-ir.md)."""
    outs = []
    for x in (x1, x2):
        s = x + pos
        h = torch.relu(s - s.mean(-1, keepdim=True))
        t = (h.view(-1, 16) @ w).view(16, 9, 16) + pos
        outs.append(torch.sigmoid(t - t.mean(-1, keepdim=True)))
    return outs


def starved_inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(16, 9, 16, generator=g), torch.randn(16, 9, 16, generator=g), torch.randn(9, 16, generator=g), torch.randn(16, 16, generator=g)]


def pair(a, b):
    """Two independent elementwise kernels of one shape (the smallest horizontal case)."""
    return torch.sin(a) * 2, torch.cos(b) + 1


def pair_inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 32, generator=g), torch.randn(4, 32, generator=g)]


SCENARIOS: dict[str, tuple[Callable[..., Any], Callable[[], list[torch.Tensor]], bool]] = {
    "independent": (independent, independent_inputs, True),
    "starved": (starved, starved_inputs, False),
    "pair": (pair, pair_inputs, False),
}

_CACHE: dict[tuple[str, str], Run] = {}


def scenario(name: str, passes: Any) -> Run:
    """Compile and run scenario ``name`` with ``passes`` (memoized for the session)."""
    import json

    key = (name, json.dumps(passes, sort_keys=True))
    if key not in _CACHE:
        fn, make_inputs, grad = SCENARIOS[name]
        _CACHE[key] = run_compiled(fn, make_inputs(), passes, grad)
    return _CACHE[key]


def eager(name: str) -> tuple[Any, list[Any]]:
    fn, make_inputs, grad = SCENARIOS[name]
    return run_eager(fn, make_inputs(), grad)


# ------------------------------------------------------- GPU-only scheduler paths on CPU
class FakeGpuUnsupported(RuntimeError):
    """This torch's GPU-only scheduler code is not laid out as ``fake_gpu_on_cpu`` expects."""


@contextlib.contextmanager
def fake_gpu_on_cpu() -> Iterator[None]:
    """Schedule CPU graphs as Inductor schedules them for an H200, without a GPU.

    Inductor's Triton backend generates the CPU kernels (``cpu_backend="triton"``); the
    GPU-only scheduler paths are opened (``is_gpu``, the mix-order reduction's CUDA/XPU
    check) and reductions are split for 132 SMs; every generated Triton kernel becomes a
    no-op (nothing is compiled or run by Triton: outputs are garbage, codegen is real);
    Optimus's combo rule accepts CPU nodes. Undone on exit.
    """
    from torch._inductor import async_compile, ir
    from torch._inductor import config as inductor_config
    from torch._inductor import scheduler as sched

    from optimus.inductor_ir import inductor_api
    from optimus.rules import kernel_fusion as rules

    if not hasattr(sched, "MixOrderReduction") or not hasattr(inductor_config.triton, "mix_order_reduction_split_size"):
        raise FakeGpuUnsupported("this torch has no mix-order reductions")
    saved: list[tuple[Any, str, Any]] = []

    def put(obj: Any, name: str, value: Any) -> None:
        old = obj.__dict__[name] if isinstance(obj, type) and name in obj.__dict__ else getattr(obj, name)
        saved.append((obj, name, old))
        setattr(obj, name, value)

    if hasattr(sched, "_is_gpu_triton_backend"):  # torch 2.13
        put(sched, "_is_gpu_triton_backend", lambda node1, node2: True)
    else:  # torch 2.11: the device check is inline in MixOrderReduction.can_fuse
        fn = sched.MixOrderReduction.can_fuse.__func__
        consts = fn.__code__.co_consts
        if ("cuda", "xpu") not in consts:
            raise FakeGpuUnsupported("this torch's mix-order device check is not the one this helper opens")
        opened = tuple(("cuda", "xpu", "cpu") if c == ("cuda", "xpu") else c for c in consts)
        put(fn, "__code__", fn.__code__.replace(co_consts=opened))
    put(sched.BaseSchedulerNode, "is_gpu", lambda self: True)
    put(torch.utils._triton, "triton_hash_with_backend", lambda: "NO-TRITON-BACKEND")
    create = ir.DeviceProperties.create
    put(ir.DeviceProperties, "create", staticmethod(lambda device: create(device)._replace(multi_processor_count=132)))

    class NoKernel:
        def run(self, *args: Any, **kwargs: Any) -> None:
            pass

    put(async_compile.AsyncCompile, "triton", lambda self, *args, **kwargs: NoKernel())

    def combo_backend(scheduler: Any, device: Any) -> Any:
        backend = scheduler.get_backend(device)
        triton = getattr(backend, "_triton_scheduling", backend)
        return triton if hasattr(triton, "generate_combo_kernel_code") else None

    put(inductor_api, "combo_backend", combo_backend)
    put(rules.combo_small_kernels.pattern, "test", lambda m: inductor_api.combinable(m.anchor.node))
    try:
        with inductor_config.patch({"cpu_backend": "triton", "triton.mix_order_reduction_split_size": 64}):
            yield
    finally:
        for obj, name, old in reversed(saved):
            setattr(obj, name, old)
