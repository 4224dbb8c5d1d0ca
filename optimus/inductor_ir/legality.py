"""Buffer-level legality of an Inductor-IR plan: what each kernel reads and writes, and
which buffers Inductor's code generation drops on the way.

Inductor generates one kernel per node, in list order, and buffers disappear while it
does:

* **kernel-local buffers**: a kernel drops a buffer it writes when every user of the
  buffer is inside it (``Kernel.remove_kernel_local_buffers``; in a combo kernel, per
  sub-kernel);
* **codegen replacements**: a split mix-order reduction drops its partial sums and
  computes the second-stage reduction itself (``inductor_api.codegen_replacements``);
  ``codegen_node`` then skips that reduction, combo-kernel codegen does not;
* **removed buffers**: what ``V.graph.removed_buffers`` holds already (dead code).

A kernel that loads a dropped buffer fails in ``KernelArgs.input`` with
``AssertionError: bufN``. Generating a combo's source before accepting it cannot see
this: the buffer is dropped later, while the nodes before the combo are generated.

``plan_problems(scheduler, nodes, facts)`` lists what would go wrong with a node list:

``order``          a node reads a buffer whose writer runs later
``removed``        a node reads a buffer Inductor removed already
``dropped``        a node reads a buffer another node's codegen drops, and Inductor will
                   not skip the reading operation (it never does in a combo kernel)
``kernel_local``   a node reads a buffer its writer's kernel would drop as kernel-local
                   (Inductor's ``users`` of the buffer do not include the reader)
``combo_member``   a combo member Inductor's combo codegen cannot generate (extern,
                   template, nop, foreach, mix-order) or whose operation codegen replaces
``combo_write``    two members of one combo write the same buffer
``combo_read``     a combo member reads (or must wait for) another member's output

``new_problems(scheduler, original, plan)`` returns the problems of ``plan`` that
Inductor's own list does not have: the driver refuses such a plan and keeps Inductor's.
Problems are compared by a key of operation and buffer names, which fusion does not
change, so a quirk Inductor's list already has never refuses a plan.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

from . import inductor_api


@dataclasses.dataclass(frozen=True)
class Problem:
    """One reason a node list cannot be generated.

    ``key`` identifies it across plans (kind, operation and buffer names); ``reason`` is
    the general reason (a decline reason, the same for every node it applies to);
    ``detail`` names the operations and buffers.
    """

    key: tuple[str, ...]
    reason: str
    detail: str

    @property
    def kind(self) -> str:
        return self.key[0]


@dataclasses.dataclass
class CodegenFacts:
    """What Inductor's codegen will drop, known before codegen starts.

    ``dropped``: buffer -> the node whose codegen removes it; ``replaced``: operation ->
    the node whose code computes it instead; ``removed``: ``V.graph.removed_buffers``.
    """

    removed: set[str] = dataclasses.field(default_factory=set)
    dropped: dict[str, str] = dataclasses.field(default_factory=dict)
    replaced: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def collect(cls, nodes: list[Any]) -> "CodegenFacts":
        facts = cls(removed=inductor_api.removed_buffers())
        for n in nodes:
            buffers, ops = inductor_api.codegen_replacements(n)
            for b in buffers:
                facts.dropped[b] = n.get_name()
            for op in ops:
                facts.replaced[op] = n.get_name()
        return facts


REPLACED = (
    "Inductor computes it in a mix-order reduction's code (the second stage of a split reduction) and skips it "
    "in plain kernels; a combo kernel would generate it and read a dropped buffer"
)
DROPPED_READ = "reads a partial sum that a mix-order reduction drops when it is generated"
NO_KERNEL = "Inductor generates no kernel for it (a mix-order reduction's code computes it: the second stage of a split reduction)"


# ---------------------------------------------------------------------- node access
def is_combo(node: Any) -> bool:
    return inductor_api._is_kind(node, "ForeachKernelSchedulerNode")


def leaves(node: Any) -> list[Any]:
    """The IR operations (scheduler nodes) inside a possibly fused or combo node."""
    return list(inductor_api.call_safely(node.get_nodes, [node]) or [node])


def units(node: Any) -> list[Any]:
    """The kernels a node generates: a combo's members (sub-kernels), else the node."""
    if is_combo(node):
        return list(getattr(node, "snodes", []) or [])
    return [node]


def reads(leaf: Any) -> Iterator[tuple[str, bool]]:
    """``(buffer name, ordering only)`` for each dependency of one operation."""
    rw = getattr(leaf, "read_writes", None)
    for dep in getattr(rw, "reads", ()) if rw is not None else ():
        yield dep.name, type(dep).__name__ == "WeakDep"


def writes(node: Any) -> set[str]:
    return set(inductor_api.call_safely(node.get_buffer_names, ()))


def _writer_op(scheduler: Any, name: str) -> str | None:
    buf = getattr(scheduler, "name_to_buf", {}).get(name)
    if buf is None:
        return None
    return inductor_api.call_safely(buf.defining_op_name, None)


def generates_no_kernel(node: Any, facts: CodegenFacts) -> bool:
    """Every operation of ``node`` is computed by another node's code: Inductor skips it
    (``codegen_node``), so fusing it with anything saves nothing."""
    ops = [leaf.get_name() for leaf in leaves(node)]
    return bool(ops) and all(op in facts.replaced for op in ops)


# ---------------------------------------------------------------------- combo checks
def combo_member_problem(node: Any, facts: CodegenFacts) -> Problem | None:
    """Why ``node`` cannot be a combo sub-kernel whatever the other members are, or None."""
    if not inductor_api.combinable(node):
        what = f"{type(node).__name__} is not a kernel that combo codegen can generate"
        return Problem(("combo_member", leaves(node)[0].get_name()), what, f"{node.get_name()}: {what}")
    for leaf in leaves(node):
        op = leaf.get_name()
        if op in facts.replaced:
            return Problem(
                ("combo_member", op),
                REPLACED,
                f"{op} is computed by the mix-order reduction {facts.replaced[op]} itself, which drops the buffer {op} reads",
            )
        for name, weak in reads(leaf):
            if not weak and name in facts.dropped:
                return Problem(
                    ("combo_member", op),
                    DROPPED_READ,
                    f"{op} reads {name}, which the mix-order reduction {facts.dropped[name]} drops when it is generated",
                )
    return None


def combo_problems(members: list[Any], facts: CodegenFacts) -> list[Problem]:
    """Everything that stops ``members`` from being one combo kernel: each member's own
    problem, two members writing one buffer, a member reading another's output."""
    out: list[Problem] = []
    for m in members:
        p = combo_member_problem(m, facts)
        if p is not None:
            out.append(p)
    writer: dict[str, int] = {}
    for i, m in enumerate(members):
        for b in sorted(writes(m)):
            if b in writer and writer[b] != i:
                out.append(
                    Problem(("combo_write", b), "two members write the same buffer", f"{members[writer[b]].get_name()} and {m.get_name()} both write {b}")
                )
            writer.setdefault(b, i)
    for i, m in enumerate(members):
        for leaf in leaves(m):
            for name, _ in reads(leaf):
                j = writer.get(name)
                if j is not None and j != i:
                    out.append(
                        Problem(
                            ("combo_read", leaf.get_name(), name),
                            "a member reads another member's output",
                            f"{leaf.get_name()} reads {name}, written by {members[j].get_name()} in the same combo kernel",
                        )
                    )
    return out


# ----------------------------------------------------------------------- whole plan
def plan_problems(scheduler: Any, nodes: list[Any], facts: CodegenFacts) -> list[Problem]:
    """Every read in ``nodes`` that Inductor's codegen of this list would fail on."""
    mutation_real_name = getattr(scheduler, "mutation_real_name", {}) or {}
    position: dict[str, int] = {}  # operation -> index of the node holding it
    unit_ops: dict[str, frozenset[str]] = {}  # operation -> operations of its kernel
    for i, n in enumerate(nodes):
        for u in units(n):
            ops = frozenset(leaf.get_name() for leaf in leaves(u))
            for op in ops:
                position[op] = i
                unit_ops[op] = ops
    out: list[Problem] = []
    for i, n in enumerate(nodes):
        combo = is_combo(n)
        if combo:
            out.extend(combo_problems(units(n), facts))
        for leaf in leaves(n):
            op = leaf.get_name()
            for name, weak in reads(leaf):
                writer = _writer_op(scheduler, name)
                j = position.get(writer) if writer is not None else None
                if j is not None and j > i:
                    out.append(Problem(("order", op, name), "reads a buffer before its writer runs", f"{op} reads {name} before its writer {writer} runs"))
                if weak:
                    continue
                real = mutation_real_name.get(name, name)
                if real in facts.removed:
                    out.append(Problem(("removed", op, real), "reads a buffer Inductor removed", f"{op} reads {real}, which Inductor removed"))
                # codegen_node skips the replaced operations; combo codegen generates them
                if name in facts.dropped and (combo or op not in facts.replaced):
                    out.append(
                        Problem(("dropped", op, name), DROPPED_READ, f"{op} reads {name}, which {facts.dropped[name]} drops when it is generated")
                    )
                if writer is None or j is None or unit_ops.get(writer) == unit_ops.get(op):
                    continue  # a graph input, or written inside the same kernel
                if inductor_api.removable_through_fusion(scheduler, name, unit_ops[writer]):
                    out.append(
                        Problem(
                            ("kernel_local", op, name),
                            "reads a buffer its writer's kernel drops as kernel-local",
                            f"{op} reads {name}, which the kernel of {writer} drops as kernel-local (Inductor records no other user)",
                        )
                    )
    return out


def new_problems(scheduler: Any, original: list[Any], plan: list[Any], facts: CodegenFacts | None = None) -> list[Problem]:
    """The problems ``plan`` has that Inductor's own ``original`` list does not."""
    facts = facts if facts is not None else CodegenFacts.collect(original)
    known = {p.key for p in plan_problems(scheduler, original, facts)}
    seen: set[tuple[str, ...]] = set()
    out = []
    for p in plan_problems(scheduler, plan, facts):
        if p.key not in known and p.key not in seen:
            seen.add(p.key)
            out.append(p)
    return out


__all__ = ["CodegenFacts", "Problem", "combo_member_problem", "combo_problems", "generates_no_kernel", "new_problems", "plan_problems"]
