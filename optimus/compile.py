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
import dataclasses
import functools
import hashlib
import importlib.util
import logging
import os
import pathlib
from typing import Any, Callable

import torch
import torch.fx as fx

from . import distributed, planner, safety_net, torch_api
from .aten_ir.view import graph_kind
from .core.runner import optimize_graph
from .core.snapshot import restore, snapshot
from .core.passkey import UuidKeyed
from .core.registry import REGISTRY, PassConfig, resolve
from .core import upstream_names
from .core.report import Report

log = logging.getLogger("optimus")

CustomGraphPass = torch_api.CustomGraphPass or object

# The backend's own keys in ``options`` (everything else there is an Inductor option).
PASSES_OPTION = "optimus_passes"
TUNE_OPTION = "optimus_tune"
# The default is the planner: it prices each rewrite and bounds its memory, so it does not
# spend memory for speed the way the fixed presets may ("all" peaks at 5.9x Inductor's on
# interformer inference), and on the H200 it keeps Inductor's speed or better on all but one
# of the zoo's medians (docs/planner.md, "Against the targets", which also lists what it
# misses). The fixed presets stay available by name.
DEFAULT_PASSES = "auto"
# Under CUDA graphs (mode="reduce-overhead") the rules whose replacement has not run under
# graph capture (the rule trait ``cudagraph_safe=False``) are left out, unless this variable
# is "1" (to try them there); rules with ``cudagraph_options`` take those options there.
CUDAGRAPH_KERNELS_ENV = "OPTIMUS_CUDAGRAPH_KERNELS"


# What decides the code a compile produces: every module of the package outside this one
# folder, and the kernels the rules may emit (the whole kernels package). The folder holds
# the tools (the command line, the demo, the fuzzer, the bench and the kernel benchmarks,
# the model zoo, the measurement helpers); changing them keeps every compile-cache entry
# valid. A module added anywhere else in the package is hashed from the moment it exists.
TOOLS_FOLDER = "tools"


def compiled_source_files(package: pathlib.Path | None = None,
                          kernels: list[pathlib.Path] | None = None) -> list[tuple[str, pathlib.Path]]:
    """(name in the key, path) of every source file the compile-cache key hashes, sorted:
    each ``.py`` under ``package`` (default: this package's folder) but those under its
    tools folder, and each ``.py`` of ``kernels`` (default: the folders of the installed
    ``optimus.kernels``, which in a checkout is the top-level ``kernels/``), named
    ``kernels/...``."""
    root = pathlib.Path(__file__).parent if package is None else package
    found: list[tuple[str, pathlib.Path]] = []
    for f in root.rglob("*.py"):
        name = f.relative_to(root).as_posix()
        # an installed kernels package sits inside the package: it is hashed below, once
        if name.split("/", 1)[0] not in (TOOLS_FOLDER, "kernels"):
            found.append((name, f))
    if kernels is None:
        spec = importlib.util.find_spec("optimus.kernels")
        kernels = [pathlib.Path(p) for p in (spec.submodule_search_locations or [])] if spec is not None else []
    for folder in kernels:
        found += [(f"kernels/{f.relative_to(folder).as_posix()}", f) for f in folder.rglob("*.py")]
    return sorted(found)


def hash_sources(files: list[tuple[str, pathlib.Path]]) -> str:
    """Hash of the torch version and of ``files``' names and contents (in the order given)."""
    h = hashlib.sha256(torch.__version__.encode())
    for name, path in files:
        h.update(name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """Hash of the sources that decide compiled code and the torch version (part of every
    cache key)."""
    return hash_sources(compiled_source_files())


SCHEDULER_HOOKS = torch_api.SCHEDULER_HOOKS
_INNER_HOOKS = ("post_grad_custom_pre_pass",) + torch_api.SCHEDULER_HOOKS
_FX_LEVELS = ("torch_ir", "aten_ir")


class Session:
    """One ``optimus.compile`` call: its resolved passes and the report they fill."""

    def __init__(self, config: PassConfig, tune: bool = False) -> None:
        self.config = config
        self.base_config = config  # passes="auto": each compile attaches its own planner
        self.tune = tune
        self.report = Report(config.spec or "custom")
        self._names: collections.Counter[str] = collections.Counter()
        for note in config.notes:  # e.g. upstream pass names translated to ours
            self.report.note_once(note)

    def fingerprint(self) -> str:
        return f"optimus-{source_fingerprint()}-{self.config.fingerprint()}"

    def levels(self) -> tuple[str, ...]:
        return tuple(lv for lv in ("torch_ir", "aten_ir", "inductor_ir") if self.config.enabled(lv))

    def next_graph_name(self, kind: str) -> str:
        idx = self._names[f"graph:{kind}"]
        self._names[f"graph:{kind}"] += 1
        return f"{kind} {idx}"

    def current_graph(self) -> str | None:
        """The name of the graph Inductor is compiling now, if the per-graph compile named it."""
        return safety_net.GRAPH_KIND.get()

    def graph_name(self, level: str, graph: fx.Graph) -> str:
        current = self.current_graph()
        if current is not None and level != "torch_ir":
            return current  # named by the per-graph ladder: the same at every level
        if level == "aten_ir":
            from .aten_ir.view import graph_kind

            kind = graph_kind(graph)
        else:
            kind = "graph"
        idx = self._names[f"{level}:{kind}"]
        self._names[f"{level}:{kind}"] += 1
        return f"{kind} {idx}"

    def note_once(self, note: str) -> None:
        self.report.note_once(note)

    def run_level(self, level: str, graph: fx.Graph) -> None:
        gm = graph.owning_module
        if gm is None:
            log.warning("optimus: %s graph without an owning module; skipped", level)
            self.report.notes.append(f"{level}: graph without an owning module skipped")
            return
        try:
            gr = optimize_graph(gm, level, self.config, self.report, self.graph_name(level, graph))
            note = distributed.collective_note(gm) if gr is not None else None
            if note:
                gr.notes.append(note)  # type: ignore[union-attr]
            if gr is not None and level == "aten_ir" and graph_kind(graph) == "backward":
                adopted = torch_api.adopt_gradient_layouts(graph)
                if adopted:
                    gr.notes.append(f"{len(adopted)} gradient(s) returned row-major as computed, not copied back to the traced strides "
                                    f"(AccumulateGrad takes them as they are): {', '.join(adopted[:4])}{' ...' if len(adopted) > 4 else ''}")
        except Exception as e:  # never break the compile
            if safety_net.passthrough(e):
                raise
            log.warning("optimus: %s pass failed and was skipped: %s", level, e)
            self.report.notes.append(f"{level}: pass failed and was skipped ({type(e).__name__}: {e})")

    # ------------------------------------------------------------ hooks
    def optimus_hooks(self, levels: tuple[str, ...]) -> dict[str, Any]:
        """Optimus's own pass per Inductor hook, for the given levels.

        The post-grad pass is installed whenever any level is: its uuid covers every
        level, which keeps the cache key right on torch versions whose key leaves a hook
        out (2.11 ignores the post-fusion hook)."""
        levels = tuple(lv for lv in levels if self.config.enabled(lv))
        if not levels:
            return {}
        hooks: dict[str, Any] = {}
        if "torch_ir" in levels:
            hooks["pre_grad_custom_pass"] = LevelPass(self, "torch_ir", levels)
        hooks["post_grad_custom_pre_pass"] = LevelPass(self, "aten_ir", levels)
        if "inductor_ir" in levels:
            from .inductor_ir import scheduler_patches

            hooks.update(scheduler_patches(self))
        return hooks

    def inductor_patches(self, levels: tuple[str, ...] | None = None, user: dict[str, Any] | None = None) -> dict[str, Any]:
        """Inductor config patches installing the passes of ``levels`` (default: every
        enabled level), chained after the user's own passes in the same hooks."""
        ours = self.optimus_hooks(self.levels() if levels is None else levels)
        return safety_net.hook_patches(user or {}, ours)

    def _attempts(self, user: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The per-graph ladder: every level, then without Inductor-IR, then without any."""
        plans: list[tuple[str, tuple[str, ...]]] = [("with every Optimus level", self.levels())]
        if "inductor_ir" in self.levels() and any(lv in self.levels() for lv in _FX_LEVELS):
            plans.append(("without the Inductor-IR passes", tuple(lv for lv in self.levels() if lv != "inductor_ir")))
        plans.append(("without any Optimus pass", ()))
        attempts = []
        for label, levels in plans:
            patches = self.inductor_patches(levels, user)
            attempts.append((label, {h: patches.get(h, user.get(h)) for h in _INNER_HOOKS}))
        return attempts

    def _note_user_setup(self, user: dict[str, Any]) -> None:
        for hook, value in user.items():
            names = ", ".join(safety_net._name(p) for p in torch_api.as_pass_list(value))
            self.note_once(f"your {hook} ({names}) runs, followed by Optimus's passes in the same hook")
        for note in upstream_names.user_fusion_notes():
            self.note_once(note)

    # ------------------------------------------------------------ compile
    def compile(self, gm: fx.GraphModule, example_inputs: list[Any], inductor_options: dict[str, Any] | None = None) -> Callable[..., Any]:
        """Compile one Dynamo graph with Inductor and Optimus's passes, guarded so that
        no failure of ours breaks it (see ``optimus.safety_net``)."""
        options = dict(inductor_options or {})
        user = torch_api.user_hooks(options)
        self._note_user_setup(user)
        plain = {**options, **safety_net.hook_patches(user, {})}
        self.config = self.base_config
        if self.base_config.planned:  # passes="auto": the planner's choice for this graph
            self.config = planner.plan_compile(self.base_config, gm, example_inputs, options, self.tune, self.report,
                                               _compile_plan, self.next_graph_name, source_fingerprint)
        self.config = self._without_capture_unsafe_rules(self.config, options)
        return self._compile(gm, example_inputs, options, user, plain)

    def _without_capture_unsafe_rules(self, config: PassConfig, options: dict[str, Any]) -> PassConfig:
        """Under CUDA graphs, the rules not safe under graph capture (``cudagraph_safe=False``)
        are left out (said once), unless ``OPTIMUS_CUDAGRAPH_KERNELS=1`` keeps them (an
        experiment; said too); the selected rules take their ``cudagraph_options``."""
        if not options.get("triton.cudagraphs"):
            return config
        unsafe = [r.name for r in REGISTRY.rules() if not r.cudagraph_safe]
        if os.environ.get(CUDAGRAPH_KERNELS_ENV) == "1":
            self.note_once(f"CUDA graphs: {CUDAGRAPH_KERNELS_ENV}=1 keeps {', '.join(unsafe)} on (experimental: its op has not run under capture yet)")
            return config
        rules = {lv: tuple(r for r in names if r not in unsafe) for lv, names in config.rules.items()}
        dropped = sorted({r for names in config.rules.values() for r in names} & set(unsafe))
        options = dict(config.options)
        for level, names in rules.items():
            for name in names:
                off = REGISTRY.get(name).cudagraph_options.get(level) if name in REGISTRY else None
                if off:
                    options[(level, name)] = {**options.get((level, name), {}), **off}
        if dropped:
            self.note_once(f"CUDA graphs: {', '.join(dropped)} off (its Triton op has not run under graph capture yet; {CUDAGRAPH_KERNELS_ENV}=1 keeps it on)")
        return dataclasses.replace(config, rules=rules, options=options)

    def _compile(self, gm: fx.GraphModule, example_inputs: list[Any], options: dict[str, Any], user: dict[str, Any], plain: dict[str, Any]) -> Callable[..., Any]:
        if not self.levels():
            return torch_api.compile_fx(gm, example_inputs, None, plain)
        eager = safety_net.eager_outputs(gm)  # before any rewrite
        record = snapshot(gm.graph)
        before = torch_api.cache_hit_counts()
        ladder: Any = safety_net.GraphLadder(self._attempts(user), self.report, self.next_graph_name)
        mark = len(self.report.graphs)
        piece = distributed.piece_of(gm)  # a DDP bucket, a graph between FSDP hooks, ...
        if piece is not None:
            ladder = distributed.PieceNotes(ladder, self.report, piece.note())
        try:
            compiled = torch_api.compile_fx(gm, example_inputs, ladder, {**options, **self.inductor_patches(None, user)})
            if piece is not None:
                distributed.add_note(self.report.graphs[mark:], piece.note())  # the Torch-IR graph
        except Exception as e:
            if safety_net.passthrough(e):
                # Dynamo's control flow, not a failure: it compiles the graph again
                for g in self.report.graphs[mark:]:
                    g.discarded = f"Dynamo restarted this compile ({type(e).__name__}); the graph is rewritten again when it is compiled again"
                raise
            if safety_net.user_error(e):
                raise
            restore(gm.graph, record)
            gm.recompile()
            safety_net.discard(self.report, self.report.graphs[mark:], f"compiling a graph with Optimus failed ({safety_net.brief(e)}); compiled again without any Optimus pass")
            compiled = torch_api.compile_fx(gm, example_inputs, None, plain)
        else:
            self._note_cache_hits(before)
        mine = self.report.graphs[mark:]  # the graphs of this compile (a backward may follow)
        graph = ", ".join(dict.fromkeys(f"{g.level} {g.graph}" for g in mine)) or "a graph"

        def recompile() -> Callable[..., Any]:
            restore(gm.graph, record)
            gm.recompile()
            return torch_api.compile_fx(gm, example_inputs, None, plain)

        def discard(why: str) -> None:
            safety_net.discard(self.report, mine, f"{graph}: {why}")

        return safety_net.OutputGuard(compiled, recompile, eager, self.report.notes.append, not safety_net.mutates_inputs(gm), discard)

    def _note_cache_hits(self, before: dict[str, int]) -> None:
        after = torch_api.cache_hit_counts()
        hits = {k: after[k] - before[k] for k in after if after[k] - before[k] > 0}
        if hits:
            self.report.notes.append(
                f"{sum(hits.values())} graph(s) loaded from the compile cache ({hits}); "
                "Optimus passes ran when they were first compiled and are not re-reported"
            )


class LevelPass(UuidKeyed, CustomGraphPass):  # type: ignore[misc]
    """An Inductor custom graph pass running one level's rules.

    ``levels`` are the levels active in this compile attempt (the safety net retries a
    graph with fewer); the uuid names them. Pickled as its uuid (``core.passkey``):
    torch 2.11 pickles ``pre_grad_custom_pass`` into the FX graph cache key instead of
    asking its uuid.
    """

    def __init__(self, session: Session, level: str, levels: tuple[str, ...] | None = None) -> None:
        self.session = session
        self.level = level
        self.levels = tuple(levels) if levels is not None else session.levels()

    def __call__(self, graph: fx.Graph) -> None:
        if self.level in self.levels and self.session.config.enabled(self.level):
            self.session.run_level(self.level, graph)

    def uuid(self) -> str:
        return f"{self.level}:{'+'.join(self.levels)}:{self.session.fingerprint()}"


def _compile_plan(config: PassConfig, gm: fx.GraphModule, example_inputs: list[Any], inductor_options: dict[str, Any]) -> Callable[..., Any]:
    """``gm`` compiled under ``config``, in a session of its own, untuned (a trial of the
    planner's ``tune=True``)."""
    return Session(config).compile(gm, example_inputs, inductor_options)


def _split_options(options: dict[str, Any] | None) -> tuple[Any, bool, dict[str, Any] | None]:
    """``options`` of ``torch.compile(backend="optimus")``: Optimus's own keys out
    (passes, tune), the Inductor options left."""
    if not options:
        return None, False, options
    rest = dict(options)
    passes = rest.pop(PASSES_OPTION, None)
    tune = rest.pop(TUNE_OPTION, False)
    if not isinstance(tune, bool):
        raise TypeError(f"options[{TUNE_OPTION!r}] must be a bool, got {type(tune).__name__}")
    return passes, tune, (rest or None)


def make_backend(passes: Any = DEFAULT_PASSES, mode: str | None = None, options: dict[str, Any] | None = None, dynamic: bool | None = None, tune: bool = False) -> Callable[..., Callable[..., Any]]:
    """A Dynamo backend running Inductor with the given Optimus passes.

    ``mode`` and ``options`` are ``torch.compile``'s (validated now, the way
    ``torch.compile`` validates them); the backend also accepts them per call, as
    ``torch.compile(..., backend=this_backend, mode=...)`` passes them. ``tune``: with
    ``passes="auto"``, measure the candidate plans per graph (``mode="max-autotune"``
    implies it)."""
    config = resolve(passes)
    if tune and not config.planned:
        raise ValueError(f"tune=True measures the planner's candidate plans: use it with passes='auto' (got passes={config.spec!r})")
    session = Session(config, tune=tune)
    base = torch_api.mode_options(mode, options, dynamic)

    def optimus_backend(gm: fx.GraphModule, example_inputs: list[Any], mode: str | None = None, options: dict[str, Any] | None = None) -> Callable[..., Any]:
        _, _, options = _split_options(options)
        extra = torch_api.mode_options(mode, options, dynamic)
        _remember(session.report)
        return session.compile(gm, example_inputs, {**base, **extra})

    optimus_backend.session = session  # type: ignore[attr-defined]
    optimus_backend.report = session.report  # type: ignore[attr-defined]  # this backend's graphs only
    return optimus_backend


_LAST: list[Report] = []


_SESSIONS: dict[str, Session] = {}


def optimus_backend(gm: fx.GraphModule, example_inputs: list[Any], mode: str | None = None, options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """``torch.compile(model, backend="optimus", mode=..., options=...)``.

    ``options`` holds Inductor options, plus ``"optimus_passes"`` to choose Optimus's
    passes (default ``"auto"``: the planner chooses; or a preset such as ``"all"``) and ``"optimus_tune"``
    (with ``"auto"``: measure the candidate plans per graph). Graphs compiled through the registered backend with the
    same passes share one session; its report (``optimus.last_report()``) accumulates
    every graph compiled this way. The object ``torch.compile`` returns carries no report
    (a backend never sees it); for one model's own report use ``optimus.compile`` or
    ``backend = optimus.make_backend(...)`` and ``backend.report``.
    """
    passes, tune, options = _split_options(options)
    config = resolve(passes if passes is not None else DEFAULT_PASSES)
    if tune and not config.planned:
        raise ValueError(f"options[{TUNE_OPTION!r}] measures the planner's candidate plans: use it with {PASSES_OPTION}='auto'")
    key = config.fingerprint() + config.spec + f":tune={tune}"
    session = _SESSIONS.get(key)
    if session is None:
        session = _SESSIONS[key] = Session(config, tune=tune)
    _remember(session.report)
    return session.compile(gm, example_inputs, torch_api.mode_options(mode, options, None))


def _remember(report: Report) -> None:
    _LAST[:] = [report]


def last_report() -> Report | None:
    """The report of the most recent ``optimus.compile``/``optimize``/``explain`` call or
    backend compile: through ``torch.compile(m, backend="optimus")``, the registered
    backend's report for those options (every graph compiled that way in this process)."""
    return _LAST[0] if _LAST else None


def compile(model: Any, passes: Any = DEFAULT_PASSES, tune: bool = False, pack_parameters: bool | None = None, **torch_compile_kwargs: Any) -> Any:
    """``torch.compile(model, **kwargs)`` with Optimus's passes; returns the compiled model.

    ``passes="auto"`` (the default) lets the planner choose per graph which rewrites pay
    off on this device (docs/planner.md); a preset (``"all"``, ``"vertical"``, ...) or a
    rule list runs exactly that. With ``"auto"``, ``tune=True`` also measures the
    candidate plans on the first inputs and caches the choice on disk
    (``mode="max-autotune"`` implies it). ``pack_parameters=True`` first packs the
    model's groups of sibling parameters into one buffer each, in place
    (``optimus.pack_parameters``, docs/packing.md); the report's notes say what it did.
    Left out (``None``), it packs where that was measured to pay: a fixed preset, the
    model's parameters on CUDA, no CUDA graphs (``optimus.packing.pack_by_default``);
    ``False`` never packs.

    Every ``torch.compile`` keyword works: ``mode`` (``"reduce-overhead"`` turns on CUDA
    graphs, ``"max-autotune"``...), ``options`` (Inductor options), ``dynamic``,
    ``fullgraph``, ``disable``. The returned object carries ``optimus_report`` (filled as
    graphs compile, on the first calls).
    """
    if "backend" in torch_compile_kwargs:
        raise TypeError("optimus.compile chooses the backend itself; use torch.compile for another backend")
    distributed.check_wrapping(model)  # DDP(DDP(m)), fully_shard(DDP(m)): a clear error
    mode = torch_compile_kwargs.pop("mode", None)
    options = torch_compile_kwargs.pop("options", None)
    if options and PASSES_OPTION in options:
        raise TypeError(f"optimus.compile takes the passes as passes=, not options[{PASSES_OPTION!r}]")
    if not isinstance(tune, bool):
        raise TypeError(f"tune must be a bool, got {type(tune).__name__}")
    if pack_parameters is not None and not isinstance(pack_parameters, bool):
        raise TypeError(f"pack_parameters must be a bool or None, got {type(pack_parameters).__name__}")
    backend = make_backend(passes, mode=mode, options=options, dynamic=torch_compile_kwargs.get("dynamic"), tune=tune)
    session = backend.session  # type: ignore[attr-defined]
    report = session.report
    _remember(report)
    if pack_parameters is None:
        from .packing import pack_by_default

        cudagraphs = bool(torch_api.mode_options(mode, options, None).get("triton.cudagraphs"))
        base = session.base_config
        pack_parameters, why = pack_by_default(model, base.planned, cudagraphs, base.rules.get("torch_ir", ()))
        report.notes.append(f"pack_parameters: {why}")
    if pack_parameters:
        from .packing import pack_for_compile

        try:
            report.notes.extend(pack_for_compile(model))
        except Exception as e:  # never break a compile: every value is kept as it was (docs/packing.md)
            log.warning("optimus: pack_parameters failed, compiling without it: %s: %s", type(e).__name__, e)
            report.notes.append(f"pack_parameters failed ({type(e).__name__}: {e}); compiled without packing what was left")
    compiled = torch.compile(model, backend=backend, **torch_compile_kwargs)
    try:
        # On the compiled object itself: torch.compile's module wrapper forwards attribute
        # writes to the wrapped model, where a later torch.compile(model) would read it back
        # as if it were its own report.
        object.__setattr__(compiled, "optimus_report", report)
    except (AttributeError, TypeError):  # pragma: no cover - objects that refuse attributes
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
    from .core.levels import make_view

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
    report.notes.extend(config.notes)
    if config.planned and config.planner is None:  # a bare graph: its device, not how it will run
        config = planner.plan_graph(config, gm, example_inputs, report)
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


def explain(
    model: Any,
    *example_inputs: Any,
    passes: Any = DEFAULT_PASSES,
    print_report: bool = True,
    graph_dir: str | None = None,
    **torch_compile_kwargs: Any,
) -> Report:
    """Compile ``model`` with Optimus (caches off, so every pass runs), run it once on
    ``example_inputs``, print the report table and return the ``Report``.

    ``graph_dir``: also write before/after pictures of every graph each level rewrote
    there (SVG through Graphviz; DOT sources and a message naming the extra when it is
    missing); the report's notes say where."""
    import contextlib

    from torch._inductor import config as inductor_config

    compiled = compile(model, passes=passes, **torch_compile_kwargs)
    fc = torch._functorch.config
    fc_patch = {"enable_autograd_cache": False} if hasattr(fc, "enable_autograd_cache") else {}
    pictures: Any = contextlib.nullcontext()
    if graph_dir is not None:
        from .graph_pictures import recording

        pictures = recording(graph_dir)
    with inductor_config.patch(fx_graph_cache=False), fc.patch(fc_patch), pictures as recorder:
        compiled(*example_inputs)
    report: Report = compiled.optimus_report
    if recorder is not None and recorder.result is not None:
        report.note_once(recorder.result.note)
    if print_report:
        print(report.table())
    return report
