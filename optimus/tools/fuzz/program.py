"""Fuzz programs: inputs, statements and cases, written as Python source.

A ``Case`` is a small program (``def f(x0, x1): ...``) with its inputs (``InputSpec``)
and run flags; ``combine`` joins several into one program computing them side by side.
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
    "invalid",
)
# Variables of a program: inputs x0, x1, ... and locals v0, v1, ...
_NAME = re.compile(r"\b[xv]\d+\b")
RTOL, ATOL = 1e-4, 1e-5



@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One argument of a case: name, shape, dtype and the seed of its random values."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    seed: int = 0

    def make(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed)
        return torch.randn(tuple(self.shape), generator=g, dtype=torch.float32).to(DTYPES[self.dtype])

    def meta(self) -> torch.Tensor:
        return torch.empty(tuple(self.shape), dtype=DTYPES[self.dtype], device="meta")

    def __str__(self) -> str:
        return f"{self.name}: {tuple(self.shape)} {self.dtype} (seed {self.seed})"


@dataclasses.dataclass(frozen=True)
class Stmt:
    """One line of a program. ``defs`` are the names it assigns (``v3`` or ``v4, v5``);
    the names it reads are found in the text (inputs ``x<i>``, locals ``v<i>``)."""

    text: str
    defs: tuple[str, ...] = ()
    family: str = "other"
    inplace: bool = False

    @property
    def uses(self) -> tuple[str, ...]:
        rhs = self.text.split(" = ", 1)[1] if self.defs else self.text
        return tuple(dict.fromkeys(_NAME.findall(rhs)))

    def renamed(self, mapping: dict[str, str]) -> "Stmt":
        return Stmt(_rename(self.text, mapping), tuple(mapping.get(d, d) for d in self.defs), self.family, self.inplace)


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
        lines += [f"    {s.text}" for s in self.stmts]
        outs = ", ".join(self.outputs) + ("," if len(self.outputs) == 1 else "")
        lines.append(f"    return ({outs})")
        return "\n".join(lines) + "\n"

    def function(self) -> Callable[..., Any]:
        return _function_from_source(self.source(), f"seed{self.seed}_case{self.index}")

    def families(self) -> collections.Counter:
        return collections.Counter(s.family for s in self.stmts)


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
    nx = nv = 0
    for c in cases:
        if c.raw_source is not None:
            raise ValueError("cannot combine a case given as raw source")
        mapping: dict[str, str] = {}
        for spec in c.inputs:
            mapping[spec.name] = f"x{nx}"
            inputs.append(dataclasses.replace(spec, name=f"x{nx}"))
            nx += 1
        for s in c.stmts:
            for d in s.defs:
                mapping[d] = f"v{nv}"
                nv += 1
        stmts += [s.renamed(mapping) for s in c.stmts]
        outputs += [_rename(o, mapping) for o in c.outputs]
    first = cases[0]
    return Case(tuple(inputs), tuple(stmts), tuple(outputs), first.grad, first.dynamic, first.seed, first.index)
