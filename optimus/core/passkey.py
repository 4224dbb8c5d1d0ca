"""Pass objects that Inductor's caches key by their ``uuid()`` alone.

Optimus installs pass objects in Inductor's hooks (``optimus.compile.LevelPass`` for the
FX levels, ``optimus.inductor_ir.passes.InductorIRPass`` for the scheduler hooks). Some
torch versions pickle a hook's value into the FX graph cache key instead of asking its
``uuid()`` (torch 2.11 does so for ``pre_grad_custom_pass`` and
``_post_fusion_custom_pass``), and Inductor deep-copies its config. ``UuidKeyed`` makes
both harmless: a pass pickles as its uuid (deterministic, and different exactly when the
passes differ) and copies as itself. Unpickled, it becomes a ``RestoredPass``: the same
uuid, no rewriting, so an artifact compiled in a subprocess is at worst unoptimized at that
level, never wrong.
"""

from __future__ import annotations

from typing import Any

try:
    from torch._inductor.custom_graph_pass import CustomGraphPass
except ImportError:  # pragma: no cover - torch without Inductor
    CustomGraphPass = None  # type: ignore[assignment,misc]
try:
    from torch._inductor.custom_graph_pass import CustomSchedulerPass
except ImportError:  # torch 2.11
    CustomSchedulerPass = None  # type: ignore[assignment,misc]

# 2.11 only knows CustomGraphPass (and bypasses the FX graph cache when a keyed hook is
# anything else); 2.13 adds CustomSchedulerPass for the scheduler hooks. A class deriving
# from both is accepted by both versions in every hook.
PASS_BASES: tuple[type, ...] = tuple(b for b in (CustomSchedulerPass, CustomGraphPass) if b is not None) or (object,)


class UuidKeyed:
    """Mixin: pickle as ``uuid()`` alone and copy as the object itself."""

    def uuid(self) -> str:  # pragma: no cover - provided by the subclass
        raise NotImplementedError

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_restored_pass, (self.uuid(),))

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self

    def __copy__(self) -> Any:
        return self


class RestoredPass(*PASS_BASES):  # type: ignore[misc]
    """An unpickled Optimus pass: the same uuid, no rewriting.

    Called as a graph pass it changes nothing (returns ``None``); called as a scheduler
    pass it returns the node list it was given.
    """

    def __init__(self, uuid: str) -> None:
        self._uuid = uuid

    def __call__(self, arg: Any) -> Any:  # type: ignore[override]
        return arg if isinstance(arg, list) else None

    def uuid(self) -> str:
        return self._uuid

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_restored_pass, (self._uuid,))


def _restored_pass(uuid: str) -> RestoredPass:
    return RestoredPass(uuid)
