"""Inductor-IR: passes over Inductor scheduler nodes (pre/post-fusion hooks).

The scheduler-node view and its rules arrive with the Inductor-IR issue; until then the
level has no rules, so ``scheduler_patches`` installs nothing.
"""

from __future__ import annotations

from typing import Any


def scheduler_patches(session: Any) -> dict[str, Any]:
    return {}
