"""Where gradients flow in a Torch-IR graph, and what a rewrite must keep of it.

A Torch-IR graph of a training step still carries autograd's meaning: each value either
requires grad (its example value says so) or not, and gradients stop at an op that passes
none on to inputs that require grad (a **cut**: an op under ``no_grad`` or
``inference_mode``, a view taken there, ``detach()``, ``zeros_like``). Two kinds of
rewrite can change who gets a gradient without changing any value:

* **a replacement reaching around a cut, or taking a path away**: ``cat([x[:, :2]
  computed under no_grad, x[:, 2:]])`` equals ``x[:, 0:4]``, but only the second half of ``x`` receives a
  gradient in eager; the slice gives all of ``x`` one. ``GradFlow.problem`` declines a
  replacement that lets gradient reach a value along a path that crossed a cut, whose
  result requires grad where the old value did not (or the reverse), or, in a graph with
  a cut, after which an input or parameter gets no gradient where eager gives it one
  (a cat passes zeros to the inputs of a chunk nobody differentiates);
* **merging a member whose result no gradient reaches**: a linear whose output is only
  used detached leaves its weight's ``.grad`` at ``None``; batched with siblings, the
  stack's backward gives it zeros, and an optimizer treats zeros and ``None``
  differently (weight decay, momentum). ``GradFlow.dropped`` marks such members, and
  horizontal groups (``core/group.py``) never mix them with members whose gradient is
  used.

Aten-IR graphs have no autograd left (the partitioner has applied it; nothing requires
grad), and neither do inference graphs: there every check here is free.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
import torch.fx as fx

from .regions import AMBIENT, Regions


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


_DETACH = ("detach", torch.detach, torch.Tensor.detach)


def _differentiable(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point or t.dtype.is_complex


class GradFlow:
    """Autograd facts of one graph.

    ``val`` gives a node's example value (``GraphView.val``); ``regions`` its grad-mode
    regions; ``ambient_grad`` the grad mode the graph was compiled under; ``autograd``
    whether the level keeps autograd's meaning (Torch-IR) or not (Aten-IR: all free).

    Whether a value requires grad: an existing node's as its example value says (Dynamo
    ran the op in its region's mode: a view taken under ``no_grad`` of a value that
    requires grad still requires grad, a new leaf whose gradient stops there). A node a
    rule builds (its metadata computed under ``no_grad``) is derived: with gradients
    recorded, when one of its inputs requires grad; without, when it is a view of such an
    input or returns the input itself. Committed nodes keep what was derived.
    """

    def __init__(self, graph: fx.Graph, val: Callable[[Any], Any], regions: Regions, ambient_grad: bool, autograd: bool = True) -> None:
        self.graph = graph
        self.val = val
        self.regions = regions
        self.ambient_grad = ambient_grad
        self._rg: dict[fx.Node, bool] = {}
        if autograd:
            for n in graph.nodes:
                self._rg[n] = self._derive(n, self._rg.__getitem__, trust_meta=True)
        self.active = any(self._rg.values())
        # a graph with a cut: a rewrite may also take away the (zero) gradient a leaf got
        self.has_cuts = self.active and any(self.is_cut(n) for n in graph.nodes)
        self._leaves_now: set[fx.Node] | None = None  # _leaves_with_gradient of the graph as it is

    def __bool__(self) -> bool:
        """Whether any value of the graph requires grad (a training graph)."""
        return self.active

    # ------------------------------------------------------------ facts
    def _derive(self, node: fx.Node, rg_of: Callable[[fx.Node], bool], trust_meta: bool) -> bool:
        if node.op in ("placeholder", "get_attr"):
            return any(t.requires_grad for t in _tensors(self.val(node)))
        if node.op not in ("call_function", "call_method", "call_module"):
            return False
        out = _tensors(self.val(node))
        if out and not any(_differentiable(t) for t in out):
            return False
        if node.target in _DETACH:
            return False
        if trust_meta and out:
            return any(t.requires_grad for t in out)  # Dynamo ran the op under its region's mode
        if not any(rg_of(i) for i in node.all_input_nodes):
            return False
        # without gradients recorded, a view of a value that requires grad still says so (a
        # new leaf: its gradient stops there), and an op that returns its input returns it
        return self.grad_enabled_at(node) or self._returns_input(node) or any(t._is_view() for t in out)

    def _returns_input(self, node: fx.Node) -> bool:
        """``contiguous()`` of a contiguous tensor, ``to()`` its own dtype: the input itself."""
        out = self.val(node)
        return isinstance(out, torch.Tensor) and any(self.val(i) is out for i in node.all_input_nodes)

    def flows(self, node: fx.Node) -> bool:
        """Whether gradient reaching ``node`` goes on to its inputs: it ran with gradients
        recorded (and is no ``detach``), or it returned its input itself."""
        if node.target in _DETACH:
            return False
        return self.grad_enabled_at(node) or self._returns_input(node)

    def _requires_grad(self, node: Any) -> bool:
        return isinstance(node, fx.Node) and self._rg.get(node, False)

    def grad_enabled_at(self, node: fx.Node) -> bool:
        """Whether ``node`` runs with gradients recorded (an unknown flag counts as on)."""
        grad, inference, _ = self.regions.state_at(node)
        if any(flag is not False for flag in inference):
            return False
        if grad == AMBIENT:
            return self.ambient_grad
        return grad is not False

    def is_cut(self, node: fx.Node) -> bool:
        """An op whose inputs require grad but that passes no gradient on to them (under
        ``no_grad`` or ``inference_mode``, ``detach``); its result requires none, or is a view
        that became a leaf of its own."""
        if node.op not in ("call_function", "call_method", "call_module"):
            return False
        out = _tensors(self.val(node))
        if out and not any(_differentiable(t) for t in out):
            return False
        return any(self._requires_grad(i) for i in node.all_input_nodes) and not (self._requires_grad(node) and self.flows(node))

    def requires_grad(self, node: fx.Node, built: set[fx.Node]) -> bool:
        """``requires_grad`` of ``node``'s result; ``built``: the new nodes of a rewrite
        not committed yet (judged from their inputs and region)."""
        if node not in built:
            return self._requires_grad(node)
        return self._derive(node, lambda i: self.requires_grad(i, built), trust_meta=False)

    def mark_built(self, new_nodes: list[fx.Node]) -> None:
        """Keep the facts of a committed rewrite's new nodes."""
        if not self.active:
            return
        built = set(new_nodes)
        flags = {n: self.requires_grad(n, built) for n in new_nodes}
        self._rg.update(flags)
        self._leaves_now = None  # a commit rewired the graph

    # ------------------------------------------------------------ rewrites
    def problem(self, pairs: list[tuple[fx.Node, fx.Node]], new_nodes: Iterable[fx.Node]) -> str | None:
        """Why replacing each ``old`` by its ``new`` would change who gets a gradient, if it
        would: a result's ``requires_grad`` changes, or gradient from the replacements
        reaches a value that, in the graph as it is, gets gradient from the replaced values
        only through a cut (or not at all), or an input or parameter would get no gradient
        where eager gives it one (the whole-graph walk, in a graph with a cut or where the
        rewrite may leave a value unused). The pairs count together: the members of a
        horizontal group are slices of one batched op whose backward reads every member's
        inputs, as the members together did."""
        if not self.active:
            return None
        built = set(new_nodes)
        olds: list[fx.Node] = []
        reads: dict[fx.Node, fx.Node] = {}
        for old, new in pairs:
            want, got = self._requires_grad(old), self.requires_grad(new, built)
            if want != got:
                return (f"{new.name} would {'' if got else 'not '}require grad where {old.name} "
                        f"{'does' if want else 'does not'} (a value computed under no_grad or detached)")
            if got:
                olds.append(old)
                for r in self._grad_reads(new, built):
                    reads.setdefault(r, new)
        reached = self._reached_without_cut(olds, list(reads))
        for r, new in reads.items():
            if r not in reached:
                names = ", ".join(o.name for o in olds[:3]) + (", ..." if len(olds) > 3 else "")
                return f"gradient from {new.name} would reach {r.name}, which gets none from {names} but through a no_grad region or a detach"
        if self.has_cuts or self._may_drop_a_use(pairs, built):
            if self._leaves_now is None:
                self._leaves_now = self._leaves_with_gradient({}, set())
            before = self._leaves_now
            after = self._leaves_with_gradient(dict(pairs), built)
            if before - after:
                lost = ", ".join(sorted(n.name for n in before - after))
                return f"{lost} would get no gradient (eager gives one, zeros too, through {olds[0].name if olds else pairs[0][0].name})"
        return None

    def _may_drop_a_use(self, pairs: list[tuple[fx.Node, fx.Node]], built: set[fx.Node]) -> bool:
        """Whether the rewrite may leave a value that requires grad unused (and so an input
        or parameter behind it without a gradient): some input of a replaced node is used by
        replaced nodes and unused nodes only, and read by no replacement. Cheap, and what
        tells when a graph without cuts needs the whole-graph walk (``slice(cat([x, w]))`` ->
        ``x`` leaves ``w`` unused)."""
        replaced = {old for old, _ in pairs}
        kept = {new for _, new in pairs} | {i for n in built for i in n.all_input_nodes}
        for old in replaced:
            for i in old.all_input_nodes:
                if i not in kept and self._requires_grad(i) and all(u in replaced or (u.op != "output" and not u.users) for u in i.users):
                    return True
        return False

    def _leaves_with_gradient(self, replace: dict[fx.Node, fx.Node], built: set[fx.Node]) -> set[fx.Node]:
        """The inputs and parameters that get a gradient (zeros too) from the graph's
        outputs: walk back from the outputs through ops that pass gradient on, reading each
        replaced node as its replacement."""
        out = next((n for n in reversed(self.graph.nodes) if n.op == "output"), None)
        if out is None:
            return set()
        leaves: set[fx.Node] = set()
        stack = [replace.get(i, i) for i in out.all_input_nodes]
        seen: set[fx.Node] = set()
        while stack:
            n = stack.pop()
            if n in seen or not self.requires_grad(n, built):
                continue
            seen.add(n)
            if n.op in ("placeholder", "get_attr"):
                leaves.add(n)
            elif self.flows(n):  # a new node reads the graph as it is, the old nodes included
                stack.extend(i if n in built else replace.get(i, i) for i in n.all_input_nodes)
        return leaves

    def _grad_reads(self, new: fx.Node, built: set[fx.Node]) -> list[fx.Node]:
        """The existing nodes gradient flows into from ``new`` (through the new nodes that
        record gradients)."""
        if new not in built:
            return [new] if self._requires_grad(new) else []
        reads: dict[fx.Node, None] = {}
        stack, seen = [new], {new}
        while stack:
            n = stack.pop()
            if not self.requires_grad(n, built) or not self.flows(n):
                continue
            for i in n.all_input_nodes:
                if i in seen:
                    continue
                seen.add(i)
                if i in built:
                    stack.append(i)
                elif self._requires_grad(i):
                    reads[i] = None
        return list(reads)

    def _reached_without_cut(self, olds: list[fx.Node], targets: list[fx.Node]) -> set[fx.Node]:
        """Of ``targets``, those that get gradient from ``olds`` along every path that
        reaches them: walk back from ``olds`` through their inputs; a target reachable
        only through a cut, or through a cut as well, is left out. The walk stops below
        the earliest target."""
        if not targets:
            return set()
        floor = min(t._sort_key for t in targets)
        wanted, starts = set(targets), set(olds)
        clean: set[fx.Node] = set()
        behind_cut: set[fx.Node] = set()
        stack: list[tuple[fx.Node, bool]] = [(o, False) for o in olds]
        seen: set[tuple[fx.Node, bool]] = set()
        while stack:
            n, cut = stack.pop()
            if (n, cut) in seen or n._sort_key < floor:
                continue
            seen.add((n, cut))
            if n in wanted and n not in starts:
                (behind_cut if cut else clean).add(n)
            through = cut or self.is_cut(n)
            for i in n.all_input_nodes:
                stack.append((i, through))
        return {t for t in targets if t in clean and t not in behind_cut} | (starts & wanted)

    # ------------------------------------------------------------ groups
    def dropped(self) -> set[fx.Node]:
        """Values that require grad but that no gradient ever reaches: no graph output is
        computed from them along a path where gradient flows (only detached, only used
        under no_grad, ...). Their inputs' ``.grad`` stays ``None`` in eager."""
        if not self.active:
            return set()
        used: set[fx.Node] = set()
        out = next((n for n in reversed(self.graph.nodes) if n.op == "output"), None)
        for n in reversed(list(self.graph.nodes)):
            if not self._requires_grad(n):
                continue
            if (out is not None and out in n.users) or any(u in used and self.flows(u) for u in n.users):
                used.add(n)
        return {n for n in self.graph.nodes if n.op not in ("placeholder", "get_attr", "output") and self._requires_grad(n) and n not in used}
