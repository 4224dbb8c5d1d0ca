"""The oracle: run a case eagerly and compiled with Optimus at each level, compare.

One Dynamo compile serves both levels (``_Capture``); outputs, input gradients, inputs
written in place and output aliasing must equal eager's, and the report must hold no rule
error, rollback or exhausted budget. ``check_case`` / ``check_source`` are the entry points.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import logging
import traceback
import warnings
from typing import Any, Callable, Iterator, Sequence

import torch

from .program import ATOL, LEVELS, RTOL, Case, InputSpec


@dataclasses.dataclass
class _Run:
    """What one execution produced (outputs detached, after backward when grad)."""

    spec: str
    outputs: list[Any]
    requires_grad: list[bool]
    grads: list[torch.Tensor | None] | None
    inputs_after: list[torch.Tensor]
    aliases: tuple


def _execute(fn: Callable[..., Any], inputs: Sequence[InputSpec], grad: bool) -> _Run:
    """Run ``fn`` on fresh inputs; with ``grad``, backpropagate a fixed random projection
    of every output that requires grad."""
    args = [spec.make().requires_grad_(grad) for spec in inputs]
    out = fn(*args)
    leaves, spec = torch.utils._pytree.tree_flatten(out)
    aliases = _alias_signature(args, leaves)
    outputs = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in leaves]
    requires = [bool(getattr(x, "requires_grad", False)) for x in leaves]
    grads = None
    if grad:
        g = torch.Generator().manual_seed(20240917)
        loss = None
        for x in leaves:
            if isinstance(x, torch.Tensor) and x.requires_grad:
                w = torch.randn(tuple(x.shape), generator=g, dtype=torch.float32).to(x.dtype)
                term = (x * w).sum()
                loss = term if loss is None else loss + term
        if loss is not None:
            loss.backward()
        grads = [None if a.grad is None else a.grad.detach().clone() for a in args]
    return _Run(str(spec), outputs, requires, grads, [a.detach().clone() for a in args], aliases)


def _storage(t: Any) -> int | None:
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return None
    return t.untyped_storage().data_ptr()


def _alias_signature(args: Sequence[torch.Tensor], leaves: Sequence[Any]) -> tuple:
    """For each output: which inputs and which other outputs share its storage."""
    ins = [_storage(a) for a in args]
    outs = [_storage(o) for o in leaves]
    sig = []
    for k, s in enumerate(outs):
        if s is None:
            sig.append(((), ()))
            continue
        sig.append((tuple(i for i, t in enumerate(ins) if t == s), tuple(j for j, t in enumerate(outs) if j != k and t == s)))
    return tuple(sig)


def _tensor_diff(a: torch.Tensor, b: torch.Tensor) -> str | None:
    if tuple(a.shape) != tuple(b.shape):
        return f"shape {tuple(b.shape)}, expected {tuple(a.shape)}"
    if a.dtype != b.dtype:
        return f"dtype {b.dtype}, expected {a.dtype}"
    if a.numel() == 0 or torch.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True):
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
    """``new``: no output may share storage with an input or another output it did not
    share with in eager (the driver's contract); ``exact``: nor lose aliasing."""
    if mode == "off" or ref == got:
        return None
    for k, ((ri, ro), (gi, go)) in enumerate(zip(ref, got)):
        extra_i, extra_o = sorted(set(gi) - set(ri)), sorted(set(go) - set(ro))
        if extra_i or extra_o:
            what = [f"input {i}" for i in extra_i] + [f"output {j}" for j in extra_o]
            return f"output aliasing: output {k} now shares storage with {', '.join(what)} (it does not in eager)"
    if mode == "exact":
        for k, ((ri, ro), (gi, go)) in enumerate(zip(ref, got)):
            lost_i, lost_o = sorted(set(ri) - set(gi)), sorted(set(ro) - set(go))
            if lost_i or lost_o:
                what = [f"input {i}" for i in lost_i] + [f"output {j}" for j in lost_o]
                return f"output aliasing lost: output {k} no longer shares storage with {', '.join(what)} (it does in eager)"
    return None


def _compare(ref: _Run, got: _Run, aliasing: str = "new") -> str | None:
    """Why ``got`` differs from ``ref`` (``None`` if it does not)."""
    if ref.spec != got.spec:
        return f"output structure differs: got {got.spec}, expected {ref.spec}"
    for i, (a, b) in enumerate(zip(ref.outputs, got.outputs)):
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return f"output {i}: got {type(b).__name__}, expected {type(a).__name__}"
        msg = _tensor_diff(a, b) if isinstance(a, torch.Tensor) else (None if a == b else f"got {b!r}, expected {a!r}")
        if msg:
            return f"output {i}: {msg}"
    if ref.requires_grad != got.requires_grad:
        return f"outputs' requires_grad {got.requires_grad}, expected {ref.requires_grad}"
    for i, (a, b) in enumerate(zip(ref.inputs_after, got.inputs_after)):
        msg = _tensor_diff(a, b)
        if msg:
            return f"input {i} after the call (written in place): {msg}"
    if ref.grads is not None and got.grads is not None:
        for i, (a, b) in enumerate(zip(ref.grads, got.grads)):
            if a is None and b is None:
                continue
            if a is None or b is None:
                present = a if a is not None else b
                if bool((present == 0).all()):
                    continue  # no gradient vs an all-zero gradient
                return f"grad of input {i}: {'missing' if b is None else 'unexpected'}"
            msg = _tensor_diff(a, b)
            if msg:
                return f"grad of input {i}: {msg}"
    return _alias_problem(ref.aliases, got.aliases, aliasing)


# ---------------------------------------------------------------------- one compile
_DECOMPOSITIONS: dict[Any, Any] | None = None


def _decompositions() -> dict[Any, Any]:
    global _DECOMPOSITIONS
    if _DECOMPOSITIONS is None:
        from torch._inductor.decomposition import select_decomp_table

        _DECOMPOSITIONS = select_decomp_table()
    return _DECOMPOSITIONS


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
            raise _OptimusError(f"optimus.optimize raised {type(e).__name__}: {e}") from e
        self.reports[level].append(gm.meta["optimus_report"])
        return gm

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.compiles += 1
        if "aten_ir" in self.levels:
            from functorch.compile import make_boxed_func
            from torch._dynamo.backends.common import aot_autograd

            def compiler(g: torch.fx.GraphModule, _inputs: Any) -> Callable[..., Any]:
                return make_boxed_func(self.optimize(g, "aten_ir").forward)

            try:
                backend = aot_autograd(fw_compiler=compiler, bw_compiler=compiler, decompositions=_decompositions())
                self.fns["aten_ir"] = backend(gm, example_inputs)
            except Exception as e:
                self.errors["aten_ir"] = e
        if "torch_ir" in self.levels:
            try:
                self.fns["torch_ir"] = self.optimize(gm, "torch_ir").forward
            except Exception as e:
                self.errors["torch_ir"] = e

        def dispatch(*args: Any) -> Any:
            fn = self.fns.get(self.mode)
            if fn is None:
                raise self.errors[self.mode]
            return fn(*args)

        return dispatch


# ------------------------------------------------------------------------- results
OK, SKIP = "ok", "skip"
FAILURE_KINDS = ("optimus_error", "rule_error", "graph_error", "mismatch")


@dataclasses.dataclass
class LevelResult:
    """One level of one case. ``kind``: ``ok``, ``skip`` (torch, not Optimus, failed or
    differs), or a failure: ``optimus_error`` (``optimize`` raised), ``rule_error`` (the
    report holds a rule error, a level rollback or an exhausted budget), ``graph_error``
    (the rewritten graph raised), ``mismatch`` (results differ from eager)."""

    level: str
    kind: str
    message: str = ""
    fired: dict[str, int] = dataclasses.field(default_factory=dict)
    declined: dict[str, int] = dataclasses.field(default_factory=dict)

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
    """(rewrites per rule, declines per rule, problems) over a level's reports."""
    fired: collections.Counter = collections.Counter()
    declined: collections.Counter = collections.Counter()
    problems: list[str] = []
    for report in reports:
        for g in report.graphs:
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
        problems += [f"note: {n}" for n in report.notes if "failed" in n or "skipped" in n]
    return dict(fired), dict(declined), problems


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence warnings and Optimus's own warning log (errors are read from reports)."""
    log = logging.getLogger("optimus")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def reference(case: Case) -> tuple[Case, _Run | None, str | None]:
    """Run ``case`` eagerly: (the case as it ran, its result, why it was skipped).

    With ``grad``, a program autograd rejects (an in-place write it forbids) runs again
    without gradients; a program eager rejects even then is skipped.
    """
    try:
        fn = case.function()
    except SyntaxError as e:
        return case, None, f"syntax: {e}"
    try:
        return case, _execute(fn, case.inputs, case.grad), None
    except Exception as e:
        first = f"eager raised {type(e).__name__}"
    if case.grad:
        nograd = dataclasses.replace(case, grad=False)
        try:
            return nograd, _execute(fn, nograd.inputs, False), None
        except Exception as e:
            first = f"eager raised {type(e).__name__}"
    return case, None, first


def check_case(
    case: Case,
    levels: Sequence[str] = LEVELS,
    passes: Any = "vertical",
    ref: _Run | None = None,
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
        if r.kind not in ("graph_error", "mismatch"):
            continue
        if not r.fired:
            r.kind, r.message = SKIP, f"torch: {r.kind} with no Optimus rewrite: {r.message}"
        elif baseline:
            base = _compiled_results(case, (lv,), "none", ref, aliasing)
            if isinstance(base, str) or base[lv].kind != OK:
                why = base if isinstance(base, str) else base[lv].message
                r.kind, r.message = SKIP, f"torch: {r.kind} also without Optimus ({why}): {r.message}"
    return CaseResult(case, results)


def _compiled_results(case: Case, levels: tuple[str, ...], passes: Any, ref: _Run, aliasing: str) -> dict[str, LevelResult] | str:
    fn = case.function()
    torch._dynamo.reset()
    cap = _Capture(levels, passes)
    compiled = torch.compile(fn, backend=cap, fullgraph=True, dynamic=case.dynamic)
    results: dict[str, LevelResult] = {}
    try:
        for lv in levels:
            cap.mode = lv
            got: _Run | None = None
            error: str | None = None
            try:
                with contextlib.redirect_stderr(io.StringIO()):  # fx prints a failing graph's code
                    got = _execute(compiled, case.inputs, case.grad)
            except Exception as e:
                if cap.compiles == 0:
                    return f"dynamo raised {type(e).__name__}: {_first_line(e)}"
                error = f"{type(e).__name__}: {_first_line(e)}"
                tb = "".join(traceback.format_exception(e)).rstrip()
            fired, declined, problems = _report_facts(cap.reports[lv])
            if lv in cap.optimus_errors:
                r = LevelResult(lv, "optimus_error", cap.optimus_errors[lv], fired, declined)
            elif problems:
                r = LevelResult(lv, "rule_error", "\n".join(problems), fired, declined)
            elif error is not None:
                if lv in cap.errors and not cap.reports[lv]:
                    r = LevelResult(lv, SKIP, f"torch: building the {lv} graph raised {error}", fired, declined)
                else:
                    r = LevelResult(lv, "graph_error", f"the rewritten graph raised {error}\n{_tail(tb)}", fired, declined)
            else:
                assert got is not None
                msg = _compare(ref, got, aliasing)
                r = LevelResult(lv, "mismatch" if msg else OK, msg or "", fired, declined)
            if cap.compiles > 1:
                r.message += f" (note: {cap.compiles} compiles)"
            results[lv] = r
    finally:
        torch._dynamo.reset()
    return results


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
