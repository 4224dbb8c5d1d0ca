"""The program generator: ``generate(seed, index)`` builds case ``index`` of the stream
for ``seed`` (deterministic), running every statement as it goes on small CPU tensors
that require grad as the case's arguments will, inside the statement's grad-mode,
inference-mode and autocast regions: shapes, dtypes, ``requires_grad`` and what autograd
refuses are known while the program is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import warnings
from typing import Any, Callable, Iterator, Sequence

import torch

from .program import BARE, PREFIXES, Case, InputSpec, Stmt


class _Reject(Exception):
    """The generator's current step does not fit the pool; try another."""


@dataclasses.dataclass
class _Val:
    """A tensor the program can use: a variable, or one chunk of a tuple variable."""

    name: str  # the variable, or the canonical expression of a chunk (``v3[1]``)
    meta: torch.Tensor  # its value while the program is built (a small CPU tensor)
    kind: str  # "input", "state" (a parameter or buffer), "fresh" (a new buffer), "view", "chunk"
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


GRAD_OFF = ("torch.no_grad()", "torch.set_grad_enabled(False)", BARE + "torch.set_grad_enabled(False)")
GRAD_ON = ("torch.enable_grad()", "torch.set_grad_enabled(True)")
INFERENCE = "torch.inference_mode()"
AUTOCAST = (
    'torch.autocast("cpu", dtype=torch.bfloat16)',
    'torch.autocast(device_type="cpu", dtype=torch.bfloat16)',
    'torch.amp.autocast("cpu", dtype=torch.bfloat16)',
    'torch.autocast("cpu")',
)
AUTOCAST_OFF = ('torch.autocast("cpu", enabled=False)', 'torch.autocast(device_type="cpu", enabled=False)')


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
        self.inputs: list[InputSpec] = []
        self.ctx: list[str] = []  # the regions the next statement runs in, outermost first
        self.autocast_used = False
        self.last_cat: tuple[list[torch.Tensor], int, bool] = ([], 0, False)  # pieces, dim, stack

    # ------------------------------------------------------------------ plumbing
    def new(self) -> str:
        name = f"v{self.nvar}"
        self.nvar += 1
        return name

    @contextlib.contextmanager
    def regions(self) -> Iterator[None]:
        """Enter the current regions (``self.ctx``), as the program will."""
        with contextlib.ExitStack() as stack:
            for entry in self.ctx:
                stack.enter_context(eval(entry[len(BARE) :] if entry.startswith(BARE) else entry, self.ns))
            yield

    def run(self, text: str) -> None:
        try:
            with self.regions():
                exec(text, self.ns)
        except (RuntimeError, IndexError, ValueError, TypeError, NotImplementedError) as e:
            raise _Reject(str(e)) from None

    def eval(self, expr: str) -> Any:
        try:
            with self.regions():
                return eval(expr, self.ns)
        except (RuntimeError, IndexError, ValueError, TypeError, NotImplementedError) as e:
            raise _Reject(str(e)) from None

    def emit(self, text: str, defs: Sequence[str] = (), family: str = "other", inplace: bool = False) -> None:
        self.run(text)
        self.stmts.append(Stmt(text, tuple(defs), family, inplace, tuple(self.ctx)))

    def new_input(self, role: str, shape: Sequence[int], dtype: str = "float32") -> _Val:
        """A new argument: a parameter (``w<i>``) or buffer (``b<i>``) of the program."""
        prefix = PREFIXES[role]
        k = sum(1 for spec in self.inputs if spec.name[0] == prefix)
        spec = InputSpec(f"{prefix}{k}", tuple(shape), dtype, self.rng.randrange(2**31), role)
        self.inputs.append(spec)
        self.ns[spec.name] = spec.make(self.grad)
        v = _Val(spec.name, self.ns[spec.name], "state" if spec.state else "input", spec.name)
        self.vals.append(v)
        return v

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
        snap = (len(self.stmts), len(self.vals), len(self.groups), self.nvar, len(self.inputs), list(self.ctx), self.autocast_used)
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
            for spec in self.inputs[snap[4] :]:
                self.ns.pop(spec.name, None)
            del self.inputs[snap[4] :]
            self.ctx[:] = snap[5]
            self.autocast_used = snap[6]
            return False

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, pred: Callable[[_Val], bool] | None = None, avoid: Sequence[_Val] = ()) -> _Val:
        cands = [v for v in self.vals if (pred is None or pred(v)) and v not in avoid]
        if not cands:
            raise _Reject("no operand")
        recent = {id(v) for v in [v for v in cands if v.kind != "state"][-3:]}
        weights = [0.25 if v.kind == "state" else 1.0 + 4.0 * (id(v) in recent) - 0.6 * (v.kind == "input") for v in cands]
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
        with warnings.catch_warnings(), torch.enable_grad():
            warnings.simplefilter("ignore")
            self.inputs = self.make_inputs()
            for spec in self.inputs:
                self.ns[spec.name] = spec.make(self.grad)
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
        return Case(tuple(self.inputs), tuple(self.stmts), tuple(outputs), self.grad, dynamic, self.seed, self.index)

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
            InputSpec(f"x{i}", tuple(s), "float64" if i == f64 else "float32", rng.randrange(2**31), "data" if self.chance(0.12) else "input")
            for i, s in enumerate(shapes)
        ]

    def step(self) -> None:
        names = [
            "split", "cat", "stack", "unbind", "getitem", "slice", "select", "view", "permute",
            "squeeze", "unary", "binary", "inplace", "clone", "motif", "region", "towers", "state", "cast",
        ]  # fmt: skip
        weights = [12, 9, 4, 5, 2, 7, 4, 8, 6, 6, 7, 7, 4, 2, 22, 10, 6, 4, 1]
        if not self.groups:
            weights[names.index("cat")] = 4
        if len(self.ctx) >= 3:  # regions nest at most three deep
            weights[names.index("region")] = 0
        name = self.rng.choices(names, weights)[0]
        getattr(self, f"g_{name}")()

    def choose_outputs(self) -> list[str]:
        rng = self.rng
        used: set[str] = set()
        for s in self.stmts:
            used.update(s.uses)
        outs: list[str] = []
        sinks = [v for v in self.vals if v.kind not in ("input", "state") and v.tuple_name is None and v.name not in used]
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
        buffers = [v for v in self.vals if v.kind == "state" and v.name.startswith("b")]
        if buffers and self.chance(0.3):  # state the program updated, returned
            outs.append(rng.choice(buffers).name)
        if self.chance(0.07):  # a view of an argument, returned
            self.attempt(lambda: outs.append(self.view_of(self.pick(lambda v: v.kind in ("input", "state"))).name))
        if not outs:
            outs.append(self.vals[-1].name if self.vals[-1].tuple_name is None else self.expr(self.vals[-1]))
        named = [v for v in self.vals if v.name in outs and v.tuple_name is None and v.name in self.ns]  # (not the invalid op's)
        if named and self.chance(0.06):  # an output and a view of it
            base = rng.choice(named)
            self.attempt(lambda: outs.append(self.view_of(base).name))
        if self.chance(0.08):
            outs.append(rng.choice(outs))  # the same tensor returned twice
        rng.shuffle(outs)
        return outs

    def view_of(self, t: _Val) -> _Val:
        """``vN`` = a view of ``t`` (transposed, a row, flattened, unsqueezed, detached)."""
        e = self.expr(t)
        forms = [f"{e}.unsqueeze(0)", f"{e}.detach()", f"{e}[None]"]
        if t.rank >= 1 and t.shape[0] > 0:
            forms += [f"{e}[0]", f"{e}[{t.shape[0] - 1}:]"]
        if t.rank >= 2:
            forms += [f"{e}.transpose(0, -1)", f"{e}.t()" if t.rank == 2 else f"{e}.flatten(1)"]
        if t.meta.is_contiguous():
            forms.append(f"{e}.view(-1)")
        return self.assign(self.rng.choice(forms), "view", "view", t.root, t.multi)

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
        forbids writes to leaves and to outputs of multi-output views), a buffer or a data
        input."""
        if self.grad:
            own = [v for v in self.vals if v.tuple_name is None and v.kind in ("input", "state") and not v.meta.requires_grad]
            if own and self.chance(0.2):
                return self.rng.choice(own)
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
        base = len(self.ctx)
        if self.grad and t.kind in ("input", "state"):  # an argument's state is written outside autograd
            self.ctx.append(rng.choice(GRAD_OFF))
        self.emit(rng.choice(forms), (), "inplace", True)
        del self.ctx[base:]

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

    # -------------------------------------------------------------- regions
    def g_region(self) -> None:
        """A grad-mode, inference-mode or autocast region around a few steps; sometimes
        with a region inside that turns the mode back (``enable_grad`` inside ``no_grad``,
        autocast disabled inside autocast)."""
        rng = self.rng
        kind = rng.choices(["no_grad", "enable_in_no_grad", "inference", "autocast", "autocast_off"], [8, 3, 2, 4, 2])[0]
        inner = None
        if kind in ("no_grad", "enable_in_no_grad"):
            outer = rng.choice(GRAD_OFF)
            if kind == "enable_in_no_grad":
                inner = rng.choice(GRAD_ON)
        elif kind == "inference":
            outer = INFERENCE
        else:
            outer = rng.choice(AUTOCAST)
            self.autocast_used = True
            if kind == "autocast_off":
                inner = rng.choice(AUTOCAST_OFF)
        base = len(self.ctx)
        self.ctx.append(outer)
        done = self.region_steps(rng.randint(1, 3))
        if inner is not None:
            self.ctx.append(inner)
            done += self.region_steps(rng.randint(1, 2))
            self.ctx.pop()
            if self.chance(0.4):
                done += self.region_steps(1)
        del self.ctx[base:]
        if not done:
            raise _Reject("empty region")

    def region_steps(self, n: int) -> int:
        done = tries = 0
        while done < n and tries < 4 * n:
            tries += 1
            done += self.attempt(self.region_step)
        return done

    def region_step(self) -> None:
        name = self.rng.choices(["towers", "step", "detach"], [3, 6, 1])[0]
        if name == "towers":
            self.g_towers()
        elif name == "detach":
            self.m_detach()
        else:
            self.step()

    def autocast_on(self) -> bool:
        """Whether the innermost autocast region (if any) is enabled."""
        for entry in reversed(self.ctx):
            if "autocast" in entry:
                return "enabled=False" not in entry
        return False

    def tower_region(self) -> str:
        rng = self.rng
        kind = rng.choices(["grad_off", "grad_on", "inference", "autocast"], [6, 1, 1, 2])[0]
        if kind == "autocast":
            self.autocast_used = True
            return rng.choice(AUTOCAST)
        return {"grad_off": lambda: rng.choice(GRAD_OFF), "grad_on": lambda: rng.choice(GRAD_ON), "inference": lambda: INFERENCE}[kind]()

    def param(self, shape: Sequence[int], frozen_p: float, dtype: str) -> _Val:
        return self.new_input("frozen" if self.chance(frozen_p) else "param", shape, dtype)

    def g_towers(self) -> None:
        """Towers: the same layers (linear / matmul / addmm / bmm, layer_norm, activation)
        applied with their own parameters to one input, to the chunks of a split, or to
        tensors of one shape; some towers under no_grad, inference_mode or autocast, some
        parameters frozen or detached; the results concatenated, stacked, summed or left
        apart. The material of the horizontal rules (batch_linear, batch_linear_lhs,
        batch_layer_norm, batch_pointwise, batch_mm) and of their region checks."""
        rng = self.rng
        src = self.pick(lambda v: v.rank in (2, 3) and v.meta.numel() > 0 and v.meta.is_floating_point() and v.kind != "state")
        if src.meta.dtype not in (torch.float32, torch.float64) and not self.autocast_on():
            e = self.expr(src)
            src = self.assign(rng.choice([f"{e}.float()", f"{e}.to(torch.float32)"]), "cast", "fresh")
        dtype = "float64" if src.meta.dtype == torch.float64 else "float32"
        rank, d = src.rank, src.shape[-1]
        k = rng.randint(2, 6)
        layout = rng.choices(["shared", "split", "pool"], [4, 5, 2])[0]
        xs = [src] * k
        if layout == "split":
            sizes = [c for c in range(1, d) if d % c == 0 and d // c <= 6]
            if sizes:
                c = rng.choice(sizes)
                e = self.expr(src)
                rhs = rng.choice([f"{e}.split({c}, -1)", f"torch.split({e}, {c}, dim={rank - 1})", f"torch.chunk({e}, {d // c}, -1)"])
                xs = self.tuple_result(rhs, "split", "split", src, rank - 1).chunks
        elif layout == "pool":
            same = [v for v in self.vals if v.shape == src.shape and v.meta.dtype == src.meta.dtype and v is not src and v.kind != "state"]
            if same:
                xs = [src] + rng.sample(same, min(len(same), k - 1))
        op = rng.choices(["linear", "matmul", "addmm", "bmm", "none"], [6, 3, 1, 1, 2])[0]
        if (op == "addmm" and rank != 2) or (op == "bmm" and rank != 3):
            op = "linear"
        n = rng.randint(1, 6)
        bias = op == "addmm" or (op == "linear" and self.chance(0.5))
        norm = "before" if op == "none" else rng.choices([None, "before", "after"], [5, 2, 2])[0]
        norm_form = rng.randrange(3)
        affine = self.chance(0.7)
        act = rng.choice(["relu", "tanh", "sigmoid"]) if self.chance(0.6) else None
        pattern = rng.choices(["plain", "one", "mixed", "all"], [3, 4, 3, 2])[0]
        region = self.tower_region()
        target = rng.randrange(len(xs))
        frozen_p = rng.choice([0.0, 0.3, 0.6])
        base = len(self.ctx)
        outs = []
        for i, x in enumerate(xs):
            if pattern == "all" or (pattern == "one" and i == target):
                self.ctx.append(region)
            elif pattern == "mixed" and self.chance(0.5):
                self.ctx.append(self.tower_region())
            h = x
            if norm == "before":
                h = self.layer_norm(h, affine, norm_form, frozen_p, dtype)
            if op != "none":
                h = self.tower_op(op, h, n, bias, frozen_p, dtype)
            if act:
                e = self.expr(h)
                h = self.assign(rng.choice([f"{e}.{act}()", f"torch.{act}({e})"]), "unary", "fresh")
            if norm == "after":
                h = self.layer_norm(h, affine, norm_form, frozen_p, dtype)
            del self.ctx[base:]
            outs.append(h)
        how = rng.choices(["cat", "stack", "sum", "apart"], [5, 2, 1, 2])[0]
        items = "[" + ", ".join(self.expr(o) for o in outs) + "]"
        if how == "cat":
            self.assign(self.cat_fn(items, self.dim(outs[0].rank - 1, outs[0].rank)), "cat", "fresh")
        elif how == "stack":
            self.assign(self.cat_fn(items, 0, stack=True), "stack", "fresh")
        elif how == "sum":
            self.assign(" + ".join(self.expr(o) for o in outs), "binary", "fresh")

    def tower_op(self, op: str, h: _Val, n: int, bias: bool, frozen_p: float, dtype: str) -> _Val:
        rng = self.rng
        e, cin = self.expr(h), h.shape[-1]
        if op == "linear":
            w = self.param((n, cin), frozen_p, dtype).name
            if self.chance(0.1):
                w = f"{w}.detach()"
            if bias:
                b = self.param((n,), frozen_p, dtype).name
                rhs = rng.choice([f"F.linear({e}, {w}, {b})", f"F.linear({e}, {w}, bias={b})", f"torch.nn.functional.linear({e}, {w}, {b})"])
            else:
                rhs = rng.choice([f"F.linear({e}, {w})", f"torch.nn.functional.linear({e}, {w})"])
        elif op == "matmul":
            w = self.param((cin, n), frozen_p, dtype).name
            forms = [f"{e} @ {w}", f"torch.matmul({e}, {w})"] + ([f"torch.mm({e}, {w})", f"{e}.mm({w})"] if h.rank == 2 else [])
            rhs = rng.choice(forms)
        elif op == "addmm":
            w = self.param((cin, n), frozen_p, dtype).name
            b = self.param((n,), frozen_p, dtype).name
            rhs = rng.choice([f"torch.addmm({b}, {e}, {w})", f"{b}.addmm({e}, {w})"])
        else:  # bmm
            w = self.param((h.shape[0], cin, n), frozen_p, dtype).name
            rhs = rng.choice([f"torch.bmm({e}, {w})", f"{e}.bmm({w})"])
        return self.assign(rhs, "linear", "fresh")

    def layer_norm(self, h: _Val, affine: bool, form: int, frozen_p: float, dtype: str) -> _Val:
        e, c = self.expr(h), h.shape[-1]
        if not affine:
            rhs = [f"F.layer_norm({e}, ({c},))", f"F.layer_norm({e}, [{c}], eps=1e-6)", f"torch.layer_norm({e}, [{c}])"][form]
        else:
            g = self.param((c,), frozen_p, dtype).name
            b = self.param((c,), frozen_p, dtype).name
            rhs = [f"F.layer_norm({e}, ({c},), {g}, {b})", f"F.layer_norm({e}, [{c}], weight={g}, bias={b}, eps=1e-6)", f"torch.layer_norm({e}, [{c}], {g}, {b})"][form]
        return self.assign(rhs, "norm", "fresh")

    # -------------------------------------------------------------- state
    def g_state(self) -> None:
        if self.chance(0.65):
            self.m_buffer()
        else:
            self.m_update_argument()

    def m_buffer(self) -> None:
        """A buffer (module state) updated in place: a running average (under no_grad or of
        a detached value), a copy, a counter, a write through a view; sometimes read after."""
        rng = self.rng
        t = self.pick(lambda v: v.rank >= 1 and v.kind != "state" and v.meta.numel() > 0 and v.meta.is_floating_point())
        reduce = t.rank >= 2 and self.chance(0.4)
        shape = t.shape[1:] if reduce else t.shape
        dtype = "float64" if t.meta.dtype == torch.float64 else "float32"
        existing = [v for v in self.vals if v.kind == "state" and v.name.startswith("b") and v.shape == shape]
        buf = rng.choice(existing) if existing and self.chance(0.5) else self.new_input("buffer", shape, dtype)
        b, e = buf.name, self.expr(t)
        src = f"{e}.mean(0)" if reduce else e
        m = rng.choice([0.9, 0.5, 0.99])
        rest = round(1 - m, 4)
        form = rng.choices(["ema_no_grad", "ema_detach", "copy", "count", "view_write"], [4, 3, 2, 2, 1])[0]
        base = len(self.ctx)
        if form in ("ema_no_grad", "copy") and (self.grad or self.chance(0.5)):
            self.ctx.append(rng.choice(GRAD_OFF))
        if form == "ema_no_grad":
            self.emit(f"{b}.mul_({m})", (), "state", True)
            self.emit(rng.choice([f"{b}.add_({src}, alpha={rest})", f"{b}.add_({src} * {rest})"]), (), "state", True)
        elif form == "ema_detach":
            self.emit(f"{b}.mul_({m}).add_({src}.detach(), alpha={rest})", (), "state", True)
        elif form == "copy":
            self.emit(rng.choice([f"{b}.copy_({src})", f"{b}.copy_({src}.detach())"]), (), "state", True)
        elif form == "count":
            self.emit(f"{b}.add_(1)", (), "state", True)
        else:
            if buf.shape[-1] < 1:
                raise _Reject("empty")
            self.emit(f"{self.slice_expr(buf, buf.rank - 1, 0, rng.randint(1, buf.shape[-1]))}.mul_(0.5)", (), "state", True)
        del self.ctx[base:]
        if self.chance(0.5):
            other = self.partner(buf)
            if other is not None and other.kind != "state":
                self.assign(rng.choice([f"{self.expr(other)} * {b}", f"{b} + {self.expr(other)}"]), "binary", "fresh")

    def m_update_argument(self) -> None:
        """An input or parameter updated in place, under no_grad where it requires grad
        (an optimizer step's form)."""
        rng = self.rng
        t = self.pick(lambda v: v.kind in ("input", "state") and v.tuple_name is None and v.rank >= 1 and v.meta.numel() > 0)
        e = t.name
        base = len(self.ctx)
        if t.meta.requires_grad or self.chance(0.3):
            self.ctx.append(rng.choice(GRAD_OFF))
        forms = [f"{e}.add_(0.5)", f"{e}.mul_(0.9)", f"{e}[0].zero_()", f"{self.slice_expr(t, t.rank - 1, 0, 1)}.mul_(2)"]
        other = self.partner(t, other_storage=True)
        if other is not None and torch.broadcast_shapes(t.shape, other.shape) == t.shape:
            o = self.expr(other)
            forms += [f"{e}.sub_({o}, alpha=0.1)", f"{e}.copy_({o})", f"{e}.add_({o}.detach() * 0.01)"]
        self.emit(rng.choice(forms), (), "state", True)
        del self.ctx[base:]

    def m_detach(self) -> None:
        """``detach``: a detached copy used next to the original (stop-gradient,
        straight-through)."""
        rng = self.rng
        t = self.pick(lambda v: v.meta.is_floating_point() and v.kind != "state")
        e = self.expr(t)
        other = self.partner(t)
        forms = [f"{e}.detach()", f"torch.detach({e})", f"{e} * {e}.detach()", f"{e}.detach() + {e}"]
        if other is not None and torch.broadcast_shapes(t.shape, other.shape) == t.shape:
            forms.append(f"{e} + ({self.expr(other)} - {e}).detach()")
        rhs = rng.choice(forms)
        if rhs.endswith(".detach()") or rhs.startswith("torch.detach("):
            self.assign(rhs, "clone", "view", t.root, t.multi)
        else:
            self.assign(rhs, "binary", "fresh")

    def g_cast(self) -> None:
        rng = self.rng
        low = [v for v in self.vals if v.meta.dtype == torch.bfloat16]
        if low and self.chance(0.7):
            e = self.expr(rng.choice(low))
            self.assign(rng.choice([f"{e}.float()", f"{e}.to(torch.float32)"]), "cast", "fresh")
        elif self.autocast_used:
            e = self.expr(self.pick(lambda v: v.meta.dtype == torch.float32 and v.kind != "state"))
            self.assign(rng.choice([f"{e}.to(torch.bfloat16)", f"{e}.bfloat16()"]), "cast", "fresh")
        else:
            raise _Reject("no cast")

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
