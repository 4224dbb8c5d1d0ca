"""Measuring kernels, time and memory the same way for every configuration.

"Kernels" means launches per step:

* on CUDA, the CUDA kernel events ``torch.profiler`` records for one call (cuBLAS
  included);
* on CPU, for Inductor-compiled code, the loop nests in the generated C++ plus extern
  kernel calls (Inductor's CPU backend emits one C++ function per fused region with one
  loop nest per kernel); for eager CPU code, the aten operators that compute (views and
  other aliasing ops launch nothing and are not counted).

``torch._inductor.metrics.generated_kernel_count`` over-counts (it counts kernel objects,
not launches), so it is not used.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import statistics
import sys
import time
from typing import Any, Callable

import torch

__all__ = [
    "compiled_kernel_count",
    "count_kernels",
    "cpu_loop_nests",
    "generated_kernel_count",
    "median_step_ms",
    "peak_memory",
    "peak_tensor_memory",
    "step_ms_medians",
    "synchronize",
]

_FOR_RE = re.compile(r"\bfor\s*\(")
_EXTERN_RE = re.compile(r"\bextern_kernels\.\w+\(")
_TRITON_RE = re.compile(r"async_compile\.triton\(")


def synchronize(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def cpu_loop_nests(source: str) -> int:
    """Count outermost ``for`` loops in Inductor-generated C++ code.

    Braces are tracked so that loops nested inside another loop's body are not counted
    again; a loop nest is one kernel's worth of work on the CPU backend.
    """
    count = 0
    stack: list[bool] = []  # one entry per open brace: does it open a loop body?
    pending_for = False  # saw ``for(`` whose body brace has not opened yet
    depth_in_for = 0  # how many open braces are loop bodies
    paren = 0
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c == "f" and _FOR_RE.match(source, i) and (i == 0 or not (source[i - 1].isalnum() or source[i - 1] == "_")):
            if depth_in_for == 0 and not pending_for:
                count += 1
            pending_for = True
            i += 3
            continue
        if c == "(":
            paren += 1
        elif c == ")":
            paren -= 1
        elif c == "{":
            opens_loop = pending_for and paren == 0
            stack.append(opens_loop)
            if opens_loop:
                depth_in_for += 1
                pending_for = False
        elif c == "}":
            if stack and stack.pop():
                depth_in_for -= 1
        elif c == ";" and pending_for and paren == 0:
            pending_for = False  # loop with a single-statement body
        i += 1
    return count


def generated_kernel_count(sources: list[str]) -> int:
    """Kernels in the code Inductor generated for one or more graphs.

    Triton: one ``async_compile.triton(`` per kernel. C++: loop nests in every
    ``cpp_pybinding``/``cpp`` kernel. Both: plus ``extern_kernels.*`` calls (matmuls).
    """
    total = 0
    for src in sources:
        triton = len(_TRITON_RE.findall(src))
        if triton:
            total += triton
        else:
            for body in re.findall(r"async_compile\.cpp(?:_pybinding)?\([^\n]*r'''(.*?)'''", src, re.S):
                total += cpu_loop_nests(body)
        total += len(_EXTERN_RE.findall(src))
    return total


def compiled_kernel_count(step_fn: Callable[[], Any], device: str | torch.device = "cpu") -> tuple[Any, int]:
    """Run a not-yet-compiled step once, capturing all code Inductor generates for it.

    Returns the step's result and the kernel count of the generated code (forward and,
    for a training step, backward graphs). On CUDA prefer ``count_kernels`` after
    warm-up, which counts launches rather than generated kernels.
    """
    from torch._inductor.utils import run_and_get_code

    result, sources = run_and_get_code(step_fn)
    return result, generated_kernel_count(list(sources))


class _AtenCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts aten operators that compute something (aliasing ops excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not _is_aliasing(func):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _is_aliasing(op: Any) -> bool:
    schema = getattr(op, "_schema", None)
    if schema is None:
        return False
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


# What the profiler library (Kineto) itself writes to the process's stderr at every start and stop
_PROFILER_CHATTER = re.compile(r"^(USDT|STAGE):.*(profiler_start|profiler_stop|Completed Stage)")


@contextlib.contextmanager
def profiler_chatter_captured() -> Any:
    """Hold back what native code writes to stderr while the block runs.

    Kineto, the profiler's native library, prints ``profiler_start`` / ``profiler_stop``
    lines straight to file descriptor 2, which lands in the middle of a progress bar.
    The descriptor is pointed at a temporary file for the block; Kineto's own lines are
    dropped afterwards and anything else is written back through the progress bar's
    writer (tqdm's, when a bar is showing), so nothing else is lost.
    """
    import tempfile

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable descriptor 2: nothing to protect
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode(errors="replace")
    kept = "".join(line for line in text.splitlines(keepends=True) if not _PROFILER_CHATTER.match(line))
    if kept:
        _write_stderr(kept)


def _write_stderr(text: str) -> None:
    """``text`` on stderr, around any tqdm progress bar rather than inside it."""
    try:
        from tqdm import tqdm
    except ImportError:
        sys.stderr.write(text)
        return
    with tqdm.external_write_mode(file=sys.stderr):
        sys.stderr.write(text)
    sys.stderr.flush()


def count_kernels(step_fn: Callable[[], Any], device: str | torch.device = "cpu") -> int:
    """Kernels launched by one call of an already warmed-up step function.

    CUDA: kernel events of ``torch.profiler`` (includes cuBLAS and Triton kernels).
    CPU: computing aten operators dispatched (eager) -- for compiled CPU code use
    ``compiled_kernel_count``, since compiled C++ kernels are invisible to dispatch.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        synchronize(dev)
        with profiler_chatter_captured(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            step_fn()
            synchronize(dev)
        events = [e for e in prof.events() if _is_cuda_kernel(e)]
        return len(events)
    counter = _AtenCounter()
    with counter:
        step_fn()
    return counter.count


def kernel_profile(step_fn: Callable[[], Any], device: str | torch.device, top: int = 8) -> dict[str, Any]:
    """CUDA: the kernels of one call of a warmed-up step with their device time:
    ``{"count", "device_us", "top": [[name, calls, total_us], ...]}`` (longest first)."""
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device(device)
    synchronize(dev)
    with profiler_chatter_captured(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        step_fn()
        synchronize(dev)
    by_name: dict[str, list[float]] = {}
    for e in prof.events():
        if _is_cuda_kernel(e):
            us = float(getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0) or 0.0)
            by_name.setdefault(e.name or "?", []).append(us)
    rows = sorted(([name, len(v), round(sum(v), 2)] for name, v in by_name.items()), key=lambda r: -r[2])
    return {
        "count": sum(r[1] for r in rows),
        "device_us": round(sum(r[2] for r in rows), 2),
        "top": [[name[:120], calls, us] for name, calls, us in rows[:top]],
    }


# Where a training step's host time goes, by the profiler ranges torch records (each part's
# time is exclusive of the parts nested in it).
SPLIT_PARTS = ("graphs", "compiled_wrappers", "guards", "autograd", "optimizer", "other")
_GRAPH_CALL = "## Call CompiledFxGraph"  # the generated code of one compiled graph (its launches)
_WRAPPERS = ("Torch-Compiled Region", "CompiledFunctionBackward")  # Dynamo's and AOTAutograd's Python around it
_GUARDS = "TorchDynamo Cache Lookup"  # guard evaluation before a compiled frame runs
_OPTIMIZER = ("Optimizer.step#", "Optimizer.zero_grad#")
_ENGINE = "autograd::engine::evaluate_function: "
_STEP = "optimus.step"


def time_split(step_fn: Callable[[], Any], device: str | torch.device = "cpu", steps: int = 5, warmup: int = 3) -> dict[str, Any]:
    """Where one step's time goes, averaged over ``steps`` profiled steps, in ms per step.

    ``wall_ms``: the step as the profiler saw it on the host (inflated by the profiler;
    compare parts within a row, and ``step_ms`` from the unprofiled timing across rows);
    ``device_busy_ms``: the sum of the GPU kernels' times (0 on the CPU); ``host_ms``: the
    wall time by part, each exclusive of the parts inside it:

    * ``graphs``: the generated code of the compiled graphs (forward and backward), which
      launches their kernels (under CUDA graphs: replays them);
    * ``compiled_wrappers``: Dynamo's and AOTAutograd's Python around those calls;
    * ``guards``: Dynamo's guard evaluation (cache lookup) before each compiled frame;
    * ``autograd``: the autograd engine's work outside the compiled backward
      (``AccumulateGrad`` of every parameter, backward of ops outside the graphs);
    * ``optimizer``: ``step`` and ``zero_grad``;
    * ``other``: the rest (the caller's Python, the loss, allocations, the profiler's own).
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    dev = torch.device(device)
    for _ in range(warmup):
        step_fn()
    synchronize(dev)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            with record_function(_STEP):
                step_fn()
            synchronize(dev)
    events = list(prof.events())
    cpu = [e for e in events if not _is_cuda_kernel(e) and getattr(e, "time_range", None) is not None]

    def spans(pred: Callable[[str], bool]) -> list[tuple[float, float]]:
        return _outermost([(e.time_range.start, e.time_range.end, _thread(e)) for e in cpu if pred(e.name or "")])

    graphs = spans(lambda n: n.startswith(_GRAPH_CALL))
    wrappers = spans(lambda n: n.startswith(_WRAPPERS))
    guards = spans(lambda n: n == _GUARDS)
    optimizer = spans(lambda n: n.startswith(_OPTIMIZER))
    autograd = spans(lambda n: n.startswith(_ENGINE) and not n.endswith("CompiledFunctionBackward"))
    per_step: dict[str, list[float]] = {k: [] for k in ("wall", *SPLIT_PARTS)}
    for step in spans(lambda n: n == _STEP):  # each step alone: the medians shed an outlier step
        within = [step]
        parts = {
            "graphs": _inside(graphs, within),
            "compiled_wrappers": max(_inside(wrappers, within) - _inside(graphs, wrappers, within), 0.0),
            "guards": _inside(guards, within),
            "autograd": max(_inside(autograd, within) - _inside(graphs, autograd, within) - _inside(wrappers, autograd, within), 0.0),
            "optimizer": _inside(optimizer, within),
        }
        parts["other"] = max(_length(within) - sum(parts.values()), 0.0)
        per_step["wall"].append(_length(within))
        for k, v in parts.items():
            per_step[k].append(v)
    device_us = sum(float(getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0) or 0.0) for e in events if _is_cuda_kernel(e))
    med = {k: statistics.median(v) / 1e3 if v else 0.0 for k, v in per_step.items()}  # us -> ms
    return {
        "wall_ms": round(med["wall"], 4),
        "device_busy_ms": round(device_us / 1e3 / max(steps, 1), 4),
        "host_ms": {k: round(med[k], 4) for k in SPLIT_PARTS},
        "steps": steps,
    }


def _thread(event: Any) -> Any:
    return getattr(event, "thread", None)


def _outermost(spans: list[tuple[float, float, Any]]) -> list[tuple[float, float]]:
    """The spans not nested in another of the list (per thread), as (start, end)."""
    out: list[tuple[float, float]] = []
    by_thread: dict[Any, list[tuple[float, float]]] = {}
    for start, end, thread in spans:
        by_thread.setdefault(thread, []).append((start, end))
    for items in by_thread.values():
        items.sort(key=lambda se: (se[0], -se[1]))
        last_end = float("-inf")
        for start, end in items:
            if start >= last_end:
                out.append((start, end))
                last_end = end
    return out


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in spans)


def _inside(inner: list[tuple[float, float]], outer: list[tuple[float, float]], within: list[tuple[float, float]] | None = None) -> float:
    """How much of ``inner``'s time lies inside ``outer``'s spans (and inside ``within``'s)."""
    total = 0.0
    for s, e in inner:
        for os_, oe in outer:
            lo, hi = max(s, os_), min(e, oe)
            if within is not None:
                lo, hi = max(lo, within[0][0]), min(hi, within[0][1])
            if hi > lo:
                total += hi - lo
    return total


def _is_cuda_kernel(event: Any) -> bool:
    dev_type = getattr(event, "device_type", None)
    if dev_type is None or "CUDA" not in str(dev_type):
        return False
    name = event.name or ""
    # Memcpy/Memset rows are not kernels.
    return not name.startswith(("Memcpy", "Memset", "[memory]"))


def median_step_ms(step_fn: Callable[[], Any], device: str | torch.device = "cpu", warmup: int = 5, iters: int = 30) -> float:
    """Median wall time of one step in milliseconds (CUDA events on GPU)."""
    return step_ms_medians(step_fn, device, warmup=warmup, iters=iters, repeats=1)[0]


def step_ms_medians(
    step_fn: Callable[[], Any], device: str | torch.device = "cpu", warmup: int = 5, iters: int = 30, repeats: int = 1
) -> list[float]:
    """``repeats`` medians, each over ``iters`` steps, taken back to back after one ``warmup``.

    The spread of the medians states how noisy the figure is; ``repeats=1`` is
    ``median_step_ms``.
    """
    dev = torch.device(device)
    for _ in range(warmup):
        step_fn()
    synchronize(dev)
    medians: list[float] = []
    for _ in range(max(repeats, 1)):
        times: list[float] = []
        if dev.type == "cuda":
            for _ in range(iters):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                step_fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
        else:
            for _ in range(iters):
                t0 = time.perf_counter()
                step_fn()
                times.append((time.perf_counter() - t0) * 1e3)
        medians.append(statistics.median(times))
    return medians


def peak_memory(step_fn: Callable[[], Any], device: str | torch.device = "cpu") -> int:
    """Peak memory of one step in bytes.

    CUDA: ``torch.cuda.max_memory_allocated`` around the step. CPU: the process's peak
    resident set size (a high-water mark for the whole process, so compare runs made in
    fresh processes or read it as an upper bound).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        step_fn()
        synchronize(dev)
        return int(torch.cuda.max_memory_allocated(dev))
    if _reset_peak_rss():  # Linux: the high-water mark of this step alone
        step_fn()
        peak = _read_peak_rss()
        if peak is not None:
            return peak
    step_fn()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def peak_step_memory_cuda(step_fn: Callable[[], Any], device: str | torch.device) -> tuple[int, int]:
    """``(own, total)`` peak bytes of one CUDA step: ``own`` is the peak above what was
    allocated when the step started (activations, temporaries, workspaces, gradients the
    step allocates), ``total`` is ``torch.cuda.max_memory_allocated`` over the step.

    ``own`` is what a graph rewrite changes; ``total`` also holds parameters, optimizer
    state, inputs and whatever else the process keeps (a benchmark worker holds the eager
    references and earlier rows' leftovers), so totals of rows measured in different
    processes are not comparable.
    """
    dev = torch.device(device)
    synchronize(dev)
    before = int(torch.cuda.memory_allocated(dev))
    torch.cuda.reset_peak_memory_stats(dev)
    step_fn()
    synchronize(dev)
    total = int(torch.cuda.max_memory_allocated(dev))
    return max(total - before, 0), total


def peak_tensor_memory(step_fn: Callable[[], Any]) -> int | None:
    """Peak bytes of CPU tensors that ``step_fn`` allocates and holds at once, above what was
    live when it started (parameters, inputs and anything older are not counted).

    Read off the profiler's allocation events (``profile_memory=True``): every allocation and
    free of the CPU allocator, in order, summed. Deterministic, unlike the resident set size,
    which also holds the Python process, freed pages the allocator keeps and the compile's
    leftovers. ``None`` when this torch's profiler gives no such events.
    """
    from torch.profiler import ProfilerActivity, profile

    try:
        with profiler_chatter_captured(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step_fn()
        cpu = torch.autograd.DeviceType.CPU
        events = [
            (e.start_ns(), e.nbytes())
            for e in prof.profiler.kineto_results.events()  # type: ignore[union-attr]
            if e.name() == "[memory]" and e.device_type() == cpu
        ]
    except Exception:  # pragma: no cover - a profiler without these fields
        return None
    if not events:
        return None
    live = peak = 0
    for _, nbytes in sorted(events):
        live += nbytes
        peak = max(peak, live)
    return peak


def _reset_peak_rss() -> bool:
    """Reset the process's RSS high-water mark (Linux ``/proc/self/clear_refs`` 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _read_peak_rss() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@contextlib.contextmanager
def fresh_inductor_cache():
    """Fresh, empty Inductor and Triton cache directories, the FX graph and AOT autograd
    caches off, and Inductor's in-memory compiled-kernel caches cleared before and after.

    Used so that compile times are cold and no configuration reuses another's artifacts.
    """
    import os
    import tempfile

    from torch._inductor import config as inductor_config

    with tempfile.TemporaryDirectory(prefix="optimus-inductor-") as tmp:
        old = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp
        os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")
        patches: dict[str, Any] = {"fx_graph_cache": False}
        if hasattr(inductor_config, "autotune_local_cache"):
            patches["autotune_local_cache"] = False
        functorch_cfg = torch._functorch.config
        fc_patch = {"enable_autograd_cache": False} if hasattr(functorch_cfg, "enable_autograd_cache") else {}
        try:
            _clear_cache_dir_memo()
            with inductor_config.patch(patches), functorch_cfg.patch(fc_patch):
                yield tmp
        finally:
            for key, value in old.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            _clear_cache_dir_memo()


def _clear_cache_dir_memo() -> None:
    """Inductor memoizes its cache dir and compiled kernels in memory; forget them so the
    environment variables rule and nothing compiled earlier is reused."""
    try:
        from torch._inductor.utils import clear_caches

        clear_caches()
    except ImportError:  # pragma: no cover
        pass
    try:
        from torch._inductor.async_compile import CompiledTritonKernels

        CompiledTritonKernels.cache_clear()
    except (ImportError, AttributeError):  # pragma: no cover - layout differs across versions
        pass
    try:
        from torch._inductor.runtime import cache_dir_utils

        for name in ("cache_dir", "default_cache_dir"):
            fn = getattr(cache_dir_utils, name, None)
            if hasattr(fn, "cache_clear"):
                fn.cache_clear()
    except ImportError:  # pragma: no cover - layout differs across versions
        pass
