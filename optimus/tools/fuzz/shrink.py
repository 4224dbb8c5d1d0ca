"""Shrinking a failing case to a small reproducer, and the ``Failure`` it becomes."""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Callable, Iterator

from .oracle import LevelResult, check_case
from .program import _NAME, BARE, Case, Stmt, _rename


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
    entries = list(dict.fromkeys(e for s in case.stmts for e in s.ctx))
    for entry in entries:  # leave a region out: its statements run in the regions around it
        yield dataclasses.replace(case, stmts=tuple(dataclasses.replace(s, ctx=tuple(e for e in s.ctx if e != entry)) for s in case.stmts))
    for i, s in enumerate(case.stmts):  # one statement out of its innermost region
        if s.ctx:
            yield dataclasses.replace(case, stmts=case.stmts[:i] + (dataclasses.replace(s, ctx=s.ctx[:-1]),) + case.stmts[i + 1 :])
    for entry in entries:  # a bare set_grad_enabled as a with block
        if entry.startswith(BARE):
            plain = entry[len(BARE) :]
            yield dataclasses.replace(case, stmts=tuple(dataclasses.replace(s, ctx=tuple(plain if e == entry else e for e in s.ctx)) for s in case.stmts))
    for k, spec in enumerate(case.inputs):  # a parameter as a plain input, a frozen one as data
        simpler = {"param": "input", "frozen": "data"}.get(spec.role)
        if simpler:
            yield dataclasses.replace(case, inputs=case.inputs[:k] + (dataclasses.replace(spec, role=simpler),) + case.inputs[k + 1 :])
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


def shrink(case: Case, still_fails: Callable[[Case], bool], max_tries: int = 600, max_seconds: float = 90.0) -> tuple[Case, int]:
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
        m = re.match(r"(call \d+: )?(output aliasing lost|output aliasing|output structure|outputs' requires_grad|output|grad of parameter|grad|input)", r.message)
        if not m:
            return "mismatch:"
        return f"mismatch:{m.group(2)}" + (f" ({m.group(1)[:-2]})" if m.group(1) else "")
    if r.kind == "fallback":
        m = re.search(r"(autograd differs|raised \((\w+)|failed \((\w+))", r.message)
        return f"fallback:{(m.group(2) or m.group(3) or 'autograd') if m else ''}"
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
        r = check_case(c, (level,), passes, aliasing=aliasing).levels.get(level)  # a failure of torch's own is no reduction
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
    inputs = ", ".join(
        f'InputSpec("{i.name}", {tuple(i.shape)}, "{i.dtype}", seed={i.seed}' + (f', role="{i.role}")' if i.role != "input" else ")") for i in m.inputs
    )
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
        "from optimus.tools.fuzz import InputSpec, check_source",
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
