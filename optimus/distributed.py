"""Optimus under data-parallel and sharded training (DDP, FSDP2, TorchRec).

Three jobs (see docs/distributed.md):

* **What a graph is part of.** Under ``DistributedDataParallel`` with
  ``torch._dynamo.config.optimize_ddp`` on, Dynamo's DDPOptimizer cuts each Dynamo graph
  at gradient-bucket boundaries and compiles every piece separately; Optimus then sees one
  bucket at a time, so no rewrite (and no horizontal group) can span two buckets. Under
  FSDP2 the all-gathers and reduce-scatters run in hooks Dynamo does not trace, so each
  compiled graph lies between two of them. ``piece_of`` tells which of these a Dynamo
  graph is (DDPOptimizer's piece number is read from its compiler's frame: private, and
  left out of the note when not found); ``Piece.note`` is what every graph report of it
  says.
* **Bad input, said clearly.** ``check_wrapping`` refuses a model wrapped twice (DDP in
  DDP, DDP with FSDP); ``check_consistent`` raises the same error on every rank when the
  ranks would compile different programs (devices, parameters, versions).
* **A launcher that cannot hang.** ``launch`` starts ``nproc`` processes with
  ``torch.multiprocessing.spawn`` (gloo on CPU, NCCL on GPU, a ``file://`` rendezvous in a
  directory of the caller's, so no network), waits for them against a deadline, and
  terminates every rank when one fails or time runs out. Each rank's result is a JSON
  file the parent reads back.

Collectives traced *into* a graph (functional collectives, ``wait_tensor``) are barriers
for every rewrite; see ``optimus.core.collectives``.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .core.collectives import is_collective

# The GPU machines need NVLink multicast off (NCCL's NVLS and symmetric memory's multicast);
# every process the launcher starts gets these.
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


# ------------------------------------------------------------------ graph pieces
@dataclass(frozen=True)
class Piece:
    """Where one Dynamo graph sits in distributed training."""

    kind: str  # "ddp_optimizer" | "ddp" | "fsdp"
    index: int | None = None  # 1-based piece number (DDPOptimizer)
    count: int | None = None  # pieces DDPOptimizer cut the Dynamo graph into

    def note(self) -> str:
        if self.kind == "ddp_optimizer":
            where = f"graph {self.index} of {self.count}" if self.index and self.count else "a graph"
            return (
                f"{where} from DDPOptimizer (one per DDP gradient bucket, torch._dynamo.config.optimize_ddp): "
                "rewrites and horizontal groups are limited to this bucket"
            )
        if self.kind == "ddp":
            return (
                "compiled under DistributedDataParallel with optimize_ddp off: one graph for every "
                "bucket; DDP all-reduces the gradients after this graph's backward"
            )
        return (
            "compiled under FSDP: parameters are all-gathered before this graph and gradients "
            "reduce-scattered after it, in hooks outside the graph; rewrites and horizontal groups "
            "are limited to this graph"
        )


def _ddp_optimizer_position() -> tuple[int | None, int | None]:
    """(piece, pieces) of the DDPOptimizer split being compiled now, read from the frame of
    its ``SubmodCompiler.run_node`` (private; ``(None, None)`` when it is not found)."""
    try:
        from torch._dynamo.backends.distributed import SubmodCompiler
    except ImportError:  # pragma: no cover - torch without distributed
        return None, None
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        node = frame.f_locals.get("n")
        if isinstance(owner, SubmodCompiler) and frame.f_code.co_name == "run_node" and isinstance(node, torch.fx.Node):
            targets = [str(n.target) for n in owner.module.graph.nodes if n.op == "call_module"]
            if str(node.target) in targets:
                return targets.index(str(node.target)) + 1, len(targets)
            return None, len(targets)
        frame = frame.f_back
    return None, None


def active_ddp() -> Any:
    """The ``DistributedDataParallel`` module whose forward is running (Dynamo compiles
    inside it), or ``None``."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # pragma: no cover
        return None
    getter = getattr(DistributedDataParallel, "_get_active_ddp_module", None)
    return getter() if getter is not None else None


def _reads_fsdp_parameters(gm: torch.fx.GraphModule) -> bool:
    """Does the graph take parameters of an FSDP-managed module (FSDP2 ``fully_shard`` or
    FSDP1)? Dynamo marks their sources (``FSDPNNModuleSource``)."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            break
        src = getattr(n, "_dynamo_source", None)
        try:
            guard_source = src.guard_source  # a property in 2.13, a method in older torch
            if callable(guard_source):
                guard_source = guard_source()
            if guard_source.is_fsdp_module():
                return True
        except Exception:  # no source, or another layout
            continue
    return False


def piece_of(gm: torch.fx.GraphModule) -> Piece | None:
    """Which distributed piece the Dynamo graph ``gm`` (about to be compiled) is, if any."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is not None and "DDPOptimizer" in str(getattr(reason, "reason", "")):
        index, count = _ddp_optimizer_position()
        return Piece("ddp_optimizer", index, count)
    if active_ddp() is not None:
        try:
            from torch._dynamo.utils import get_optimize_ddp_mode

            mode = get_optimize_ddp_mode()
        except Exception:  # pragma: no cover - older layouts
            mode = None
        # DDPOptimizer hands a graph whose parameters fit one bucket over uncut
        return Piece("ddp_optimizer", 1, 1) if mode == "ddp_optimizer" else Piece("ddp")
    if _reads_fsdp_parameters(gm):
        return Piece("fsdp")
    return None


class PieceNotes:
    """Wraps Inductor's per-graph compiler so that every graph report made while it
    compiles (forward now, backward lazily at the first ``backward()``) gets the note."""

    def __init__(self, inner: Callable[..., Any], report: Any, note: str) -> None:
        self.inner = inner
        self.report = report
        self.note = note

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        mark = len(self.report.graphs)
        try:
            return self.inner(*args, **kwargs)
        finally:
            add_note(self.report.graphs[mark:], self.note)


def add_note(graphs: list[Any], note: str) -> None:
    for g in graphs:
        if note not in g.notes:
            g.notes.append(note)


def collective_note(gm: torch.fx.GraphModule) -> str | None:
    """The report note for a graph with collectives traced into it (``None`` without)."""
    from collections import Counter

    found = Counter(
        getattr(n.target, "__name__", str(n.target)).split(".")[0]
        for n in gm.graph.nodes
        if n.op == "call_function" and is_collective(n.target)
    )
    if not found:
        return None
    names = ", ".join(f"{name} x{k}" for name, k in sorted(found.items()))
    return f"{sum(found.values())} collective op(s) in this graph ({names}): barriers; no rewrite moves work across them or removes them"


# ------------------------------------------------------------------ bad input
def check_wrapping(model: Any) -> None:
    """Raise ``ValueError`` for a model wrapped twice by data-parallel wrappers.

    Two ``DistributedDataParallel`` on one chain of modules all-reduce every gradient
    twice; DDP and FSDP on one chain reduce it twice in two ways. Torch accepts some of
    these silently (``DDP(DDP(m))``, ``fully_shard(DDP(m))``); Optimus refuses to
    compile them. (TorchRec's ``DistributedModelParallel`` holds one DDP for the dense
    part: that is a single wrapper.)"""
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
    except ImportError:  # pragma: no cover
        return
    fsdp = fsdp_types()
    root = getattr(model, "_orig_mod", model)
    if not isinstance(root, torch.nn.Module):
        return

    def wrappers(m: torch.nn.Module) -> list[str]:
        kinds = []
        if isinstance(m, DDP):
            kinds.append("DistributedDataParallel")
        if fsdp and isinstance(m, fsdp):
            kinds.append("FSDP")
        return kinds

    def walk(m: torch.nn.Module, chain: list[str], path: str) -> None:
        here = chain + [f"{k} at {path or 'the model'}" for k in wrappers(m)]
        ddps = sum(w.startswith("DistributedDataParallel") for w in here)
        # nested FSDP (blocks and the root) is how FSDP is meant to be used; DDP twice, or
        # DDP with FSDP on one chain, reduces every gradient twice
        if len(here) > len(chain) and (ddps > 1 or (ddps and len(here) > ddps)):
            raise ValueError(
                "the model is wrapped twice for data-parallel training (" + " inside ".join(reversed(here)) + "): "
                "every gradient would be reduced twice. Wrap it once: DistributedDataParallel(model), or "
                "fully_shard() on blocks and the root, not both"
            )
        for name, child in m.named_children():
            walk(child, here, f"{path}.{name}" if path else name)

    walk(root, [], "")


def fsdp_types() -> tuple[type, ...]:
    found: list[type] = []
    try:
        from torch.distributed.fsdp import FSDPModule

        found.append(FSDPModule)
    except ImportError:  # pragma: no cover - older torch
        try:
            from torch.distributed._composable.fsdp import FSDPModule  # type: ignore[no-redef]

            found.append(FSDPModule)
        except ImportError:
            pass
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        found.append(FullyShardedDataParallel)
    except ImportError:  # pragma: no cover
        pass
    return tuple(found)


def check_consistent(model: torch.nn.Module | None = None, group: Any = None, **facts: Any) -> None:
    """Check that every rank compiles the same thing; raise the same ``ValueError`` on
    every rank when they disagree.

    Compares the devices and the names, shapes and dtypes of ``model``'s parameters, the
    torch version and any ``facts`` given (``passes=...``). One ``all_gather_object`` on
    ``group``: call it at the same point on every rank, after wrapping and before the first
    step (a rank that differs there would otherwise fail or hang in its first collective).
    """
    import hashlib

    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "torch.distributed's default process group is not initialized: call "
            "torch.distributed.init_process_group() first (torchrun sets the environment it reads)"
        )
    mine: dict[str, Any] = {"torch": torch.__version__, **{k: repr(v) for k, v in facts.items()}}
    if model is not None:
        params = list(model.named_parameters())
        mine["devices"] = ",".join(sorted({p.device.type for _, p in params})) or "none"
        h = hashlib.sha256()
        for name, p in params:
            h.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
        mine["parameters"] = f"{len(params)} tensors, layout {h.hexdigest()[:12]}"
    world = dist.get_world_size(group)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine, group=group)
    problems = []
    for key in sorted({k for g in gathered for k in g}):
        values = [g.get(key) for g in gathered]
        if len(set(values)) > 1:
            problems.append(f"{key}: " + ", ".join(f"rank {r} {v}" for r, v in enumerate(values)))
    if problems:
        raise ValueError("ranks disagree, so they would compile different programs: " + "; ".join(problems))


# ------------------------------------------------------------------ launcher
class LaunchError(RuntimeError):
    """A rank failed, or the ranks did not finish before the deadline."""


@dataclass
class RankContext:
    """What a worker function gets: its rank, the world, where to write, the device."""

    rank: int
    world_size: int
    workdir: str
    device: str
    backend: str
    extra: dict[str, Any] = field(default_factory=dict)

    def log(self, message: str) -> None:
        """A line in this rank's log file (the launcher shows the tail on failure)."""
        with open(os.path.join(self.workdir, f"rank{self.rank}.log"), "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {message}\n")


def default_backend(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def _rank_main(rank: int, fn: Callable[[RankContext, Any], Any], world_size: int, workdir: str, device: str,
               backend: str, payload: Any, pg_timeout_s: float, init_pg: bool) -> None:
    import torch.distributed as dist

    os.environ.update(GPU_ENV)  # before any communicator exists (also set at spawn)
    _dump_stacks_on(os.path.join(workdir, f"rank{rank}.log"))
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(rank % max(torch.cuda.device_count(), 1))
        device = f"cuda:{torch.cuda.current_device()}"
    ctx = RankContext(rank, world_size, workdir, device, backend)
    try:
        if init_pg:
            dist.init_process_group(
                backend,
                init_method="file://" + os.path.join(workdir, "rendezvous"),
                rank=rank,
                world_size=world_size,
                timeout=datetime.timedelta(seconds=pg_timeout_s),
            )
        ctx.log("started")
        result = fn(ctx, payload)
        with open(os.path.join(workdir, f"rank{rank}.json.tmp"), "w") as f:
            json.dump(result, f)
        os.replace(os.path.join(workdir, f"rank{rank}.json.tmp"), os.path.join(workdir, f"rank{rank}.json"))
        ctx.log("finished")
    except BaseException:
        ctx.log("failed:\n" + traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


_STACK_SIGNAL = getattr(__import__("signal"), "SIGUSR1", None)
_stack_files: list[Any] = []  # kept open for the life of the rank


def _dump_stacks_on(log_path: str) -> None:
    """On ``SIGUSR1``, write every thread's Python stack to the rank's log (the launcher
    sends it to ranks that miss the deadline, before terminating them)."""
    import faulthandler

    if _STACK_SIGNAL is None:  # pragma: no cover - not on this platform
        return
    f = open(log_path, "a")
    _stack_files.append(f)
    faulthandler.register(_STACK_SIGNAL, file=f, all_threads=True)


def launch(
    fn: Callable[[RankContext, Any], Any],
    payload: Any,
    nproc: int,
    workdir: str,
    timeout_s: float,
    device: str = "cpu",
    backend: str | None = None,
    init_pg: bool = True,
) -> list[Any]:
    """Run ``fn(ctx, payload)`` on ``nproc`` new processes; return each rank's result.

    ``fn`` must be importable (a module-level function) and return something JSON can
    hold. The process group is initialized before ``fn`` runs (``init_pg=False`` leaves
    it to ``fn``) with a ``file://`` rendezvous under ``workdir``, gloo on CPU and NCCL on
    CUDA unless ``backend`` says otherwise. Every rank gets ``NCCL_NVLS_ENABLE=0`` and
    ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``.

    Never hangs: when a rank raises or dies, the others are terminated and
    ``LaunchError`` names the rank, with its traceback; when ``timeout_s`` passes first,
    every rank is terminated and ``LaunchError`` shows the tail of each rank's log.
    """
    import torch.multiprocessing as mp

    os.makedirs(workdir, exist_ok=True)
    for name in ["rendezvous"] + [f"rank{r}.{ext}" for r in range(nproc) for ext in ("json", "log")]:
        try:  # a rendezvous file or results left by an earlier launch in the same folder
            os.remove(os.path.join(workdir, name))
        except FileNotFoundError:
            pass
    backend = backend or default_backend(device)
    pg_timeout = max(30.0, timeout_s)
    started = time.monotonic()
    saved = {k: os.environ.get(k) for k in GPU_ENV}
    os.environ.update(GPU_ENV)  # the children inherit it at spawn; ours is restored after
    try:
        ctx = mp.spawn(
            _rank_main,
            args=(fn, nproc, workdir, device, backend, payload, pg_timeout, init_pg),
            nprocs=nproc,
            join=False,
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        while True:
            left = timeout_s - (time.monotonic() - started)
            if left <= 0:
                _dump_stacks(ctx.processes)
                _terminate(ctx.processes)
                raise LaunchError(f"{nproc} rank(s) did not finish within {timeout_s:.0f} s; all terminated "
                                  f"(each rank's Python stacks are at the end of {workdir}/rank<N>.log).\n" + _log_tails(workdir, nproc))
            if ctx.join(timeout=min(left, 1.0), grace_period=5.0):
                break
    except mp.ProcessRaisedException as e:
        index, message = _root_cause(ctx, e.error_index, str(e))
        raise LaunchError(f"rank {index} failed; the other ranks were terminated:{message}") from None
    except mp.ProcessExitedException as e:
        raise LaunchError(f"rank {e.error_index} died ({e}); the other ranks were terminated.\n" + _log_tails(workdir, nproc)) from None
    finally:
        _terminate(ctx.processes)
    results = []
    for rank in range(nproc):
        with open(os.path.join(workdir, f"rank{rank}.json")) as f:
            results.append(json.load(f))
    return results


# What a rank says when it was not the first to fail but lost a peer that did.
_PEER_FAILURE = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing",
                 "communicator was aborted", "Broken pipe")


def _root_cause(ctx: Any, index: int, message: str) -> tuple[int, str]:
    """The rank whose failure started it: ``join`` reports the lowest-numbered failed rank,
    which may be one whose collective failed because another rank had already raised.
    Prefer a rank whose error is not such a peer failure (read from the ranks' error
    files, waiting up to 2 s for them)."""
    if not any(marker in message for marker in _PEER_FAILURE):
        return index, message
    files = getattr(ctx, "error_files", None) or []
    deadline = time.monotonic() + 2.0
    while True:
        for rank, path in enumerate(files):
            if rank == index:
                continue
            try:
                with open(path, "rb") as f:
                    text = str(pickle.load(f))
            except Exception:  # not written (yet), or not a whole pickle
                continue
            if text and not any(marker in text for marker in _PEER_FAILURE):
                return rank, f"\n\n-- Process {rank} terminated with the following error:\n{text}"
        if time.monotonic() > deadline:
            return index, message
        time.sleep(0.1)


def _dump_stacks(processes: list[Any]) -> None:
    if _STACK_SIGNAL is None:  # pragma: no cover
        return
    for p in processes:
        if p.is_alive() and p.pid:
            try:
                os.kill(p.pid, _STACK_SIGNAL)
            except OSError:
                pass
    time.sleep(1.0)  # let them write


def _terminate(processes: list[Any]) -> None:
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5.0
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _log_tails(workdir: str, nproc: int, lines: int = 6) -> str:
    out = []
    for rank in range(nproc):
        path = os.path.join(workdir, f"rank{rank}.log")
        try:
            with open(path) as f:
                tail = f.read().splitlines()[-lines:]
        except OSError:
            tail = ["(no log: the rank never started its worker)"]
        out.append(f"rank {rank}: " + " | ".join(tail))
    return "\n".join(out)
