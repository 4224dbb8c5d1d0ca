"""Differential fuzzer for the canonicalization and vertical rules (``optimus fuzz``).

Every case is a small random program, written as Python source::

    def f(x0, x1):
        v0 = x0.split([1, 3], dim=-1)
        v1 = torch.cat([v0[1], x1, v0[0]], 1)
        v2 = v1.view(3, 2, -1).relu()
        ...
        return (v2, v0[1])

built from a pool of live tensors with split / chunk / cat / stack / unbind / getitem /
slice / select / view / reshape / flatten / permute / transpose / squeeze / unsqueeze /
pointwise ops, in every spelling the Torch-IR view reads (keyword and positional, negative
dims, ``torch.concat(..., axis=)``), with shapes that make split sizes not divide, chunks
empty, slices run out of range, and in-place writes to intermediates, views and chunks.

Each case runs eagerly (the reference) and through ``torch.compile`` with a backend that
rewrites the captured graph with every registered ``canonicalize`` and ``vertical`` rule
(``passes="vertical"``) at both levels:

* **Torch-IR**: ``optimus.optimize(gm, level="torch_ir")`` on Dynamo's graph, which then
  runs eagerly (autograd supplies gradients);
* **Aten-IR**: ``aot_autograd`` with Inductor's decompositions and forward/backward
  compilers that call ``optimus.optimize(gm, level="aten_ir")``.

Outputs, input gradients, inputs written in place and (at Torch-IR) which outputs alias
which inputs must equal eager's; the report must hold no rule errors, level rollbacks or
exhausted rewrite budgets. A failing case is shrunk (statements, outputs, inputs, flags,
shapes) and printed as a reproducer ready to paste into a test.

Speed: Dynamo and AOTAutograd cost a few hundred milliseconds per compile, mostly fixed.
So one compile serves both levels (the backend builds both rewritten versions and a
switch picks one per call), and several cases are compiled together as one function
(``batch``); a batch that fails is re-run case by case to find the culprit.

Command line: ``optimus fuzz --cases N --seed S`` (also ``python -m optimus.fuzz``);
library: ``fuzz(...)``, ``generate(seed, index)``, ``check_case(...)``, ``check_source(...)``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import hashlib
import io
import json
import linecache
import logging
import math
import random
import re
import sys
import time
import traceback
import warnings
from typing import Any, Callable, Iterator, Sequence

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


# ============================================================================ programs
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


# =========================================================================== generator
class _Reject(Exception):
    """The generator's current step does not fit the pool; try another."""


@dataclasses.dataclass
class _Val:
    """A tensor the program can use: a variable, or one chunk of a tuple variable."""

    name: str  # the variable, or the canonical expression of a chunk (``v3[1]``)
    meta: torch.Tensor
    kind: str  # "input", "fresh" (a new buffer), "view", "chunk"
    root: str  # the variable whose storage it shares
    multi: bool = False  # derived from a multi-output view (split/chunk/unbind output)
    tuple_name: str | None = None
    pos: int = 0
    count: int = 0

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.meta.shape)

    @property
    def rank(self) -> int:
        return self.meta.dim()

    @property
    def var(self) -> str:
        return self.tuple_name or self.name


@dataclasses.dataclass
class _Group:
    """The chunks of one split/chunk/unbind, in order."""

    op: str  # "split" or "unbind"
    dim: int  # non-negative dim of the source
    chunks: list[_Val]
    tuple_name: str | None
    source: _Val


class _Gen:
    """Builds one random program, checking every statement on meta tensors as it goes."""

    def __init__(self, seed: int, index: int) -> None:
        self.seed, self.index = seed, index
        self.rng = random.Random(seed * 1_000_003 + index)
        self.ns: dict[str, Any] = {"torch": torch, "F": torch.nn.functional}
        self.stmts: list[Stmt] = []
        self.vals: list[_Val] = []
        self.groups: list[_Group] = []
        self.nvar = 0
        self.grad = True
        self.last_cat: tuple[list[torch.Tensor], int, bool] = ([], 0, False)  # pieces, dim, stack

    # ------------------------------------------------------------------ plumbing
    def new(self) -> str:
        name = f"v{self.nvar}"
        self.nvar += 1
        return name

    def run(self, text: str) -> None:
        try:
            exec(text, self.ns)
        except (RuntimeError, IndexError, ValueError, TypeError, NotImplementedError) as e:
            raise _Reject(str(e)) from None

    def eval(self, expr: str) -> Any:
        try:
            return eval(expr, self.ns)
        except (RuntimeError, IndexError, ValueError, TypeError, NotImplementedError) as e:
            raise _Reject(str(e)) from None

    def emit(self, text: str, defs: Sequence[str] = (), family: str = "other", inplace: bool = False) -> None:
        self.run(text)
        self.stmts.append(Stmt(text, tuple(defs), family, inplace))

    def assign(self, rhs: str, family: str, kind: str, root: str | None = None, multi: bool = False) -> _Val:
        """``vN = rhs``; returns the new tensor."""
        name = self.new()
        self.emit(f"{name} = {rhs}", [name], family)
        meta = self.ns[name]
        if not isinstance(meta, torch.Tensor):
            raise _Reject("not a tensor")
        if meta.dim() > 5 or meta.numel() > 4096:
            raise _Reject("too big")
        v = _Val(name, meta, kind, root or name, multi)
        self.vals.append(v)
        return v

    def attempt(self, step: Callable[[], Any]) -> bool:
        snap = (len(self.stmts), len(self.vals), len(self.groups), self.nvar)
        try:
            step()
            return True
        except _Reject:
            del self.stmts[snap[0] :]
            del self.vals[snap[1] :]
            del self.groups[snap[2] :]
            for i in range(snap[3], self.nvar):
                self.ns.pop(f"v{i}", None)
            self.nvar = snap[3]
            return False

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, pred: Callable[[_Val], bool] | None = None, avoid: Sequence[_Val] = ()) -> _Val:
        cands = [v for v in self.vals if (pred is None or pred(v)) and v not in avoid]
        if not cands:
            raise _Reject("no operand")
        n = len(cands)
        weights = [1.0 + 4.0 * (i >= n - 3) - 0.6 * (v.kind == "input") for i, v in enumerate(cands)]
        return self.rng.choices(cands, weights)[0]

    def expr(self, v: _Val) -> str:
        """How the program names ``v`` here (a chunk as ``t[i]`` or ``t[i - n]``)."""
        if v.tuple_name is None:
            return v.name
        i = v.pos - v.count if self.chance(0.25) else v.pos
        return f"{v.tuple_name}[{i}]"

    def dim(self, d: int, rank: int) -> int:
        """``d`` as written: non-negative or negative."""
        return d - rank if rank > 0 and self.chance(0.45) else d

    def dim_arg(self, d: int, name: str = "dim", default: int | None = None) -> str:
        """``, d`` or ``, dim=d`` (or nothing when ``d`` is the default)."""
        r = self.rng.random()
        if default is not None and d == default and r < 0.25:
            return ""
        if r < 0.6:
            return f", {d}"
        return f", {name}={d}"

    def ints(self, values: Sequence[int]) -> str:
        """A list or tuple literal."""
        inner = ", ".join(str(v) for v in values)
        if self.chance(0.7):
            return f"[{inner}]"
        return f"({inner}{',' if len(values) == 1 else ''})"

    # ------------------------------------------------------------------ program
    def build(self) -> Case:
        rng = self.rng
        self.grad = self.chance(0.8)
        dynamic = self.chance(0.15)
        inputs = self.make_inputs()
        for spec in inputs:
            self.ns[spec.name] = spec.meta()
            self.vals.append(_Val(spec.name, self.ns[spec.name], "input", spec.name))
        steps = rng.randint(2, 9)
        done = tries = 0
        while done < steps and tries < 80:
            tries += 1
            if self.attempt(self.step):
                done += 1
        invalid = self.chance(0.012)
        if invalid:
            self.attempt(self.invalid_op)
        outputs = self.choose_outputs()
        return Case(tuple(inputs), tuple(self.stmts), tuple(outputs), self.grad, dynamic, self.seed, self.index)

    def make_inputs(self) -> list[InputSpec]:
        rng = self.rng
        n = rng.choice([1, 1, 2, 2, 2, 3])
        rank = rng.choice([1, 2, 2, 3, 3, 3, 4])
        base = [rng.randint(1, 6) for _ in range(rank)]
        if self.chance(0.06):
            base[rng.randrange(rank)] = 0
        shapes = [base]
        for _ in range(n - 1):
            r = rng.random()
            if r < 0.4:
                shapes.append(list(base))
            elif r < 0.75:
                s = list(base)
                s[rng.randrange(rank)] = rng.randint(1, 6)
                shapes.append(s)
            else:
                shapes.append([rng.randint(1, 6) for _ in range(rng.randint(1, 4))])
        f64 = rng.randrange(n) if self.chance(0.06) else -1
        return [
            InputSpec(f"x{i}", tuple(s), "float64" if i == f64 else "float32", rng.randrange(2**31))
            for i, s in enumerate(shapes)
        ]

    def step(self) -> None:
        names = [
            "split", "cat", "stack", "unbind", "getitem", "slice", "select", "view", "permute",
            "squeeze", "unary", "binary", "inplace", "clone", "motif",
        ]  # fmt: skip
        weights = [12, 9, 4, 5, 2, 7, 4, 8, 6, 6, 7, 7, 4, 2, 22]
        if not self.groups:
            weights[names.index("cat")] = 4
        name = self.rng.choices(names, weights)[0]
        getattr(self, f"g_{name}")()

    def choose_outputs(self) -> list[str]:
        rng = self.rng
        used: set[str] = set()
        for s in self.stmts:
            used.update(s.uses)
        outs: list[str] = []
        sinks = [v for v in self.vals if v.kind != "input" and v.tuple_name is None and v.name not in used]
        for v in reversed(sinks):
            if len(outs) < 5:
                outs.append(v.name)
        for g in self.groups:  # a split nothing reads: return one of its chunks, usually
            if g.chunks and g.tuple_name and g.tuple_name not in used and self.chance(0.6):
                outs.append(self.expr(rng.choice(g.chunks)))
        chunks = [v for v in self.vals if v.kind == "chunk"]
        if chunks and self.chance(0.4):  # a chunk returned directly (often used elsewhere too)
            for v in rng.sample(chunks, min(len(chunks), rng.randint(1, 2))):
                outs.append(self.expr(v))
        tuples = sorted({v.tuple_name for v in chunks if v.tuple_name})
        if tuples and self.chance(0.06):
            outs.append(rng.choice(tuples))  # a whole tuple of chunks
        if self.chance(0.05):
            outs.append(rng.choice([v for v in self.vals if v.kind == "input"]).name)
        if not outs:
            outs.append(self.vals[-1].name if self.vals[-1].tuple_name is None else self.expr(self.vals[-1]))
        if self.chance(0.08):
            outs.append(rng.choice(outs))  # the same tensor returned twice
        rng.shuffle(outs)
        return outs

    # -------------------------------------------------------------- tuples
    def tuple_result(self, rhs: str, family: str, op: str, src: _Val, dim: int) -> _Group:
        """``vN = rhs`` (chunks read as ``vN[i]``) or ``va, vb = rhs`` (unpacked)."""
        value = self.eval(rhs)
        if not isinstance(value, (tuple, list)):
            raise _Reject("not a tuple")
        count = len(value)
        root, kind = src.root, "chunk"
        if 1 <= count <= 4 and self.chance(0.35):
            names = [self.new() for _ in range(count)]
            lhs = ", ".join(names) + ("," if count == 1 else "")
            self.emit(f"{lhs} = {rhs}", names, family)
            chunks = [_Val(n, self.ns[n], kind, root, True) for n in names]
            tuple_name = None
        else:
            tuple_name = self.new()
            self.emit(f"{tuple_name} = {rhs}", [tuple_name], family)
            value = self.ns[tuple_name]
            chunks = [_Val(f"{tuple_name}[{i}]", t, kind, root, True, tuple_name, i, count) for i, t in enumerate(value)]
        self.vals.extend(chunks)
        group = _Group(op, dim, chunks, tuple_name, src)
        self.groups.append(group)
        return group

    # -------------------------------------------------------------- families
    def g_split(self, src: _Val | None = None, dim: int | None = None) -> _Group:
        rng = self.rng
        t = src or self.pick(lambda v: v.rank >= 1)
        if t.rank < 1:
            raise _Reject("rank 0")
        r = t.rank
        d = dim if dim is not None else rng.randrange(r)
        size = t.shape[d]
        ds = self.dim(d, r)
        e = self.expr(t)
        mode = rng.choices(["int", "list", "chunk", "with_sizes"], [5, 5, 3, 1])[0]
        if mode == "int":
            divisors = [k for k in range(1, size + 1) if size % k == 0] or [1]
            k = rng.choice(divisors) if self.chance(0.5) else rng.randint(1, size + 2)
            rhs = rng.choice(
                [
                    f"{e}.split({k}{self.dim_arg(ds, default=0)})",
                    f"torch.split({e}, {k}{self.dim_arg(ds, default=0)})",
                    f"torch.split({e}, split_size_or_sections={k}, dim={ds})",
                    f"{e}.split(split_size={k}, dim={ds})",
                ]
            )
        elif mode in ("list", "with_sizes"):
            sizes = self.composition(size)
            lit = self.ints(sizes)
            if mode == "list":
                rhs = rng.choice(
                    [
                        f"{e}.split({lit}{self.dim_arg(ds, default=0)})",
                        f"torch.split({e}, {lit}{self.dim_arg(ds, default=0)})",
                        f"torch.split({e}, split_size_or_sections={lit}, dim={ds})",
                    ]
                )
            else:
                rhs = rng.choice(
                    [f"{e}.split_with_sizes({lit}{self.dim_arg(ds, default=0)})", f"torch.split_with_sizes({e}, {lit}, dim={ds})"]
                )
        else:
            n = rng.randint(1, size + 2)
            rhs = rng.choice(
                [
                    f"torch.chunk({e}, {n}{self.dim_arg(ds, default=0)})",
                    f"{e}.chunk({n}{self.dim_arg(ds, default=0)})",
                    f"torch.chunk({e}, chunks={n}, dim={ds})",
                ]
            )
        return self.tuple_result(rhs, "split", "split", t, d)

    def composition(self, size: int) -> list[int]:
        """Section sizes summing to ``size``; sometimes with empty sections."""
        rng = self.rng
        if size == 0:
            return [0] * rng.randint(1, 2)
        n = rng.randint(1, min(4, size + 1))
        if self.chance(0.15):
            cuts = sorted(rng.randint(0, size) for _ in range(n - 1))
        else:
            n = min(n, size)
            cuts = sorted(rng.sample(range(1, size), n - 1))
        bounds = [0, *cuts, size]
        return [b - a for a, b in zip(bounds, bounds[1:])]

    def g_unbind(self, src: _Val | None = None) -> _Group:
        rng = self.rng
        t = src or self.pick(lambda v: v.rank >= 1 and min(v.shape) <= 6)
        if t.rank < 1:
            raise _Reject("rank 0")
        d = rng.choice([i for i, s in enumerate(t.shape) if s <= 6] or [0])
        ds = self.dim(d, t.rank)
        e = self.expr(t)
        rhs = rng.choice(
            [f"{e}.unbind({ds})", f"torch.unbind({e}{self.dim_arg(ds, default=0)})", f"{e}.unbind(dim={ds})"]
            + ([f"{e}.unbind()"] if d == 0 else [])
        )
        return self.tuple_result(rhs, "unbind", "unbind", t, d)

    def g_getitem(self) -> None:
        groups = [g for g in self.groups if g.tuple_name and g.chunks]
        if not groups:
            raise _Reject("no tuple")
        g = self.rng.choice(groups)
        c = self.rng.choice(g.chunks)
        v = self.assign(self.expr(c), "getitem", "chunk", c.root, True)
        v.kind = "chunk"

    def cat_fn(self, items: str, d: int, stack: bool = False) -> str:
        rng = self.rng
        if stack:
            return rng.choice([f"torch.stack({items}{self.dim_arg(d, default=0)})", f"torch.stack({items}, dim={d})"])
        return rng.choice(
            [
                f"torch.cat({items}{self.dim_arg(d, default=0)})",
                f"torch.cat({items}{self.dim_arg(d, default=0)})",
                f"torch.concat({items}, axis={d})",
                f"torch.concat({items}{self.dim_arg(d, default=0)})",
                f"torch.concatenate({items}, axis={d})",
                f"torch.cat(tensors={items}, dim={d})",
            ]
        )

    def g_cat(self, stack: bool = False) -> _Val:
        if self.groups and self.chance(0.75):
            return self.cat_group(self.rng.choice(self.groups[-3:]), stack)
        return self.cat_pool(stack)

    def g_stack(self) -> _Val:
        return self.g_cat(stack=True)

    def cat_group(self, g: _Group, stack: bool = False, mode: str | None = None) -> _Val:
        """cat/stack of the chunks of one split: all in order (the identity, for a cat
        along the split dim or a stack of an unbind), shuffled, partial, repeated, with an
        extra tensor, or along another dim."""
        rng = self.rng
        chunks = g.chunks
        n = len(chunks)
        if n == 0:
            raise _Reject("no chunks")
        mode = mode or rng.choices(["all", "shuffle", "subset", "repeat", "extra"], [45, 20, 15, 10, 10])[0]
        order = list(range(n))
        if mode == "shuffle" and n > 1:
            while order == sorted(order):
                rng.shuffle(order)
        elif mode == "subset" and n > 1:
            a = rng.randrange(n)
            b = rng.randrange(a + 1, n + 1)
            if b - a == n:
                b -= 1
            order = order[a:b] or [0]
        elif mode == "repeat":
            order = order + [rng.randrange(n) for _ in range(rng.randint(1, 2))]
            rng.shuffle(order)
        crank = chunks[0].rank
        if stack:
            d = g.dim if g.op == "unbind" and self.chance(0.75) else rng.randrange(crank + 1)
            ds = self.dim(d, crank + 1)
        else:
            if crank < 1:
                raise _Reject("cat of scalars")
            d = g.dim if g.op == "split" and self.chance(0.75) else rng.randrange(crank)
            ds = self.dim(d, crank)
        items = [self.expr(chunks[i]) for i in order]
        if mode == "extra":
            ref = chunks[order[0]]

            def fits(v: _Val) -> bool:
                if v.rank != ref.rank:
                    return False
                return all(a == b for i, (a, b) in enumerate(zip(v.shape, ref.shape)) if stack or i != d)

            other = [v for v in self.vals if fits(v) and v.var != g.tuple_name and v not in chunks]
            extra = self.expr(rng.choice(other)) if other else self.expr(ref)
            items.insert(rng.choice([0, len(items)]), extra)
        self.last_cat = ([self.eval(i) for i in items], d, stack)
        lst = "[" + ", ".join(items) + "]"
        if mode == "all" and g.tuple_name and self.chance(0.45):
            lst = rng.choice([g.tuple_name, f"list({g.tuple_name})", f"[*{g.tuple_name}]"])
        elif mode == "subset" and g.tuple_name and order and order[-1] == n - 1 and self.chance(0.4):
            lst = f"{g.tuple_name}[{order[0]}:]"
        elif mode == "extra" and g.tuple_name and self.chance(0.3):
            lst = f"[*{g.tuple_name}, {items[-1] if items[0] == self.expr(chunks[0]) else items[0]}]"
        return self.assign(self.cat_fn(lst, ds, stack), "stack" if stack else "cat", "fresh")

    def cat_pool(self, stack: bool = False) -> _Val:
        rng = self.rng
        a = self.pick(lambda v: v.rank >= (0 if stack else 1))
        d = rng.randrange(a.rank + (1 if stack else 0))

        def fits(v: _Val) -> bool:
            if v.rank != a.rank or v is a:
                return False
            return all(x == y for i, (x, y) in enumerate(zip(v.shape, a.shape)) if stack or i != d)

        others = [v for v in self.vals if fits(v)]
        chosen = [a] + rng.sample(others, min(len(others), rng.randint(1, 2)))
        if len(chosen) == 1 or self.chance(0.2):
            chosen.append(a)
        rng.shuffle(chosen)
        self.last_cat = ([v.meta for v in chosen], d, stack)
        lst = "[" + ", ".join(self.expr(v) for v in chosen) + "]"
        ds = self.dim(d, a.rank + (1 if stack else 0))
        return self.assign(self.cat_fn(lst, ds, stack), "stack" if stack else "cat", "fresh")

    def slice_expr(self, t: _Val, d: int, start: int | None, end: int | None, step: int = 1) -> str:
        e = self.expr(t)
        s = "" if start is None else str(start)
        s += ":" + ("" if end is None else str(end))
        if step != 1:
            s += f":{step}"
        if d == t.rank - 1 and t.rank > 1 and self.chance(0.2):
            return f"{e}[..., {s}]"
        return f"{e}[{':, ' * d}{s}]"

    def g_slice(self, src: _Val | None = None) -> _Val:
        rng = self.rng
        t = src or self.pick(lambda v: v.rank >= 1)
        if t.rank < 1:
            raise _Reject("rank 0")
        d = rng.randrange(t.rank)
        size = t.shape[d]
        if self.chance(0.25):
            start = rng.randint(0, size)
            length = rng.randint(0, size - start)
            ds = self.dim(d, t.rank)
            e = self.expr(t)
            rhs = rng.choice([f"torch.narrow({e}, {ds}, {start}, {length})", f"{e}.narrow({ds}, {start}, {length})"])
        else:

            def bound() -> int | None:
                r = rng.random()
                if r < 0.2:
                    return None
                if r < 0.35:
                    return rng.randint(-size - 2, -1)  # negative, sometimes out of range
                if r < 0.45:
                    return size + rng.randint(0, 3)  # past the end
                return rng.randint(0, size)

            step = 2 if self.chance(0.1) else 1
            rhs = self.slice_expr(t, d, bound(), bound(), step)
        return self.assign(rhs, "slice", "view", t.root, t.multi)

    def g_select(self) -> _Val:
        rng = self.rng
        t = self.pick(lambda v: v.rank >= 1 and max(v.shape) > 0)
        d = rng.choice([i for i, s in enumerate(t.shape) if s > 0])
        size = t.shape[d]
        i = rng.randrange(-size, size)
        e = self.expr(t)
        ds = self.dim(d, t.rank)
        rhs = rng.choice([f"{e}[{':, ' * d}{i}]", f"{e}.select({ds}, {i})", f"torch.select({e}, {ds}, {i})"])
        return self.assign(rhs, "select", "view", t.root, t.multi)

    def reshape_target(self, shape: tuple[int, ...]) -> list[int]:
        rng = self.rng
        s = list(shape)
        numel = math.prod(s)
        r = rng.random()
        if r < 0.25 and len(s) >= 2:  # merge two neighbours
            i = rng.randrange(len(s) - 1)
            s[i : i + 2] = [s[i] * s[i + 1]]
        elif r < 0.5 and s:  # split one dim in two
            i = rng.randrange(len(s))
            divs = [k for k in range(1, s[i] + 1) if s[i] and s[i] % k == 0] or [1]
            k = rng.choice(divs)
            s[i : i + 1] = [k, s[i] // k if s[i] else 0]
        elif r < 0.65:  # flat
            s = [numel]
        elif r < 0.8:  # add or drop a size-1 dim
            ones = [i for i, v in enumerate(s) if v == 1]
            if ones and self.chance(0.5):
                del s[rng.choice(ones)]
            else:
                s.insert(rng.randint(0, len(s)), 1)
        else:  # back to the shape of another tensor of the same size
            same = [v.shape for v in self.vals if v.meta.numel() == numel and v.shape != shape]
            s = list(rng.choice(same)) if same else [numel]
        if s and numel and self.chance(0.35):
            s[rng.randrange(len(s))] = -1
        return s

    def g_view(self) -> _Val:
        rng = self.rng
        t = self.pick()
        e = self.expr(t)
        r = rng.random()
        if r < 0.6:
            target = self.reshape_target(t.shape)
            if len(target) > 5:
                raise _Reject("rank")
            args = ", ".join(str(v) for v in target)
            lit = self.ints(target) if target else "()"
            forms = [f"{e}.view({lit})", f"{e}.reshape({lit})", f"torch.reshape({e}, {lit})"]
            if target:
                forms += [f"{e}.view({args})", f"{e}.reshape({args})"]
            if t.rank >= 1 and len(target) == 2 and target[0] == t.shape[0] and self.chance(0.5):
                forms = [f"{e}.reshape({e}.size(0), -1)", f"{e}.view({e}.shape[0], -1)"]
            rhs = rng.choice(forms)
        elif r < 0.8 and t.rank >= 1:
            a = rng.randrange(t.rank)
            b = rng.randrange(a, t.rank)
            sa, sb = self.dim(a, t.rank), self.dim(b, t.rank)
            rhs = rng.choice(
                [f"{e}.flatten()", f"{e}.flatten({sa})", f"{e}.flatten({sa}, {sb})", f"torch.flatten({e}, start_dim={sa}, end_dim={sb})"]
            )
        elif t.rank >= 1:
            d = rng.randrange(t.rank)
            size = t.shape[d]
            divs = [k for k in range(1, size + 1) if size % k == 0] or [1]
            k = rng.choice(divs)
            sizes = [k, size // k if size else 0]
            if size and self.chance(0.3):
                sizes[rng.randrange(2)] = -1
            ds = self.dim(d, t.rank)
            rhs = rng.choice([f"{e}.unflatten({ds}, {self.ints(sizes)})", f"torch.unflatten({e}, {ds}, {self.ints(sizes)})"])
        else:
            raise _Reject("rank 0")
        return self.assign(rhs, "view", "view", t.root, t.multi)

    def g_permute(self, src: _Val | None = None, perm: list[int] | None = None) -> _Val:
        rng = self.rng
        t = src or self.pick(lambda v: v.rank >= 2)
        if t.rank < 1:
            raise _Reject("rank 0")
        e = self.expr(t)
        r = t.rank
        if perm is not None or self.chance(0.55):
            if perm is None:
                perm = list(range(r))
                rng.shuffle(perm)
            shown = [self.dim(p, r) for p in perm]
            rhs = rng.choice(
                [
                    f"{e}.permute({', '.join(map(str, shown))})",
                    f"{e}.permute({self.ints(shown)})",
                    f"torch.permute({e}, {self.ints(shown)})",
                    f"{e}.permute(dims={self.ints(shown)})",
                ]
            )
        elif self.chance(0.8) or r != 2:
            a, b = rng.randrange(r), rng.randrange(r)
            sa, sb = self.dim(a, r), self.dim(b, r)
            rhs = rng.choice([f"{e}.transpose({sa}, {sb})", f"torch.transpose({e}, {sa}, {sb})", f"{e}.movedim({sa}, {sb})"])
        else:
            rhs = f"{e}.t()"
        return self.assign(rhs, "permute", "view", t.root, t.multi)

    def g_squeeze(self) -> _Val:
        rng = self.rng
        t = self.pick()
        e = self.expr(t)
        r = t.rank
        if self.chance(0.5) and r < 5:
            d = rng.randint(-r - 1, r)
            rhs = rng.choice([f"{e}.unsqueeze({d})", f"torch.unsqueeze({e}, {d})", f"{e}.unsqueeze(dim={d})", f"{e}[None]" if d == 0 else f"{e}.unsqueeze({d})"])
        else:
            ones = [i for i, s in enumerate(t.shape) if s == 1]
            if r == 0:
                rhs = f"{e}.squeeze()"
            else:
                d = rng.choice(ones) if ones and self.chance(0.7) else rng.randrange(r)
                ds = self.dim(d, r)
                forms = [f"{e}.squeeze()", f"{e}.squeeze({ds})", f"torch.squeeze({e}, {ds})", f"{e}.squeeze(dim={ds})"]
                picked = sorted(set(ones[:2] if len(ones) >= 2 and self.chance(0.5) else rng.sample(range(r), min(r, 2))))
                dims = ", ".join(str(self.dim(i, r)) for i in picked) + ("," if len(picked) == 1 else "")
                forms += [f"{e}.squeeze(({dims}))", f"torch.squeeze({e}, ({dims}))"]
                rhs = rng.choice(forms)
        return self.assign(rhs, "squeeze", "view", t.root, t.multi)

    def g_unary(self, src: _Val | None = None) -> _Val:
        rng = self.rng
        t = src or self.pick()
        e = self.expr(t)
        op = rng.choices(["relu", "tanh", "sigmoid", "exp", "neg", "abs"], [4, 3, 3, 1, 2, 2])[0]
        forms = {
            "relu": [f"{e}.relu()", f"torch.relu({e})", f"F.relu({e})"],
            "tanh": [f"{e}.tanh()", f"torch.tanh({e})"],
            "sigmoid": [f"{e}.sigmoid()", f"torch.sigmoid({e})"],
            "exp": [f"{e}.exp()", f"torch.exp({e})"],
            "neg": [f"-{e}", f"{e}.neg()", f"torch.neg({e})"],
            "abs": [f"{e}.abs()", f"torch.abs({e})"],
        }[op]
        return self.assign(rng.choice(forms), "unary", "fresh")

    def partner(self, a: _Val, other_storage: bool = False) -> _Val | None:
        """A tensor that broadcasts against ``a`` into a small result (with
        ``other_storage``: one that does not share ``a``'s storage)."""
        cands = []
        for v in self.vals:
            if v is a or (other_storage and v.root == a.root):
                continue
            try:
                shape = torch.broadcast_shapes(a.shape, v.shape)
            except RuntimeError:
                continue
            if len(shape) <= 5 and math.prod(shape) <= 4096:
                cands.append(v)
        same = [v for v in cands if v.shape == a.shape]
        pool = same if same and self.chance(0.6) else cands
        return self.rng.choice(pool) if pool else None

    def g_binary(self) -> _Val:
        rng = self.rng
        a = self.pick()
        b = self.partner(a) if self.chance(0.65) else None
        ea = self.expr(a)
        alpha = rng.choice([2, -1, 0.5])
        if b is not None:
            eb = self.expr(b)
            rhs = rng.choice(
                [
                    f"{ea} + {eb}", f"{ea} - {eb}", f"{ea} * {eb}", f"{ea} / ({eb}.abs() + 1)",
                    f"torch.add({ea}, {eb}, alpha={alpha})", f"torch.sub({ea}, {eb}, alpha={alpha})",
                    f"{ea}.add({eb})", f"{ea}.mul({eb})", f"torch.mul({ea}, {eb})",
                    f"torch.div({ea}, {eb}.abs() + 1)", f"{ea}.sub({eb}, alpha={alpha})",
                ]
            )  # fmt: skip
        else:
            c = rng.choice([2, 0.5, -1.5, 3])
            rhs = rng.choice(
                [
                    f"{ea} + {c}", f"{c} - {ea}", f"{ea} * {c}", f"{ea} / {c}", f"torch.mul({ea}, {c})",
                    f"{ea}.div({c})", f"torch.add({ea}, {c}, alpha={alpha})", f"{ea} - {c}",
                ]
            )  # fmt: skip
        return self.assign(rhs, "binary", "fresh")

    def g_clone(self) -> _Val:
        t = self.pick()
        e = self.expr(t)
        form = self.rng.choice([f"{e}.clone()", f"{e}.contiguous()", f"torch.clone({e})", f"{e}.detach()"])
        if form.endswith(".contiguous()"):
            return self.assign(form, "clone", "view", t.root, t.multi)  # may alias
        if form.endswith(".detach()"):
            return self.assign(form, "clone", "view", t.root, t.multi)
        return self.assign(form, "clone", "fresh")

    def writable(self) -> _Val:
        """A tensor an in-place op may write. With grad: a fresh non-leaf buffer (autograd
        forbids writes to leaves and to outputs of multi-output views)."""
        if self.grad:
            fresh = [v for v in self.vals if v.kind == "fresh"]
            if not fresh or self.chance(0.4):
                t = self.pick(lambda v: v.kind != "fresh")
                e = self.expr(t)
                return self.assign(self.rng.choice([f"{e} * 1", f"{e}.clone()", f"{e} + 0"]), "clone", "fresh")
            return self.rng.choice(fresh[-3:])
        return self.pick()

    def g_inplace(self, target: _Val | None = None) -> None:
        rng = self.rng
        t = target or self.writable()
        e = self.expr(t)
        b = self.partner(t, other_storage=True)
        forms = [f"{e}.add_(1)", f"{e}.mul_(2)", f"{e}.relu_()", f"{e}.neg_()", f"torch.relu_({e})", f"{e}.sigmoid_()"]
        if b is not None and torch.broadcast_shapes(t.shape, b.shape) == t.shape:
            eb = self.expr(b)
            forms += [f"{e}.add_({eb}, alpha=2)", f"{e}.copy_({eb})", f"{e}.mul_({eb})"]
            if t.tuple_name is None:
                forms.append(f"{e} += {eb}")
        if t.rank >= 1 and t.shape[-1] > 1:
            forms.append(f"{self.slice_expr(t, t.rank - 1, 0, rng.randint(1, t.shape[-1]))}.mul_(0.5)")
        self.emit(rng.choice(forms), (), "inplace", True)

    def g_motif(self) -> None:
        name = self.rng.choices(
            [
                "split_cat", "unbind_stack", "split_split", "slices_cat", "permute_back", "unsqueeze_squeeze",
                "view_back", "cat_split", "cat_slice", "select_stack", "split_map_cat", "cat_cat", "write_after_views",
                "two_splits_cat", "split_squeeze", "split_same_op", "einsum",
            ],
            [10, 5, 5, 4, 3, 3, 3, 5, 3, 2, 3, 2, 4, 4, 3, 5, 2],
        )[0]  # fmt: skip
        getattr(self, f"m_{name}")()

    # -------------------------------------------------------------- motifs
    def m_split_cat(self) -> None:
        g = self.g_split()
        self.cat_group(g, stack=False, mode="all" if self.chance(0.5) else None)

    def m_unbind_stack(self) -> None:
        g = self.g_unbind()
        self.cat_group(g, stack=self.chance(0.8), mode="all" if self.chance(0.5) else None)

    def m_split_split(self) -> None:
        g = self.g_split()
        if not g.chunks:
            raise _Reject("no chunks")
        c = self.rng.choice(g.chunks)
        same = self.chance(0.7)
        g2 = self.g_split(src=c, dim=g.dim if same else None)
        if self.chance(0.5):
            self.cat_group(g2, mode="all")

    def m_slices_cat(self) -> None:
        rng = self.rng
        t = self.pick(lambda v: v.rank >= 1)
        d = rng.randrange(t.rank)
        size = t.shape[d]
        cuts = sorted(rng.randint(0, size) for _ in range(rng.randint(1, 2)))
        bounds = [0, *cuts, size]
        parts = [self.slice_expr(t, d, a if a or self.chance(0.5) else None, b if b != size or self.chance(0.5) else None) for a, b in zip(bounds, bounds[1:])]
        if self.chance(0.2):
            rng.shuffle(parts)
        ds = self.dim(d, t.rank)
        self.assign(self.cat_fn("[" + ", ".join(parts) + "]", ds), "cat", "fresh")

    def m_permute_back(self) -> None:
        rng = self.rng
        t = self.pick(lambda v: v.rank >= 2)
        perm = list(range(t.rank))
        rng.shuffle(perm)
        p = self.g_permute(src=t, perm=perm)
        inverse = [perm.index(i) for i in range(t.rank)]
        if self.chance(0.3):
            self.g_unary(src=p)
            p = self.vals[-1]
        self.g_permute(src=p, perm=inverse)

    def m_unsqueeze_squeeze(self) -> None:
        rng = self.rng
        t = self.pick(lambda v: v.rank < 5)
        d = rng.randint(-t.rank - 1, t.rank)
        u = self.assign(f"{self.expr(t)}.unsqueeze({d})", "squeeze", "view", t.root, t.multi)
        d2 = d if self.chance(0.7) else rng.randint(-u.rank, u.rank - 1)
        self.assign(rng.choice([f"{u.name}.squeeze({d2})", f"torch.squeeze({u.name}, {d2})"]), "squeeze", "view", t.root, t.multi)

    def m_view_back(self) -> None:
        t = self.pick()
        target = self.reshape_target(t.shape)
        v = self.assign(f"{self.expr(t)}.{self.rng.choice(['view', 'reshape'])}({self.ints(target)})", "view", "view", t.root, t.multi)
        if self.chance(0.3):
            v = self.g_unary(src=v)
        self.assign(f"{v.name}.{self.rng.choice(['view', 'reshape'])}({self.ints(list(t.shape))})", "view", "view", v.root, v.multi)

    def m_cat_split(self) -> None:
        """Split a cat (unbind a stack) back into the pieces it was made of."""
        c = self.g_cat(stack=self.chance(0.3))
        pieces, d, stack = self.last_cat
        if stack:
            self.tuple_result(f"{c.name}.unbind({self.dim(d, c.rank)})", "unbind", "unbind", c, d)
            return
        sizes = [p.shape[d] for p in pieces]
        if self.chance(0.2) and len(sizes) > 1:  # a different partition
            sizes = self.composition(c.shape[d])
        g = self.tuple_result(f"{c.name}.split({self.ints(sizes)}, {self.dim(d, c.rank)})", "split", "split", c, d)
        if g.chunks and self.chance(0.4):
            self.g_unary(src=self.rng.choice(g.chunks))

    def m_cat_slice(self) -> None:
        """A slice of a cat, or a select of a stack (sometimes exactly one input)."""
        c = self.g_cat(stack=self.chance(0.3))
        pieces, d, stack = self.last_cat
        if c.rank == 0:
            raise _Reject("rank 0")
        if stack:
            i = self.rng.randrange(-len(pieces), len(pieces)) if pieces else 0
            e = self.expr(c)
            self.assign(self.rng.choice([f"{e}.select({self.dim(d, c.rank)}, {i})", f"{e}[{':, ' * d}{i}]"]), "select", "view", c.root)
            return
        if self.chance(0.5) and pieces:  # exactly one of the pieces
            k = self.rng.randrange(len(pieces))
            a = sum(p.shape[d] for p in pieces[:k])
            self.assign(self.slice_expr(c, d, a, a + pieces[k].shape[d]), "slice", "view", c.root)
            return
        d = self.rng.randrange(c.rank)
        size = c.shape[d]
        a = self.rng.randint(0, size)
        b = self.rng.randint(a, size)
        self.assign(self.slice_expr(c, d, a, b), "slice", "view", c.root)

    def m_select_stack(self) -> None:
        t = self.pick(lambda v: v.rank >= 1 and 0 < min(v.shape) and max(v.shape) <= 6)
        d = self.rng.randrange(t.rank)
        e = self.expr(t)
        items = [f"{e}[{':, ' * d}{i}]" if self.chance(0.6) else f"{e}.select({d}, {i})" for i in range(t.shape[d])]
        self.assign(f"torch.stack([{', '.join(items)}], {self.dim(d, t.rank)})", "stack", "fresh")

    def m_split_map_cat(self) -> None:
        g = self.g_split()
        mapped = []
        for c in g.chunks:
            if self.chance(0.7):
                mapped.append(self.g_unary(src=c))
            else:
                mapped.append(c)
        if not mapped:
            raise _Reject("no chunks")
        ds = self.dim(g.dim, g.source.rank)
        self.assign(self.cat_fn("[" + ", ".join(self.expr(v) for v in mapped) + "]", ds), "cat", "fresh")

    def m_cat_cat(self) -> None:
        """A cat of a cat (along the same dim, or another)."""
        inner = self.g_cat()
        _, d, stack = self.last_cat
        if stack or inner.rank == 0:
            raise _Reject("stack")
        if self.chance(0.3):
            d = self.rng.randrange(inner.rank)

        def fits(v: _Val) -> bool:
            return v.rank == inner.rank and v is not inner and all(a == b for i, (a, b) in enumerate(zip(v.shape, inner.shape)) if i != d)

        others = [v for v in self.vals if fits(v)]
        items = [inner] + self.rng.sample(others, min(len(others), 1))
        if len(items) == 1:
            items.append(inner)
        self.rng.shuffle(items)
        self.assign(self.cat_fn("[" + ", ".join(self.expr(v) for v in items) + "]", self.dim(d, inner.rank)), "cat", "fresh")

    def m_two_splits_cat(self) -> None:
        """A cat of chunks of two splits: of one tensor split twice (a prefix of one and
        the rest of the other cover it in order, yet are not one split's chunks) or of two
        tensors of one shape."""
        rng = self.rng
        t = self.pick(lambda v: v.rank >= 1 and max(v.shape) > 0)
        d = rng.choice([i for i, s in enumerate(t.shape) if s > 0])
        twins = [v for v in self.vals if v is not t and v.shape == t.shape]
        u = rng.choice(twins) if twins and self.chance(0.35) else t
        g1 = self.g_split(src=t, dim=d)
        g2 = self.g_split(src=u, dim=d)

        def ends(g: _Group) -> list[int]:
            out, acc = [], 0
            for c in g.chunks:
                acc += c.shape[d]
                out.append(acc)
            return out

        e1, e2 = ends(g1), ends(g2)
        common = [b for b in e1[:-1] if b in e2[:-1]]
        if common and self.chance(0.7):
            cut = rng.choice(common)
            items = [c for c, e in zip(g1.chunks, e1) if e <= cut] + [c for c, e in zip(g2.chunks, e2) if e > cut]
        else:
            pool = g1.chunks + g2.chunks
            items = rng.sample(pool, min(len(pool), rng.randint(2, 4)))
        lst = "[" + ", ".join(self.expr(c) for c in items) + "]"
        self.assign(self.cat_fn(lst, self.dim(d, t.rank)), "cat", "fresh")

    def m_split_squeeze(self) -> None:
        """Size-1 chunks squeezed along the split dim (an unbind in disguise)."""
        rng = self.rng
        t = self.pick(lambda v: v.rank >= 1 and 0 < max(v.shape) and min(v.shape) <= 6)
        d = rng.choice([i for i, s in enumerate(t.shape) if 0 < s <= 6] or [0])
        ds = self.dim(d, t.rank)
        e = self.expr(t)
        g = self.tuple_result(rng.choice([f"{e}.split(1, {ds})", f"torch.split({e}, 1, dim={ds})", f"torch.chunk({e}, {t.shape[d]}, {ds})"]), "split", "split", t, d)
        for c in g.chunks:
            if self.chance(0.85):
                dd = self.dim(d, c.rank)
                self.assign(rng.choice([f"{self.expr(c)}.squeeze({dd})", f"torch.squeeze({self.expr(c)}, {dd})"]), "squeeze", "view", c.root, True)

    def m_split_same_op(self) -> None:
        """The same elementwise op on every chunk of a split (hoistable above the split),
        with a shared operand, per-chunk scalars or per-chunk tensors."""
        rng = self.rng
        g = self.g_split()
        if not g.chunks:
            raise _Reject("no chunks")
        kind = rng.choice(["unary", "scalar", "shared", "per_chunk"])
        op = rng.choice(["relu", "tanh", "sigmoid", "neg", "abs"])
        binop = rng.choice(["+", "-", "*", "/"])
        outs = []
        for c in g.chunks:
            e = self.expr(c)
            if kind == "unary":
                rhs = f"{e}.{op}()" if self.chance(0.7) else f"torch.{op}({e})"
            elif kind == "scalar":
                rhs = f"{e} {binop} {rng.choice([2, 0.5, -3, 1.5])}"
            else:
                other = self.partner(c) if kind == "per_chunk" else None
                if kind == "shared" or other is None or torch.broadcast_shapes(c.shape, other.shape) != c.shape:
                    shared = [v for v in self.vals if v.rank <= c.rank and v.shape == c.shape[c.rank - v.rank :]]
                    other = rng.choice(shared) if shared else c
                oe = self.expr(other)
                rhs = f"{e} {binop} {oe}" if binop != "/" else f"{e} / ({oe}.abs() + 1)"
            outs.append(self.assign(rhs, "unary" if kind == "unary" else "binary", "fresh"))
        if self.chance(0.5):
            lst = "[" + ", ".join(v.name for v in outs) + "]"
            self.assign(self.cat_fn(lst, self.dim(g.dim, g.source.rank)), "cat", "fresh")

    def m_einsum(self) -> None:
        """A few einsums: the batched vector-matrix form, elementwise, transposes, sums."""
        rng = self.rng
        t = self.pick(lambda v: 1 <= v.rank <= 3)
        e = self.expr(t)
        letters = "abc"[: t.rank]
        form = rng.choice(["bmm", "mul", "perm", "sum"])
        if form == "bmm" and t.rank == 3:
            k = rng.randint(1, 3)
            y = self.assign(f"torch.cat([{e}.unsqueeze(-1)] * {k}, -1).sigmoid()", "cat", "fresh")
            rhs = f'torch.einsum("abc,abcd->abd", {e}, {y.name})'
        elif form == "mul":
            other = [v for v in self.vals if v.shape == t.shape and v is not t]
            o = self.expr(rng.choice(other)) if other else e
            rhs = f'torch.einsum("{letters},{letters}->{letters}", {e}, {o})'
        elif form == "perm":
            out = list(letters)
            rng.shuffle(out)
            rhs = f'torch.einsum("{letters}->{"".join(out)}", {e})'
        else:
            rhs = f'torch.einsum("{letters}->{letters[:-1]}", {e})'
        self.assign(rhs, "einsum", "fresh")

    def m_write_after_views(self) -> None:
        """Take views of a buffer, write the buffer in place, then use the views."""
        rng = self.rng
        if self.grad:
            t = self.writable()
        else:
            t = self.pick(lambda v: v.rank >= 1)
        if t.rank < 1:
            raise _Reject("rank 0")
        before = len(self.vals)
        view_kind = rng.choice(["slice", "split", "view", "permute"])
        if view_kind == "slice":
            self.g_slice(src=t)
        elif view_kind == "split":
            self.g_split(src=t)
        elif view_kind == "view":
            self.assign(f"{self.expr(t)}.view({self.ints([-1])})" if t.meta.is_contiguous() else f"{self.expr(t)}.reshape(-1)", "view", "view", t.root, t.multi)
        else:
            self.g_permute(src=t) if t.rank >= 2 else self.g_slice(src=t)
        views = self.vals[before:]
        self.g_inplace(target=t)
        if views:
            self.g_unary(src=rng.choice(views))

    def invalid_op(self) -> None:
        """A deliberately invalid op (out-of-range dim or index): eager must reject it."""
        rng = self.rng
        t = self.pick(lambda v: v.rank >= 1)
        e = self.expr(t)
        r = t.rank
        name = self.new()
        text = rng.choice(
            [
                f"{name} = {e}.split(1, dim={r + rng.randint(0, 2)})",
                f"{name} = torch.cat([{e}, {e}], dim={-r - 1 - rng.randint(0, 2)})",
                f"{name} = {e}.select(0, {t.shape[0] + rng.randint(0, 2)})",
                f"{name} = {e}.unsqueeze({r + 2})",
                f"{name} = {e}.split([{t.shape[0] + 1}], 0)",
            ]
        )
        self.stmts.append(Stmt(text, (name,), "invalid"))
        self.vals.append(_Val(name, t.meta, "fresh", name))


def generate(seed: int, index: int) -> Case:
    """Case ``index`` of the stream for ``seed`` (deterministic)."""
    return _Gen(seed, index).build()


# ============================================================================== runs
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


# ========================================================================= shrinking
def _dce(case: Case) -> Case:
    """Drop statements whose names nothing reads (in-place writes stay) and unused inputs."""
    live: set[str] = set()
    for o in case.outputs:
        live.update(_NAME.findall(o))
    keep: list[Stmt] = []
    for s in reversed(case.stmts):
        if s.inplace or any(d in live for d in s.defs):
            keep.append(s)
            live.update(s.uses)
    inputs = tuple(i for i in case.inputs if i.name in live) or case.inputs[:1]
    return dataclasses.replace(case, stmts=tuple(reversed(keep)), inputs=inputs)


def _delete(case: Case, drop: set[int]) -> Case | None:
    """``case`` without statements ``drop`` and everything that reads what they define."""
    gone: set[str] = set()
    keep: list[Stmt] = []
    for i, s in enumerate(case.stmts):
        if i in drop or any(u in gone for u in s.uses):
            gone.update(s.defs)
        else:
            keep.append(s)
    outputs = tuple(o for o in case.outputs if not set(_NAME.findall(o)) & gone)
    if not outputs:
        return None
    return _dce(dataclasses.replace(case, stmts=tuple(keep), outputs=outputs))


def _candidates(case: Case) -> Iterator[Case]:
    """Smaller or simpler variants of ``case``, most promising first."""
    n = len(case.stmts)
    for k in range(len(case.outputs)):
        if len(case.outputs) > 1:
            yield _dce(dataclasses.replace(case, outputs=case.outputs[:k] + case.outputs[k + 1 :]))
    size = max(n // 2, 1)
    while size >= 1:
        for start in range(n - size, -1, -size) if n >= size else ():
            c = _delete(case, set(range(start, start + size)))
            if c is not None:
                yield c
        size //= 2
    for i, s in enumerate(case.stmts):  # drop an in-place write, returning what it wrote
        if s.inplace and s.uses:
            target = _NAME.findall(s.text)[0]
            outputs = case.outputs if target in case.outputs else case.outputs + (target,)
            yield _dce(dataclasses.replace(case, stmts=case.stmts[:i] + case.stmts[i + 1 :], outputs=outputs))
    for i, s in enumerate(case.stmts):  # bypass a statement: its users read one of its inputs
        if s.inplace:
            continue
        for d in s.defs:
            for u in s.uses:
                mapping = {d: u}
                rest = tuple(t.renamed(mapping) for t in case.stmts[i + 1 :])
                outputs = tuple(_rename(o, mapping) for o in case.outputs)
                if rest != case.stmts[i + 1 :] or outputs != case.outputs:
                    yield _dce(dataclasses.replace(case, stmts=case.stmts[: i + 1] + rest, outputs=outputs))
        if len(s.defs) == 1:  # a chunk ``v[i]`` of a tuple read as the tensor that was split
            chunk = re.compile(rf"\b{s.defs[0]}\[-?\d+\]")
            for u in s.uses:
                rest = tuple(dataclasses.replace(t, text=_sub_rhs(chunk, u, t)) for t in case.stmts[i + 1 :])
                outputs = tuple(chunk.sub(u, o) for o in case.outputs)
                if rest != case.stmts[i + 1 :] or outputs != case.outputs:
                    yield _dce(dataclasses.replace(case, stmts=case.stmts[: i + 1] + rest, outputs=outputs))
    if case.dynamic:
        yield dataclasses.replace(case, dynamic=False)
    if case.grad:
        yield dataclasses.replace(case, grad=False)
    for k, spec in enumerate(case.inputs):
        if spec.dtype != "float32":
            yield dataclasses.replace(case, inputs=case.inputs[:k] + (dataclasses.replace(spec, dtype="float32"),) + case.inputs[k + 1 :])
    for k, spec in enumerate(case.inputs):
        for j, size in enumerate(spec.shape):
            for smaller in dict.fromkeys((1, size // 2, size - 1)):
                if 0 < smaller < size:
                    shape = spec.shape[:j] + (smaller,) + spec.shape[j + 1 :]
                    new = dataclasses.replace(spec, shape=shape)
                    yield dataclasses.replace(case, inputs=case.inputs[:k] + (new,) + case.inputs[k + 1 :])


def _sub_rhs(pattern: re.Pattern, repl: str, s: Stmt) -> str:
    if s.defs:
        lhs, rhs = s.text.split(" = ", 1)
        return f"{lhs} = {pattern.sub(repl, rhs)}"
    return pattern.sub(repl, s.text)


def shrink(case: Case, still_fails: Callable[[Case], bool], max_tries: int = 300, max_seconds: float = 90.0) -> tuple[Case, int]:
    """Greedy reduction: keep the first smaller variant that still fails, until none does
    (or the budget is spent). Returns (smallest failing case, tries)."""
    deadline = time.perf_counter() + max_seconds
    tries = 0
    seen: set[str] = {case.source() + repr(case.inputs) + repr((case.grad, case.dynamic))}
    best = case
    progress = True
    while progress:
        progress = False
        for cand in _candidates(best):
            if tries >= max_tries or time.perf_counter() > deadline:
                return best, tries
            key = cand.source() + repr(cand.inputs) + repr((cand.grad, cand.dynamic))
            if key in seen:
                continue
            seen.add(key)
            tries += 1
            if still_fails(cand):
                best = cand
                progress = True
                break
    return best, tries


# ========================================================================= failures
@dataclasses.dataclass
class Failure:
    """A case on which Optimus failed at one level, and its minimized reproducer."""

    case: Case
    level: str
    kind: str
    message: str
    fired: dict[str, int]
    minimized: Case
    min_result: LevelResult
    tries: int = 0
    shrink_seconds: float = 0.0
    passes: Any = "vertical"
    aliasing: str = "new"

    def reproducer(self) -> str:
        return format_reproducer(self)

    @property
    def key(self) -> str:
        """The failure's class: level, signature and, once minimized, the rules (beyond
        canonicalization and dead-code removal) that fired on the minimized case."""
        if not self.tries:
            return f"{self.level} {signature(self.min_result)} (not minimized)"
        rules = sorted(n for n in self.min_result.fired if n not in _TRIVIAL_RULES)
        return f"{self.level} {signature(self.min_result)} [{', '.join(rules)}]"

    def to_dict(self) -> dict[str, Any]:
        m = self.minimized
        return {
            "label": self.case.label,
            "key": self.key,
            "level": self.level,
            "kind": self.kind,
            "message": self.message,
            "fired": self.fired,
            "original_source": self.case.source(),
            "minimized_source": m.source(),
            "minimized_inputs": [dataclasses.asdict(i) for i in m.inputs],
            "grad": m.grad,
            "dynamic": m.dynamic,
            "minimized_kind": self.min_result.kind,
            "minimized_message": self.min_result.message,
            "minimized_fired": self.min_result.fired,
            "shrink_tries": self.tries,
            "reproducer": self.reproducer(),
        }


_TRIVIAL_RULES = frozenset({"dead_code_elimination", "canonicalize_split_cat_args"})


def _class_key(r: LevelResult) -> str:
    rules = sorted(n for n in r.fired if n not in _TRIVIAL_RULES)
    return f"{r.level} {signature(r)} [{', '.join(rules)}]"


def signature(r: LevelResult) -> str:
    """What a shrunk case must still show: the failure kind, and which mismatch (aliasing,
    outputs, gradients, inputs written in place), exception type or failing rule."""
    if r.kind == "mismatch":
        m = re.match(r"(output aliasing lost|output aliasing|output structure|outputs' requires_grad|output|grad|input)", r.message)
        return f"mismatch:{m.group(1) if m else ''}"
    if r.kind == "graph_error":
        m = re.search(r"raised (\w+)", r.message)
        return f"graph_error:{m.group(1) if m else ''}"
    if r.kind == "rule_error":
        return "rule_error:" + ",".join(sorted(set(re.findall(r"rule (\w+) raised", r.message)))) if "rule " in r.message else "rule_error:driver"
    if r.kind == "optimus_error":
        lines = [ln for ln in r.message.splitlines() if ln.strip()]
        return f"optimus_error:{lines[-1].split(':')[0] if lines else ''}"
    return r.kind


def _still_fails(level: str, sig: str, passes: Any, aliasing: str = "new") -> Callable[[Case], bool]:
    def test(c: Case) -> bool:
        r = check_case(c, (level,), passes, baseline=False, aliasing=aliasing).levels.get(level)
        return r is not None and r.failed and signature(r) == sig

    return test


def investigate(case: Case, result: LevelResult, passes: Any = "vertical", shrink_budget: float | None = 90.0, aliasing: str = "new") -> Failure:
    """Shrink a failing case (``shrink_budget`` seconds; ``None``: do not shrink)."""
    t0 = time.perf_counter()
    minimized, tries = case, 0
    final: LevelResult | None = result
    if shrink_budget:
        minimized, tries = shrink(case, _still_fails(result.level, signature(result), passes, aliasing), max_seconds=shrink_budget)
        final = check_case(minimized, (result.level,), passes, aliasing=aliasing).levels.get(result.level)
    if final is None or not final.failed:  # e.g. the small case fails in torch too: keep the original
        minimized, final = case, result
    return Failure(case, result.level, result.kind, result.message, result.fired, minimized, final, tries, time.perf_counter() - t0, passes, aliasing)


def format_reproducer(f: Failure) -> str:
    m, r = f.minimized, f.min_result
    rules = ", ".join(f"{k} x{v}" for k, v in sorted(r.fired.items())) or "none"
    src = m.source()
    inputs = ", ".join(f'InputSpec("{i.name}", {tuple(i.shape)}, "{i.dtype}", seed={i.seed})' for i in m.inputs)
    name = re.sub(r"\W+", "_", f"fuzz_seed{m.seed}_case{m.index}_{f.level}")
    bar = "=" * 78
    lines = [
        bar,
        f"optimus fuzz FAILURE: {r.kind} at {f.level} ({f.case.label})",
        f"rules that fired ({f.level}): {rules}",
        f"minimized from {len(f.case.stmts)} to {len(m.stmts)} statements in {f.tries} tries ({f.shrink_seconds:.1f} s)",
        f"inputs: {'; '.join(str(i) for i in m.inputs)}",
        f"grad={m.grad} dynamic={m.dynamic} passes={f.passes!r} aliasing={f.aliasing!r}",
        "",
        r.message,
        "-" * 78,
        "import torch",
        "from optimus.fuzz import InputSpec, check_source",
        "",
        f'SOURCE = """\n{src}"""',
        "",
        "",
        f"def test_{name}():",
        f"    inputs = [{inputs}]",
        f'    problem = check_source(SOURCE, inputs, level="{f.level}", grad={m.grad}, dynamic={m.dynamic}, passes={f.passes!r}'
        + (f", aliasing={f.aliasing!r})" if f.aliasing != "new" else ")"),
        "    assert problem is None, problem",
        bar,
    ]
    return "\n".join(lines)


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


# ============================================================================ driver
def resolve_passes(passes: Any) -> Any:
    """``"registered"``: every registered canonicalize and vertical rule, also those off
    by default; anything else is an ordinary ``passes`` value."""
    if passes == "registered":
        import optimus

        return [r.name for r in optimus.list_rules() if r.kind in ("canonicalize", "vertical")]
    return passes


@dataclasses.dataclass
class FuzzResult:
    """Counts and findings of one ``fuzz`` run."""

    seed: int
    requested: int
    levels: tuple[str, ...]
    passes: Any
    batch: int
    aliasing: str = "new"
    generated: int = 0
    passed: int = 0
    nograd: int = 0  # cases that ran without gradients (autograd rejects their writes)
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    level_skips: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    skip_examples: dict[str, str] = dataclasses.field(default_factory=dict)
    failed_cases: int = 0
    failures: list[Failure] = dataclasses.field(default_factory=list)
    fired: dict[str, collections.Counter] = dataclasses.field(default_factory=dict)
    declined: dict[str, collections.Counter] = dataclasses.field(default_factory=dict)
    families: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    compiles: int = 0
    batches: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's CPU time (the machine may be shared)
    stopped: str = ""

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def progress_line(self) -> str:
        rate = self.generated / self.seconds if self.seconds else 0.0
        return (
            f"fuzz: {self.generated}/{self.requested} cases, {self.passed} passed, {self.skipped_total} skipped, "
            f"{self.failed_cases} failed, {self.seconds:.0f} s ({rate:.1f} cases/s)"
        )

    def summary(self) -> str:
        import optimus

        out = [
            f"optimus fuzz: seed {self.seed}, {self.requested} cases requested, levels {'+'.join(self.levels)}, "
            f"passes {self.passes!r}, aliasing {self.aliasing!r}, batch {self.batch}, torch {torch.__version__}",
            f"cases: {self.generated} generated, {self.passed} passed, {self.skipped_total} skipped, {self.failed_cases} failed"
            f" ({self.nograd} ran without gradients: autograd rejects their in-place writes)",
        ]
        if self.skipped:
            out.append("skipped: " + ", ".join(f"{k} x{v}" for k, v in self.skipped.most_common()))
        if self.level_skips:
            out.append("levels skipped (torch itself raises or differs, not Optimus): " + ", ".join(f"{k} x{v}" for k, v in sorted(self.level_skips.items())))
        if self.failures:
            kinds = collections.Counter(f"{f.kind}@{f.level}" for f in self.failures)
            out.append("failures: " + ", ".join(f"{k} x{v}" for k, v in kinds.most_common()))
            out.append("failure classes (level, signature, rules that fired on the minimized case):")
            classes = collections.Counter(f.key for f in self.failures)
            for key, n in classes.most_common():
                first = next(f for f in self.failures if f.key == key)
                out.append(f"  x{n:<4} {key}  (e.g. {first.case.label}, {len(first.minimized.stmts)} statements)")
        if self.stopped:
            out.append(f"stopped early: {self.stopped}")
        names = sorted({n for c in self.fired.values() for n in c})
        out.append(f"{'rewrites per rule':<40}" + "".join(f"{lv:>10}" for lv in self.levels))
        for n in names:
            out.append(f"  {n:<38}" + "".join(f"{self.fired.get(lv, {}).get(n, 0):>10}" for lv in self.levels))
        config = optimus.resolve(resolve_passes(self.passes))
        selected = list(dict.fromkeys(r.name for lv in self.levels for r in config.rules_for(lv)))
        never = [n for n in selected if n not in names]
        if never:
            out.append("rules that never fired: " + ", ".join(never))
        per = self.seconds / self.generated if self.generated else 0.0
        cpu = self.cpu_seconds / self.generated if self.generated else 0.0
        out.append(
            f"time: {self.seconds:.1f} s ({per * 1000:.0f} ms per case; CPU {self.cpu_seconds:.1f} s, {cpu * 1000:.0f} ms per case; "
            f"{self.compiles} compiles in {self.batches} batches)"
        )
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        import optimus

        config = optimus.resolve(resolve_passes(self.passes))
        rules = {lv: {r.name: r.fingerprint() for r in config.rules_for(lv)} for lv in self.levels}
        return {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": " ".join(sys.argv),
            "rules": rules,
            "seed": self.seed,
            "requested": self.requested,
            "levels": list(self.levels),
            "passes": self.passes,
            "batch": self.batch,
            "aliasing": self.aliasing,
            "torch": torch.__version__,
            "generated": self.generated,
            "passed": self.passed,
            "nograd": self.nograd,
            "skipped": dict(self.skipped),
            "skip_examples": self.skip_examples,
            "level_skips": dict(self.level_skips),
            "failed_cases": self.failed_cases,
            "failures": [f.to_dict() for f in self.failures],
            "fired": {lv: dict(c) for lv, c in self.fired.items()},
            "declined": {lv: dict(c) for lv, c in self.declined.items()},
            "families": dict(self.families),
            "compiles": self.compiles,
            "batches": self.batches,
            "seconds": round(self.seconds, 2),
            "cpu_seconds": round(self.cpu_seconds, 2),
            "stopped": self.stopped,
        }


def _skip_category(why: str) -> str:
    m = re.match(r"(eager raised|dynamo raised|syntax)\s*(\w*)", why)
    return f"{m.group(1)} {m.group(2)}".strip() if m else why[:40]


class _Fuzzer:
    def __init__(self, res: FuzzResult, shrink_seconds: float | None, max_shrink: int, on_failure: Callable[[Failure], None] | None) -> None:
        self.res = res
        self.shrink_seconds = shrink_seconds
        self.max_shrink = max_shrink
        self.on_failure = on_failure
        self.seen: set[str] = set()
        self.shrunk = 0

    def count(self, r: CaseResult) -> None:
        for lv, lr in r.levels.items():
            self.res.fired.setdefault(lv, collections.Counter()).update(lr.fired)
            self.res.declined.setdefault(lv, collections.Counter()).update(lr.declined)

    def run_batch(self, members: list[Case]) -> None:
        """Check ``members`` compiled as one program; if that is not clean, re-run each
        case alone at the levels that were not (a level the batch passed is verified for
        every member: the batch's outputs are theirs)."""
        res = self.res
        res.batches += 1
        combined = combine(members)
        r = check_case(combined, res.levels, res.passes, aliasing=res.aliasing)
        res.compiles += 1
        if r.ok or len(members) == 1:
            self.record(r, passed=len(members))
            return
        self.count(r)
        redo = res.levels if r.skip else tuple(lv for lv in res.levels if r.levels[lv].kind != OK)
        outcomes = []
        for m in members:
            outcomes.append(check_case(m, redo, res.passes, aliasing=res.aliasing))
            res.compiles += 1
            self.record(outcomes[-1], counted=not r.skip)
        if r.failures and not any(o.failures for o in outcomes):
            self.record(r, counted=True)  # the combination fails where no single case does

    def record(self, o: CaseResult, counted: bool = False, passed: int = 1) -> None:
        """Count one checked case (or a clean batch of ``passed`` cases); investigate failures."""
        res = self.res
        if not counted:
            self.count(o)
        if o.skip:
            cat = _skip_category(o.skip)
            res.skipped[cat] += 1
            res.skip_examples.setdefault(cat, f"{o.case.label}: {o.skip}")
            return
        for lv, lr in o.levels.items():
            if lr.kind == SKIP:
                res.level_skips[lv] += 1
                res.skip_examples.setdefault(f"level {lv}", f"{o.case.label}: {lr.message[:500]}")
        bad = o.failures
        if not bad:
            res.passed += passed
            return
        res.failed_cases += 1
        first = bad[0]
        key = _class_key(first)
        fresh = key not in self.seen
        self.seen.add(key)
        budget = self.shrink_seconds if fresh and self.shrunk < self.max_shrink else None
        self.shrunk += budget is not None
        failure = investigate(o.case, first, res.passes, budget, res.aliasing)
        if len(bad) > 1:
            failure.message += "\n(also failing: " + ", ".join(f"{b.kind} at {b.level}" for b in bad[1:]) + ")"
        res.failures.append(failure)
        if self.on_failure is not None:
            self.on_failure(failure)


def fuzz(
    cases: int = 100,
    seed: int = 0,
    levels: Sequence[str] = LEVELS,
    passes: Any = "vertical",
    batch: int = 8,
    aliasing: str = "new",
    shrink_seconds: float | None = 90.0,
    max_shrink: int = 8,
    max_failures: int = 10,
    max_seconds: float | None = None,
    progress: Callable[[FuzzResult], None] | None = None,
    on_failure: Callable[[Failure], None] | None = None,
    progress_every: float = 10.0,
) -> FuzzResult:
    """Generate ``cases`` programs from ``seed`` and check each at ``levels``.

    Cases are compiled ``batch`` at a time (same grad/dynamic flags); a batch that fails
    is re-run case by case. Failing cases are shrunk (the first ``max_shrink``, for at
    most ``shrink_seconds`` each). Stops after ``max_failures`` failing cases or
    ``max_seconds``.
    """
    import optimus

    optimus.list_rules()  # load the built-in rules
    for lv in levels:
        if lv not in LEVELS:
            raise ValueError(f"unknown level {lv!r}; valid: {', '.join(LEVELS)}")
    if aliasing not in ALIASING_MODES:
        raise ValueError(f"aliasing must be one of {ALIASING_MODES}, got {aliasing!r}")
    res = FuzzResult(seed, cases, tuple(levels), passes, max(1, batch), aliasing)
    fz = _Fuzzer(res, shrink_seconds, max_shrink, on_failure)
    t0 = last = time.perf_counter()
    c0 = time.process_time()
    pending: dict[tuple[bool, bool], list[Case]] = collections.defaultdict(list)
    with _quiet():
        for index in range(cases):
            res.seconds = time.perf_counter() - t0
            if max_seconds is not None and res.seconds > max_seconds:
                res.stopped = f"time limit ({max_seconds:g} s) after {index} cases"
                break
            if res.failed_cases >= max_failures:
                res.stopped = f"{res.failed_cases} failing cases (max_failures)"
                break
            case = generate(seed, index)
            res.generated += 1
            res.families.update(case.families())
            ran, ref, why = reference(case)
            if ref is None:
                cat = _skip_category(why or "")
                res.skipped[cat] += 1
                res.skip_examples.setdefault(cat, f"{case.label}: {why}")
                continue
            if case.grad and not ran.grad:
                res.nograd += 1
            key = (ran.grad, ran.dynamic)
            pending[key].append(ran)
            if len(pending[key]) >= res.batch:
                fz.run_batch(pending.pop(key))
            if progress is not None and time.perf_counter() - last >= progress_every:
                last = time.perf_counter()
                res.seconds = last - t0
                progress(res)
        for key in list(pending):
            if res.failed_cases < max_failures:
                fz.run_batch(pending.pop(key))
    res.seconds = time.perf_counter() - t0
    res.cpu_seconds = time.process_time() - c0
    return res


# =============================================================================== CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", type=int, default=200, help="number of programs (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the program stream (default 0)")
    p.add_argument("--level", choices=["both", *LEVELS], default="both", help="levels to check (default both)")
    p.add_argument(
        "--passes",
        default="vertical",
        help="passes to run: 'vertical' (default: the canonicalize + vertical rules on by default), 'registered' "
        "(every registered canonicalize + vertical rule, also those off by default), or any optimus passes value",
    )
    p.add_argument("--batch", type=int, default=8, help="cases compiled together (default 8; 1 = one compile per case)")
    p.add_argument(
        "--aliasing",
        choices=ALIASING_MODES,
        default="new",
        help="output aliasing check: 'new' (default): no output may newly alias an input or another output; "
        "'exact': nor stop aliasing; 'off'",
    )
    p.add_argument("--json", metavar="FILE", default=None, help="write the summary and every failure as JSON")
    p.add_argument("--max-seconds", type=float, default=None, help="stop starting new cases after this many seconds")
    p.add_argument("--max-failures", type=int, default=10, help="stop after this many failing cases (default 10)")
    p.add_argument("--shrink-seconds", type=float, default=90.0, help="time to minimize each failure (default 90; 0 = off)")
    p.add_argument("--max-shrink", type=int, default=8, help="minimize at most this many failures, one per new class (default 8)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--list", action="store_true", help="print the generated programs (source, inputs, flags) and exit")


def run_cli(args: argparse.Namespace) -> int:
    if args.list:
        for i in range(args.cases):
            c = generate(args.seed, i)
            flags = f"grad={c.grad} dynamic={c.dynamic}"
            print(f"# {c.label}: {flags}; " + "; ".join(str(spec) for spec in c.inputs))
            print(c.source())
        return 0
    levels = LEVELS if args.level == "both" else (args.level,)
    passes: Any = args.passes
    if isinstance(passes, str) and passes.strip().startswith(("{", "[")):
        passes = json.loads(passes)
    elif isinstance(passes, str) and "," in passes:
        passes = [p.strip() for p in passes.split(",") if p.strip()]
    import optimus

    optimus.resolve(resolve_passes(passes))  # a bad name fails here, before any work

    def progress(res: FuzzResult) -> None:
        print(res.progress_line(), flush=True)

    def on_failure(f: Failure) -> None:
        if f.tries:
            print(f.reproducer(), flush=True)
        else:  # not minimized (its class was seen before, or the shrink budget is spent)
            first = f.message.splitlines()[0] if f.message else ""
            print(f"FAILURE {f.kind} at {f.level} ({f.case.label}), not minimized: {first[:200]}", flush=True)

    res = fuzz(
        cases=args.cases,
        seed=args.seed,
        levels=levels,
        passes=passes,
        batch=args.batch,
        aliasing=args.aliasing,
        shrink_seconds=args.shrink_seconds or None,
        max_shrink=args.max_shrink,
        max_failures=args.max_failures,
        max_seconds=args.max_seconds,
        progress=None if args.quiet else progress,
        on_failure=on_failure,
    )
    print(res.summary(), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res.to_dict(), fh, indent=2, default=repr)
    return 1 if res.failed_cases else 0


def register(subparsers: Any) -> None:
    """Add the ``fuzz`` subcommand to the ``optimus`` command line."""
    p = subparsers.add_parser("fuzz", help="differential fuzzer: random split/cat/view programs, rewritten vs eager")
    add_arguments(p)
    p.set_defaults(func=run_cli)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optimus.fuzz", description="Differential fuzzer for Optimus's vertical rules")
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
