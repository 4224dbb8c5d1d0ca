"""Inductor-IR: fusion rules over Inductor scheduler nodes (pre/post-fusion hooks).

* ``view.SchedulerView``: scheduler nodes as canonical ``Call``s (kinds ``pointwise``,
  ``reduction``, ``template``, ``extern``, ``nop``, ``combo``, ``composite``), plus
  reads/writes, iteration sizes and dependency reachability;
* ``rule.FusionRule`` / ``fusion_rule``: the Inductor-IR kind of rule (a ``PatternRule``
  deciding which nodes become one kernel), registered in the shared registry
  (``levels=("inductor_ir",)``); the built-in ones are in ``optimus/rules/kernel_fusion.py``;
* ``passes``: the driver inside Inductor's ``_pre_fusion_custom_pass`` /
  ``_post_fusion_custom_pass`` hooks (legality, rollback, report, cache keys).

``scheduler_patches(session)`` is what ``optimus.compile`` merges into Inductor's config
patches when the ``inductor_ir`` level has rules enabled. See docs/inductor-ir.md.
"""

from __future__ import annotations

from typing import Any

from .rule import ComboAction, FuseAction, FusionBuilder, FusionMatch, FusionRule, fusion_rule

__all__ = [
    "ComboAction",
    "FuseAction",
    "FusionBuilder",
    "FusionMatch",
    "FusionRule",
    "fusion_rule",
    "scheduler_patches",
]


def scheduler_patches(session: Any) -> dict[str, Any]:
    """Inductor config patches installing the session's Inductor-IR passes.

    Empty (with a report note) when this torch has no scheduler hooks; Optimus's other
    levels still run.
    """
    from . import inductor_api

    ok, why = inductor_api.hooks_supported()
    if not ok:
        note = f"inductor_ir: unsupported on this torch ({why}); Inductor-IR rules did not run"
        if note not in session.report.notes:
            session.report.notes.append(note)
        return {}
    from .passes import InductorIRPass

    return {
        "_pre_fusion_custom_pass": InductorIRPass(session, "pre_fusion"),
        "_post_fusion_custom_pass": InductorIRPass(session, "post_fusion"),
    }
