"""Optimus's names in PyTorch's logging system, and every use of its private API.

``torch._logging`` lets an out-of-tree package register a log name and artifact names
(``register_log``, ``register_artifact``); after that ``TORCH_LOGS="optimus"`` (INFO),
``TORCH_LOGS="+optimus"`` (DEBUG), ``TORCH_LOGS="optimus_graphs"`` and
``torch._logging.set_logs(modules={"optimus": logging.DEBUG, "optimus_graphs": True})`` work like
PyTorch's own names. ``trace_structured`` writes the artifacts ``tlparse`` shows for a
``TORCH_TRACE=dir`` run.

These functions live in ``torch._logging._internal`` (stable from 2.11 to 2.15, but
private), so all access goes through this module, guarded: a torch without them leaves
Optimus logging through plain ``logging`` and nothing fails.

When torch parses ``TORCH_LOGS``: once, inside ``import torch`` (``_init_logs``). Since
2.13 it first loads the ``torch.backends`` entry points ("so backends can register
their log names before TORCH_LOGS is parsed"); Optimus's entry point
(``_optimus_torch_logs.autoload``) runs :func:`register` then. Torch 2.11 parses first;
a name it does not know but can import as a module (``optimus``) it imports, with
every subpackage, during the parse, so ``import optimus`` registers everything in time
for the names that follow ``optimus`` in ``TORCH_LOGS``.

This module imports nothing from Optimus (nor torch at import time): the entry point
runs it from its file while ``import torch`` is still under way.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

LOG_NAME = "optimus"
"""``TORCH_LOGS`` name of Optimus's logger (``logging.getLogger("optimus")``)."""

ARTIFACTS: dict[str, tuple[str, bool]] = {
    # name: (description shown by TORCH_LOGS="+help", off_by_default)
    "optimus_graphs": ("Optimus: each FX graph before and after each level's rewrites", True),
    "optimus_report": ("Optimus: the table of rewrites and declines of each graph, after its level ran", False),
}
"""Artifact names. Off-by-default ones print only when named (``+optimus`` alone does
not dump whole graphs); the others also print under ``+optimus``."""


def _internal() -> Any | None:
    try:
        from torch._logging import _internal
    except Exception:  # noqa: BLE001 - a torch without it: no registration
        return None
    return _internal


def register() -> bool:
    """Register Optimus's log and artifact names with torch (idempotent, never raises).

    Returns whether torch knows the names now.
    """
    internal = _internal()
    if internal is None:
        return False
    try:
        internal.register_log(LOG_NAME, [LOG_NAME])
        for name, (description, off_by_default) in ARTIFACTS.items():
            internal.register_artifact(name, description, visible=True, off_by_default=off_by_default)
    except Exception:  # noqa: BLE001 - registration is best effort
        return False
    return True


def artifact_logger(name: str) -> logging.Logger:
    """The logger of one artifact (a child of ``optimus``); a plain child logger, off,
    when torch cannot make one."""
    internal = _internal()
    if internal is not None and register():
        try:
            return internal.getArtifactLogger(LOG_NAME, name)
        except Exception:  # noqa: BLE001
            pass
    fallback = logging.getLogger(f"{LOG_NAME}.__{name}")
    fallback.propagate = False
    return fallback


def tracing() -> bool:
    """Whether torch writes a structured trace to a file (``TORCH_TRACE=dir``, or
    ``TORCH_COMPILE_DEBUG=1``): only then are Optimus's trace payloads computed.

    That is torch's own trace handler with a directory or an open file; other handlers
    on the trace logger (test frameworks attach capture handlers to every logger) do
    not count.
    """
    internal = _internal()
    trace_log = getattr(internal, "trace_log", None)
    lazy = getattr(internal, "LazyTraceHandler", None)
    if trace_log is None or lazy is None:
        return False
    return any(
        isinstance(h, lazy) and (getattr(h, "root_dir", None) is not None or getattr(h, "stream", None) is not None)
        for h in trace_log.handlers
    )


def trace_artifact(name: str, payload_fn: Callable[[], str], encoding: str = "string") -> None:
    """Write one artifact into the ``TORCH_TRACE`` log (what tlparse lists under the
    current compile id). ``encoding`` is ``"string"`` or ``"json"``."""
    try:
        from torch._logging import trace_structured
    except Exception:  # noqa: BLE001
        return
    try:
        trace_structured(
            "artifact",
            metadata_fn=lambda: {"name": name, "encoding": encoding},
            payload_fn=payload_fn,
        )
    except Exception:  # noqa: BLE001 - tracing never breaks a compile
        logging.getLogger(LOG_NAME).debug("optimus: could not write trace artifact %s", name, exc_info=True)
