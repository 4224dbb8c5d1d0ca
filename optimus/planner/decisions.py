"""The planner's decision cache: which plan won for a graph, on disk.

A decision is keyed by the graph's *structure* (every node's op and target, argument
structure, and the shapes, dtypes and devices of its values; not node names, not
weights) plus what changes the answer: the device, CUDA graphs on or off, the torch
version and Optimus's own source fingerprint. The next compile of the same model reads
the decision and pays no tuning. A corrupt or unreadable file is ignored with a warning
(and rewritten on the next decision); a decision naming a plan that no longer exists is
ignored, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import threading
from typing import Any

import torch
import torch.fx as fx

from .costmodel import cache_dir

log = logging.getLogger("optimus")
_LOCK = threading.Lock()


def _describe_value(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"T{tuple(str(s) for s in v.shape)}{v.dtype}{v.device.type}{tuple(str(s) for s in v.stride()) if v.layout == torch.strided else ''}"
    if isinstance(v, (list, tuple)):
        return "(" + ",".join(_describe_value(x) for x in v) + ")"
    if isinstance(v, (int, float, bool, str, type(None))):
        return repr(v)
    return type(v).__name__


def graph_key(gm: fx.GraphModule, extra: dict[str, Any]) -> str:
    """A hash of the graph's structure and the context that changes the best plan."""
    h = hashlib.sha256()
    index: dict[fx.Node, int] = {}
    for i, n in enumerate(gm.graph.nodes):
        index[n] = i
        if n.op == "placeholder":
            target = ""  # an argument's name is not structure
        else:
            target = n.target if isinstance(n.target, str) else getattr(n.target, "__qualname__", None) or repr(n.target)
        args = fx.node.map_arg((n.args, n.kwargs), lambda a: f"%{index.get(a, -1)}")
        val = n.meta.get("example_value", n.meta.get("val"))
        h.update(f"{n.op}|{getattr(n.target, '__module__', '')}.{target}|{args!r}|{_describe_value(val)}\n".encode())
    h.update(json.dumps(extra, sort_keys=True, default=str).encode())
    return h.hexdigest()[:32]


class DecisionCache:
    """``{key: {"plan": name, "measured_ms": {...}, ...}}`` in one JSON file."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = pathlib.Path(path) if path is not None else cache_dir() / "decisions.json"

    def _load(self) -> dict[str, Any]:
        if not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            return data
        except Exception as e:
            log.warning("optimus: ignoring the planner's decision cache %s (%s)", self.path, e)
            return {}

    def get(self, key: str, valid_plans: set[str]) -> dict[str, Any] | None:
        with _LOCK:
            entry = self._load().get(key)
        if not isinstance(entry, dict) or entry.get("plan") not in valid_plans:
            if entry is not None:
                log.warning("optimus: ignoring a stale planner decision for %s (%r)", key, entry)
            return None
        return entry

    def put(self, key: str, entry: dict[str, Any]) -> None:
        with _LOCK:
            data = self._load()
            data[key] = entry
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
                tmp.replace(self.path)
            except OSError as e:  # pragma: no cover - read-only home
                log.warning("optimus: could not write the planner's decision cache (%s)", e)
