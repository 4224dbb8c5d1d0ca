"""The safety net: nothing Optimus does may break a compile or change what a user observes.

Three guards, used by ``optimus.compile.Session``:

* ``HookPass`` - what Optimus installs in each Inductor hook: the user's own passes (from
  Inductor's config or the compile's ``options``) run first, then Optimus's. Chained,
  never replaced; the cache identity covers both. A user's pass that raises is marked as
  theirs (``user_error``) so no guard mistakes it for an Optimus failure.
* ``GraphLadder`` - Inductor's per-graph compiler (``compile_fx_inner``) wrapped so that
  each forward, backward or inference graph, also one AOTAutograd compiles lazily at the
  first ``backward()``, compiles with every Optimus level, else without the Inductor-IR
  passes, else without any Optimus pass; the graph is restored from a snapshot between
  attempts and the report says which graph fell back, from what, and which rules had
  changed it. Only an error without any Optimus pass reaches the user (Inductor's own).
  The ladder never changes a graph's inputs or outputs, so a forward compiled with a pass
  and a backward compiled without it still fit together.
* ``OutputGuard`` - the compiled program's first call: if it raises, the graph is
  compiled again without Optimus and called again (unless the graph writes its inputs in
  place: a second run could apply a write twice); and its outputs are checked against the
  aliasing eager would show (from the traced graph's fake tensors): an output that shares
  storage with an input or another output where eager's did not is copied on every call.

Dynamo's and AOTAutograd's control-flow exceptions (restart the analysis, skip a frame,
tensorify a scalar) pass through all of them untouched.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import logging
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from . import torch_api
from .core.snapshot import restore, snapshot
from .core.passkey import PASS_BASES, UuidKeyed

log = logging.getLogger("optimus")

# The graph Inductor is compiling now ("forward 0", "backward 0", "inference 1", ...), set
# by the ladder around each per-graph compile so every level's report names it the same.
GRAPH_KIND: contextvars.ContextVar[str | None] = contextvars.ContextVar("optimus_graph_kind", default=None)

_USER_MARK = "_optimus_user_pass"


# ------------------------------------------------------------------ errors
def user_error(e: BaseException) -> str | None:
    """The user pass that raised ``e`` (or an exception it caused), if one did."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [e]
    while stack:
        x = stack.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        mark = getattr(x, _USER_MARK, None)
        if mark:
            return str(mark)
        stack += [x.__cause__, x.__context__, getattr(x, "inner_exception", None)]
    return None


def passthrough(e: BaseException) -> bool:
    """Is ``e`` one of Dynamo's control-flow signals (to be re-raised untouched)?"""
    return isinstance(e, torch_api.passthrough_exceptions())


def brief(e: BaseException, limit: int = 240) -> str:
    """``Type: first line of the message`` (Inductor wraps its errors; unwrap one level)."""
    inner = getattr(e, "inner_exception", None)
    if isinstance(inner, BaseException):
        e = inner
    text = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {text[:limit]}"


# ------------------------------------------------------------------ chained hooks
def _name(p: Any) -> str:
    return getattr(p, "__qualname__", None) or type(p).__qualname__


def _code_identity(p: Any) -> str:
    """A stand-in identity for a user pass without ``uuid()``: its qualified name and code."""
    import inspect

    target = p if callable(p) and hasattr(p, "__code__") else type(p)
    try:
        src = inspect.getsource(target)
    except (OSError, TypeError):
        src = repr(getattr(target, "__code__", target))
    return hashlib.sha256(f"{_name(p)}:{src}".encode()).hexdigest()[:16]


class HookPass(UuidKeyed, *PASS_BASES):  # type: ignore[misc]
    """One Inductor hook's value under Optimus: the user's passes, then Optimus's.

    Graph hooks (``pre_grad_custom_pass``, ``post_grad_custom_pre_pass``) mutate the graph
    and return ``None``; scheduler hooks take and return the node list. ``uuid()`` combines
    every chained pass's uuid; it is ``None`` when a user pass has none, which makes
    Inductor bypass its FX graph cache exactly as it would for that pass alone.
    """

    def __init__(self, hook: str, user: Sequence[Any], ours: Callable[..., Any] | None) -> None:
        self.hook = hook
        self.user = list(user)
        self.ours = ours

    def __call__(self, arg: Any, is_inference: bool | None = None) -> Any:  # type: ignore[override]
        scheduler = self.hook in torch_api.SCHEDULER_HOOKS
        for p in self.user:
            try:
                if torch_api.inference_aware(p):
                    current = GRAPH_KIND.get() or ""
                    result = p(arg, is_inference=bool(is_inference) if is_inference is not None else current.startswith("inference"))
                else:
                    result = p(arg)
            except Exception as e:
                setattr(e, _USER_MARK, f"{self.hook} = {_name(p)}")
                if hasattr(e, "add_note"):
                    e.add_note(f"[optimus] raised by your {self.hook} pass {_name(p)!r}; Optimus runs it before its own passes and did not catch it")
                raise
            if scheduler:
                arg = result
        if self.ours is not None:
            result = self.ours(arg)
            if scheduler:
                arg = result
        return arg if scheduler else None

    def uuid(self) -> Any:
        parts = []
        for p in self.user:
            u = torch_api.pass_uuid(p)
            if u is None:
                return None
            parts.append(str(u))
        ours = torch_api.pass_uuid(self.ours) if self.ours is not None else "-"
        return f"{self.hook}|user:{','.join(parts)}|optimus:{ours}"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # torch 2.11 pickles some hooks into its cache key: never pickle as "None"
        ident = self.uuid() or f"{self.hook}|user-code:{','.join(_code_identity(p) for p in self.user)}|optimus:{torch_api.pass_uuid(self.ours)}"
        from .core.passkey import _restored_pass

        return (_restored_pass, (ident,))


def hook_patches(user: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """Config patches for every hook that has a user pass or an Optimus pass: Optimus's
    pass alone where the user set nothing there, else both chained (``HookPass``)."""
    patches: dict[str, Any] = {}
    for hook in torch_api.HOOKS:
        mine = ours.get(hook)
        if mine is None:
            if hook in user:
                patches[hook] = user[hook]
        elif hook in user:
            patches[hook] = HookPass(hook, torch_api.as_pass_list(user[hook]), mine)
        else:
            patches[hook] = mine
    return patches


# ------------------------------------------------------------------ per-graph ladder
class GraphLadder:
    """``inner_compile`` for ``compile_fx``: each graph compiles with as much of Optimus as
    works.

    ``attempts`` are ``(label, patches)`` from most to least Optimus ("with every Optimus
    level", "without the Inductor-IR passes", "without any Optimus pass"); each attempt's
    patches keep the user's own passes. ``report`` receives a note per fallback, and the
    graph reports the failed attempt wrote are marked discarded.
    """

    def __init__(self, attempts: list[tuple[str, dict[str, Any]]], report: Any, name_graph: Callable[[str], str]) -> None:
        self.attempts = attempts
        self.report = report
        self.name_graph = name_graph

    def __call__(self, gm: fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        kind = "backward" if kwargs.get("is_backward") else ("inference" if kwargs.get("is_inference") else "forward")
        name = self.name_graph(kind)
        record = snapshot(gm.graph)
        token = GRAPH_KIND.set(name)
        try:
            for i, (label, patches) in enumerate(self.attempts):
                mark = len(self.report.graphs)
                try:
                    with torch_api.patched(patches):
                        return torch_api.compile_fx_inner(gm, example_inputs, **kwargs)
                except Exception as e:
                    if i == len(self.attempts) - 1 or passthrough(e) or user_error(e):
                        raise
                    restore(gm.graph, record)
                    gm.recompile()
                    self._fell_back(name, label, self.attempts[i + 1][0], e, self.report.graphs[mark:])
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            GRAPH_KIND.reset(token)

    def _fell_back(self, name: str, failed: str, then: str, e: BaseException, graphs: list[Any]) -> None:
        discard(self.report, graphs, f"{name}: compiling {failed} failed ({brief(e)}); compiled again {then}")


def discard(report: Any, graphs: list[Any], why: str) -> str:
    """The safety net threw away the rewrites of ``graphs`` (their compiled program was
    replaced by one built with fewer or no Optimus passes): mark each discarded, so the
    report's counts describe the program that runs, and say which rules had changed them,
    in the report's notes and the ``optimus`` log. Returns the note."""
    changed = sorted({f"{rule} ({g.level} {g.graph})" for g in graphs if not g.discarded for rule, s in g.rules.items() if s.matched})
    for g in graphs:
        g.discarded = g.discarded or why
    note = why
    if changed:
        note += f". Rewrites thrown away: {', '.join(changed)}"
    report.notes.append(note)
    log.warning("optimus: %s", note)
    return note


# ------------------------------------------------------------------ first call + aliasing
def _storage(t: Any) -> Any:
    from torch.multiprocessing.reductions import StorageWeakRef

    if not isinstance(t, torch.Tensor):
        return None
    try:
        return StorageWeakRef(t.untyped_storage())
    except Exception:  # sparse, nested, ...: not judged
        return None


@dataclasses.dataclass(frozen=True)
class EagerOutputs:
    """What eager's outputs are, read from the traced graph's fake values before any
    rewrite: which share storage with an input or another output (``(output,
    "input"|"output", index)``), and whether each needs a gradient (``None`` where a
    value is not a tensor or unknown)."""

    aliasing: frozenset[tuple[int, str, int]]
    requires_grad: tuple[bool | None, ...]


def _example(n: Any) -> Any:
    if not isinstance(n, fx.Node):
        return None
    return n.meta.get("example_value", n.meta.get("val"))


def eager_outputs(gm: fx.GraphModule) -> EagerOutputs | None:
    """``EagerOutputs`` of the traced graph; ``None`` where it has no fake values to tell."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out_node = next((n for n in reversed(gm.graph.nodes) if n.op == "output"), None)
    if out_node is None:
        return None
    outs = out_node.args[0]
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    in_st = [_storage(_example(p)) for p in placeholders]
    out_st = [_storage(_example(o)) for o in outs]
    if all(s is None for s in out_st):
        return None
    pairs: set[tuple[int, str, int]] = set()
    for i, s in enumerate(out_st):
        if s is None:
            continue
        pairs |= {(i, "input", j) for j, t in enumerate(in_st) if t is not None and t == s}
        pairs |= {(i, "output", k) for k, t in enumerate(out_st) if k != i and t is not None and t == s}
    grads = tuple(v.requires_grad if isinstance(v, torch.Tensor) else None for v in map(_example, outs))
    return EagerOutputs(frozenset(pairs), grads)


def grad_mismatches(outputs: Sequence[Any], eager: EagerOutputs) -> list[str]:
    """The outputs whose ``requires_grad`` differs from eager's, described."""
    if len(outputs) != len(eager.requires_grad):
        return []
    return [
        f"output {i} {'needs' if want else 'does not need'} a gradient in eager but {'does not' if want else 'does'} here"
        for i, (t, want) in enumerate(zip(outputs, eager.requires_grad))
        if want is not None and isinstance(t, torch.Tensor) and t.requires_grad != want
    ]


def _ptr(t: Any) -> int | None:
    if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.layout != torch.strided:
        return None
    try:
        return t.untyped_storage().data_ptr()
    except Exception:
        return None


def new_aliases(inputs: Sequence[Any], outputs: Sequence[Any], eager: set[tuple[int, str, int]]) -> list[tuple[int, str, int]]:
    """Aliasing in the compiled program's outputs that eager's did not have."""
    in_ptr = [_ptr(x) for x in inputs]
    out_ptr = [_ptr(y) for y in outputs]
    found: list[tuple[int, str, int]] = []
    for i, p in enumerate(out_ptr):
        if p is None:
            continue
        for j, q in enumerate(in_ptr):
            if q == p and (i, "input", j) not in eager:
                found.append((i, "input", j))
        for k in range(i):
            if out_ptr[k] == p and (i, "output", k) not in eager and (k, "output", i) not in eager:
                found.append((i, "output", k))
    return found


class OutputGuard:
    """The compiled callable Dynamo receives: first call guarded, outputs kept as eager's.

    On the first call: if the program raises, or returns an output whose ``requires_grad``
    differs from eager's (a rewrite changed what autograd sees), the graph is compiled
    again without Optimus (``recompile``), ``discard`` is told why (the report marks the
    graphs whose rewrites are thrown away), and it is called again. Outputs sharing
    storage where eager's did not are copied on every call; a copy keeps eager's autograd
    (a clone recorded by autograd where the output needs a gradient, a detached one where
    it does not).
    """

    def __init__(
        self,
        compiled: Callable[..., Any],
        recompile: Callable[[], Callable[..., Any]] | None,
        eager: EagerOutputs | set[tuple[int, str, int]] | None,
        note: Callable[[str], None],
        may_rerun: bool,
        discard: Callable[[str], None] | None = None,
    ) -> None:
        self.compiled = compiled
        self._recompile = recompile
        if isinstance(eager, (set, frozenset)):
            eager = EagerOutputs(frozenset(eager), ())
        self._eager = eager
        self._note = note
        self._discard = discard or self._note_and_log
        self._may_rerun = may_rerun
        self._first = True
        self._copy: tuple[int, ...] = ()

    def __getattr__(self, name: str) -> Any:  # attributes AOTAutograd put on the function
        if name == "_boxed_call":
            # Dynamo calls a backend's result with positional arguments; the flag that
            # AOTAutograd's wrapper copies from its inner function does not apply here
            raise AttributeError(name)
        return getattr(self.__dict__["compiled"], name)

    def __call__(self, *args: Any) -> Any:
        if self._first:
            return self._first_call(args)
        out = self.compiled(*args)
        if self._copy:
            out = self._copied(out)
        return out

    def _copied(self, out: Any) -> Any:
        out = list(out)
        grads = self._eager.requires_grad if self._eager is not None else ()
        for i in self._copy:
            want = grads[i] if i < len(grads) else None
            if want is False:
                out[i] = out[i].detach().clone()
            else:
                with torch.enable_grad() if want else contextlib.nullcontext():
                    out[i] = out[i].clone()
        return tuple(out)

    def _note_and_log(self, why: str) -> None:
        self._note(why)
        log.warning("optimus: %s", why)

    def _rerun_without_optimus(self, why: str, args: tuple[Any, ...]) -> Any:
        self._discard(f"{why}; compiled again without any Optimus pass")
        assert self._recompile is not None
        self.compiled = self._recompile()
        return self.compiled(*args)

    def _first_call(self, args: tuple[Any, ...]) -> Any:
        inputs = list(args)
        try:
            out = self.compiled(*args)
        except Exception as e:
            if self._recompile is None or passthrough(e) or user_error(e):
                raise
            if not self._may_rerun:
                self._discard(f"the first call of a graph compiled with Optimus raised ({brief(e)}); not re-run without Optimus because the graph writes its inputs in place")
                raise
            out = self._rerun_without_optimus(f"the first call of a graph compiled with Optimus raised ({brief(e)})", tuple(inputs))
        else:
            wrong = grad_mismatches(out, self._eager) if self._eager is not None and isinstance(out, (list, tuple)) else []
            if wrong:
                why = f"the first call of a graph compiled with Optimus returned outputs whose autograd differs from eager's ({'; '.join(wrong[:3])})"
                if self._recompile is not None and self._may_rerun:
                    out = self._rerun_without_optimus(why, tuple(inputs))
                else:
                    self._discard(f"{why}; not re-run because the graph writes its inputs in place")
        self._first = False
        self._recompile = None  # drop the snapshot it holds
        if self._eager is not None and isinstance(out, (list, tuple)):
            found = new_aliases(inputs, out, set(self._eager.aliasing))
            if found:
                self._copy = tuple(sorted({i for i, _, _ in found}))
                desc = ", ".join(f"output {i} shares storage with {what} {j}" for i, what, j in found)
                self._note(f"compiled outputs alias where eager's do not ({desc}); those outputs are copied on every call, as eager returns fresh tensors")
                out = self._copied(out)
        return out


def mutates_inputs(gm: fx.GraphModule) -> bool:
    """Could the traced graph write one of its inputs in place? (An in-place op whose
    written argument shares storage with an input, judged from the fake values; an
    in-place op without values to judge counts as a write.)"""
    inputs = {_storage(n.meta.get("example_value", n.meta.get("val"))) for n in gm.graph.nodes if n.op == "placeholder"}
    inputs.discard(None)
    for n in gm.graph.nodes:
        if n.op not in ("call_function", "call_method"):
            continue
        name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
        schema = getattr(n.target, "_schema", None)
        written: list[Any] = []
        if schema is not None:
            written = [a for a, s in zip(n.args, schema.arguments) if s.alias_info is not None and s.alias_info.is_write]
        elif isinstance(name, str) and name.endswith("_") and not name.startswith("_") and n.args:
            written = [n.args[0]]
        if n.kwargs.get("out") is not None:
            written.append(n.kwargs["out"])
        for w in written:
            if not isinstance(w, fx.Node):
                continue
            st = _storage(w.meta.get("example_value", w.meta.get("val")))
            if st is None or st in inputs:
                return True
    return False
