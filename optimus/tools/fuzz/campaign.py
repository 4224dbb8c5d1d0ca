"""``fuzz()``: generate cases, check them in batches, investigate failures, count."""

from __future__ import annotations

import collections
import dataclasses
import re
import sys
import time
from typing import Any, Callable, Sequence

import torch

from ...core.table import format_table
from .generate import generate
from .oracle import ALIASING_MODES, ALL_LEVELS, OK, SKIP, CaseResult, LevelResult, _quiet, check_case, reference, resolve_passes
from .program import Case, combine
from .shrink import Failure, _class_key, investigate, signature


@dataclasses.dataclass
class FuzzResult:
    """Counts and findings of one ``fuzz`` run."""

    seed: int
    requested: int
    levels: tuple[str, ...]
    passes: Any
    batch: int
    aliasing: str = "new"
    dynamic: str = "mixed"
    grad: str = "mixed"
    first: int = 0  # index of the first case
    generated: int = 0
    passed: int = 0
    nograd: int = 0  # cases that ran without gradients (autograd rejects their writes)
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    level_skips: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    level_skip_reasons: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # "level: what torch did"
    skip_examples: dict[str, str] = dataclasses.field(default_factory=dict)
    failed_cases: int = 0
    fp64_judged: int = 0  # levels beyond the tolerance that the fp64 rule passed
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
            f"optimus fuzz: seed {self.seed}, {self.requested} cases requested{f' from case {self.first}' if self.first else ''}, levels {'+'.join(self.levels)}, "
            f"passes {self.passes!r}, aliasing {self.aliasing!r}, dynamic {self.dynamic!r}, grad {self.grad!r}, batch {self.batch}, torch {torch.__version__}",
            f"cases: {self.generated} generated, {self.passed} passed, {self.skipped_total} skipped, {self.failed_cases} failed"
            f" ({self.nograd} ran without gradients: autograd rejects their in-place writes)",
        ]
        if self.fp64_judged:
            out.append(f"judged against an fp64 reference (beyond the tolerance, within PyTorch's benchmark rule): {self.fp64_judged} levels")
        if self.skipped:
            out.append("skipped: " + ", ".join(f"{k} x{v}" for k, v in self.skipped.most_common()))
        if self.level_skips:
            out.append("levels skipped (torch itself raises or differs, not Optimus): " + ", ".join(f"{k} x{v}" for k, v in sorted(self.level_skips.items())))
            for reason, n in self.level_skip_reasons.most_common(8):
                out.append(f"  x{n} {reason}")
        if self.failures:
            kinds = collections.Counter(f"{f.kind}@{f.level}" for f in self.failures)
            out.append("failures: " + ", ".join(f"{k} x{v}" for k, v in kinds.most_common()))
            out.append("failure classes (level, signature, rules that fired on the minimized case):")
            classes = collections.Counter(f.key for f in self.failures)
            for key, n in classes.most_common():
                first = next(f for f in self.failures if f.key == key)
                out.append(f"  x{n} {key}  (e.g. {first.case.label}, {len(first.minimized.stmts)} statements)")
        if self.stopped:
            out.append(f"stopped early: {self.stopped}")
        names = sorted({n for c in self.fired.values() for n in c})
        rows = [[n, *(self.fired.get(lv, {}).get(n, 0) for lv in self.levels)] for n in names]
        out.append(format_table(["rewrites per rule", *self.levels], rows, [False] + [True] * len(self.levels)))
        config = optimus.resolve(resolve_passes(self.passes))
        selected = list(dict.fromkeys(r.name for lv in self.levels for sub in _config_levels(lv) for r in config.rules_for(sub)))
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
        rules = {lv: {r.name: r.fingerprint() for sub in _config_levels(lv) for r in config.rules_for(sub)} for lv in self.levels}
        return {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": " ".join(sys.argv),
            "rules": rules,
            "seed": self.seed,
            "first": self.first,
            "requested": self.requested,
            "levels": list(self.levels),
            "passes": self.passes,
            "batch": self.batch,
            "aliasing": self.aliasing,
            "dynamic": self.dynamic,
            "grad": self.grad,
            "torch": torch.__version__,
            "generated": self.generated,
            "passed": self.passed,
            "nograd": self.nograd,
            "skipped": dict(self.skipped),
            "skip_examples": self.skip_examples,
            "level_skips": dict(self.level_skips),
            "level_skip_reasons": dict(self.level_skip_reasons),
            "failed_cases": self.failed_cases,
            "fp64_judged": self.fp64_judged,
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


def _config_levels(level: str) -> tuple[str, ...]:
    """The Optimus levels a fuzz level runs (``compile``: every one, inside Inductor)."""
    return ("torch_ir", "aten_ir", "inductor_ir") if level == "compile" else (level,)


def skip_reason(r: LevelResult) -> str:
    """What torch did at a skipped level: the failure's kind and signature (or the
    exception), and whether Optimus had rewritten anything."""
    if r.torch_failure is None:
        m = re.match(r"torch: building the \w+ graph raised (\w+: .{0,70})", r.message)
        return f"building the graph raised {m.group(1)}" if m else r.message[:80]
    kind, message, rewritten = r.torch_failure
    how = "also without Optimus" if rewritten else "no Optimus rewrite"
    if kind == "graph_error":
        e = re.search(r"raised (\w+: .{0,70})", message)
        return f"graph_error ({how}): {e.group(1) if e else message[:70]}"
    detail = re.search(r"(missing \(eager computes one\)|unexpected \(eager leaves it None\)|requires_grad \[.*?\], expected \[.*?\]|max abs diff|dtype \S+, expected \S+)", message)
    return f"{kind} ({how}): {signature(LevelResult(r.level, kind, message))}" + (f" {detail.group(1)}" if detail else "")


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
                reason = f"{lv}: {skip_reason(lr)}"
                res.level_skip_reasons[reason] += 1
                res.skip_examples.setdefault(reason, f"{o.case.label}: {lr.message[:500]}")
                res.skip_examples.setdefault(f"level {lv}", f"{o.case.label}: {lr.message[:500]}")
        res.fp64_judged += sum(lr.fp64_judged for lr in o.levels.values())
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


DYNAMIC_MODES = ("mixed", "always", "never")
GRAD_MODES = ("mixed", "always", "never")


def fuzz(
    cases: int = 100,
    seed: int = 0,
    levels: Sequence[str] = ("torch_ir", "aten_ir"),
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
    dynamic: str = "mixed",
    grad: str = "mixed",
    first: int = 0,
) -> FuzzResult:
    """Generate ``cases`` programs from ``seed`` (indices ``first`` on: a campaign may run
    one seed's stream in several processes) and check each at ``levels``
    (``torch_ir``, ``aten_ir``: ``optimus.optimize`` on the captured graphs; ``compile``:
    ``optimus.compile`` end to end).

    ``dynamic``: ``"mixed"`` (the generator's choice, ``dynamic=True`` for ~15% of
    cases), ``"always"`` (every case compiled with every size symbolic) or ``"never"``.
    ``grad``: ``"mixed"`` (the generator's choice: gradients for ~80% of cases),
    ``"always"`` or ``"never"`` (forward only).

    Cases are compiled ``batch`` at a time (same grad/dynamic/precision flags); a batch that fails
    is re-run case by case. Failing cases are shrunk (the first ``max_shrink``, for at
    most ``shrink_seconds`` each). Stops after ``max_failures`` failing cases or
    ``max_seconds``.
    """
    import optimus

    optimus.list_rules()  # load the built-in rules
    for lv in levels:
        if lv not in ALL_LEVELS:
            raise ValueError(f"unknown level {lv!r}; valid: {', '.join(ALL_LEVELS)}")
    if dynamic not in DYNAMIC_MODES:
        raise ValueError(f"dynamic must be one of {DYNAMIC_MODES}, got {dynamic!r}")
    if grad not in GRAD_MODES:
        raise ValueError(f"grad must be one of {GRAD_MODES}, got {grad!r}")
    if aliasing not in ALIASING_MODES:
        raise ValueError(f"aliasing must be one of {ALIASING_MODES}, got {aliasing!r}")
    if first < 0:
        raise ValueError(f"first must be >= 0, got {first}")
    res = FuzzResult(seed, cases, tuple(levels), passes, max(1, batch), aliasing, dynamic, grad, first=first)
    fz = _Fuzzer(res, shrink_seconds, max_shrink, on_failure)
    t0 = last = time.perf_counter()
    c0 = time.process_time()
    pending: dict[tuple[bool, bool, bool], list[Case]] = collections.defaultdict(list)
    with _quiet():
        for index in range(first, first + cases):
            res.seconds = time.perf_counter() - t0
            if max_seconds is not None and res.seconds > max_seconds:
                res.stopped = f"time limit ({max_seconds:g} s) after {index - first} cases"
                break
            if res.failed_cases >= max_failures:
                res.stopped = f"{res.failed_cases} failing cases (max_failures)"
                break
            try:
                case = generate(seed, index)
            except Exception as e:  # a bug of the generator's own: counted and shown, the run goes on
                res.generated += 1
                cat = f"generator raised {type(e).__name__}"
                res.skipped[cat] += 1
                res.skip_examples.setdefault(cat, f"seed {seed}, case {index}: {e}")
                continue
            if dynamic != "mixed":
                case = dataclasses.replace(case, dynamic=dynamic == "always")
            if grad != "mixed":
                case = dataclasses.replace(case, grad=grad == "always")
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
            key = (ran.grad, ran.dynamic, ran.low_precision)
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
