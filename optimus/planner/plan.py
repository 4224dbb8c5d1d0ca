"""The planner behind ``passes="auto"``: which rewrites run, how big each group is.

``passes="auto"`` selects every rule (like ``"all"``) and attaches a ``Planner`` to the
compile. The planner decides three things, each reported:

1. **Which rules run** (``configure``): under CUDA graphs a replay launches every kernel
   from the device, so a rule whose only gain is fewer launches (the rule trait
   ``saves_only_launches``: combo kernels) saves nothing and is left out.
2. **Whether a horizontal group pays** (``judge``, called by the FX driver once the
   replacement is built, before it is committed): the members' estimated device time
   against the new nodes' (``estimate.nodes_cost``: stacks and cats are copies, the
   batched op does the members' work, launches cost only when kernels are launched one
   by one). A group that is not faster by the estimate is declined, with the estimate
   in its reason.
3. **How big a group may be** (``chunk``): the graph's peak memory as Inductor would run
   it, simulated with the group applied (``memory.Liveness.with_group``: the fused buffer,
   the stacked copy, the members' consumers moved after the fused op; in a Torch-IR
   training graph, activations saved for the backward and the group's gradients held at
   once; in AOTAutograd's training forward, saved results the backward can no longer free
   one member at a time); a group that would raise the graph's peak (as the planner first
   saw it) by more than ``memory_increase`` (2%; on small graphs ``STEP_SLACK``, about 8 MiB,
   at Torch-IR, where the graph is the whole step, and ``MEMORY_SLACK`` at the later levels) is
   cut into chunks that fit (``order`` puts members reading one input smallest result
   first; the driver tries each chunk as a group of its own), or declined when not even
   ``min_group`` members fit, or when its members read consecutive parts of one tensor
   (``CUT_PARTS_WHY``).
   What a group copies is the rule's to say (``GroupRule.copies``).
4. **How far the kernel-merging Inductor-IR rules may raise memory** (``rule_options``):
   every rule with a ``memory_increase`` option (the trait ``Rule.memory_bounded``: the
   rules merging independent kernels) gets it, and their driver declines merges above it
   by Inductor's own estimate of the schedule's peak (``planner.schedule_memory.ScheduleMemory``).

``plan_compile`` is what a compile asks for each Dynamo graph: the passes with this
graph's planner attached, or with ``tune=True`` (or ``mode="max-autotune"``) the fastest of
the candidate plans measured on the graph's inputs (``tune``, ``decisions``).
``plan_graph`` is the same for a bare graph (``optimus.optimize``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Callable

import torch
import torch.fx as fx

from ..core.group import Cut
from ..core.registry import AUTO, REGISTRY, PassConfig, exclude_rules, resolve
from ..core.report import GraphReport, Report
from ..core.segments import stack_is_free
from ..core.symbolic import size_hint
from ..core.view import GraphView
from ..core.vocab import ParamRef
from . import costmodel, estimate, tune
from .memory import MEMORY_SLACK, STEP_SLACK, Liveness, MemoryBudget

# Rules that merge independent kernels run the merged kernel where the first ran, so the
# second's outputs (and what it needs) are live earlier: unbounded, on towers32 inference
# these fusions alone took the H200's peak memory to 1.94x Inductor's. The planner bounds
# every rule that has a ``memory_increase`` option by it (``rule_options``).
MEMORY_INCREASE = 0.02  # groups may raise a graph's estimated peak by at most 2%, or its slack on small graphs
# A cut of a group over consecutive parts of one tensor turns each chunk's stack into a slice
# of that tensor. On the H200 such cuts on splitcat inference gave a wrong result that the CPU
# did not reproduce (docs/planner.md, "Memory"); until the cause is known, they are declined.
CUT_PARTS_WHY = 'a chunk would read a slice of it, and such cuts gave a wrong result on the H200 (docs/planner.md, "Memory")'
MIN_GAIN = 0.0  # µs: a group must be estimated faster than its members, strictly


@dataclasses.dataclass(frozen=True)
class Context:
    """What the planner knows about the compile: device, CUDA graphs, training, tuning."""

    device: str  # "cuda" / "cpu"
    cudagraphs: bool = False
    training: bool = False
    tune: bool = False

    @classmethod
    def of_compile(cls, example_inputs: list[Any], inductor_options: dict[str, Any], mode_tunes: bool = False) -> "Context":
        tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
        device = "cuda" if any(t.device.type == "cuda" for t in tensors) else "cpu"
        cudagraphs = bool(inductor_options.get("triton.cudagraphs", False))
        training = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        tune = mode_tunes or bool(inductor_options.get("max_autotune", False))
        return cls(device, cudagraphs, training, tune)

    @classmethod
    def of_graph(cls, gm: fx.GraphModule, example_inputs: list[Any] | tuple[Any, ...] | None = None) -> "Context":
        """A bare graph's context (``optimus.optimize``): its device; launched kernels, no grad."""
        values = list(example_inputs or []) + [n.meta.get("val", n.meta.get("example_value")) for n in gm.graph.nodes if n.op == "placeholder"]
        cuda = any(isinstance(v, torch.Tensor) and v.device.type == "cuda" for v in values)
        return cls("cuda" if cuda else "cpu")

    def describe(self) -> str:
        parts = [self.device, "CUDA graphs" if self.cudagraphs else "launched kernels", "training" if self.training else "inference"]
        return ", ".join(parts)


def plan_compile(
    base: PassConfig,
    gm: fx.GraphModule,
    example_inputs: list[Any],
    inductor_options: dict[str, Any],
    tune_requested: bool,
    report: Report,
    compile_plan: Callable[[PassConfig, fx.GraphModule, list[Any], dict[str, Any]], Callable[..., Any]],
    graph_name: Callable[[str], str],
    source_fingerprint: Callable[[], str],
) -> PassConfig:
    """``passes="auto"`` for one Dynamo graph: ``base`` with a planner for this compile's
    context, its rules and rule options (said in ``report``); with tuning, the measured
    fastest candidate plan instead (``tune.measure_plans``, whose trials ``compile_plan``
    compiles, each as ``candidate_config`` says; ``graph_name`` names the tuned graph in the notes, ``source_fingerprint`` keys
    the decision cache)."""
    context = Context.of_compile(example_inputs, inductor_options, tune_requested)
    if context.tune:
        untuned = dataclasses.replace(context, tune=False)
        extra = {"context": dataclasses.asdict(untuned), "optimus": source_fingerprint(), "excluded": sorted(base.excluded)}

        def trial(plan: str, trial_gm: fx.GraphModule, inputs: list[Any], options: dict[str, Any]) -> Callable[..., Any]:
            return compile_plan(candidate_config(base, plan), trial_gm, inputs, options)

        plan = tune.measure_plans(gm, example_inputs, inductor_options, context.training, extra, trial, report.notes, graph_name("tuned graph"))
        if plan == AUTO:
            return _with_planner(base, untuned, report)
        if plan is not None:
            return candidate_config(base, plan)
    return _with_planner(base, context, report, describe=True)


def candidate_config(base: PassConfig, plan: str) -> PassConfig:
    """What a tuned candidate ``plan`` compiles, in its trial and once chosen: the plan less
    the rules the user excluded from ``base`` (their exclusions hold for every candidate).
    ``"auto"`` as a candidate is ``base`` itself, the planner deciding."""
    if plan == AUTO:
        return base
    return dataclasses.replace(exclude_rules(resolve(plan), base.excluded), spec=f"{AUTO}:{plan}")


def plan_graph(config: PassConfig, gm: fx.GraphModule, example_inputs: list[Any] | tuple[Any, ...] | None, report: Report) -> PassConfig:
    """``passes="auto"`` on a bare graph (``optimus.optimize``): a planner for its device,
    not for how it will run (``Context.of_graph``)."""
    planner = Planner(Context.of_graph(gm, example_inputs))
    report.notes.append(planner.describe())
    return dataclasses.replace(config, planner=planner)


def _with_planner(base: PassConfig, context: Context, report: Report, describe: bool = False) -> PassConfig:
    """``base`` with a planner for ``context``: its rules and rule options."""
    planner = Planner(context)
    rules, notes = planner.configure(dict(base.rules))
    if describe:
        report.note_once(planner.describe())
    for note in notes:
        report.note_once(note)
    return dataclasses.replace(base, rules=rules, options=planner.rule_options(base.options), planner=planner)


@dataclasses.dataclass
class Decision:
    """One horizontal group the planner judged."""

    rule: str
    anchor: str
    members: int
    before: estimate.Cost
    after: estimate.Cost
    accepted: bool
    why: str = ""

    @property
    def gain_us(self) -> float:
        return self.before.us - self.after.us

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "anchor": self.anchor,
            "members": self.members,
            "before_us": round(self.before.us, 2),
            "before_kernels": self.before.kernels,
            "after_us": round(self.after.us, 2),
            "after_kernels": self.after.kernels,
            "accepted": self.accepted,
            "why": self.why,
        }


class Planner:
    """One compile's planner (see module docstring). The FX driver calls
    ``round_started`` / ``order`` / ``chunk`` / ``judge`` / ``accepted``
    (``core.group.GroupPlanner``)."""

    def __init__(self, context: Context, profile: costmodel.DeviceProfile | None = None, memory_increase: float = MEMORY_INCREASE) -> None:
        self.context = context
        self.profile = profile if profile is not None else costmodel.profile(context.device)
        self.memory_increase = memory_increase
        self._budget: MemoryBudget | None = None
        self._budget_graph: fx.Graph | None = None
        self._live: Liveness | None = None
        self._report: GraphReport | None = None
        self._training = False
        self._outputs_saved = False

    # ------------------------------------------------------------------ identity
    def fingerprint(self) -> str:
        """Changes when a decision could: the context and the device profile."""
        data = {"context": dataclasses.asdict(self.context), "profile": self.profile.to_json(), "memory": self.memory_increase}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def describe(self) -> str:
        return f"planner: {self.context.describe()}; device profile {self.profile.device} ({self.profile.source})"

    # ------------------------------------------------------------------ levels
    def configure(self, rules: dict[str, tuple[str, ...]]) -> tuple[dict[str, tuple[str, ...]], list[str]]:
        """The rules per level this compile runs, and a note per rule left out."""
        notes: list[str] = []
        if not self.context.cudagraphs:
            return rules, notes
        out = dict(rules)
        for level, names in rules.items():
            kept = tuple(r for r in names if not (r in REGISTRY and REGISTRY.get(r).saves_only_launches))
            for r in names:
                if r not in kept:
                    notes.append(f"planner: {r} off (it only saves launches, and CUDA graphs make launches free)")
            out[level] = kept
        return out, notes

    def rule_options(self, options: dict[tuple[str, str], dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
        """The rules' options under this planner: the rules whose driver bounds what they
        merge (``Rule.memory_bounded``) get ``memory_increase`` (the schedule's estimated peak
        may rise by at most that much) at each of their levels, unless it was set."""
        out = {k: dict(v) for k, v in options.items()}
        for rule in REGISTRY.rules():
            if rule.memory_bounded:
                for level in rule.levels:
                    out.setdefault((level, rule.name), {}).setdefault("memory_increase", self.memory_increase)
        return out

    # ------------------------------------------------------------------ groups
    def round_started(self, view: GraphView, report: GraphReport) -> None:
        """A round of group rules starts on ``view``'s graph (as it is now). The memory
        budget is the graph's peak when the planner first saw it (round 1), so rounds
        cannot add up allowances."""
        self._report = report
        self._training = self.context.training and view.level == "torch_ir"
        # AOTAutograd's training forward: its outputs are what the backward reads (and frees)
        self._outputs_saved = view.graph_kind() == "forward"
        self._live = None
        try:
            live = self._liveness(view)
        except Exception as e:  # no metadata to size tensors: memory is not judged
            self._budget = None
            note = f"planner: no liveness for this graph ({type(e).__name__}: {e}); group sizes are not bounded by memory"
            if note not in report.notes:
                report.notes.append(note)
            return
        if self._budget is None or self._budget_graph is not view.graph:
            self._budget = MemoryBudget(live.peak, self.memory_increase, self._slack(view))
            self._budget_graph = view.graph

    @staticmethod
    def _slack(view: GraphView) -> int:
        """Bytes a graph may add however small its peak: the step's allowance at Torch-IR,
        where the graph is the step, a sliver at the later levels (see ``STEP_SLACK``)."""
        return STEP_SLACK if view.level == "torch_ir" else MEMORY_SLACK

    def _budget_for(self, view: GraphView, members: list[fx.Node], held: Callable[[int], int | None] | None = None) -> MemoryBudget:
        """The graph's budget for a group of ``members``. A training group's backward holds
        the output gradients of all its members at once; the estimate credits it with what
        the ops depending on every member saved and have freed by then. Past the later
        levels' sliver that credit decides more than it has been measured to bear (mmoe's
        six expert projections, 24 MiB of gradients, were estimated within the step's
        allowance and measured 23.7 MiB over Inductor's peak), so a group whose gradients
        alone exceed the step's allowance is judged with the sliver (``MEMORY_SLACK``),
        unless its rule says what its backward holds (``held``): then no credit is taken."""
        budget = self._budget
        assert budget is not None
        if held is not None and held(len(members)) is not None:
            return budget
        if budget.slack_bytes > MEMORY_SLACK and self._liveness(view).gradient_bytes(members) > budget.slack_bytes:
            return MemoryBudget(budget.base_peak, self.memory_increase, MEMORY_SLACK)
        return budget

    def _liveness(self, view: GraphView) -> Liveness:
        """The current graph's liveness (rebuilt after each accepted group)."""
        if self._live is None:
            self._live = Liveness(view.graph, saved_for_backward=self._training, view=view, outputs_saved=self._outputs_saved)
        return self._live

    def _peak_with(self, view: GraphView, members: list[fx.Node], copies: list[list[Any]] | None, custom_op: bool = False,
                   budget: MemoryBudget | None = None, held: Callable[[int], int | None] | None = None) -> float:
        budget = budget or self._budget
        allowed = budget.allowed if budget is not None else None
        return self._liveness(view).with_group(members, self._stacked_inputs(view, members, copies), allowed=allowed, opaque_backward=custom_op,
                                               held=held(len(members)) if held is not None else None)

    @staticmethod
    def _stacked_inputs(view: GraphView, members: list[fx.Node], copies: list[list[Any]] | None = None) -> list[tuple[fx.Node | None, int]]:
        """What the group's replacement copies each step, with the bytes of each member's
        part: the rule's ``copies`` (``GroupRule.copied_operands``: stacked activations and
        weights, packed operands, concatenated indices), else the members' activation
        inputs (none when they are consecutive parts of one tensor: that stack is a view).
        Only the first ``len(members)`` values of each list count (a chunk's members)."""
        if copies is None:
            firsts = Planner._first_inputs(members)
            copies = [] if firsts is None or stack_is_free(view, firsts) else [firsts]
        out: list[tuple[fx.Node | None, int]] = []
        for values in copies:
            for value in values[: len(members)]:
                if isinstance(value, ParamRef):
                    p = view.gm.get_parameter(value.target)
                    out.append((None, p.numel() * p.element_size()))
                    continue
                v = view.tensor_val(value) if isinstance(value, fx.Node) else None
                if v is not None:
                    out.append((value, size_hint(v.numel()) * v.element_size()))  # its own bytes, not its base's
        return out

    def order(self, view: GraphView, members: list[fx.Node]) -> list[int]:
        """The members (positions) ordered by the bytes of their results, smallest first
        (stable: equal shapes keep graph order), when they all read one input. Members are
        independent, so any chunk of them is legal; the chunks are prefixes, so the members
        that raise memory least are cut together (a shared input's narrow gates, not its
        wide projections). Members reading different inputs keep graph order: their inputs
        may be consecutive parts of one tensor, which a reordered stack would copy."""
        firsts = [n.all_input_nodes[0] if n.all_input_nodes else None for n in members]
        if firsts[0] is None or any(f is not firsts[0] for f in firsts):
            return list(range(len(members)))
        return sorted(range(len(members)), key=lambda i: _result_bytes(view, members[i]))

    def chunk(self, view: GraphView, members: list[fx.Node], min_group: int, copies: list[list[Any]] | None = None, custom_op: bool = False,
              held: Callable[[int], int | None] | None = None) -> Cut | None:
        """``None`` when every member fits the memory budget; else the group cut into
        chunks that fit (``core.group.Cut``). Results of different sizes (ordered smallest
        first by ``order``): the longest prefix that fits, then the rest as a group of its
        own (cut again if it must be); results of one size: balanced chunks (8 of which at
        most 5 fit: 4 + 4). ``copies``: what the replacement copies
        (``GroupRule.copied_operands``; ``None``: the members' first inputs); ``custom_op``:
        the replacement is one of our custom ops (``GroupRule.custom_op``); ``held``: what
        its backward holds for the first n members, where the rule says (``GroupRule.held_in_backward``)."""
        sized = self._fitting(view, members, min_group, copies, custom_op, held)
        if sized is None:
            return None
        size, why = sized
        smallest = max(2, min_group)
        if size < smallest:
            return Cut(declined=f"{why}; no smaller group fits")
        where = f"group of {len(members)} at {members[-1].name}"
        if len({_result_bytes(view, n) for n in members}) > 1:
            rest = tuple(range(size, len(members)))
            parts = (tuple(range(size)),) + ((rest,) if len(rest) >= smallest else ())
            return Cut(parts, f"{where} cut after its {size} smallest ({why})")
        size = -(-len(members) // -(-len(members) // size))  # balanced: 8 at most 5 -> 4 + 4
        parts = tuple(tuple(range(start, min(start + size, len(members)))) for start in range(0, len(members), size))
        return Cut(tuple(p for p in parts if len(p) >= smallest), f"{where} cut into groups of {size} ({why})")

    def _fitting(self, view: GraphView, members: list[fx.Node], min_group: int, copies: list[list[Any]] | None, custom_op: bool,
                 held: Callable[[int], int | None] | None = None) -> tuple[int, str] | None:
        """``None`` when every member fits the memory budget; else the members per chunk
        (0: not even ``min_group`` fit) and why."""
        if self._budget is None or len(members) < 2:
            return None
        budget = self._budget_for(view, members, held)
        whole = self._peak_with(view, members, copies, custom_op, budget, held)
        if budget.fits(whole):
            return None
        cut = not self._reads_parts_of_one_tensor(view, members)
        k = 0
        if cut:
            # the longest prefix that fits (the rise grows with the prefix): a binary search,
            # a handful of simulations; members that all read one input come smallest
            # result first (the driver orders them), so their narrow ones fit together
            lo, hi = max(2, min_group), len(members) - 1
            while lo <= hi:
                size = (lo + hi) // 2
                if budget.fits(self._peak_with(view, members[:size], copies, custom_op, budget, held)):
                    k, lo = size, size + 1
                else:
                    hi = size - 1
        rise = budget.increase(whole) / 2**20
        why = (
            f"memory: all {len(members)} at once would raise the graph's estimated peak by {rise:.2f} MiB "
            f"to {whole / 2**20:.2f} MiB (allowed: {self.memory_increase:.0%} or {budget.slack_bytes // 2**10:.0f} KiB)"
        )
        if not cut:
            return 0, why + f"; not cut: its members read consecutive parts of one tensor ({CUT_PARTS_WHY})"
        return k, why

    @staticmethod
    def _first_inputs(members: list[fx.Node]) -> list[fx.Node] | None:
        """Each member's activation (first) input; ``None`` if a member has no input."""
        firsts = [m.all_input_nodes[0] for m in members if m.all_input_nodes]
        return firsts if len(firsts) == len(members) else None

    @staticmethod
    def _reads_parts_of_one_tensor(view: GraphView, members: list[fx.Node]) -> bool:
        """The members' inputs are consecutive parts of one tensor (a chunk would read a
        slice of it). Members that all read one whole tensor are not parts: any chunk of
        them reads that same tensor."""
        firsts = Planner._first_inputs(members)
        if firsts is None or all(f is firsts[0] for f in firsts):
            return False
        return stack_is_free(view, firsts)

    def judge(self, view: GraphView, rule: str, anchor: fx.Node, members: list[fx.Node], new_nodes: list[fx.Node]) -> str | None:
        """Why the built replacement should not be committed, if it should not."""
        p, launched = self.profile, not self.context.cudagraphs
        before = estimate.nodes_cost(view, members, p, launched, self._training)
        after = estimate.nodes_cost(view, new_nodes, p, launched, self._training, estimate.work(view, members))
        ok = before.us - after.us > MIN_GAIN
        why = "" if ok else f"cost model: not faster (est. {after.us - before.us:+.1f} µs: {before} -> {after}{' under CUDA graphs' if not launched else ''})"
        self._record(Decision(rule, anchor.name, len(members), before, after, ok, why))
        return None if ok else why

    def accepted(self, view: GraphView, members: list[fx.Node]) -> None:
        self._live = None  # the graph changed: the next group is judged on the new one

    def _record(self, d: Decision) -> None:
        if self._report is not None:
            self._report.decisions.append(d.to_dict())


def _result_bytes(view: GraphView, node: fx.Node) -> int:
    """The bytes of ``node``'s result (its size hint where symbolic; 0 if unknown)."""
    v = view.tensor_val(node)
    return 0 if v is None else size_hint(v.numel()) * v.element_size()
