"""Run one zoo model through every configuration and measure each the same way.

For each (model, mode, configuration), in this process (or, with ``--workers N``, in
one of N worker processes: ``optimus.tools.bench.parallel``):

1. ``torch._dynamo.reset()`` and a fresh, empty Inductor cache directory with the FX
   graph and AOT autograd caches off, so compile time is cold and nothing is shared;
2. a fresh model built from the seed (same initial parameters for every
   configuration) and wrapped by the configuration;
3. the first step, timed, with TF32 off: it compiles (cold compile time = first step
   minus one steady step) and gives the outputs and parameter gradients judged against
   eager in the row's precision and fp64 by the dynamo benchmarks' rule
   (``optimus.tools.bench.accuracy``);
4. in the ``tf32`` precision (CUDA), TF32 is turned on and one untimed step recompiles
   (Dynamo guards on the TF32 flag);
5. the timed section (with workers, under an exclusive inter-process lock): kernels
   per step (CUDA: profiler kernel events of one warmed-up step; CPU: loop nests and
   extern calls in the generated code plus the aten ops that run outside it, or the
   computing aten ops for eager; CUDA graphs: counted after the timed steps, on a
   replay), ``repeats`` medians of the step time over ``iters`` steps after
   ``warmup``, and the peak memory of one step.

A training step is forward, ``loss.backward()`` and ``torch.optim.SGD.step()`` (not
compiled); an inference step is the forward under ``torch.no_grad()``. Each row runs in
one precision (``optimus.tools.bench.precision``: under autocast the forward and the loss are
inside ``torch.autocast``, the backward and the optimizer outside). A configuration
that raises is recorded with its error and the next one runs.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import logging
import os
import platform
import statistics
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Iterator

import torch

from ...core.driver import DEAD_CODE
from ..models import ZooModel
from . import accuracy
from . import precision as precisions
from .accuracy import Reference
from .configs import CONFIGS, upstream_fusion_options
from .external import get_bench_model
from .results import key as row_key

MODES = ("train", "infer")
LR = 0.01


@dataclass
class BenchOptions:
    device: str = "cpu"
    size: str = "small"
    iters: int = 30
    warmup: int = 5
    seed: int = 0
    precisions: tuple[str, ...] = ("fp32",)  # optimus.tools.bench.precision names; every row runs in one
    lr: float = LR
    cold: bool = True  # fresh cache dirs per configuration (False: reuse compiled kernels; CI only)
    repeats: int = 1  # medians of ``iters`` steps taken this many times (their spread is reported)
    dynamic: bool = False  # compile with dynamic=True
    workers: int = 1  # processes compiling concurrently (recorded in every row)
    compile_threads: int | None = None  # TORCHINDUCTOR_COMPILE_THREADS of each worker (None: Inductor's default)
    isolate: bool = False  # workers: no row builds, compiles or runs its first step while one is timed
    time_split: bool = False  # profile where a step's time goes (measure.time_split) into row["time_split"]

    def tolerance(self, mode: str, precision: str = "fp32") -> float:
        """The accuracy rule's ``tol``: 1e-3 for CUDA training or under autocast, else 1e-4."""
        return accuracy.accuracy_tolerance(self.device, mode, precision)

    def compile_kwargs(self) -> dict[str, Any]:
        return {"dynamic": True} if self.dynamic else {}


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
    """A model under one configuration, with its step functions, in one precision
    (``optimus.tools.bench.precision``): ``inputs`` are the zoo's inputs cast as the precision
    casts them (``prepare`` casts the model and the inputs before it is wrapped)."""

    def __init__(self, zoo: ZooModel, fn: Callable[..., Any], mode: str, lr: float, cudagraphs: bool = False,
                 precision: "str | precisions.Precision" = "fp32", inputs: tuple[Any, ...] | None = None) -> None:
        self.zoo = zoo
        self.fn = fn
        self.mode = mode
        self.cudagraphs = cudagraphs
        self.precision = precisions.get(precision)
        self.inputs = tuple(zoo.inputs) if inputs is None else inputs
        self.params = [p for p in zoo.model.parameters() if p.requires_grad]
        self.opt = torch.optim.SGD(self.params, lr=lr) if mode == "train" else None

    @staticmethod
    def prepare(zoo: ZooModel, precision: "str | precisions.Precision") -> tuple[Any, ...]:
        """Cast ``zoo``'s model in place as ``precision`` runs it; its inputs, cast likewise."""
        return precisions.get(precision).cast(zoo.model, zoo.inputs)

    def forward_backward(self) -> torch.Tensor:
        """Forward and backward (no optimizer step): the parity step."""
        if self.cudagraphs:
            # One step is one CUDA-graph generation: the previous step's outputs may be reused.
            torch.compiler.cudagraph_mark_step_begin()
        autocast = self.precision.autocast(self.zoo.device)
        if self.mode == "infer":
            with torch.no_grad(), autocast:
                return self.fn(*self.inputs)
        for p in self.params:
            p.grad = None
        with autocast:  # the forward and the loss, as autocast's documentation has it
            out = self.fn(*self.inputs)
            loss = self.zoo.loss(out)
        loss.backward()
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

        with self.precision.autocast(self.zoo.device):
            out = self.fn(*self.inputs).detach().requires_grad_()

        def rest() -> None:
            with self.precision.autocast(self.zoo.device):
                loss = self.zoo.loss(out)
            loss.backward()
            self.opt.step()  # type: ignore[union-attr]

        return count_kernels(rest, "cpu")

    def grads(self) -> list[torch.Tensor | None]:
        return [None if p.grad is None else p.grad.detach().clone() for p in self.params]


def compare(ref: Reference, out: torch.Tensor, grads: list[torch.Tensor | None] | None, tol: float) -> dict[str, Any]:
    """The accuracy record of a step (``optimus.tools.bench.accuracy.judge``)."""
    return accuracy.judge(ref, out, grads, tol)


def eager_reference(name: str, mode: str, opts: BenchOptions, precision: str = "fp32") -> Reference:
    """Eager results in ``precision`` and fp64 results of the first step, TF32 off."""
    return accuracy.eager_reference(name, mode, opts.size, opts.device, opts.seed, precision)


class CudagraphSkips:
    """Inductor's "skipping cudagraphs due to ..." messages and skip count since creation."""

    def __init__(self) -> None:
        from torch._dynamo.utils import counters

        self._counters = counters
        self._before = counters["inductor"].get("cudagraph_skips", 0)
        self.messages: list[str] = []

    def reasons(self) -> list[str]:
        skips = self._counters["inductor"].get("cudagraph_skips", 0) - self._before
        return self.messages + ["(no reason logged)"] * max(skips - len(self.messages), 0)


@contextlib.contextmanager
def cudagraph_watch() -> Iterator[CudagraphSkips]:
    """Collect cudagraph skips (and their logged reasons) while the block runs."""
    watch = CudagraphSkips()

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            watch.messages.append(record.getMessage())

    try:
        from torch._inductor.cudagraph_utils import cudagraphs_log as logger
    except ImportError:  # pragma: no cover - layout differs across versions
        logger = None
    handler = _Collect(level=logging.DEBUG)
    if logger is not None:
        logger.addHandler(handler)
    try:
        yield watch
    finally:
        if logger is not None:
            logger.removeHandler(handler)


def _cudagraph_status(dev: torch.device, watch: CudagraphSkips) -> str:
    if dev.type != "cuda":
        return "n/a on cpu"
    skipped = watch.reasons()
    if not skipped:
        return "on"
    reasons = sorted(set(skipped))
    return f"skipped {len(skipped)}x: " + "; ".join(r[:120] for r in reasons[:3])


# --- one row --------------------------------------------------------------------------


def new_row(name: str, mode: str, config: str, opts: BenchOptions, error: str | None = None,
            precision: str = "fp32") -> dict[str, Any]:
    """A row with every field present and nothing measured yet (status "error")."""
    dev = torch.device(opts.device)
    prec = precisions.get(precision)
    return {
        "model": name,
        "mode": mode,
        "config": config,
        **prec.record(),
        "size": opts.size,
        "device": dev.type,
        "status": "error",
        "error": error,
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
        "output_dtype": None,
        "optimus_rewrites": None,
        "iters": opts.iters,
        "warmup": opts.warmup,
        "repeats": opts.repeats,
        "seed": opts.seed,
        "tf32": prec.tf32 if dev.type == "cuda" else None,  # for the timed steps; accuracy: always off
        "cold_compile": opts.cold,
        "dynamic": opts.dynamic,
        "workers": opts.workers,
        "compile_threads": opts.compile_threads,
        "isolated": opts.isolate if opts.workers > 1 else None,
    }


def skipped_row(name: str, mode: str, config: str, opts: BenchOptions, reason: str,
                precision: str = "fp32") -> dict[str, Any]:
    """The row of a model that cannot run here (an external model's library is missing)."""
    row = new_row(name, mode, config, opts, error=reason, precision=precision)
    row["status"] = "skipped"
    row["env"] = environment(opts.device)
    return row


def run_config(
    name: str,
    mode: str,
    config: str,
    opts: BenchOptions,
    ref: Reference | None,
    timed_section: Callable[[], ContextManager[Any]] | None = None,
    busy_section: Callable[[], ContextManager[Any]] | None = None,
    precision: str = "fp32",
) -> dict[str, Any]:
    """Measure ``name`` in ``mode`` under ``config`` in ``precision``; never raises (errors go in the row).

    ``ref`` holds the eager references of the same precision (``eager_reference``).

    ``timed_section`` (workers: an exclusive inter-process lock) is held around
    everything that is timed or counted: warm-up, timed steps, kernel count and peak
    memory. Building, compiling and the first (accuracy) step run outside it, inside
    ``busy_section`` (workers with ``isolate``: a shared lock that timed sections wait for).
    """
    from .. import measure

    dev = torch.device(opts.device)
    cfg = CONFIGS[config]
    prec = precisions.get(precision)
    tf32 = prec.tf32 and dev.type == "cuda"
    row = new_row(name, mode, config, opts, precision=precision)
    if cfg.cudagraphs:
        row["cudagraphs"] = None
    if config == "upstream":
        row["upstream_options"] = {k: sorted(v) for k, v in upstream_fusion_options().items()}
    torch._dynamo.reset()
    runner = None
    timed = timed_section or contextlib.nullcontext
    busy = busy_section or contextlib.nullcontext
    try:
        with (
            cold_compile() if opts.cold else warm_compile(),
            cfg.context(),
            cudagraph_watch() as cudagraph_skips,
            accuracy.tf32_mode(False),
        ):
            with busy():  # the GPU work outside the timed section
                zoo = get_bench_model(name, opts.size, opts.device, opts.seed)
                row["batch_size"] = zoo.batch_size
                inputs = Runner.prepare(zoo, prec)
                runner = Runner(zoo, cfg.wrap(zoo.model, **opts.compile_kwargs()), mode, opts.lr,
                                cudagraphs=cfg.cudagraphs, precision=prec, inputs=inputs)

                # First step, TF32 off: compiles; its outputs and gradients are the accuracy check.
                measure.synchronize(dev)
                t0 = time.perf_counter()
                if cfg.compiled and dev.type == "cpu":
                    out, generated = measure.compiled_kernel_count(runner.forward_backward, dev)
                else:
                    out, generated = runner.forward_backward(), None
                measure.synchronize(dev)
                row["first_step_s"] = time.perf_counter() - t0
                row["output_dtype"] = str(out.dtype).replace("torch.", "")  # autocast's, where it ran
                if ref is not None:
                    row["parity"] = compare(ref, out, runner.grads() if mode == "train" else None,
                                            opts.tolerance(mode, precision))
                if runner.opt is not None:
                    runner.opt.step()
                del out
                row.update(_optimus_summary(runner.fn))

            with accuracy.tf32_mode(tf32):
                if tf32 and cfg.compiled:
                    # Dynamo guards on the TF32 flag: the first step with TF32 on recompiles.
                    with busy():
                        t0 = time.perf_counter()
                        runner.step()
                        measure.synchronize(dev)
                        row["tf32_recompile_s"] = time.perf_counter() - t0

                with timed():
                    # Kernels per step. CUDA graphs: counted after the timed steps, so the
                    # profiled step is surely a replay (kernels run while a graph is being
                    # captured are not executed, hence not seen by the profiler).
                    count_late = dev.type == "cuda" and cfg.cudagraphs
                    if not count_late:
                        _count_kernels(row, runner, dev, generated)

                    # Time and memory.
                    medians = measure.step_ms_medians(runner.step, dev, warmup=opts.warmup, iters=opts.iters,
                                                      repeats=opts.repeats)
                    ms = statistics.median(medians)
                    if count_late:
                        _count_kernels(row, runner, dev, generated)
                    if count_late:  # a replay allocates nothing: its memory was taken at capture
                        row["peak_memory_bytes"] = None
                        row["memory_method"] = ("n/a under CUDA graphs: the graph's pool is allocated at capture, "
                                                "so max_memory_allocated over a replay does not see it")
                    else:
                        row["peak_memory_bytes"], row["memory_method"], row["peak_memory_total_bytes"] = _peak_memory(runner.step, dev)
                    if opts.time_split:
                        row["time_split"] = measure.time_split(runner.step, dev)
            row["step_ms"] = ms
            if opts.repeats > 1:
                row["step_ms_repeats"] = medians
                row["step_ms_spread"] = (max(medians) - min(medians)) / ms if ms > 0 else 0.0
            row["examples_per_s"] = zoo.batch_size / (ms / 1e3)
            row["compile_s"] = max(row["first_step_s"] - ms / 1e3, 0.0) if cfg.compiled else 0.0
            if cfg.cudagraphs:
                row["cudagraphs"] = _cudagraph_status(dev, cudagraph_skips)
            row["status"] = "ok"
    except Exception as e:  # a failing configuration must not lose the other rows
        row["error"] = _describe(e)
    finally:
        del runner
        torch._dynamo.reset()
        _release(opts.device)
    return row


def _count_kernels(row: dict[str, Any], runner: Runner, dev: torch.device, generated: int | None) -> None:
    """Kernels per step into ``row`` (see the module docstring for the methods)."""
    from .. import measure

    if dev.type == "cuda":
        runner.step()
        prof = measure.kernel_profile(runner.step, dev)
        row["kernels"] = prof["count"]
        row["kernel_device_us"] = prof["device_us"]  # summed kernel time: where a step's device time goes
        row["top_kernels"] = prof["top"]
        row["kernel_method"] = "cuda profiler kernel events per step"
    elif generated is not None:
        row["kernels"] = generated + runner.outside_ops()
        row["kernel_method"] = "cpu: generated loop nests + extern calls + aten ops outside the graph"
    else:
        runner.step()
        row["kernels"] = measure.count_kernels(runner.step, dev)
        row["kernel_method"] = "cpu: computing aten ops per step"


def _optimus_summary(fn: Any) -> dict[str, Any]:
    """Which Optimus rules fired (and any rule errors), from the compiled model's report."""
    report = getattr(fn, "optimus_report", None)
    if report is None:
        return {}
    try:
        totals = report.rule_totals()
        return {
            "optimus_rules": {name: st.matched for name, st in totals.items() if st.matched},
            # the rewrites that reached the compiled program (dead-code removal is not one)
            "optimus_rewrites": sum(st.matched for name, st in totals.items() if name != DEAD_CODE),
            "optimus_errors": [str(e)[:200] for e in report.errors()[:5]],
            # graphs the safety net compiled again without (some of) Optimus: their
            # rewrites are not in optimus_rules; why, per graph
            "optimus_fallbacks": sorted({f"{g.level} {g.graph}: {g.discarded}"[:300] for g in report.graphs if g.discarded}),
        }
    except Exception as e:  # the report is informative only
        return {"optimus_rules": None, "optimus_errors": [f"report unavailable: {_describe(e)}"]}


def _peak_memory(step: Callable[[], Any], dev: torch.device) -> tuple[int, str, int | None]:
    """``(peak bytes of the step's own memory, method, process total or None)``."""
    from .. import measure

    if dev.type == "cuda":
        own, total = measure.peak_step_memory_cuda(step, dev)
        return own, "cuda: peak bytes allocated during one step above what was live before it (max_memory_allocated - memory_allocated)", total
    peak = measure.peak_tensor_memory(step)
    if peak is not None:
        return peak, "cpu: peak bytes of tensors allocated during one step (profiler allocation events; state live before the step not counted)", None
    return measure.peak_memory(step, dev), "cpu: peak RSS over one step (VmHWM after reset; else the process high-water mark)", None


def _describe(e: BaseException) -> str:
    first = str(e).strip().splitlines()
    msg = f"{type(e).__name__}: {first[0] if first else ''}"
    frames = traceback.extract_tb(e.__traceback__)
    if frames:
        f = frames[-1]
        msg += f" [at {os.path.basename(f.filename)}:{f.lineno} in {f.name}]"
    return msg[:500]


# --- many rows ------------------------------------------------------------------------


def plan(models: Iterable[str], modes: Iterable[str], configs: Iterable[str],
         precisions: Iterable[str] = ("fp32",)) -> list[tuple[str, str, str, str]]:
    """``(model, mode, config, precision)`` rows: a model's precisions back to back."""
    return [(m, mode, c, p) for m in models for mode in modes for p in precisions for c in configs]


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
    """Run the whole plan (every precision of ``opts.precisions``); ``on_row`` sees each row
    as soon as it is measured.

    ``skip`` holds row keys (``results.key``) not to run (already measured);
    ``deadline`` (a ``time.perf_counter()`` value) stops the plan before a configuration
    that would not finish in time, judged by the longest compiled configuration of the
    same model and mode so far (or once the deadline has passed).
    """
    warm_compile_pool(opts.device)
    env = environment(opts.device)
    rows: list[dict[str, Any]] = []
    for name in models:
        for mode in modes:
            longest = 0.0
            for precision in opts.precisions:
                todo = [c for c in configs if row_key(name, mode, c, precision) not in skip]
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
                    ref = eager_reference(name, mode, opts, precision)
                except Exception as e:
                    ref_error = _describe(e)
                _release(opts.device)
                for config in todo:
                    expected = longest if CONFIGS[config].compiled else 0.0
                    if deadline is not None and time.perf_counter() + expected > deadline:
                        return rows
                    if progress is not None:
                        progress.describe(f"{name} {mode} {config} {precision}")
                    started = time.perf_counter()
                    row = run_config(name, mode, config, opts, ref, precision=precision)
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
