"""Peak live memory of an FX graph, and what a horizontal fusion would do to it.

Liveness is read off the graph's fake values: every storage (views share their base's,
found through fake-tensor storage identity) is live from the first node that produces
it to the last node that reads it, or to the end if a graph output holds it; inputs
(placeholders: parameters, activations saved for backward, user inputs) are live
throughout. The estimate over-counts what Inductor fuses away (elementwise temporaries
never reach memory), so the planner judges *changes* against it, never absolutes:

* a horizontal group computes every member's output at once, at the position of the
  last member, into one buffer that lives until the last member's output dies; the
  members' inputs must live until then too; the members' outputs no longer exist
  earlier. ``group_delta`` turns that into a change of the live-bytes curve;
* ``MemoryBudget`` keeps the curve with every accepted group's change applied, so a
  series of groups that are each small cannot add up to a large peak increase.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
import torch
import torch.fx as fx


def _val(node: Any) -> Any:
    if not isinstance(node, fx.Node):
        return None
    return node.meta.get("val", node.meta.get("example_value"))


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors in a node's value (a tensor, or nested lists/tuples of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []


def _hint(x: Any) -> int:
    if isinstance(x, int):
        return x
    node = getattr(x, "node", None)
    hint = getattr(node, "hint", None)
    return int(hint) if hint is not None else 0


def _storage_key(t: torch.Tensor) -> Any:
    from torch.multiprocessing.reductions import StorageWeakRef

    try:
        return StorageWeakRef(t.untyped_storage())
    except Exception:  # pragma: no cover - tensors without storage
        return ("id", id(t))


def _nbytes(t: torch.Tensor) -> int:
    try:
        return _hint(t.untyped_storage().nbytes())
    except Exception:
        n = 1
        for s in t.shape:
            n *= _hint(s)
        return n * t.element_size()


class Liveness:
    """Per-node live bytes of ``graph`` (``curve[i]`` = bytes live while node ``i`` runs)."""

    def __init__(self, graph: fx.Graph, saved_for_backward: bool = False) -> None:
        """``saved_for_backward``: a training graph before AOTAutograd (Torch-IR), whose
        results that need a gradient are kept for the backward: they stay live to the end
        (the forward's peak is where every saved activation is live at once)."""
        self.nodes = list(graph.nodes)
        self.index = {n: i for i, n in enumerate(self.nodes)}
        n = len(self.nodes)
        start: dict[Any, int] = {}
        end: dict[Any, int] = {}
        size: dict[Any, int] = {}
        self.storage_of: dict[fx.Node, list[Any]] = {}
        for i, node in enumerate(self.nodes):
            keys = []
            for t in tensors_of(_val(node)):
                k = _storage_key(t)
                keys.append(k)
                if k not in start:
                    start[k] = 0 if node.op == "placeholder" else i
                    size[k] = _nbytes(t)
                    end[k] = n - 1 if node.op == "placeholder" else i
            self.storage_of[node] = keys
        if saved_for_backward:
            for i, node in enumerate(self.nodes):
                if node.op != "placeholder" and any(getattr(t, "requires_grad", False) for t in tensors_of(_val(node))):
                    for k in self.storage_of[node]:
                        end[k] = n - 1
        for i, node in enumerate(self.nodes):
            for inp in node.all_input_nodes:
                for k in self.storage_of.get(inp, ()):
                    end[k] = max(end[k], n - 1 if node.op == "output" else i)
        self.start, self.end, self.size = start, end, size
        diff = np.zeros(n + 1, dtype=np.float64)
        for k, s in size.items():
            diff[start[k]] += s
            diff[end[k] + 1] -= s
        self.curve = np.cumsum(diff)[:n]

    @property
    def peak(self) -> float:
        return float(self.curve.max()) if len(self.curve) else 0.0

    def lifetime(self, node: fx.Node) -> tuple[int, int, int]:
        """(first position, last position, bytes) of ``node``'s own output storage(s)."""
        keys = self.storage_of.get(node, [])
        if not keys:
            return self.index.get(node, 0), self.index.get(node, 0), 0
        return min(self.start[k] for k in keys), max(self.end[k] for k in keys), sum(self.size[k] for k in keys)

    def group_delta(self, members: Sequence[fx.Node], extra_inputs: Iterable[tuple[fx.Node, int]] = ()) -> np.ndarray:
        """The change of the curve if ``members`` ran as one op at the last member's
        position writing one buffer, with ``extra_inputs`` ``(node, bytes)`` copied (a
        stack of separate tensors) right there."""
        n = len(self.curve)
        diff = np.zeros(n + 1, dtype=np.float64)
        pos = [self.index[m] for m in members if m in self.index]
        if not pos:
            return np.zeros(n)
        at = max(pos)
        total = 0
        last = at
        for m in members:
            s, e, b = self.lifetime(m)
            diff[s] -= b  # the member's own output no longer exists on its own
            diff[e + 1] += b
            total += b
            last = max(last, e)
            for inp in m.all_input_nodes:  # its inputs now live until the fused op
                for k in self.storage_of.get(inp, ()):
                    if self.end[k] < at:
                        diff[self.end[k] + 1] += self.size[k]
                        diff[at + 1] -= self.size[k]
        diff[at] += total  # one buffer holding every member's output
        diff[last + 1] -= total
        copied = sum(b for _, b in extra_inputs)
        diff[at] += copied  # stacked operands: transient, at the fused op
        diff[at + 1] -= copied
        return np.cumsum(diff)[:n]


class MemoryBudget:
    """The curve with every accepted group applied, against an allowed peak."""

    def __init__(self, live: Liveness, allowed_increase: float, slack_bytes: float = 0.0) -> None:
        self.live = live
        self.base_peak = live.peak
        # a fraction of the peak, but never less than ``slack_bytes`` (tiny graphs)
        self.allowed = self.base_peak + max(self.base_peak * allowed_increase, slack_bytes)
        self.curve = live.curve.copy()

    def increase(self, delta: np.ndarray) -> float:
        """Bytes the peak would rise above the *original* peak with ``delta`` applied."""
        return max(0.0, float((self.curve + delta).max()) - self.base_peak)

    def fits(self, delta: np.ndarray) -> bool:
        return float((self.curve + delta).max()) <= self.allowed

    def accept(self, delta: np.ndarray) -> None:
        self.curve = self.curve + delta
