"""The oracle: run a case eagerly and compiled with Optimus at each level, compare.

A case runs as a module (``_Program``): its parameters and buffers are the module's own,
its data inputs the call's arguments. The program is called twice, eagerly and compiled:
fresh data on each call, the same parameters and buffers (what the first call wrote in
place, the second call reads). After each call, outputs (values, dtypes,
``requires_grad``), the gradients of inputs and parameters (a parameter eager leaves
without a gradient must stay without one), every argument written in place and output
aliasing must equal eager's, and the report must hold no rule error, rollback, exhausted
budget or fallback.

Levels: ``torch_ir`` and ``aten_ir`` share one Dynamo compile (``_Capture``:
``optimus.optimize`` on Dynamo's graph, and on AOTAutograd's graphs); ``compile`` runs
``optimus.compile`` end to end (Inductor, the safety net and its output guard).
``check_case`` / ``check_source`` are the entry points.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import io
import logging
import re
import traceback
import warnings
from typing import Any, Callable, Iterator, Sequence

import torch

from .program import ATOL, LEVELS, LOW_ATOL, LOW_RTOL, RTOL, Case, InputSpec

CALLS = 2  # each program is called this many times, eagerly and compiled
# Programs with matmuls and normalizations, and everything through Inductor (``compile``).
MATH_RTOL, MATH_ATOL = 1e-3, 1e-4
ALL_LEVELS: tuple[str, ...] = (*LEVELS, "compile")


class _Program(torch.nn.Module):
    """A case as a module: parameters and buffers are its own (made from their seeds, kept
    from call to call), data inputs are the arguments of ``forward``."""

    def __init__(self, fn: Callable[..., Any], inputs: Sequence[InputSpec], grad: bool) -> None:
        super().__init__()
        self.fn = fn
        self.specs = tuple(inputs)
        self.grad = grad
        self.kinds = tuple("state" if spec.state else "data" for spec in inputs)
        for spec in inputs:
            if spec.role == "buffer":
                self.register_buffer(spec.name, spec.make(grad))
            elif spec.state:
                self.register_parameter(spec.name, spec.make(grad))

    def forward(self, *data: Any) -> Any:
        args, k = [], 0
        for spec, kind in zip(self.specs, self.kinds):
            if kind == "state":
                args.append(getattr(self, spec.name))
            else:
                args.append(data[k])
                k += 1
        return self.fn(*args)

    def arguments(self, data: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Every argument of ``fn`` for a call with ``data``, in the program's order."""
        it = iter(data)
        return [getattr(self, spec.name) if spec.state else next(it) for spec in self.specs]

    def reset(self) -> None:
        """State back to its seeds' values, gradients cleared (in place: the compiled
        module keeps the same tensors)."""
        with torch.no_grad():
            for spec in self.specs:
                if spec.state:
                    t = getattr(self, spec.name)
                    t.copy_(spec.make())
                    t.grad = None


@dataclasses.dataclass
class _Run:
    """What one call produced (outputs detached, after backward when grad)."""

    spec: str
    outputs: list[Any]
    requires_grad: list[bool]
    grads: list[torch.Tensor | None] | None  # per argument (None: none, or it needs none)
    inputs_after: list[torch.Tensor]
    aliases: tuple


def _execute(program: _Program, fn: Callable[..., Any], grad: bool, call: int, collect: bool = False) -> _Run:
    """Call ``fn`` (``program`` or its compiled form) with fresh data for call ``call``;
    with ``grad``, backpropagate a fixed random projection of every output that requires
    grad. The caller's grad mode is on, as a training step's is."""
    data = [spec.make(grad, call) for spec in program.specs if not spec.state]
    args = program.arguments(data)
    for a in args:
        a.grad = None
    with _caller_modes(collect):
        out = fn(*data)
        leaves, spec = torch.utils._pytree.tree_flatten(out)
        aliases = _alias_signature(args, leaves)
        outputs = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in leaves]
        requires = [bool(getattr(x, "requires_grad", False)) for x in leaves]
        grads = None
        if grad:
            g = torch.Generator().manual_seed(20240917 + call)
            loss = None
            for x in leaves:
                if isinstance(x, torch.Tensor) and x.requires_grad:
                    w = torch.randn(tuple(x.shape), generator=g, dtype=torch.float32).to(x.dtype)
                    term = (x * w).sum()
                    loss = term if loss is None else loss + term
            if loss is not None:
                loss.backward()
            grads = [None if not a.is_leaf or a.grad is None else a.grad.detach().clone() for a in args]
    return _Run(str(spec), outputs, requires, grads, [a.detach().clone() for a in args], aliases)


_PINNED: list[Any] = []


class CallError(Exception):
    """A call raised: the original's type, first line and traceback, as text (the
    original and its frames are dropped, see ``_caller_modes``)."""

    def __init__(self, kind: str, line: str, tb: str) -> None:
        super().__init__(f"{kind}: {line}")
        self.kind, self.line, self.tb = kind, line, tb


def _thread_state() -> tuple:
    """What a call may leave changed: grad and inference mode, CPU autocast, and the
    dispatcher's thread-local included/excluded keys."""
    return (
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        torch.is_autocast_enabled("cpu"),
        repr(torch._C._dispatch_tls_local_include_set()),
        repr(torch._C._dispatch_tls_local_exclude_set()),
    )


def _set_dispatch_keys(included: str, excluded: str) -> None:
    """Force the thread-local dispatch key sets back to ``included``/``excluded`` (their
    reprs)."""
    for name, key in torch._C.DispatchKey.__members__.items():
        if name in ("Undefined", "EndOfFunctionalityKeys") or name.startswith("Start"):
            continue
        try:
            inc = torch._C._dispatch_tls_is_dispatch_key_included(key)
            exc = torch._C._dispatch_tls_is_dispatch_key_excluded(key)
            want_inc = re.search(rf"\b{name}\b", included) is not None
            want_exc = re.search(rf"\b{name}\b", excluded) is not None
            if inc != want_inc:
                torch._C._dispatch_tls_set_dispatch_key_included(key, want_inc)
            if exc != want_exc:
                torch._C._dispatch_tls_set_dispatch_key_excluded(key, want_exc)
        except (RuntimeError, ValueError):
            continue


@contextlib.contextmanager
def _caller_modes(collect: bool = False) -> Iterator[None]:
    """Run a call in the modes a call starts in (grad enabled, no inference mode,
    autocast off) and leave the thread as it was, whatever the call did.

    A compiled graph that raises leaves the regions it entered (its markers have no
    ``finally``), and so does AOTAutograd when tracing such a graph fails, which also
    leaves its tracing dispatch keys set. Worse, a mode guard it left entered restores the
    state of its own creation when it is freed, at the next garbage collection. So an
    exception is turned into a ``CallError`` (text only), the garbage is collected inside
    the wrapper (when the call raised, the thread state changed, or ``collect``: a safety
    net that caught an exception), and then the state is set back; a state left changed
    even then is repaired key by key."""
    before = _thread_state()
    error: CallError | None = None
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast("cpu", enabled=False):
        inner = _thread_state()
        try:
            yield
        except Exception as e:
            error = e if isinstance(e, CallError) else _as_text(e)
            del e
        if error is not None or collect or _thread_state() != inner:
            gc.collect()
    if _thread_state() != before:
        if torch.is_inference_mode_enabled() and not before[1]:
            guard = torch._C._InferenceMode(False)  # held for good: a leaked guard may still restore its state
            guard.__enter__()
            _PINNED.append(guard)
        torch._C._set_grad_enabled(before[0])
        if torch.is_autocast_enabled("cpu") != before[2]:
            torch.set_autocast_enabled("cpu", before[2])
        _set_dispatch_keys(before[3], before[4])
    if error is not None:
        raise error


def _calls(program: _Program, fn: Callable[..., Any], grad: bool, collect: bool = False) -> list[_Run]:
    """``CALLS`` calls of ``fn``, the program's state carried from one to the next."""
    return [_execute(program, fn, grad, k, collect) for k in range(CALLS)]


def _storage(t: Any) -> int | None:
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return None
    return t.untyped_storage().data_ptr()


def _bytes(t: torch.Tensor) -> set[int]:
    """The byte offsets in its storage where ``t``'s elements start."""
    idx = torch.tensor(t.storage_offset())
    for size, stride in zip(t.shape, t.stride()):
        idx = idx.unsqueeze(-1) + torch.arange(size) * stride
    return {int(i) * t.element_size() for i in idx.flatten().tolist()}


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` share memory: one storage and at least one element (outputs in
    different chunks of one buffer share a storage but no element)."""
    if a.element_size() != b.element_size():
        return True
    return not _bytes(a).isdisjoint(_bytes(b))


def _alias_signature(args: Sequence[torch.Tensor], leaves: Sequence[Any]) -> tuple:
    """For each output: which inputs and which other outputs share memory with it."""
    ins = [_storage(a) for a in args]
    outs = [_storage(o) for o in leaves]
    sig = []
    for k, s in enumerate(outs):
        if s is None:
            sig.append(((), ()))
            continue
        sig.append(
            (
                tuple(i for i, t in enumerate(ins) if t == s and _overlap(args[i], leaves[k])),
                tuple(j for j, t in enumerate(outs) if j != k and t == s and _overlap(leaves[j], leaves[k])),
            )
        )
    return tuple(sig)


def _tensor_diff(a: torch.Tensor, b: torch.Tensor, tol: tuple[float, float] = (RTOL, ATOL), fp64: Any = None) -> str | None:
    """Why ``b`` (compiled) differs from ``a`` (eager), ``None`` if it does not. Beyond
    ``tol``, with ``fp64`` (the value in the fp64 reference run) the difference is judged
    as PyTorch's benchmark harness judges it: ``b`` passes if its error against ``fp64`` is
    within the harness's multiple of eager's own error."""
    if tuple(a.shape) != tuple(b.shape):
        return f"shape {tuple(b.shape)}, expected {tuple(a.shape)}"
    if a.dtype != b.dtype:
        return f"dtype {b.dtype}, expected {a.dtype}"
    if a.numel() == 0 or torch.allclose(a, b, rtol=tol[0], atol=tol[1], equal_nan=True):
        return None
    if isinstance(fp64, torch.Tensor) and tuple(fp64.shape) == tuple(a.shape) and a.is_floating_point():
        from optimus.tools.bench.accuracy import judge_tensor

        if judge_tensor("value", a, b, fp64, tol=tol[0]).ok:
            return None
    with torch.no_grad():
        da, db = a.double(), b.double()
        diff = (da - db).abs().nan_to_num(float("inf"))
        both_nan = da.isnan() & db.isnan()
        diff[both_nan | (da == db)] = 0
        idx = tuple(int(i) for i in torch.unravel_index(diff.argmax(), a.shape)) if a.dim() else ()
        return f"max abs diff {diff.max().item():.4g} at {idx}: got {db[idx].item():.6g}, expected {da[idx].item():.6g} (shape {tuple(a.shape)})"


ALIASING_MODES = ("new", "exact", "off")


def _alias_problem(ref: tuple, got: tuple, mode: str) -> str | None:
    """``new``: no output may share memory (one storage and at least one element) with an
    input or another output it did not share memory with in eager (the driver's
    contract); ``exact``: nor lose aliasing."""
    if mode == "off" or ref == got:
        return None
    for k, ((ri, ro), (gi, go)) in enumerate(zip(ref, got)):
        extra_i, extra_o = sorted(set(gi) - set(ri)), sorted(set(go) - set(ro))
        if extra_i or extra_o:
            what = [f"input {i}" for i in extra_i] + [f"output {j}" for j in extra_o]
            return f"output aliasing: output {k} now shares memory with {', '.join(what)} (it does not in eager)"
    if mode == "exact":
        for k, ((ri, ro), (gi, go)) in enumerate(zip(ref, got)):
            lost_i, lost_o = sorted(set(ri) - set(gi)), sorted(set(ro) - set(go))
            if lost_i or lost_o:
                what = [f"input {i}" for i in lost_i] + [f"output {j}" for j in lost_o]
                return f"output aliasing lost: output {k} no longer shares memory with {', '.join(what)} (it does in eager)"
    return None


def _compare_calls(
    ref: Sequence[_Run],
    got: Sequence[_Run],
    inputs: Sequence[InputSpec],
    aliasing: str = "new",
    tol: tuple[float, float] = (RTOL, ATOL),
    ref64: Sequence[_Run] | None = None,
) -> str | None:
    """Why the calls ``got`` differ from ``ref`` (``None`` if they do not); a difference on
    a later call is prefixed ``call k:``. ``ref64``: the fp64 reference's calls, which
    judge a value beyond ``tol`` (``_tensor_diff``)."""
    for k, (a, b) in enumerate(zip(ref, got)):
        msg = _compare(a, b, inputs, aliasing, tol, ref64[k] if ref64 is not None else None)
        if msg:
            return msg if k == 0 else f"call {k + 1}: {msg}"
    return None


def _at(values: Sequence[Any] | None, i: int) -> Any:
    return values[i] if values is not None and i < len(values) else None


def _compare(
    ref: _Run, got: _Run, inputs: Sequence[InputSpec] = (), aliasing: str = "new", tol: tuple[float, float] = (RTOL, ATOL), ref64: _Run | None = None
) -> str | None:
    """Why ``got`` differs from ``ref`` (``None`` if it does not); ``ref64``: the same call
    of the fp64 reference (``_tensor_diff``)."""
    if ref.spec != got.spec:
        return f"output structure differs: got {got.spec}, expected {ref.spec}"
    r64 = ref64 if ref64 is not None and ref64.spec == ref.spec else None
    for i, (a, b) in enumerate(zip(ref.outputs, got.outputs)):
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return f"output {i}: got {type(b).__name__}, expected {type(a).__name__}"
        msg = _tensor_diff(a, b, tol, _at(r64 and r64.outputs, i)) if isinstance(a, torch.Tensor) else (None if a == b else f"got {b!r}, expected {a!r}")
        if msg:
            return f"output {i}: {msg}"
    if ref.requires_grad != got.requires_grad:
        return f"outputs' requires_grad {got.requires_grad}, expected {ref.requires_grad}"
    for i, (a, b) in enumerate(zip(ref.inputs_after, got.inputs_after)):
        msg = _tensor_diff(a, b, tol, _at(r64 and r64.inputs_after, i))
        if msg:
            return f"input {i}{_role(inputs, i)} after the call (written in place): {msg}"
    if ref.grads is not None and got.grads is not None:
        for i, (a, b) in enumerate(zip(ref.grads, got.grads)):
            param = i < len(inputs) and inputs[i].role in ("param", "frozen")
            what = f"grad of parameter {inputs[i].name} (input {i})" if param else f"grad of input {i}"
            if a is None and b is None:
                continue
            if a is None or b is None:
                present = a if a is not None else b
                if not param and bool((present == 0).all()):
                    continue  # an input: no gradient vs an all-zero gradient
                return f"{what}: {'missing (eager computes one)' if b is None else 'unexpected (eager leaves it None)'}"
            msg = _tensor_diff(a, b, tol, _at(r64 and r64.grads, i))
            if msg:
                return f"{what}: {msg}"
    return _alias_problem(ref.aliases, got.aliases, aliasing)


def _role(inputs: Sequence[InputSpec], i: int) -> str:
    return f" ({inputs[i].name}, {inputs[i].role})" if i < len(inputs) and inputs[i].role != "input" else ""


def tolerance(case: Case, level: str) -> tuple[float, float]:
    """(rtol, atol) for comparing ``case`` at ``level`` with eager: exact to rounding for
    programs that only move and combine values elementwise; looser where products and
    normalizations are summed in another order (a batched matmul, a decomposed
    layer_norm's backward, Inductor's code) or computed in bfloat16."""
    if case.low_precision:
        return LOW_RTOL, LOW_ATOL
    if level == "compile" or case.reduces:
        return MATH_RTOL, MATH_ATOL
    return RTOL, ATOL


# ---------------------------------------------------------------------- one compile
_DECOMPOSITIONS: dict[Any, Any] | None = None


def _decompositions() -> dict[Any, Any]:
    global _DECOMPOSITIONS
    if _DECOMPOSITIONS is None:
        from torch._inductor.decomposition import select_decomp_table

        _DECOMPOSITIONS = select_decomp_table()
    return _DECOMPOSITIONS


def _as_text(e: BaseException) -> CallError:
    """``e`` kept as text, its frames cleared (they may hold mode guards a failed trace left
    entered, see ``_caller_modes``)."""
    kept = CallError(type(e).__name__, _first_line(e), "".join(traceback.format_exception(e)).rstrip())
    traceback.clear_frames(e.__traceback__)
    return kept


class _OptimusError(Exception):
    """``optimus.optimize`` itself raised (wrapped so it is told apart from torch's errors)."""


class _Capture:
    """A Dynamo backend rewriting the captured graph at each requested level.

    One Dynamo compile serves every level: the backend builds the Aten-IR version
    (``aot_autograd`` with Optimus in its forward/backward compilers) from the untouched
    graph, then rewrites the graph itself at Torch-IR; ``mode`` picks which one a call runs.
    """

    def __init__(self, levels: Sequence[str], passes: Any) -> None:
        self.levels = tuple(levels)
        self.passes = resolve_passes(passes)
        self.mode = self.levels[0]
        self.compiles = 0
        self.fns: dict[str, Callable[..., Any]] = {}
        self.errors: dict[str, BaseException] = {}  # level -> error building it (torch's)
        self.optimus_errors: dict[str, str] = {}  # level -> traceback of optimus.optimize
        self.reports: dict[str, list[Any]] = {lv: [] for lv in self.levels}

    def optimize(self, gm: torch.fx.GraphModule, level: str) -> torch.fx.GraphModule:
        import optimus

        try:
            optimus.optimize(gm, passes=self.passes, level=level)
        except Exception as e:
            self.optimus_errors[level] = "".join(traceback.format_exception(e)).rstrip()
            traceback.clear_frames(e.__traceback__)
            raise _OptimusError(f"optimus.optimize raised {type(e).__name__}: {e}") from None
        self.reports[level].append(gm.meta["optimus_report"])
        return gm

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.compiles += 1
        if "aten_ir" in self.levels:
            from functorch.compile import make_boxed_func
            from torch._dynamo.backends.common import aot_autograd

            def compiler(g: torch.fx.GraphModule, _inputs: Any) -> Callable[..., Any]:
                return make_boxed_func(self.optimize(g, "aten_ir").forward)

            try:  # (contained: a failed trace must not leave its modes to the Torch-IR level)
                with _caller_modes():
                    backend = aot_autograd(fw_compiler=compiler, bw_compiler=compiler, decompositions=_decompositions())
                    self.fns["aten_ir"] = backend(gm, example_inputs)
            except CallError as e:
                self.errors["aten_ir"] = e
        if "torch_ir" in self.levels:
            try:
                with _caller_modes():
                    self.fns["torch_ir"] = self.optimize(gm, "torch_ir").forward
            except CallError as e:
                self.errors["torch_ir"] = e

        def dispatch(*args: Any) -> Any:
            fn = self.fns.get(self.mode)
            if fn is None:
                raise self.errors[self.mode]
            return fn(*args)

        return dispatch


# ------------------------------------------------------------------------- results
OK, SKIP = "ok", "skip"
FAILURE_KINDS = ("optimus_error", "rule_error", "fallback", "graph_error", "mismatch")


@dataclasses.dataclass
class LevelResult:
    """One level of one case. ``kind``: ``ok``, ``skip`` (torch, not Optimus, failed or
    differs), or a failure: ``optimus_error`` (``optimize`` raised), ``rule_error`` (the
    report holds a rule error, a level rollback or an exhausted budget), ``fallback``
    (``compile`` only: the safety net threw a graph's rewrites away), ``graph_error``
    (the rewritten graph raised), ``mismatch`` (results differ from eager)."""

    level: str
    kind: str
    message: str = ""
    fired: dict[str, int] = dataclasses.field(default_factory=dict)
    declined: dict[str, int] = dataclasses.field(default_factory=dict)
    torch_failure: tuple[str, str, bool] | None = None  # a skip's (kind, message, whether Optimus had rewritten anything)
    fp64_judged: bool = False  # beyond the tolerance, within the fp64 rule (``_tensor_diff``)

    @property
    def failed(self) -> bool:
        return self.kind in FAILURE_KINDS


@dataclasses.dataclass
class CaseResult:
    case: Case  # with ``grad`` as actually run
    levels: dict[str, LevelResult]
    skip: str | None = None  # why the whole case was skipped

    @property
    def failures(self) -> list[LevelResult]:
        return [r for r in self.levels.values() if r.failed]

    @property
    def ok(self) -> bool:
        return self.skip is None and all(r.kind == OK for r in self.levels.values())


def _report_facts(reports: Sequence[Any]) -> tuple[dict[str, int], dict[str, int], list[str]]:
    """(rewrites per rule, declines per rule, problems) over a level's reports. A problem
    is a rule error, a level rollback, an exhausted budget, a failed pass, or a graph the
    safety net compiled again without the passes that had rewritten it (a fallback)."""
    fired: collections.Counter = collections.Counter()
    declined: collections.Counter = collections.Counter()
    problems: list[str] = []
    for report in reports:
        for g in report.graphs:
            if g.discarded and not g.discarded.startswith("Dynamo restarted"):
                problems.append(f"fallback: {g.level} {g.graph}: {g.discarded}")
            if g.discarded:
                continue  # its rewrites never ran
            for name, stats in g.rules.items():
                if stats.matched:
                    fired[name] += stats.matched
                n = sum(stats.declined.values())
                if n:
                    declined[name] += n
                problems += [f"rule {name} raised on {g.graph} (rolled back): {err}" for err in stats.errors]
            for note in g.notes:
                if "rolled back" in note or "rewrite budget" in note or "failed" in note:
                    problems.append(f"{g.graph}: {note}")
        # (a fallback's own note repeats what the discarded graphs say)
        problems += [f"note: {n}" for n in report.notes if ("failed" in n or "skipped" in n) and "compiled again" not in n]
    return dict(fired), dict(declined), problems


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence warnings and Optimus's own warning log (errors are read from reports)."""
    logs = [logging.getLogger(name) for name in ("optimus", "torch.fx.experimental.symbolic_shapes")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)


def reference(case: Case) -> tuple[Case, list[_Run] | None, str | None]:
    """Run ``case`` eagerly, ``CALLS`` times: (the case as it ran, its calls' results, why
    it was skipped).

    With ``grad``, a program autograd rejects (an in-place write it forbids) runs again
    without gradients; a program eager rejects even then is skipped.
    """
    try:
        fn = case.function()
    except SyntaxError as e:
        return case, None, f"syntax: {e}"
    try:
        program = _Program(fn, case.inputs, case.grad)
        return case, _calls(program, program, case.grad), None
    except Exception as e:
        first = f"eager raised {e.kind if isinstance(e, CallError) else type(e).__name__}"
    if case.grad:
        nograd = dataclasses.replace(case, grad=False)
        try:
            program = _Program(fn, nograd.inputs, False)
            return nograd, _calls(program, program, False), None
        except Exception as e:
            first = f"eager raised {e.kind if isinstance(e, CallError) else type(e).__name__}"
    return case, None, first


def fp64_reference(case: Case) -> list[_Run] | None:
    """``case``'s calls run eagerly with every argument held in float64 (``Case.in_fp64``),
    or ``None`` where the program does not run so (it fixes a dtype that no longer matches)."""
    try:
        fn = case.function()
        program = _Program(fn, case.in_fp64().inputs, case.grad)
        return _calls(program, program, case.grad)
    except Exception:
        return None


def check_case(
    case: Case,
    levels: Sequence[str] = LEVELS,
    passes: Any = "vertical",
    ref: list[_Run] | None = None,
    baseline: bool = True,
    aliasing: str = "new",
) -> CaseResult:
    """Run ``case`` eagerly and compiled with Optimus at ``levels``; compare.

    A graph error or mismatch where no Optimus rewrite happened, or that also appears with
    ``passes="none"`` (when ``baseline``), is torch's, not Optimus's: the level is skipped.
    """
    if ref is None:
        case, ref, why = reference(case)
        if ref is None:
            return CaseResult(case, {}, why)
    levels = tuple(levels)
    results = _compiled_results(case, levels, passes, ref, aliasing)
    if isinstance(results, str):
        return CaseResult(case, {}, results)
    for lv, r in list(results.items()):
        if r.kind not in ("graph_error", "mismatch", "fallback"):
            continue
        if not r.fired and r.kind != "fallback":  # (a fallback's rewrites are not counted: they were thrown away)
            r.torch_failure = (r.kind, r.message, False)
            r.kind, r.message = SKIP, f"torch: {r.kind} with no Optimus rewrite: {r.message}"
        elif baseline:
            base = _compiled_results(case, (lv,), "none", ref, aliasing)
            if isinstance(base, str) or base[lv].kind != OK:
                why = base if isinstance(base, str) else base[lv].message
                r.torch_failure = (r.kind, r.message, True)
                r.kind, r.message = SKIP, f"torch: {r.kind} also without Optimus ({why}): {r.message}"
    return CaseResult(case, results)


def _compiled_results(case: Case, levels: tuple[str, ...], passes: Any, ref: list[_Run], aliasing: str) -> dict[str, LevelResult] | str:
    results: dict[str, LevelResult] = {}
    fx_levels = tuple(lv for lv in levels if lv in LEVELS)
    if fx_levels:
        got = _captured_results(case, fx_levels, passes, ref, aliasing)
        if isinstance(got, str):
            return got
        results.update(got)
    if "compile" in levels:
        got = _end_to_end_result(case, passes, ref, aliasing)
        if isinstance(got, str):
            return got
        results["compile"] = got
    return {lv: results[lv] for lv in levels}


def _level_result(
    case: Case, lv: str, got: list[_Run] | None, error: str | None, tb: str, reports: Sequence[Any], optimus_error: str | None, build_error: bool, ref: list[_Run], aliasing: str
) -> LevelResult:
    fired, declined, problems = _report_facts(reports)
    if optimus_error is not None:
        return LevelResult(lv, "optimus_error", optimus_error, fired, declined)
    if problems:
        kind = "fallback" if all(p.startswith("fallback:") for p in problems) else "rule_error"
        return LevelResult(lv, kind, "\n".join(problems), fired, declined)
    if error is not None:
        if build_error:
            return LevelResult(lv, SKIP, f"torch: building the {lv} graph raised {error}", fired, declined)
        return LevelResult(lv, "graph_error", f"the rewritten graph raised {error}\n{_tail(tb)}", fired, declined)
    assert got is not None
    tol = tolerance(case, lv)
    msg = _compare_calls(ref, got, case.inputs, aliasing, tol)
    if msg is None:
        return LevelResult(lv, OK, "", fired, declined)
    ref64 = fp64_reference(case)
    if ref64 is not None and _compare_calls(ref, got, case.inputs, aliasing, tol, ref64) is None:
        return LevelResult(lv, OK, "", fired, declined, fp64_judged=True)
    return LevelResult(lv, "mismatch", msg + ("" if ref64 is not None else " (no fp64 reference: the program does not run in float64)"), fired, declined)


def _captured_results(case: Case, levels: tuple[str, ...], passes: Any, ref: list[_Run], aliasing: str) -> dict[str, LevelResult] | str:
    """``optimus.optimize`` on Dynamo's graph (Torch-IR) and on AOTAutograd's (Aten-IR),
    one Dynamo compile for both."""
    program = _Program(case.function(), case.inputs, case.grad)
    torch._dynamo.reset()
    cap = _Capture(levels, passes)
    compiled = torch.compile(program, backend=cap, fullgraph=True, dynamic=case.dynamic)
    results: dict[str, LevelResult] = {}
    try:
        for lv in levels:
            cap.mode = lv
            program.reset()
            got: list[_Run] | None = None
            error: str | None = None
            tb = ""
            try:
                with contextlib.redirect_stderr(io.StringIO()):  # fx prints a failing graph's code
                    got = _calls(program, compiled, case.grad)
            except CallError as e:
                if cap.compiles == 0:
                    return f"dynamo raised {e}"
                error, tb = str(e), e.tb
            build_error = lv in cap.errors and not cap.reports[lv]
            r = _level_result(case, lv, got, error, tb, cap.reports[lv], cap.optimus_errors.get(lv), build_error, ref, aliasing)
            if cap.compiles > 1:
                r.message += f" (note: {cap.compiles} compiles)"
            results[lv] = r
    finally:
        torch._dynamo.reset()
    return results


def _end_to_end_result(case: Case, passes: Any, ref: list[_Run], aliasing: str) -> LevelResult | str:
    """``optimus.compile(program, passes=passes)``: Dynamo, every Optimus level inside
    Inductor, the safety net and the output guard, over ``CALLS`` calls."""
    import optimus

    program = _Program(case.function(), case.inputs, case.grad)
    torch._dynamo.reset()
    counter = torch._dynamo.utils.counters
    frames_before = counter["stats"]["unique_graphs"]
    got: list[_Run] | None = None
    error: str | None = None
    tb = ""
    try:
        compiled = optimus.compile(program, passes=passes, fullgraph=True, dynamic=case.dynamic)
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                got = _calls(program, compiled, case.grad, collect=True)
        except CallError as e:
            if counter["stats"]["unique_graphs"] == frames_before:
                return f"dynamo raised {e}"
            error, tb = str(e), e.tb
        report = compiled.optimus_report
    finally:
        torch._dynamo.reset()
    return _level_result(case, "compile", got, error, tb, [report], None, False, ref, aliasing)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""


def _tail(tb: str, lines: int = 12) -> str:
    return "\n".join(tb.splitlines()[-lines:])



def check_source(
    source: str,
    inputs: Sequence[InputSpec],
    level: str = "both",
    grad: bool = True,
    dynamic: bool = False,
    passes: Any = "vertical",
    aliasing: str = "new",
) -> str | None:
    """Check one program given as source (``def f(...)``): ``None`` if Optimus handled it,
    else what went wrong (the kind, level and message)."""
    levels = LEVELS if level == "both" else (level,)
    if any(lv not in ALL_LEVELS for lv in levels):
        raise ValueError(f"level must be 'both' or one of {ALL_LEVELS}, got {level!r}")
    case = Case(tuple(inputs), grad=grad, dynamic=dynamic, raw_source=textwrap_dedent(source))
    with _quiet():
        result = check_case(case, levels, passes, aliasing=aliasing)
    if result.skip:
        return f"skipped: {result.skip}"
    bad = result.failures
    if not bad:
        return None
    return "\n".join(f"{r.kind} at {r.level} (rules fired: {r.fired}): {r.message}" for r in bad)


def textwrap_dedent(text: str) -> str:
    import textwrap

    return textwrap.dedent(text).strip("\n") + "\n"



def resolve_passes(passes: Any) -> Any:
    """``"registered"``: every registered canonicalize and vertical rule, also those off
    by default; anything else is an ordinary ``passes`` value."""
    if passes == "registered":
        import optimus

        return [r.name for r in optimus.list_rules() if r.kind in ("canonicalize", "vertical")]
    return passes
