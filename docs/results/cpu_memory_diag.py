"""Where the planner's memory estimate and the CPU proxy's measured peak part ways.

Runs like ``cpu_memory_proxy.py`` (a zoo model at its realistic size on the CPU, the planner
priced for the H200, the kernel-op rules on) for ``inductor`` and one planned configuration,
and prints, per configuration:

* the measured peaks: the whole step's (what ``cpu_memory_proxy.py`` reports), the
  forward's (activations saved for the backward included) and, in training, the backward's
  rise above what was live when it started;
* per graph the planner saw (level, kind): its estimated peak before any group (the budget's
  base), the allowance, the order the estimate chose and the largest buffers live at the
  estimated peak;
* per group the planner judged: the rule, the members, the estimated peak with the group
  applied (``Liveness.with_group``; ``bound`` where the cheap upper bound answered without
  simulating), whether memory cut it, and whether it was committed.

    python docs/results/cpu_memory_diag.py MODEL infer|train [auto] [--skip RULE[:LEVEL],...]

``--skip`` declines the named rules' groups (at one level, or all; ``*`` names every group
rule) through the planner, so one group's share of the measured peak can be read off against
a run without it. The
wrapping reads the planner's current methods (``Planner.round_started``, ``chunk``,
``judge``, ``Liveness.with_group``); it changes no decision unless ``--skip`` asks.
"""
import json
import os
import sys

os.environ["OPTIMUS_KERNEL_RULES_ON_CPU"] = "1"
import torch  # noqa: E402

import optimus  # noqa: E402
from optimus.tools import measure  # noqa: E402
from optimus.tools.bench.external import get_bench_model  # noqa: E402
from optimus.planner import costmodel, memory, plan  # noqa: E402

PROFILE = os.path.join(os.path.dirname(__file__), "h200-profile", "profile-NVIDIA_H200_2_11_0_cu130.json")
costmodel.set_profile("cpu", costmodel.DeviceProfile.from_json(json.load(open(PROFILE))))
MiB = 2**20

args = [a for a in sys.argv[1:] if not a.startswith("--")]
name, mode = args[0], args[1]
config = args[2] if len(args) > 2 else "auto"
skip: set[tuple[str, str | None]] = set()
for a in sys.argv[1:]:
    if a.startswith("--skip="):
        for item in a.split("=", 1)[1].split(","):
            rule, _, level = item.partition(":")
            skip.add((rule, level or None))

log: list[str] = []
state: dict = {}


def round_started(self, view, report):
    out = original_round_started(self, view, report)
    state["where"] = f"{view.level} {view.graph_kind()}"
    live = self._live
    if live is not None and self._budget is not None:
        top = ", ".join(f"{n} {b / MiB:.2f}" for n, b in live.live_at_peak(6))
        log.append(f"  graph {state['where']}: estimated peak {live.peak / MiB:.2f} MiB (budget base "
                   f"{self._budget.base_peak / MiB:.2f}, allowed {self._budget.allowed / MiB:.2f}; order "
                   f"{live.order_kind}); live at the peak: {top}")
    return out


def with_group(self, members, stacked=(), allowed=None, opaque_backward=False, held=None):
    stacked = list(stacked)
    peak = original_with_group(self, members, stacked, allowed, opaque_backward, held)
    memo = (tuple(m for m in members if m in self.index), tuple(stacked), opaque_backward, held)
    how = "simulated" if memo in self._group_peaks else "bound"
    state.setdefault("peaks", []).append((len(members), peak, how, sum(b for _, b in stacked)))
    return peak


def chunk(self, view, members, min_group, copies=None, custom_op=False, held=None):
    state["peaks"] = []
    sized = original_chunk(self, view, members, min_group, copies, custom_op, held)
    state["chunk"] = (sized, list(state["peaks"]))
    return sized


def judge(self, view, rule, anchor, members, new_nodes):
    level = view.level
    if (rule, None) in skip or (rule, level) in skip or ("*", None) in skip or ("*", level) in skip:
        why = "skipped (cpu_memory_diag --skip)"
        self._record(plan.Decision(rule, anchor.name, len(members), estimate_zero, estimate_zero, False, why))
        out = why
    else:
        out = original_judge(self, view, rule, anchor, members, new_nodes)
    sized, peaks = state.pop("chunk", (None, []))
    sims = "; ".join(f"{n} members -> {p / MiB:.2f} MiB ({how}, copies {c / MiB:.2f})" for n, p, how, c in peaks)
    base = self._budget.base_peak / MiB if self._budget is not None else float("nan")
    log.append(f"    {state.get('where', '?')}: {rule} x{len(members)} at {anchor.name}: "
               f"{'TAKEN' if out is None else 'declined'}; base {base:.2f} MiB; with_group: {sims or 'not asked'}"
               f"{'' if out is None else '; ' + out[:160]}")
    return out


original_round_started, plan.Planner.round_started = plan.Planner.round_started, round_started
original_chunk, plan.Planner.chunk = plan.Planner.chunk, chunk
original_judge, plan.Planner.judge = plan.Planner.judge, judge
original_with_group, memory.Liveness.with_group = memory.Liveness.with_group, with_group
estimate_zero = None
try:
    from optimus.planner.estimate import Cost

    estimate_zero = Cost(0.0, 0)
except Exception:  # pragma: no cover - a Cost with other fields
    pass

for cfg in ("inductor", config):
    torch._dynamo.reset()
    log.clear()
    z = get_bench_model(name, "realistic", device="cpu")
    fn = torch.compile(z.model, fullgraph=True) if cfg == "inductor" else optimus.compile(z.model, passes=cfg, fullgraph=True)

    def forward():
        if mode == "infer":
            with torch.no_grad():
                return fn(*z.inputs)
        return fn(*z.inputs)

    def step():
        out = forward()
        if mode == "train":
            z.loss(out).backward()

    step()
    step()
    peak = measure.peak_tensor_memory(step)
    line = f"{name} {mode} {cfg:9s} step peak {peak / MiB:8.2f} MiB"
    if mode == "train":
        fwd = measure.peak_tensor_memory(lambda: state.__setitem__("out", forward()))
        out = state.pop("out")
        bwd = measure.peak_tensor_memory(lambda: z.loss(out).backward())
        del out
        line += f"  forward {fwd / MiB:8.2f} MiB  backward rise {bwd / MiB:8.2f} MiB"
    print(line, flush=True)
    for entry in log:
        print(entry)
    if cfg != "inductor":
        rep = optimus.last_report()
        for g in rep.graphs:
            for note in g.notes:
                if "memory" in note or "planner" in note:
                    print(f"  note {g.level} {g.graph}: {note[:300]}")
