"""Grad-mode, inference-mode and autocast regions are part of every rewrite's meaning.

Dynamo records ``with torch.no_grad():``, ``torch.set_grad_enabled(flag)``,
``torch.inference_mode()`` and ``torch.autocast(...)`` as marker nodes in the Torch-IR
graph (``torch._C._set_grad_enabled(False)``, ``_enter_autocast(...)`` /
``_exit_autocast(ctx)``, ``_enter_inference_mode(True)`` / ``_exit_inference_mode(ctx)``);
every op between two markers runs in the state they set. The same op computes a
different value in another state: under ``no_grad`` its result has no autograd history
(``requires_grad=False``), under ``inference_mode`` it is an inference tensor, under
autocast it runs in the autocast dtype. So:

* a horizontal group's members all run in **one state** (``find_groups`` buckets by it):
  merging a no-grad tower with its grad-enabled siblings would give its weight a gradient;
* a rewrite computes every value it builds **in the state of the value it replaces**, and
  replaces a value only by an existing one **computed in the same grad and inference
  state** (``Regions.problem``), so no result gains or loses autograd history;
* no node moves **across a marker** (``Regions.markers_between``): reordering would change
  the state it runs in;
* the metadata of a node a rule builds is computed under the autocast state of its place
  (``state_at`` / ``autocast_entries``), so dtypes are those the program will produce.

Aten-IR graphs (AOTAutograd's forward, backward and inference graphs) carry no markers:
the partitioner has already applied grad mode (the backward holds exactly the gradients
eager computes) and autocast's casts are explicit ``_to_copy`` ops. A graph without
markers has one region, and every check here is free.

A state is ``(grad, inference, autocast)``: ``grad`` is ``AMBIENT`` until the graph sets
it (the mode the caller compiled under, which Dynamo guards on; it is never assumed equal
to ``True`` or ``False``), a flag, or an ``Unknown`` marker when the flag is not a
constant; ``inference`` and ``autocast`` are stacks of what was entered, innermost last.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Iterable

import torch
import torch.fx as fx

AMBIENT = "ambient"  # the grad mode the graph was entered with


@dataclasses.dataclass(frozen=True)
class Unknown:
    """A state set from a value the graph computes (a traced flag): equal only to itself."""

    marker: str


State = tuple[Any, tuple[Any, ...], tuple[Any, ...]]


def _marker_targets() -> dict[Any, str]:
    """FX call targets that change the state, by kind."""
    from torch.amp import autocast_mode
    from torch.autograd import grad_mode

    table: dict[Any, str] = {torch._C._set_grad_enabled: "grad"}
    for target, kind in (
        (getattr(autocast_mode, "_enter_autocast", None), "enter_autocast"),
        (getattr(autocast_mode, "_exit_autocast", None), "exit_autocast"),
        (getattr(grad_mode, "_enter_inference_mode", None), "enter_inference"),
        (getattr(grad_mode, "_exit_inference_mode", None), "exit_inference"),
    ):
        if target is not None:
            table[target] = kind
    return table


_MARKERS: dict[Any, str] | None = None


def marker_kind(node: fx.Node) -> str | None:
    """``"grad"``, ``"enter_autocast"``, ... when ``node`` changes the state, else ``None``."""
    global _MARKERS
    if node.op != "call_function":
        return None
    if _MARKERS is None:
        _MARKERS = _marker_targets()
    try:
        return _MARKERS.get(node.target)
    except TypeError:  # an unhashable target
        return None


def is_marker(node: fx.Node) -> bool:
    return marker_kind(node) is not None


def _constant(value: Any) -> bool:
    return not isinstance(value, fx.Node) and not (isinstance(value, (list, tuple)) and any(isinstance(v, fx.Node) for v in value))


def _after(state: State, node: fx.Node, kind: str) -> State:
    """The state right after the marker ``node`` runs in ``state``."""
    grad, inference, autocast = state
    if kind == "grad":
        flag = node.args[0] if node.args else node.kwargs.get("mode")
        grad = bool(flag) if isinstance(flag, bool) else Unknown(node.name)
    elif kind == "enter_autocast":
        args = tuple(node.args) + tuple(node.kwargs.values())
        autocast = autocast + ((tuple(str(a) for a in args) if _constant(args) else Unknown(node.name)),)
    elif kind == "exit_autocast":
        autocast = autocast[:-1] if autocast else (Unknown(node.name),)
    elif kind == "enter_inference":
        flag = node.args[0] if node.args else True
        inference = inference + ((bool(flag) if isinstance(flag, bool) else Unknown(node.name)),)
    elif kind == "exit_inference":
        inference = inference[:-1] if inference else (Unknown(node.name),)
    return grad, inference, autocast


def current_autocast() -> tuple[tuple[str, ...], ...]:
    """The autocast contexts active now, as markers record them (device type, dtype,
    enabled, cache): a Torch-IR graph Dynamo traced inside ``torch.autocast`` carries no
    marker for it, and runs under it (Dynamo guards on the autocast state); its pre-grad
    pass runs under it too."""
    entries = []
    for device in ("cpu", "cuda"):
        try:
            if torch.is_autocast_enabled(device):
                entries.append((device, str(torch.get_autocast_dtype(device)), "True", "None"))
        except Exception:  # a device type this torch build does not know
            continue
    return tuple(entries)


class Regions:
    """The state every node of one graph runs in, from the markers' places.

    Markers are never created, moved or removed by a rewrite (they have side effects and
    the driver refuses to reorder across them), so their places and the states they set
    are read once; a node's state is that of the last marker before it, found by its
    place in graph order (new nodes included).
    """

    def __init__(self, graph: fx.Graph, ambient_autocast: tuple[tuple[str, ...], ...] = ()) -> None:
        self.graph = graph
        self.markers: list[fx.Node] = []
        self.states: list[State] = []  # the state after each marker
        # the state the graph is entered in: the caller's grad mode, and the autocast the
        # graph runs under without a marker of its own
        self.start: State = (AMBIENT, (), tuple(ambient_autocast))
        state = self.start
        for n in graph.nodes:
            kind = marker_kind(n)
            if kind is not None:
                state = _after(state, n, kind)
                self.markers.append(n)
                self.states.append(state)
        self._keys = [m._sort_key for m in self.markers]

    def __bool__(self) -> bool:
        """Whether the graph has more than one region."""
        return bool(self.markers)

    def state_at(self, node: fx.Node) -> State:
        """The state ``node`` runs in (where it stands in the graph now)."""
        if not self.markers:
            return self.start
        i = bisect.bisect_left(self._keys, node._sort_key)
        if i < len(self._keys) and self.markers[i] is node:
            i += 1  # a marker runs in the state before it
        return self.states[i - 1] if i > 0 else self.start

    def autocast_entries(self, node: fx.Node) -> list[tuple[str, ...]]:
        """The autocast contexts ``node`` runs under, outermost first (their recorded
        arguments: device type, dtype, enabled, cache), for computing its metadata.
        Unknown entries are left out (the node's metadata then comes out as without them,
        and the dtype check declines what differs)."""
        return [e for e in self.state_at(node)[2] if isinstance(e, tuple)]

    def markers_between(self, a: fx.Node, b: fx.Node) -> fx.Node | None:
        """A marker strictly between ``a`` and ``b`` in graph order (either way round)."""
        if not self.markers:
            return None
        lo, hi = (a, b) if a._sort_key < b._sort_key else (b, a)
        i = bisect.bisect_right(self._keys, lo._sort_key)
        if i < len(self._keys) and self._keys[i] < hi._sort_key:
            return self.markers[i]
        return None

    def problem(self, pairs: list[tuple[fx.Node, fx.Node]], new_nodes: Iterable[fx.Node]) -> str | None:
        """Why the rewrite would change what a value is in its region, if it would.

        Every node the rewrite builds runs where it stands; a built replacement must run in
        its old value's state, and so must everything built with it. An existing node may
        replace a value computed in another autocast state (its dtype is checked) but not
        in another grad or inference state: it would bring its autograd history (or lack
        of it) along."""
        if not self.markers:
            return None
        made = {n: self.state_at(n) for n in new_nodes if not n._erased}
        for old, new in pairs:
            want = self.state_at(old)
            if new in made:
                got = next((s for s in made.values() if s != want), None)
                if got is not None:
                    return f"would compute {old.name} {describe_change(want, got)}"
            else:
                got = self.state_at(new)
                if got[:2] != want[:2]:
                    return f"would replace {old.name} by {new.name}, computed {describe_change(want, got)}"
        return None


def describe_change(want: State, got: State) -> str:
    """``"with grad enabled instead of under no_grad"`` and the like."""

    def grad(s: State) -> str:
        g = s[0]
        if g is AMBIENT or g == AMBIENT:
            return "in the caller's grad mode"
        if isinstance(g, Unknown):
            return f"in the grad mode set by {g.marker}"
        return "with grad enabled" if g else "under no_grad"

    parts = []
    if want[0] != got[0]:
        parts.append(f"{grad(got)} instead of {grad(want)}")
    if want[1] != got[1]:
        parts.append("in another inference_mode region")
    if want[2] != got[2]:
        parts.append("in another autocast region")
    return " and ".join(parts) or "in another region"


def describe(state: State) -> str:
    """A region's state in words (for decline reasons)."""
    parts = []
    g = state[0]
    if isinstance(g, bool):
        parts.append("grad enabled" if g else "no_grad")
    elif isinstance(g, Unknown):
        parts.append(f"grad mode set by {g.marker}")
    if state[1]:
        parts.append("inference_mode")
    if state[2]:
        parts.append("autocast")
    return ", ".join(parts) or "the caller's modes"
