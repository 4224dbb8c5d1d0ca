"""Training step time of the zoo under DDP (and FSDP2) with eager, Inductor and Optimus.

    python -m optimus.tools.bench.distributed --nproc N [--device cuda|cpu] [--models a,b,...]
        [--configs eager,inductor,optimus] [--wrappers ddp,fsdp2] [--size small|realistic]
        [--steps 3] [--warmup 5] [--iters 30] [--json FILE] [--timeout-minutes M]

Starts ``N`` processes (``optimus.distributed.launch``: NCCL on GPU, gloo on CPU, the same
code; ``NCCL_NVLS_ENABLE=0`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` in every one).
Every rank runs every row (model x wrapper x configuration) in the same order:

1. ``torch._dynamo.reset()``, a fresh empty Inductor cache (FX graph and AOT autograd
   caches off), so compile time is cold; the model built from the seed (same initial
   parameters on every rank, as in a 1-process run), wrapped (``ddp``: DDP with
   DDPOptimizer, ``ddp-whole``: DDP with ``optimize_ddp`` off, ``fsdp2``: ``fully_shard`` on
   the whole model, ``fsdp2-blocks``: each block compiled and sharded, then the root), and
   compiled by the configuration (``eager``, ``inductor`` = ``torch.compile``,
   ``optimus`` = ``optimus.compile``'s backend);
2. the global batch is the zoo's batch; rank ``r`` trains on its ``1/N`` slice, so the
   gradient DDP/FSDP averages is the full batch's, as in a 1-process run;
3. ``--steps`` training steps (forward, BCE loss, backward, ``SGD.step``): the first is
   timed (compile time = first step minus the median step), the losses are averaged over
   the ranks and compared with a 1-process eager run of the same steps on the full batch
   (rank 0 runs it first), and the parameters after the steps are hashed on every rank
   (DDP: the hashes must agree) and compared with that run's;
4. kernels per step on rank 0 (CUDA: ``torch.profiler`` kernel events of one step; CPU:
   generated loop nests + extern calls of the compiled graphs, or computing aten ops for
   eager), the median step time over ``--iters`` steps after ``--warmup`` (CUDA events on
   GPU), examples/s (global batch / step), and the peak memory of one step on each rank.

A row that raises on every rank is recorded with its error and the next row runs; a rank
that fails alone, or a run past ``--timeout-minutes``, ends the launch (no hang).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..cli_json import add_json_arguments, json_targets
from ..models import MODELS, SIZES, ZooModel, get_model

CONFIGS = ("eager", "inductor", "optimus")
WRAPPERS = {
    "ddp": "DistributedDataParallel; DDPOptimizer splits the graph at bucket boundaries (optimize_ddp on)",
    "ddp-whole": "DistributedDataParallel with torch._dynamo.config.optimize_ddp off (one graph)",
    "fsdp2": "fully_shard on the whole model",
    "fsdp2-blocks": "each block compiled, then fully_shard on every block and on the root",
    "none": "no wrapper (one process only: the single-process baseline)",
}
DEFAULT_MODELS = ("dlrm", "dcnv2", "towers32")
DEFAULT_WRAPPERS = ("ddp",)
LOSS_TOLERANCE = {"cpu": 1e-4, "cuda": 2e-2}  # fp32 on CPU; TF32 matmuls on GPU


@dataclass
class RowSpec:
    """One row: a model under a wrapper and a configuration, and how to run it."""

    model: str
    wrapper: str
    config: str
    size: str = "small"
    seed: int = 0
    lr: float = 0.05
    steps: int = 3
    warmup: int = 5
    iters: int = 30
    time: bool = True
    kernels: bool = True
    cold: bool = True  # fresh Inductor cache per row (False: reuse compiled kernels; tests)
    passes: Any = "all"
    bucket_cap_mb: float | None = None  # DDP's bucket size (None: DDP's default, 25 MB)
    # DDPOptimizer sizes the first bucket by torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
    # (1 MiB) whatever bucket_cap_mb says, and asserts it is not above the cap: tiny
    # models set both to cut their few kilobytes of parameters into several buckets
    first_bucket_bytes: int | None = None
    find_unused_parameters: bool = False
    fullgraph: bool = False
    tf32: bool = True
    save_params: bool = False  # rank 0 writes the parameters after the steps (tests)
    # compare with a 1-process eager run (rank 0 runs it): off for a model whose forward
    # talks to other ranks itself (it would wait for them in a 1-process run)
    reference: bool = True
    timeout_s: float = 600.0

    @property
    def key(self) -> str:
        return f"{self.model}/{self.wrapper}/{self.config}"


# ------------------------------------------------------------------ models and data
def build(name: str, size: str, device: str | torch.device, seed: int) -> ZooModel:
    """A zoo model by name, or any ``"module:function"`` returning a ``ZooModel`` (called
    with ``size=, device=, seed=``)."""
    if ":" in name:
        module, fn = name.split(":", 1)
        return getattr(importlib.import_module(module), fn)(size=size, device=device, seed=seed)
    return get_model(name, size, device, seed)


def local_batch(zoo: ZooModel, rank: int, world: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Rank ``rank``'s slice of the global batch: inputs and targets."""
    b = zoo.batch_size
    if b % world:
        raise ValueError(f"{zoo.name}: the batch of {b} does not split evenly over {world} ranks")
    n = b // world
    sl = slice(rank * n, (rank + 1) * n)
    return tuple(t[sl] for t in zoo.inputs), zoo.targets[sl]


def blocks_of(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The model's blocks for per-block FSDP: its first direct ``ModuleList`` child whose
    members are not embedding tables."""
    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList) and len(child) and not isinstance(child[0], (nn.Embedding, nn.EmbeddingBag)):
            return name, child
    raise ValueError(f"{type(model).__name__} has no list of blocks for fsdp2-blocks")


def loss_fn(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(out.float(), targets)


def clean_name(name: str) -> str:
    """A parameter's name without what wrappers add (``module.``, ``_orig_mod.``)."""
    parts = [p for p in name.split(".") if p != "_orig_mod"]
    if parts and parts[0] == "module":
        parts = parts[1:]
    return ".".join(parts)


def full_parameters(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, whole (FSDP2's DTensor shards are gathered: a collective), on CPU."""
    out: dict[str, torch.Tensor] = {}
    for name, p in module.named_parameters():
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        out[clean_name(name)] = t.to("cpu", copy=True)
    return out


def digest(params: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def one_process_run(spec: RowSpec, device: str) -> dict[str, Any]:
    """The 1-process run: eager, no wrapper, the full batch, the same steps."""
    zoo = build(spec.model, spec.size, device, spec.seed)
    params = [p for p in zoo.model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=spec.lr)
    losses = []
    for _ in range(spec.steps):
        loss = loss_fn(zoo.model(*zoo.inputs), zoo.targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return {"losses": losses, "params": full_parameters(zoo.model)}


# ------------------------------------------------------------------ wrappers
@dataclass
class Prepared:
    module: nn.Module  # what holds the parameters (the optimizer's)
    fn: Callable[..., Any]  # what a step calls
    report: Any = None  # the Optimus report (optimus only)


def _compiler(spec: RowSpec) -> tuple[Callable[[nn.Module], Any], Any]:
    """(module -> compiled callable, Optimus report or None) for the configuration."""
    if spec.config == "eager":
        return (lambda m: m), None
    if spec.config == "inductor":
        return (lambda m: torch.compile(m, fullgraph=spec.fullgraph)), None
    if spec.config == "optimus":
        import optimus
        from optimus.compile import make_backend

        backend = make_backend(spec.passes)
        report = backend.session.report  # type: ignore[attr-defined]

        def compile_with_optimus(m: nn.Module) -> Any:
            optimus.distributed.check_wrapping(m)
            return torch.compile(m, backend=backend, fullgraph=spec.fullgraph)

        return compile_with_optimus, report
    raise ValueError(f"unknown configuration {spec.config!r}; choose from: {', '.join(CONFIGS)}")


def fully_shard_fn() -> Callable[..., Any]:
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard  # type: ignore[no-redef]
    return fully_shard


def prepare(model: nn.Module, spec: RowSpec, device: torch.device) -> Prepared:
    """Wrap and compile ``model`` as the row says (``torch._dynamo.config.optimize_ddp``
    is set here and must stay so until the first step has compiled)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    compile_, report = _compiler(spec)
    if spec.wrapper in ("ddp", "ddp-whole"):
        torch._dynamo.config.optimize_ddp = spec.wrapper == "ddp"
        kwargs: dict[str, Any] = {"find_unused_parameters": spec.find_unused_parameters}
        if spec.bucket_cap_mb is not None:
            kwargs["bucket_cap_mb"] = spec.bucket_cap_mb
        first = spec.first_bucket_bytes
        if first is None and spec.bucket_cap_mb is not None:
            # DDP makes its first bucket bucket_cap_mb too when that is given; DDPOptimizer
            # would still use 1 MiB (and assert it is not above the cap): align the two
            first = int(spec.bucket_cap_mb * 2**20)
        if first is not None:
            torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = first  # restored by _run_row
        if device.type == "cuda":
            kwargs["device_ids"] = [device.index]
        ddp = DDP(model, **kwargs)
        return Prepared(ddp, compile_(ddp), report)
    if spec.wrapper == "fsdp2":
        fully_shard_fn()(model)
        return Prepared(model, compile_(model), report)
    if spec.wrapper == "fsdp2-blocks":
        name, blocks = blocks_of(model)
        shard = fully_shard_fn()
        for i, block in enumerate(blocks):
            compiled = compile_(block)  # compile, then shard the compiled block (its hooks run outside)
            shard(compiled)
            blocks[i] = compiled
        shard(model)
        return Prepared(model, model, report)
    if spec.wrapper == "none":
        return Prepared(model, compile_(model), report)
    raise ValueError(f"unknown wrapper {spec.wrapper!r}; choose from: {', '.join(WRAPPERS)}")


@contextlib.contextmanager
def compile_caches(cold: bool) -> Iterator[None]:
    """Cold: a fresh, empty Inductor cache. Warm: keep compiled kernels, but the FX graph
    and AOT autograd caches off, so every graph is compiled (and rewritten) again."""
    if cold:
        from ..measure import fresh_inductor_cache

        with fresh_inductor_cache():
            yield
        return
    from torch._inductor import config as inductor_config

    fc = torch._functorch.config
    fc_patch = {"enable_autograd_cache": False} if hasattr(fc, "enable_autograd_cache") else {}
    with inductor_config.patch(fx_graph_cache=False), fc.patch(fc_patch):
        yield


def report_summary(report: Any) -> dict[str, Any] | None:
    """What the Optimus report says, in JSON: rewrites per rule, and per graph its level,
    name, rewrites, notes and whether it was discarded."""
    if report is None:
        return None
    totals = report.rule_totals()
    return {
        "rewrites": sum(s.matched for s in totals.values()),
        "rules": {name: s.matched for name, s in totals.items() if s.matched},
        "declined": {name: dict(s.declined) for name, s in totals.items() if s.declined},
        "graphs": [
            {"level": g.level, "graph": g.graph, "rewrites": g.matched, "notes": list(g.notes), "discarded": g.discarded}
            for g in report.graphs
        ],
        "notes": list(report.notes),
        "errors": report.errors()[:5],
    }


# ------------------------------------------------------------------ the worker
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_rows(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Every rank: run every row in ``payload["rows"]``; return what each measured."""
    import torch.distributed as dist

    from ... import distributed as odist

    specs = [RowSpec(**r) for r in payload["rows"]]
    device = torch.device(ctx.device)
    if device.type == "cuda":
        tf32 = all(s.tf32 for s in specs)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    odist.check_consistent(device=device.type, rows=[s.key for s in specs])
    from .harness import warm_compile_pool

    warm_compile_pool(ctx.device)  # Inductor's compile workers start before anything is timed (CUDA)
    rows = []
    refs: dict[tuple[Any, ...], dict[str, Any]] = {}
    for spec in specs:
        ref_key = (spec.model, spec.size, spec.seed, spec.lr, spec.steps)
        ref = None
        if spec.reference and ctx.rank == 0:
            if ref_key not in refs:
                refs[ref_key] = one_process_run(spec, ctx.device)
            ref = refs[ref_key]
        ctx.log(f"row {spec.key}")
        row = _run_row(ctx, spec, device, ref)
        # a row that failed on some ranks only: every rank knows (unless one is stuck)
        statuses: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(statuses, row["status"])
        row["all_ranks_ok"] = all(s == "ok" for s in statuses)
        rows.append(row)
        ctx.log(f"row {spec.key}: {row['status']} {row.get('error') or ''}")
    return {"rank": ctx.rank, "world_size": ctx.world_size, "device": ctx.device, "rows": rows}


def _run_row(ctx: Any, spec: RowSpec, device: torch.device, ref: dict[str, Any] | None) -> dict[str, Any]:
    import torch.distributed as dist

    from .. import measure

    row: dict[str, Any] = {"key": spec.key, "spec": asdict(spec), "status": "error", "error": None}
    torch._dynamo.reset()
    old_optimize_ddp = torch._dynamo.config.optimize_ddp
    old_first_bucket = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
    try:
        with compile_caches(spec.cold):
            zoo = build(spec.model, spec.size, device, spec.seed)
            inputs, targets = local_batch(zoo, ctx.rank, ctx.world_size)
            prep = prepare(zoo.model, spec, device)
            params = [p for p in prep.module.parameters() if p.requires_grad]
            opt = torch.optim.SGD(params, lr=spec.lr)

            def step() -> torch.Tensor:
                loss = loss_fn(prep.fn(*inputs), targets)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss.detach()

            count_code = spec.kernels and ctx.rank == 0 and device.type == "cpu" and spec.config != "eager"
            _sync(device)
            t0 = time.perf_counter()
            if count_code:
                first, generated = measure.compiled_kernel_count(step, device)
            else:
                first, generated = step(), None
            _sync(device)
            row["first_step_s"] = time.perf_counter() - t0
            local = [first] + [step() for _ in range(spec.steps - 1)]
            losses = torch.stack(local).float()
            row["local_losses"] = losses.tolist()
            dist.all_reduce(losses)  # the mean over ranks = the full batch's mean loss
            row["losses"] = (losses / ctx.world_size).tolist()
            full = full_parameters(prep.module)  # every rank (FSDP gathers)
            row["param_digest"] = digest(full)
            if ctx.rank == 0:
                row["reference"] = None if ref is None else {"losses": ref["losses"], "param_digest": digest(ref["params"])}
                if ref is not None:
                    row["param_max_rel_err"] = _max_rel_err(full, ref["params"])
                if spec.save_params:
                    path = os.path.join(ctx.workdir, f"params-{spec.key.replace('/', '-').replace(':', '-')}.pt")
                    torch.save(full, path)
                    row["params_file"] = path
            row["optimus"] = report_summary(prep.report)
            if spec.time:
                _measure(ctx, spec, device, step, generated, zoo.batch_size, row)
            row["status"] = "ok"
    except Exception as e:  # the same failure on every rank: record it, go on
        import traceback

        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:500]
        ctx.log(traceback.format_exc())
    finally:
        torch._dynamo.config.optimize_ddp = old_optimize_ddp
        torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = old_first_bucket
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
    return row


def _measure(ctx: Any, spec: RowSpec, device: torch.device, step: Callable[[], Any], generated: int | None,
             batch: int, row: dict[str, Any]) -> None:
    """Kernels (rank 0), median step time, examples/s and peak memory. Every rank runs the
    same steps (DDP/FSDP collectives pair up across ranks); only rank 0 profiles."""
    from .. import measure

    step()  # warm
    if ctx.rank == 0 and spec.kernels:
        if device.type == "cuda":
            row["kernels"] = measure.count_kernels(step, device)
            row["kernel_method"] = "cuda profiler kernel events per step (rank 0)"
        elif generated is not None:
            row["kernels"] = generated
            row["kernel_method"] = "cpu: generated loop nests + extern calls of the compiled graphs (rank 0)"
        else:
            row["kernels"] = measure.count_kernels(step, device)
            row["kernel_method"] = "cpu: computing aten ops per step (rank 0)"
    else:
        step()
    ms = measure.median_step_ms(step, device, warmup=spec.warmup, iters=spec.iters)
    row["step_ms"] = ms
    row["examples_per_s"] = batch / (ms / 1e3)
    row["compile_s"] = max(row["first_step_s"] - ms / 1e3, 0.0) if spec.config != "eager" else 0.0
    row["peak_memory_bytes"] = measure.peak_memory(step, device)
    row["memory_method"] = "torch.cuda.max_memory_allocated over one step" if device.type == "cuda" else "cpu: peak RSS over one step"


def _max_rel_err(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """Worst parameter error, relative to the largest magnitude of that parameter."""
    if set(got) != set(want):
        raise ValueError(f"parameters differ from the 1-process run's: {sorted(set(got) ^ set(want))[:5]}")
    worst = 0.0
    for name, w in want.items():
        g = got[name].float()
        scale = max(w.abs().max().item(), 1e-6) if w.numel() else 1.0
        worst = max(worst, (g - w.float()).abs().max().item() / scale if w.numel() else 0.0)
    return worst


# ------------------------------------------------------------------ the parent
def plan(models: Sequence[str], wrappers: Sequence[str], configs: Sequence[str], nproc: int, **spec: Any) -> list[RowSpec]:
    """Rows in run order (model, then wrapper, then configuration)."""
    if nproc < 1:
        raise ValueError("--nproc must be at least 1")
    for w in wrappers:
        if w not in WRAPPERS:
            raise ValueError(f"unknown wrapper {w!r}; choose from: {', '.join(WRAPPERS)}")
        if w == "none" and nproc > 1:
            raise ValueError("wrapper 'none' trains each rank on its own: use it with --nproc 1 only")
    for c in configs:
        if c not in CONFIGS:
            raise ValueError(f"unknown configuration {c!r}; choose from: {', '.join(CONFIGS)}")
    for m in models:
        if m not in MODELS and ":" not in m:
            raise ValueError(f"unknown model {m!r}; choose from: {', '.join(MODELS)} (or module:function)")
    return [RowSpec(model=m, wrapper=w, config=c, **spec) for m in models for w in wrappers for c in configs]


def run(rows: list[RowSpec], nproc: int, device: str, timeout_s: float, workdir: str | None = None) -> list[dict[str, Any]]:
    """Launch ``nproc`` ranks that run ``rows``; return one merged result per row."""
    from ... import distributed as odist

    workdir = workdir or tempfile.mkdtemp(prefix="optimus-dist-")
    payload = {"rows": [asdict(r) for r in rows]}
    ranks = odist.launch(run_rows, payload, nproc, workdir, timeout_s, device=device)
    return merge(ranks)


def merge(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per spec from every rank's results: rank 0's figures, the slowest rank's
    step, every rank's peak memory, whether the ranks' parameters agree, and the loss
    agreement with the 1-process run."""
    merged = []
    for i, r0 in enumerate(ranks[0]["rows"]):
        per_rank = [r["rows"][i] for r in ranks]
        row = dict(r0)
        row["world_size"] = len(ranks)
        row["device"] = ranks[0]["device"]
        if any(r["status"] != "ok" for r in per_rank):
            row["status"] = "error"
            row["error"] = next((f"rank {k}: {r['error']}" for k, r in enumerate(per_rank) if r["error"]), "failed on another rank")
        steps = [r.get("step_ms") for r in per_rank]
        if all(s is not None for s in steps):
            row["step_ms"] = max(steps)  # the slowest rank bounds the step
            row["step_ms_per_rank"] = steps
            row["examples_per_s"] = r0["examples_per_s"] * r0["step_ms"] / max(steps)
        row["peak_memory_bytes_per_rank"] = [r.get("peak_memory_bytes") for r in per_rank]
        row["rewrites_per_rank"] = [(r.get("optimus") or {}).get("rewrites") for r in per_rank]
        digests = [r.get("param_digest") for r in per_rank]
        if all(digests):
            row["ranks_agree"] = len(set(digests)) == 1
        ref = r0.get("reference")
        if ref and r0.get("losses"):
            want, got = ref["losses"], r0["losses"]
            row["loss_max_rel_err"] = max(abs(g - w) / max(abs(w), 1e-12) for g, w in zip(got, want))
        merged.append(row)
    return merged


def agreement_ok(row: dict[str, Any]) -> bool:
    tol = LOSS_TOLERANCE["cuda" if str(row.get("device", "")).startswith("cuda") else "cpu"]
    err = row.get("loss_max_rel_err")
    return err is not None and err <= tol


def table(rows: list[dict[str, Any]]) -> str:
    from ...core.table import format_bytes, format_table

    head = ["model", "wrapper", "config", "status", "step ms", "examples/s", "kernels", "compile s",
            "peak memory (max rank)", "loss rel err", "ranks agree", "rewrites", "graphs"]
    cells = []
    for r in rows:
        spec = r["spec"]
        peak = [p for p in r.get("peak_memory_bytes_per_rank") or [] if p is not None]
        opt = r.get("optimus") or {}
        n_graphs = len({g["graph"] for g in opt.get("graphs", []) if g["level"] == "torch_ir"}) if opt else None
        cells.append([
            spec["model"], spec["wrapper"], spec["config"],
            "ok" if r["status"] == "ok" else f"error: {r.get('error')}"[:60],
            _fmt(r.get("step_ms"), ".3f"), _fmt(r.get("examples_per_s"), ",.0f"), _fmt(r.get("kernels"), "d"),
            _fmt(r.get("compile_s"), ".1f"), format_bytes(max(peak)) if peak else "",
            _fmt(r.get("loss_max_rel_err"), ".1e"), {True: "yes", False: "NO", None: ""}[r.get("ranks_agree")],
            _fmt(opt.get("rewrites") if opt else None, "d"), _fmt(n_graphs, "d"),
        ])
    return format_table(head, cells, numeric=[False] * 4 + [True] * 6 + [False, True, True])


def _fmt(v: Any, spec: str) -> str:
    return "" if v is None else format(v, spec)


# ------------------------------------------------------------------ command line
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m optimus.tools.bench.distributed", description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, required=True, help="processes (one GPU each on cuda)")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if available, else cpu")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"zoo models, comma list (default {','.join(DEFAULT_MODELS)}; all: {','.join(MODELS)})")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    p.add_argument("--wrappers", default=",".join(DEFAULT_WRAPPERS), help=f"comma list of {', '.join(WRAPPERS)}")
    p.add_argument("--size", choices=list(SIZES), default=None, help="default: realistic on cuda, small on cpu")
    p.add_argument("--steps", type=int, default=3, help="training steps compared with the 1-process run (default 3)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP bucket size (default: DDP's 25 MB)")
    p.add_argument("--no-tf32", dest="tf32", action="store_false", help="CUDA: TF32 matmuls off")
    p.add_argument("--warm-cache", dest="cold", action="store_false", help="reuse compiled kernels (not cold compile times)")
    p.add_argument("--timeout-minutes", type=float, default=30.0, help="terminate every rank after this long (default 30)")
    add_json_arguments(p, "the rows (and the command, versions, device)", file_form=True)
    p.add_argument("--plan", action="store_true", help="print the rows that would run, and exit")
    return p


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def rows_from_args(args: argparse.Namespace) -> tuple[list[RowSpec], str]:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and torch.cuda.device_count() < args.nproc:
        raise ValueError(f"--nproc {args.nproc} needs {args.nproc} GPUs; {torch.cuda.device_count()} visible")
    size = args.size or ("realistic" if device == "cuda" else "small")
    models = list(MODELS) if args.models == "all" else _split(args.models)
    rows = plan(models, _split(args.wrappers), _split(args.configs), args.nproc, size=size, seed=args.seed, lr=args.lr,
                steps=args.steps, warmup=args.warmup, iters=args.iters, cold=args.cold, tf32=args.tf32,
                bucket_cap_mb=args.bucket_cap_mb, timeout_s=args.timeout_minutes * 60)
    return rows, device


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        rows, device = rows_from_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.plan:
        for r in rows:
            print(f"{r.key}  size={r.size} steps={r.steps} warmup={r.warmup} iters={r.iters} on {args.nproc} x {device}")
        return 0
    from ... import distributed as odist

    started = time.time()
    try:
        results = run(rows, args.nproc, device, args.timeout_minutes * 60)
    except odist.LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    as_json, json_path = json_targets(args)
    print(table(results), file=sys.stderr if as_json else sys.stdout)
    if as_json or json_path:
        from .harness import environment

        doc = {"command": "python -m optimus.tools.bench.distributed " + " ".join(sys.argv[1:] if argv is None else argv),
               "nproc": args.nproc, "env": environment(device), "wall_s": time.time() - started, "rows": results}
        if as_json:
            print(json.dumps(doc, indent=1, default=str))
        if json_path:
            with open(json_path + ".tmp", "w") as f:
                json.dump(doc, f, indent=1, default=str)
            os.replace(json_path + ".tmp", json_path)
    bad = [r for r in results if r["status"] != "ok" or not agreement_ok(r) or r.get("ranks_agree") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
