"""``optimus bench --workers N``: rows compiled concurrently, measured one at a time.

Compilation dominates a bench run (about 100 s for one Inductor compile of the largest
training graph on the H200, 230 s with upstream's passes) and much of it is
single-threaded Python, so a coordinator (this process) hands the (model, mode,
config, precision) rows to N worker processes (``multiprocessing`` spawn). In a worker, one row is
``harness.run_config``, as in a serial run:

1. ``torch._dynamo.reset()``, fresh cache directories, build, compile and the first
   (accuracy) step: concurrently with the other workers;
2. then the worker takes an exclusive inter-process lock (``fcntl.flock`` on a file of
   the run directory) for everything timed or counted: warm-up, timed steps, kernel
   count (profiler), peak memory; with ``timing_cores`` it also moves itself onto CPU
   cores that no worker compiles on (step times of launch-bound models depend on the
   launching thread's core) and back afterwards; releases it and takes the next row.

Rows are handed out longest expected compile first (``expected_compile_s``), so the
long compiles overlap everything else instead of trailing at the end. Each worker runs
Inductor with ``TORCHINDUCTOR_COMPILE_THREADS=compile_threads`` so N workers fit the
machine. The eager and fp64 references of a (model, mode, precision) are computed once, by
the first worker that needs them (under the lock, so they disturb no timing), saved in
the run directory and loaded by the others.

Every row records ``workers`` and ``compile_threads``: its compile time was measured
with that many concurrent compiles and is not comparable with a serial run's.
A worker that dies (segfault, out of memory) costs its row, recorded as an error, and
is replaced.
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing
import os
import queue
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Sequence

# --- scheduling -----------------------------------------------------------------------

# Cold Inductor compile (first step minus one step) of each realistic training graph on
# the H200, torch 2.11 (docs/benchmarks.md, the upstream table's JSON). dlrm, wukong and
# hstu were not measured; their figures are guesses from their graph sizes. Only the
# order these give matters (and, scaled by what the run has measured, --budget-minutes).
H200_INDUCTOR_TRAIN_COMPILE_S = {
    "splitcat": 99.0,
    "interformer": 39.0,
    "dhen": 32.0,
    "wukong": 25.0,
    "towers32": 20.0,
    "dlrm": 15.0,
    "hstu": 15.0,
    "dcnv2": 13.0,
}
MODE_FACTOR = {"train": 1.0, "infer": 0.4}
CONFIG_FACTOR = {"eager": 0.0, "upstream": 1.3, "optimus": 0.8, "optimus-cudagraphs": 0.8, "optimus-vertical": 0.9,
                 "optimus-horizontal": 0.8, "optimus-fx": 0.8}


def expected_compile_s(model: str, mode: str, config: str, prior: dict[str, float] | None = None,
                       precision: str = "fp32") -> float:
    """Expected compile seconds of a row: a measured figure from ``prior`` (keyed as
    results files are, ``results.key``) when there is one, else the H200 table scaled by
    mode and configuration (unknown compiled configurations count as plain Inductor; every
    precision as fp32)."""
    from .configs import CONFIGS
    from .results import key as row_key

    key = row_key(model, mode, config, precision)
    if prior and key in prior:
        return prior[key]
    cfg = CONFIGS.get(config)
    if cfg is not None and not cfg.compiled:
        return 0.0
    base = H200_INDUCTOR_TRAIN_COMPILE_S.get(model, 30.0) * MODE_FACTOR.get(mode, 1.0)
    return base * CONFIG_FACTOR.get(config, 1.0)


@dataclass(frozen=True)
class Task:
    model: str
    mode: str
    config: str
    expected_s: float
    precision: str = "fp32"

    @property
    def key(self) -> str:
        from .results import key

        return key(self.model, self.mode, self.config, self.precision)


def schedule(plan: Sequence[tuple[str, str, str, str]], prior: dict[str, float] | None = None) -> list[Task]:
    """The plan's ``(model, mode, config, precision)`` rows, longest expected compile first
    (ties keep the plan's order)."""
    tasks = [Task(m, md, c, expected_compile_s(m, md, c, prior, p), p) for m, md, c, p in plan]
    return sorted(tasks, key=lambda t: -t.expected_s)


def prior_compile_s(data: dict[str, Any], device: str, size: str) -> dict[str, float]:
    """Measured ``compile_s`` of the ``ok`` rows of a results file (same device and size)."""
    return {k: float(r["compile_s"]) for k, r in data.get("rows", {}).items()
            if r.get("status") == "ok" and r.get("device") == device and r.get("size") == size
            and isinstance(r.get("compile_s"), (int, float))}


# --- locks and CPU cores ----------------------------------------------------------------


class FileLock:
    """An ``fcntl.flock`` lock on ``path``, shared by every process of the run: exclusive,
    or with ``shared`` held by any number of processes at once (and no exclusive holder)."""

    def __init__(self, path: str, shared: bool = False) -> None:
        self.path = path
        self.shared = shared
        self._fd: int | None = None

    def __enter__(self) -> "FileLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX)
        self._fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class Quiet:
    """``--isolate``: rows are timed while no other row builds, compiles or runs its first
    step (that work shares the GPU and the CPU with the timed steps: with 7 workers on the
    H200 identical graphs timed 9.4 and 14.5 ms). Busy sections hold ``busy.lock`` shared; a timed section
    takes ``turnstile.lock`` (no busy section starts from then on), then ``busy.lock``
    exclusively (the busy sections in flight have ended). A busy section passes the
    turnstile before taking its shared lock and never holds both, so the two cannot wait on
    each other; waiting timed sections are not starved by new compiles."""

    def __init__(self, run_dir: str) -> None:
        self.busy_path = os.path.join(run_dir, "busy.lock")
        self.turnstile_path = os.path.join(run_dir, "turnstile.lock")

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        with FileLock(self.turnstile_path):
            held = FileLock(self.busy_path, shared=True).__enter__()
        try:
            yield
        finally:
            held.__exit__()

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        with FileLock(self.turnstile_path), FileLock(self.busy_path):
            yield


def usable_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def split_cores(timing_cores: int) -> tuple[list[int], list[int]]:
    """``(compile_cores, timing_cores)``: the last ``timing_cores`` usable cores are kept
    for timed sections; with 0 (or too few cores) both lists are every core."""
    cores = usable_cores()
    if timing_cores <= 0 or len(cores) <= timing_cores:
        return cores, cores
    return cores[:-timing_cores], cores[-timing_cores:]


def default_timing_cores(workers: int) -> int:
    """2 cores for timing when workers compile concurrently on a machine of 8+ cores."""
    return 2 if workers > 1 and len(usable_cores()) >= 8 else 0


def default_compile_threads(workers: int, compile_cores: int) -> int | None:
    """Inductor compile threads per worker so that the workers share the compile cores."""
    return None if workers <= 1 else max(1, compile_cores // workers)


def pin_process(cores: Sequence[int]) -> None:
    """Put every thread of this process on ``cores`` (Linux; a no-op elsewhere)."""
    if not hasattr(os, "sched_setaffinity"):  # pragma: no cover
        return
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # pragma: no cover
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:  # a thread that just exited
            pass


@contextlib.contextmanager
def _environ(**values: str | None) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- the worker -----------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSetup:
    worker_id: int
    run_dir: str
    compile_cores: tuple[int, ...]
    timing_cores: tuple[int, ...]


def _reference_path(run_dir: str, model: str, mode: str, precision: str = "fp32") -> str:
    return os.path.join(run_dir, f"ref-{model}-{mode}-{precision}")


def shared_reference(setup: WorkerSetup, model: str, mode: str, opts: Any,
                     timed_lock: FileLock, precision: str = "fp32") -> tuple[Any, str | None, str]:
    """The (model, mode, precision) eager references: loaded if another worker made them,
    else made here (under the timing lock: they run on the device) and saved. Returns
    ``(reference or None, error or None, "loaded" or "computed")``."""
    import torch

    from .harness import _describe, eager_reference

    base = _reference_path(setup.run_dir, model, mode, precision)
    with FileLock(base + ".lock"):
        if os.path.exists(base + ".pt"):
            return torch.load(base + ".pt", map_location=opts.device, weights_only=False), None, "loaded"
        if os.path.exists(base + ".error"):
            with open(base + ".error") as f:
                return None, f.read(), "loaded"
        try:
            with timed_lock:
                ref = eager_reference(model, mode, opts, precision)
        except Exception as e:  # the rows still run; their accuracy says why it is missing
            with open(base + ".error", "w") as f:
                f.write(_describe(e))
            return None, _describe(e), "computed"
        torch.save(ref.to("cpu"), base + ".pt.tmp")
        os.replace(base + ".pt.tmp", base + ".pt")
        return ref, None, "computed"


def worker_main(setup: WorkerSetup, opts: Any, tasks: Any, results: Any) -> None:
    """A worker process: run the rows it is sent (``Task`` or None to stop)."""
    if setup.compile_cores:
        pin_process(setup.compile_cores)  # before torch starts threads or compile workers
    from . import harness

    harness.warm_compile_pool(opts.device)
    env = harness.environment(opts.device)
    timed_lock = FileLock(os.path.join(setup.run_dir, "timed.lock"))
    quiet = Quiet(setup.run_dir) if opts.isolate else None
    refs: dict[tuple[str, str, str], tuple[Any, str | None, str]] = {}
    while True:
        task = tasks.get()
        if task is None:
            return
        source = "in memory"
        which = (task.model, task.mode, task.precision)
        if which not in refs:
            refs.clear()  # one (model, mode, precision) in memory at a time
            refs[which] = shared_reference(setup, task.model, task.mode, opts, timed_lock, task.precision)
            source = refs[which][2]
        ref, ref_error, _ = refs[which]
        waits: list[float] = []

        @contextlib.contextmanager
        def timed_section() -> Iterator[None]:
            t0 = time.perf_counter()
            with timed_lock, (quiet.timed() if quiet is not None else contextlib.nullcontext()):
                waits.append(time.perf_counter() - t0)
                if setup.timing_cores != setup.compile_cores:
                    pin_process(setup.timing_cores)
                try:
                    yield
                finally:
                    if setup.timing_cores != setup.compile_cores:
                        pin_process(setup.compile_cores)

        started = time.perf_counter()
        row = harness.run_config(task.model, task.mode, task.config, opts, ref, timed_section=timed_section,
                                 busy_section=quiet.busy if quiet is not None else None, precision=task.precision)
        if ref is None and row["parity"] is None:
            row["parity_error"] = f"eager reference failed: {ref_error}"
        row["env"] = env
        row["worker"] = setup.worker_id
        row["timing_cores"] = len(setup.timing_cores) if setup.timing_cores != setup.compile_cores else None
        row["timed_lock_wait_s"] = waits[0] if waits else None
        row["reference"] = source  # computed here, loaded (made by another worker), in memory (an earlier row)
        results.put((setup.worker_id, task.key, row, time.perf_counter() - started))


# --- the coordinator ------------------------------------------------------------------


@dataclass
class _Worker:
    setup: WorkerSetup
    process: Any
    tasks: Any
    task: Task | None = None
    started: float = 0.0


def run_parallel(
    models: list[str],
    modes: list[str],
    configs: list[str],
    opts: Any,
    workers: int,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    progress: Any = None,
    skip: set[str] | frozenset[str] = frozenset(),
    deadline: float | None = None,
    prior: dict[str, float] | None = None,
    timing_cores: int | None = None,
    worker_target: Callable[..., None] | None = None,
) -> list[dict[str, Any]]:
    """Run the plan through ``workers`` processes; ``on_row`` sees each row when it is done.

    ``opts.compile_threads`` (None: the compile cores divided among the workers) sets
    each worker's ``TORCHINDUCTOR_COMPILE_THREADS``; ``timing_cores`` (None: 2 on 8+
    cores) is how many cores are kept for timed sections. ``deadline`` stops handing
    out rows that would end after it, judged by the row's expected compile time scaled
    by how long the rows so far took against their expectation. ``worker_target``
    replaces ``worker_main`` (tests: a worker that dies).
    """
    from . import harness

    full_plan = harness.plan(models, modes, configs, opts.precisions)
    plan = [t for t in schedule(full_plan, prior) if t.key not in skip]
    if progress is not None:
        for _ in range(len(full_plan) - len(plan)):
            progress.advance()
    if not plan:
        return []
    timing = default_timing_cores(workers) if timing_cores is None else timing_cores
    compile_cores, timed_cores = split_cores(timing)
    if opts.compile_threads is None:
        opts = replace(opts, compile_threads=default_compile_threads(workers, len(compile_cores)))
    opts = replace(opts, workers=workers)

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    run_dir = tempfile.mkdtemp(prefix="optimus-bench-")
    pool: list[_Worker] = []
    done: dict[str, dict[str, Any]] = {}
    ratios: list[float] = []  # measured row time / expected compile time
    pending = list(plan)
    deaths = 0

    def start(worker_id: int) -> _Worker:
        setup = WorkerSetup(worker_id, run_dir, tuple(compile_cores), tuple(timed_cores))
        tasks = ctx.Queue()
        threads = None if opts.compile_threads is None else str(opts.compile_threads)
        with _environ(TORCHINDUCTOR_COMPILE_THREADS=threads):
            proc = ctx.Process(target=worker_target or worker_main, args=(setup, opts, tasks, results), daemon=True,
                               name=f"optimus-bench-worker-{worker_id}")
            proc.start()
        return _Worker(setup, proc, tasks)

    def finish(w: _Worker, row: dict[str, Any], took: float) -> None:
        assert w.task is not None
        if w.task.expected_s > 0 and row.get("status") == "ok":
            ratios.append(took / w.task.expected_s)
        done[w.task.key] = row
        w.task = None
        if on_row is not None:
            on_row(row)
        if progress is not None:
            progress.advance()

    def fits(task: Task) -> bool:
        if deadline is None:
            return True
        scale = statistics.median(ratios) if ratios else 1.0
        return time.perf_counter() + task.expected_s * scale <= deadline

    try:
        pool = [start(i) for i in range(min(workers, len(plan)))]
        while pending or any(w.task is not None for w in pool):
            for w in pool:
                if w.task is None and pending:
                    # the deadline: rows expected to end past it are not started (time only
                    # runs on, so they are dropped); shorter ones still are
                    pending[:] = [t for t in pending if fits(t)]
                    if not pending:
                        break
                    w.task, w.started = pending.pop(0), time.perf_counter()
                    w.tasks.put(w.task)
                    if progress is not None:
                        progress.describe(f"worker {w.setup.worker_id}: {w.task.model} {w.task.mode} {w.task.config} "
                                          f"{w.task.precision}")
            try:
                worker_id, key, row, took = results.get(timeout=1.0)
            except queue.Empty:
                for i, w in enumerate(pool):
                    if w.task is not None and not w.process.is_alive():
                        deaths += 1
                        message = (f"WorkerDied: the worker process exited with code {w.process.exitcode} "
                                   f"while running this row")
                        row = harness.new_row(w.task.model, w.task.mode, w.task.config, opts, message,
                                              precision=w.task.precision)
                        row["env"] = {"device": opts.device}
                        finish(w, row, time.perf_counter() - w.started)
                        if deaths > 2 * workers:
                            raise RuntimeError(f"bench workers keep dying ({deaths} so far; last: {message})")
                        pool[i] = start(w.setup.worker_id)
                continue
            w = next(w for w in pool if w.setup.worker_id == worker_id)
            if w.task is not None and w.task.key == key:
                finish(w, row, took)
    finally:
        for w in pool:
            if w.process.is_alive():
                w.tasks.put(None)
        for w in pool:
            w.process.join(timeout=30)
            if w.process.is_alive():
                w.process.terminate()
                w.process.join(timeout=10)
        shutil.rmtree(run_dir, ignore_errors=True)
    plan_order = [Task(m, md, c, 0.0, p).key for m, md, c, p in full_plan]
    return [done[k] for k in plan_order if k in done]
