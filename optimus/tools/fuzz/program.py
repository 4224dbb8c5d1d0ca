"""Fuzz programs: inputs, statements and cases, written as Python source.

A ``Case`` is a small program (``def f(x0, x1, w0, b0): ...``) with its inputs
(``InputSpec``: data inputs ``x<i>``, parameters ``w<i>``, buffers ``b<i>``) and run flags;
``combine`` joins several into one program computing them side by side. A statement may
run inside grad-mode, inference-mode and autocast regions (``Stmt.ctx``): the source
shows them as ``with`` blocks (or a bare ``torch.set_grad_enabled(flag)`` call and the
call that restores the mode).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import linecache
import re
from typing import Any, Callable, Sequence

import torch


LEVELS: tuple[str, ...] = ("torch_ir", "aten_ir")
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}
FAMILIES: tuple[str, ...] = (
    "split",
    "getitem",
    "cat",
    "stack",
    "unbind",
    "slice",
    "select",
    "view",
    "permute",
    "squeeze",
    "unary",
    "binary",
    "inplace",
    "clone",
    "einsum",
    "linear",
    "norm",
    "cast",
    "state",
    "invalid",
)
# Variables of a program: data inputs x0, x1, ..., parameters w0, ..., buffers b0, ...
# and locals v0, v1, ...
_NAME = re.compile(r"\b[xvwb]\d+\b")
RTOL, ATOL = 1e-4, 1e-5
_REDUCES = re.compile(r"linear\(|matmul\(|mm\(| @ |layer_norm\(|einsum\(")
# Programs computing in bfloat16 (autocast regions, casts) are compared with these.
LOW_RTOL, LOW_ATOL = 3e-2, 3e-2

# What an argument is. ``input``: data that requires grad when the case runs with
# gradients; ``data``: data that never does (a batch fed to a training step); ``param``: an
# ``nn.Parameter`` of the program's module, trained (requires grad with gradients);
# ``frozen``: a parameter with ``requires_grad=False``; ``buffer``: a module buffer (state
# the program may update in place). Parameters and buffers persist from call to call.
ROLES: tuple[str, ...] = ("input", "data", "param", "frozen", "buffer")
STATE_ROLES: frozenset[str] = frozenset({"param", "frozen", "buffer"})
PREFIXES = {"input": "x", "data": "x", "param": "w", "frozen": "w", "buffer": "b"}
# A ``Stmt.ctx`` entry starting with this is a bare call (``torch.set_grad_enabled(False)``)
# whose region ends with the call restoring the mode, not a ``with`` block.
BARE = "call:"



@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One argument of a case: name, shape, dtype, the seed of its random values, and its
    role (``ROLES``: a data input, a parameter, a frozen parameter or a buffer).
    ``upcast``: the value is made as for ``dtype`` and then held in float64 (the copy the
    fp64 reference runs on, as PyTorch's benchmark harness makes one)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    seed: int = 0
    role: str = "input"
    upcast: bool = False

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")

    @property
    def state(self) -> bool:
        """A parameter or buffer: made once, the same object on every call."""
        return self.role in STATE_ROLES

    def requires_grad(self, grad: bool) -> bool:
        """Whether the argument requires grad in a case run with (``grad``) or without gradients."""
        return grad and self.role in ("input", "param")

    def make(self, grad: bool = False, call: int = 0) -> torch.Tensor:
        """The argument's value: from its seed, and for data inputs of later calls from
        the seed and the call (fresh data each call); a parameter is an ``nn.Parameter``."""
        seed = self.seed if call == 0 or self.state else (self.seed * 1_000_003 + call) % 2**31
        g = torch.Generator().manual_seed(seed)
        t = torch.randn(tuple(self.shape), generator=g, dtype=torch.float32).to(DTYPES[self.dtype])
        if self.upcast:
            t = t.to(torch.float64)
        if self.role in ("param", "frozen"):
            return torch.nn.Parameter(t, requires_grad=self.requires_grad(grad))
        return t.requires_grad_(self.requires_grad(grad))

    def meta(self) -> torch.Tensor:
        return torch.empty(tuple(self.shape), dtype=DTYPES[self.dtype], device="meta")

    def __str__(self) -> str:
        role = "" if self.role == "input" else f", {self.role}"
        return f"{self.name}: {tuple(self.shape)} {self.dtype} (seed {self.seed}{role})"


@dataclasses.dataclass(frozen=True)
class Stmt:
    """One line of a program. ``defs`` are the names it assigns (``v3`` or ``v4, v5``);
    the names it reads are found in the text (inputs ``x<i>``/``w<i>``/``b<i>``, locals
    ``v<i>``). ``ctx``: the context managers it runs under, outermost first
    (``("torch.no_grad()", "torch.enable_grad()")``); consecutive statements under one
    prefix share its blocks."""

    text: str
    defs: tuple[str, ...] = ()
    family: str = "other"
    inplace: bool = False
    ctx: tuple[str, ...] = ()

    @property
    def uses(self) -> tuple[str, ...]:
        rhs = self.text.split(" = ", 1)[1] if self.defs else self.text
        return tuple(dict.fromkeys(_NAME.findall(rhs)))

    def renamed(self, mapping: dict[str, str]) -> "Stmt":
        return dataclasses.replace(self, text=_rename(self.text, mapping), defs=tuple(mapping.get(d, d) for d in self.defs))


def _rename(text: str, mapping: dict[str, str]) -> str:
    return _NAME.sub(lambda m: mapping.get(m.group(0), m.group(0)), text)


@dataclasses.dataclass(frozen=True)
class Case:
    """A generated program: inputs, statements, returned expressions and run flags.

    ``grad``: inputs require grad and gradients are compared (programs whose in-place
    writes autograd rejects run without). ``dynamic``: ``torch.compile(dynamic=True)``.
    ``raw_source`` replaces the statements (a pasted reproducer).
    """

    inputs: tuple[InputSpec, ...]
    stmts: tuple[Stmt, ...] = ()
    outputs: tuple[str, ...] = ()
    grad: bool = True
    dynamic: bool = False
    seed: int = 0
    index: int = 0
    raw_source: str | None = None

    @property
    def label(self) -> str:
        return f"seed {self.seed}, case {self.index}"

    def source(self) -> str:
        if self.raw_source is not None:
            return self.raw_source
        lines = [f"def f({', '.join(s.name for s in self.inputs)}):"]
        lines += render_body(self.stmts)
        outs = ", ".join(self.outputs) + ("," if len(self.outputs) == 1 else "")
        lines.append(f"    return ({outs})")
        return "\n".join(lines) + "\n"

    def function(self) -> Callable[..., Any]:
        return _function_from_source(self.source(), f"seed{self.seed}_case{self.index}")

    def families(self) -> collections.Counter:
        return collections.Counter(s.family for s in self.stmts)

    @property
    def low_precision(self) -> bool:
        """The program computes in bfloat16 (an autocast region or a cast): compared with
        ``LOW_RTOL``/``LOW_ATOL``."""
        src = self.source()
        return "autocast" in src or "bfloat16" in src

    @property
    def reduces(self) -> bool:
        """The program sums products or normalizes (matmuls, linears, layer_norm, einsum):
        compared with ``MATH`` tolerances, as reassociated sums differ in the last bits."""
        return bool(_REDUCES.search(self.source()))

    def in_fp64(self) -> "Case":
        """This case with every argument held in float64 (values made as before, then
        upcast): the program PyTorch's benchmark harness would take as its fp64 reference."""
        return dataclasses.replace(self, inputs=tuple(dataclasses.replace(s, upcast=True) for s in self.inputs))

    @property
    def has_state(self) -> bool:
        return any(spec.state for spec in self.inputs)


def _grad_mode(entries: Sequence[str]) -> bool:
    """The grad mode inside ``entries`` (the caller's is on: the oracle calls with grad enabled)."""
    mode = True
    for e in entries:
        e = e[len(BARE) :] if e.startswith(BARE) else e
        if e.startswith(("torch.no_grad(", "torch.inference_mode()")):
            mode = False
        elif e.startswith("torch.enable_grad("):
            mode = True
        elif e.startswith("torch.set_grad_enabled("):
            mode = "True" in e
    return mode


def render_body(stmts: Sequence[Stmt], indent: int = 1) -> list[str]:
    """The function body's lines: each statement inside the blocks of its ``ctx``; a bare
    region is its call, its statements, and the call restoring the grad mode around it."""
    lines: list[str] = []
    open_: list[str] = []

    def pad() -> str:
        return "    " * (indent + sum(not e.startswith(BARE) for e in open_))

    def close_to(k: int) -> None:
        while len(open_) > k:
            e = open_.pop()
            if e.startswith(BARE):
                lines.append(f"{pad()}torch.set_grad_enabled({_grad_mode(open_)})")

    for s in stmts:
        k = 0
        while k < min(len(open_), len(s.ctx)) and open_[k] == s.ctx[k]:
            k += 1
        close_to(k)
        for e in s.ctx[k:]:
            lines.append(f"{pad()}{e[len(BARE):]}" if e.startswith(BARE) else f"{pad()}with {e}:")
            open_.append(e)
        lines.append(f"{pad()}{s.text}")
    close_to(0)
    return lines


_SOURCES: collections.deque = collections.deque()


def _function_from_source(src: str, tag: str) -> Callable[..., Any]:
    """``exec`` a program; its lines are registered with ``linecache`` for tracebacks."""
    digest = hashlib.sha1(src.encode()).hexdigest()[:10]
    filename = f"<optimus-fuzz {tag} {digest}>"
    if filename not in linecache.cache:
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        _SOURCES.append(filename)
        while len(_SOURCES) > 256:
            linecache.cache.pop(_SOURCES.popleft(), None)
    ns: dict[str, Any] = {"torch": torch, "F": torch.nn.functional}
    exec(compile(src, filename, "exec"), ns)
    fn = ns.get("f")
    if not callable(fn):
        raise ValueError("the program must define a function named f")
    return fn


def combine(cases: Sequence[Case]) -> Case:
    """One program computing every case side by side (names renumbered, outputs joined)."""
    if len(cases) == 1:
        return cases[0]
    inputs: list[InputSpec] = []
    stmts: list[Stmt] = []
    outputs: list[str] = []
    counts: collections.Counter = collections.Counter()
    nv = 0
    for c in cases:
        if c.raw_source is not None:
            raise ValueError("cannot combine a case given as raw source")
        mapping: dict[str, str] = {}
        for spec in c.inputs:
            prefix = spec.name[0]
            mapping[spec.name] = f"{prefix}{counts[prefix]}"
            inputs.append(dataclasses.replace(spec, name=mapping[spec.name]))
            counts[prefix] += 1
        for s in c.stmts:
            for d in s.defs:
                mapping[d] = f"v{nv}"
                nv += 1
        stmts += [s.renamed(mapping) for s in c.stmts]
        outputs += [_rename(o, mapping) for o in c.outputs]
    first = cases[0]
    return Case(tuple(inputs), tuple(stmts), tuple(outputs), first.grad, first.dynamic, first.seed, first.index)
