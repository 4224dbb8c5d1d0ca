"""Run one zoo model through every configuration and measure each the same way.

For each (model, mode, configuration), in this process:

1. ``torch._dynamo.reset()`` and a fresh, empty Inductor cache directory with the FX
   graph and AOT autograd caches off, so compile time is cold and nothing is shared;
2. a fresh model built from the seed (same initial parameters for every
   configuration) and wrapped by the configuration;
3. the first step, timed: it compiles (cold compile time = first step minus one
   steady step) and gives the outputs and parameter gradients compared with eager;
4. kernels per step (CUDA: profiler kernel events of one warmed-up step; CPU: loop
   nests and extern calls in the generated code plus the aten ops that run outside
   it, or the computing aten ops for eager), the median step time over ``iters`` steps
   after ``warmup``, and the peak memory of one step.

A training step is forward, ``loss.backward()`` and ``torch.optim.SGD.step()`` (not
compiled); an inference step is the forward under ``torch.no_grad()``. A configuration
that raises is recorded with its error and the next one runs.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import os
import platform
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch

from ..models import ZooModel, get_model
from .configs import CONFIGS, upstream_fusion_options

MODES = ("train", "infer")
LR = 0.01


@dataclass
class BenchOptions:
    device: str = "cpu"
    size: str = "small"
    iters: int = 30
    warmup: int = 5
    seed: int = 0
    tf32: bool = True
    lr: float = LR
    cold: bool = True  # fresh cache dirs per configuration (False: reuse compiled kernels; CI only)

    @property
    def tolerance(self) -> float:
        """Max error relative to the reference's largest magnitude, per tensor."""
        if torch.device(self.device).type == "cuda":
            return 2e-2 if self.tf32 else 2e-3
        return 2e-3


def environment(device: str) -> dict[str, Any]:
    """What produced a row: versions, device and date."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is optional on CPU-only boxes
        triton_version = None
    dev = torch.device(device)
    if dev.type == "cuda":
        device_name = torch.cuda.get_device_name(dev)
    else:
        device_name = platform.processor() or platform.machine() or "cpu"
        device_name = f"CPU ({device_name}, {os.cpu_count()} cores)"
    return {
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "device": dev.type,
        "device_name": device_name,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


# --- isolation ------------------------------------------------------------------------


def cold_compile() -> Any:
    """Fresh Inductor and Triton caches, caches off, in-memory compile caches cleared."""
    from ..measure import fresh_inductor_cache

    return fresh_inductor_cache()


@contextlib.contextmanager
def warm_compile() -> Iterator[None]:
    """Keep Inductor's cache dir (compiled C++/Triton kernels, headers) but still recompile
    every graph: FX graph and AOT autograd caches off, so every configuration's passes run."""
    from torch._inductor import config as inductor_config

    fc = torch._functorch.config
    fc_patch = {"enable_autograd_cache": False} if hasattr(fc, "enable_autograd_cache") else {}
    with inductor_config.patch(fx_graph_cache=False), fc.patch(fc_patch):
        yield


def _release(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def warm_compile_pool(device: str) -> None:
    """Start Inductor's parallel compile workers before any timing (GPU runs)."""
    if torch.device(device).type != "cuda":
        return
    try:
        from torch._inductor.async_compile import AsyncCompile

        AsyncCompile.warm_pool()
    except Exception:  # pragma: no cover - best effort
        pass


# --- steps ----------------------------------------------------------------------------


class Runner:
    """A model under one configuration, with its step functions."""

    def __init__(self, zoo: ZooModel, fn: Callable[..., Any], mode: str, lr: float) -> None:
        self.zoo = zoo
        self.fn = fn
        self.mode = mode
        self.params = [p for p in zoo.model.parameters() if p.requires_grad]
        self.opt = torch.optim.SGD(self.params, lr=lr) if mode == "train" else None

    def forward_backward(self) -> torch.Tensor:
        """Forward and backward (no optimizer step): the parity step."""
        if self.mode == "infer":
            with torch.no_grad():
                return self.fn(*self.zoo.inputs)
        for p in self.params:
            p.grad = None
        out = self.fn(*self.zoo.inputs)
        self.zoo.loss(out).backward()
        return out

    def step(self) -> torch.Tensor:
        out = self.forward_backward()
        if self.opt is not None:
            self.opt.step()
        return out

    def outside_ops(self) -> int:
        """Aten ops of a training step that run outside the model (loss, its grad, SGD)."""
        if self.mode == "infer":
            return 0
        from ..measure import count_kernels

        out = self.fn(*self.zoo.inputs).detach().requires_grad_()

        def rest() -> None:
            self.zoo.loss(out).backward()
            self.opt.step()  # type: ignore[union-attr]

        return count_kernels(rest, "cpu")

    def grads(self) -> list[torch.Tensor | None]:
        return [None if p.grad is None else p.grad.detach().clone() for p in self.params]


@dataclass
class Reference:
    output: torch.Tensor
    grads: list[torch.Tensor | None]


def _rel_err(got: torch.Tensor, want: torch.Tensor, floor: float = 1e-12) -> tuple[float, float]:
    """Max abs error, and it relative to ``max|want|`` (but never to less than ``floor``)."""
    got, want = got.detach().float(), want.detach().float()
    if got.shape != want.shape:
        raise AssertionError(f"shape {tuple(got.shape)} != eager {tuple(want.shape)}")
    abs_err = (got - want).abs().max().item() if want.numel() else 0.0
    scale = want.abs().max().item() if want.numel() else 0.0
    return abs_err, abs_err / max(scale, floor)


def compare(ref: Reference, out: torch.Tensor, grads: list[torch.Tensor | None] | None, tol: float) -> dict[str, Any]:
    """Max abs/rel error of outputs (and gradients) against eager; ``ok`` within ``tol``."""
    out_abs, out_rel = _rel_err(out, ref.output)
    result: dict[str, Any] = {"out_max_abs": out_abs, "out_max_rel": out_rel, "tol": tol}
    ok = out_rel <= tol and out_abs == out_abs  # NaN check
    if grads is not None:
        g_abs = g_rel = 0.0
        missing = 0
        # A parameter whose gradient is ~1e-8 while others are ~1 is judged on the scale
        # of all gradients: rounding noise relative to its own tiny scale is not a mismatch.
        overall = max((r.detach().abs().max().item() for r in ref.grads if r is not None and r.numel()), default=0.0)
        floor = max(1e-12, 1e-3 * overall)
        for g, r in zip(grads, ref.grads):
            if (g is None) != (r is None):
                missing += 1
                continue
            if g is None or r is None:
                continue
            a, rel = _rel_err(g, r, floor)
            g_abs, g_rel = max(g_abs, a), max(g_rel, rel)
        result.update(grad_max_abs=g_abs, grad_max_rel=g_rel, grads_missing=missing)
        ok = ok and g_rel <= tol and g_abs == g_abs and missing == 0
    result["ok"] = bool(ok)
    return result


def eager_reference(name: str, mode: str, opts: BenchOptions) -> Reference:
    zoo = get_model(name, opts.size, opts.device, opts.seed)
    runner = Runner(zoo, zoo.model, mode, opts.lr)
    out = runner.forward_backward().detach().clone()
    ref = Reference(out, runner.grads() if mode == "train" else [])
    del runner, zoo
    return ref


# --- one row --------------------------------------------------------------------------


def run_config(name: str, mode: str, config: str, opts: BenchOptions, ref: Reference | None) -> dict[str, Any]:
    """Measure ``name`` in ``mode`` under ``config``; never raises (errors go in the row)."""
    from .. import measure

    dev = torch.device(opts.device)
    row: dict[str, Any] = {
        "model": name,
        "mode": mode,
        "config": config,
        "size": opts.size,
        "device": dev.type,
        "status": "error",
        "error": None,
        "batch_size": None,
        "kernels": None,
        "kernel_method": None,
        "step_ms": None,
        "examples_per_s": None,
        "peak_memory_bytes": None,
        "memory_method": None,
        "compile_s": None,
        "first_step_s": None,
        "parity": None,
        "iters": opts.iters,
        "warmup": opts.warmup,
        "seed": opts.seed,
        "tf32": opts.tf32 if dev.type == "cuda" else None,
        "cold_compile": opts.cold,
    }
    cfg = CONFIGS[config]
    if config == "upstream":
        row["upstream_options"] = {k: sorted(v) for k, v in upstream_fusion_options().items()}
    torch._dynamo.reset()
    runner = None
    try:
        with cold_compile() if opts.cold else warm_compile(), cfg.context():
            zoo = get_model(name, opts.size, opts.device, opts.seed)
            row["batch_size"] = zoo.batch_size
            runner = Runner(zoo, cfg.wrap(zoo.model), mode, opts.lr)

            # First step: compiles; its outputs and gradients are the parity check.
            measure.synchronize(dev)
            t0 = time.perf_counter()
            if cfg.compiled and dev.type == "cpu":
                out, generated = measure.compiled_kernel_count(runner.forward_backward, dev)
            else:
                out, generated = runner.forward_backward(), None
            measure.synchronize(dev)
            row["first_step_s"] = time.perf_counter() - t0
            if ref is not None:
                row["parity"] = compare(ref, out, runner.grads() if mode == "train" else None, opts.tolerance)
            if runner.opt is not None:
                runner.opt.step()
            del out
            row.update(_optimus_summary(runner.fn))

            # Kernels per step.
            if dev.type == "cuda":
                runner.step()
                row["kernels"] = measure.count_kernels(runner.step, dev)
                row["kernel_method"] = "cuda profiler kernel events per step"
            elif generated is not None:
                row["kernels"] = generated + runner.outside_ops()
                row["kernel_method"] = "cpu: generated loop nests + extern calls + aten ops outside the graph"
            else:
                runner.step()
                row["kernels"] = measure.count_kernels(runner.step, dev)
                row["kernel_method"] = "cpu: computing aten ops per step"

            # Time and memory.
            ms = measure.median_step_ms(runner.step, dev, warmup=opts.warmup, iters=opts.iters)
            row["step_ms"] = ms
            row["examples_per_s"] = zoo.batch_size / (ms / 1e3)
            row["compile_s"] = max(row["first_step_s"] - ms / 1e3, 0.0) if cfg.compiled else 0.0
            row["peak_memory_bytes"], row["memory_method"] = _peak_memory(runner.step, dev)
            row["status"] = "ok"
    except Exception as e:  # a failing configuration must not lose the other rows
        row["error"] = _describe(e)
    finally:
        del runner
        torch._dynamo.reset()
        _release(opts.device)
    return row


def _optimus_summary(fn: Any) -> dict[str, Any]:
    """Which Optimus rules fired (and any rule errors), from the compiled model's report."""
    report = getattr(fn, "optimus_report", None)
    if report is None:
        return {}
    try:
        totals = report.rule_totals()
        return {
            "optimus_rules": {name: st.matched for name, st in totals.items() if st.matched},
            "optimus_errors": [str(e)[:200] for e in report.errors()[:5]],
        }
    except Exception as e:  # the report is informative only
        return {"optimus_rules": None, "optimus_errors": [f"report unavailable: {_describe(e)}"]}


def _peak_memory(step: Callable[[], Any], dev: torch.device) -> tuple[int, str]:
    from .. import measure

    if dev.type == "cuda":
        return measure.peak_memory(step, dev), "torch.cuda.max_memory_allocated over one step"
    return measure.peak_memory(step, dev), "cpu: peak RSS over one step (VmHWM after reset; else the process high-water mark)"


def _describe(e: BaseException) -> str:
    first = str(e).strip().splitlines()
    msg = f"{type(e).__name__}: {first[0] if first else ''}"
    frames = traceback.extract_tb(e.__traceback__)
    if frames:
        f = frames[-1]
        msg += f" [at {os.path.basename(f.filename)}:{f.lineno} in {f.name}]"
    return msg[:500]


# --- many rows ------------------------------------------------------------------------


def plan(models: Iterable[str], modes: Iterable[str], configs: Iterable[str]) -> list[tuple[str, str, str]]:
    return [(m, mode, c) for m in models for mode in modes for c in configs]


def run(
    models: list[str],
    modes: list[str],
    configs: list[str],
    opts: BenchOptions,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    progress: Any = None,
    skip: set[str] | frozenset[str] = frozenset(),
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Run the whole plan; ``on_row`` sees each row as soon as it is measured.

    ``skip`` holds ``model/mode/config`` keys not to run (already measured);
    ``deadline`` (a ``time.perf_counter()`` value) stops the plan before a configuration
    that would not finish in time, judged by the longest compiled configuration of the
    same model and mode so far (or once the deadline has passed).
    """
    dev = torch.device(opts.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = opts.tf32
        torch.backends.cudnn.allow_tf32 = opts.tf32
    warm_compile_pool(opts.device)
    env = environment(opts.device)
    rows: list[dict[str, Any]] = []
    for name in models:
        for mode in modes:
            todo = [c for c in configs if f"{name}/{mode}/{c}" not in skip]
            if progress is not None:
                for _ in range(len(configs) - len(todo)):
                    progress.advance()
            if not todo:
                continue
            if deadline is not None and time.perf_counter() > deadline:
                return rows
            ref: Reference | None = None
            ref_error = None
            try:
                ref = eager_reference(name, mode, opts)
            except Exception as e:
                ref_error = _describe(e)
            _release(opts.device)
            longest = 0.0
            for config in todo:
                expected = longest if CONFIGS[config].compiled else 0.0
                if deadline is not None and time.perf_counter() + expected > deadline:
                    return rows
                if progress is not None:
                    progress.describe(f"{name} {mode} {config}")
                started = time.perf_counter()
                row = run_config(name, mode, config, opts, ref)
                if CONFIGS[config].compiled:
                    longest = max(longest, time.perf_counter() - started)
                if ref is None and row["parity"] is None:
                    row["parity_error"] = f"eager reference failed: {ref_error}"
                row["env"] = env
                rows.append(row)
                if on_row is not None:
                    on_row(row)
                if progress is not None:
                    progress.advance()
            del ref
            _release(opts.device)
    return rows
