"""The program generator: ``generate(seed, index)`` builds case ``index`` of the stream
for ``seed`` (deterministic), checking every statement on meta tensors as it goes.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any, Callable, Sequence

import torch

from .program import Case, InputSpec, Stmt


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
