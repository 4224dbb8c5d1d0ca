"""Integration with ``torch.compile`` and Inductor.

``optimus.compile(model, passes)`` is ``torch.compile`` with the ``optimus`` backend: a
Dynamo backend that calls Inductor's ``compile_fx`` with Optimus's passes installed in
Inductor's own hooks:

* Torch-IR rules  -> ``pre_grad_custom_pass``      (Dynamo's pre-grad FX graph)
* Aten-IR rules   -> ``post_grad_custom_pre_pass`` (each forward/backward graph, before
  Inductor's own post-grad pattern matching)
* Inductor-IR     -> the scheduler's pre/post-fusion hooks (``optimus.inductor_ir``)

Every hook is a ``CustomGraphPass`` whose ``uuid()`` hashes the selected rules' code,
options and the Optimus sources, so Inductor's FX graph cache is used (not bypassed) and
never returns an artifact compiled with other passes. The post-grad pass is installed
whenever any level is enabled: its uuid covers all levels, which keeps the key correct
on torch versions whose key ignores some hooks (2.11 ignores the post-fusion hook).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import logging
import pathlib
from typing import Any, Callable

import torch
import torch.fx as fx

from .core.driver import optimize_graph
from .core.passkey import UuidKeyed
from .core.registry import PassConfig, resolve
from .core.report import Report

log = logging.getLogger("optimus")

try:  # both torch 2.11 and 2.13 have it; keep the import guarded all the same
    from torch._inductor.custom_graph_pass import CustomGraphPass
except ImportError:  # pragma: no cover
    CustomGraphPass = object  # type: ignore[misc,assignment]


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """Hash of Optimus's own sources and the torch version (part of every cache key)."""
    h = hashlib.sha256(torch.__version__.encode())
    root = pathlib.Path(__file__).parent
    for path in sorted(root.rglob("*.py")):
        if "models" in path.parts or "bench" in path.parts:
            continue
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


SCHEDULER_HOOKS = ("_pre_fusion_custom_pass", "_post_fusion_custom_pass")


class Session:
    """One ``optimus.compile`` call: its resolved passes and the report they fill."""

    def __init__(self, config: PassConfig) -> None:
        self.config = config
        self.report = Report(config.spec or "custom")
        self._names: collections.Counter[str] = collections.Counter()

    def fingerprint(self) -> str:
        return f"optimus-{source_fingerprint()}-{self.config.fingerprint()}"

    def graph_name(self, level: str, graph: fx.Graph) -> str:
        if level == "aten_ir":
            names = [n.name for n in graph.nodes if n.op == "placeholder"]
            kind = "backward" if any(n.startswith("tangents") for n in names) else (
                "forward" if any(n.startswith("primals") for n in names) else "inference"
            )
        else:
            kind = "graph"
        idx = self._names[f"{level}:{kind}"]
        self._names[f"{level}:{kind}"] += 1
        return f"{kind} {idx}"

    def run_level(self, level: str, graph: fx.Graph) -> None:
        gm = graph.owning_module
        if gm is None:
            log.warning("optimus: %s graph without an owning module; skipped", level)
            self.report.notes.append(f"{level}: graph without an owning module skipped")
            return
        try:
            optimize_graph(gm, level, self.config, self.report, self.graph_name(level, graph))
        except Exception as e:  # never break the compile
            log.warning("optimus: %s pass failed and was skipped: %s", level, e)
            self.report.notes.append(f"{level}: pass failed and was skipped ({type(e).__name__}: {e})")

    def inductor_patches(self) -> dict[str, Any]:
        patches: dict[str, Any] = {}
        if not any(self.config.enabled(lv) for lv in ("torch_ir", "aten_ir", "inductor_ir")):
            return patches
        if self.config.enabled("torch_ir"):
            patches["pre_grad_custom_pass"] = LevelPass(self, "torch_ir")
        patches["post_grad_custom_pre_pass"] = LevelPass(self, "aten_ir")
        if self.config.enabled("inductor_ir"):
            from .inductor_ir import scheduler_patches

            patches.update(scheduler_patches(self))
        return patches

    def compile(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        from torch._dynamo.utils import counters
        from torch._inductor.compile_fx import compile_fx

        before = _cache_hits(counters)
        patches = self.inductor_patches()
        try:
            compiled = compile_fx(gm, example_inputs, config_patches=patches)
        except Exception as e:
            # The Inductor-IR passes change which kernels Inductor generates; if generating
            # or compiling them fails, compile again without them (the other levels' rewrites
            # are checked and rolled back in place, so they cannot fail here).
            hooks = [k for k in patches if k in SCHEDULER_HOOKS]
            if not hooks:
                raise
            note = (f"inductor_ir: compilation failed with the Inductor-IR passes ({type(e).__name__}: "
                    f"{str(e)[:200]}); compiled again without them")
            log.warning("optimus: %s", note)
            self.report.notes.append(note)
            patches = {k: v for k, v in patches.items() if k not in SCHEDULER_HOOKS}
            compiled = compile_fx(gm, example_inputs, config_patches=patches)
        hits = _cache_hits(counters) - before
        if hits:
            self.report.notes.append(
                f"{sum(hits.values())} graph(s) loaded from the compile cache ({dict(hits)}); "
                "Optimus passes ran when they were first compiled and are not re-reported"
            )
        return compiled


class LevelPass(UuidKeyed, CustomGraphPass):  # type: ignore[misc]
    """An Inductor custom graph pass running one level's rules.

    Pickled as its uuid (``core.passkey``): torch 2.11 pickles ``pre_grad_custom_pass``
    into the FX graph cache key instead of asking its uuid.
    """

    def __init__(self, session: Session, level: str) -> None:
        self.session = session
        self.level = level

    def __call__(self, graph: fx.Graph) -> None:
        if self.session.config.enabled(self.level):
            self.session.run_level(self.level, graph)

    def uuid(self) -> str:
        return f"{self.level}:{self.session.fingerprint()}"


def _cache_hits(counters: Any) -> collections.Counter[str]:
    c: collections.Counter[str] = collections.Counter()
    c["fx_graph_cache"] = counters["inductor"].get("fxgraph_cache_hit", 0)
    c["aot_autograd_cache"] = counters["aot_autograd"].get("autograd_cache_hit", 0)
    return +c


def make_backend(passes: Any = "all") -> Callable[[fx.GraphModule, list[Any]], Callable[..., Any]]:
    """A Dynamo backend running Inductor with the given Optimus passes."""
    session = Session(resolve(passes))

    def optimus_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        return session.compile(gm, example_inputs)

    optimus_backend.session = session  # type: ignore[attr-defined]
    return optimus_backend


_LAST: list[Report] = []


_DEFAULT_SESSION: list[Session] = []


def optimus_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """``torch.compile(model, backend="optimus")``: Inductor with the default passes.

    Graphs compiled through the registered backend share one session; its report
    (``optimus.last_report()``) accumulates every graph compiled this way.
    """
    if not _DEFAULT_SESSION:
        _DEFAULT_SESSION.append(Session(resolve("all")))
    session = _DEFAULT_SESSION[0]
    _remember(session.report)
    return session.compile(gm, example_inputs)


def _remember(report: Report) -> None:
    _LAST[:] = [report]


def last_report() -> Report | None:
    """The report of the most recent ``optimus.compile``/``optimize``/backend compile."""
    return _LAST[0] if _LAST else None


def compile(model: Any, passes: Any = "all", **torch_compile_kwargs: Any) -> Any:
    """``torch.compile(model, **kwargs)`` with Optimus's passes; returns the compiled model.

    The returned object carries ``optimus_report`` (filled as graphs compile, on the
    first calls).
    """
    if "backend" in torch_compile_kwargs:
        raise TypeError("optimus.compile chooses the backend itself; use torch.compile for another backend")
    backend = make_backend(passes)
    report = backend.session.report  # type: ignore[attr-defined]
    _remember(report)
    compiled = torch.compile(model, backend=backend, **torch_compile_kwargs)
    try:
        compiled.optimus_report = report
    except AttributeError:  # pragma: no cover - objects that refuse attributes
        pass
    return compiled


def optimize(
    gm: fx.GraphModule,
    passes: Any = "all",
    level: str = "torch_ir",
    example_inputs: list[Any] | tuple[Any, ...] | None = None,
    inplace: bool = True,
) -> fx.GraphModule:
    """Rewrite a bare ``fx.GraphModule`` with one level's rules and return it.

    Works on ``torch.fx.symbolic_trace`` graphs (``level="torch_ir"``), ``make_fx`` and
    ``torch.export`` graphs (``level="aten_ir"``). Rules that need shapes use the
    graph's ``example_value``/``val`` metadata; without it, pass ``example_inputs`` and
    shapes are propagated with fake tensors first. The report is available from
    ``optimus.last_report()`` and ``gm.meta["optimus_report"]``.
    """
    from .core.driver import make_view

    if level not in ("torch_ir", "aten_ir"):
        raise ValueError(f"optimize() rewrites FX graphs at 'torch_ir' or 'aten_ir', not {level!r}")
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"optimize() takes a torch.fx.GraphModule, got {type(gm).__name__}")
    config = resolve(passes)
    if not inplace:
        import copy

        gm = copy.deepcopy(gm)
    if example_inputs is not None:
        _propagate_fake_meta(gm, list(example_inputs))
    view = make_view(level, gm)
    report = Report(config.spec)
    _remember(report)
    optimize_graph(gm, level, config, report, "graph 0", view=view, example_inputs=list(example_inputs) if example_inputs else None)
    gm.recompile()
    gm.meta["optimus_report"] = report
    return gm


def _propagate_fake_meta(gm: fx.GraphModule, example_inputs: list[Any]) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in example_inputs]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)


def explain(model: Any, *example_inputs: Any, passes: Any = "all", print_report: bool = True, **torch_compile_kwargs: Any) -> Report:
    """Compile ``model`` with Optimus (caches off, so every pass runs), run it once on
    ``example_inputs``, print the report table and return the ``Report``."""
    from torch._inductor import config as inductor_config

    compiled = compile(model, passes=passes, **torch_compile_kwargs)
    fc = torch._functorch.config
    fc_patch = {"enable_autograd_cache": False} if hasattr(fc, "enable_autograd_cache") else {}
    with inductor_config.patch(fx_graph_cache=False), fc.patch(fc_patch):
        compiled(*example_inputs)
    report: Report = compiled.optimus_report
    if print_report:
        print(report.table())
    return report
