"""What the distributed tests share: running rows on 2 gloo ranks with a hard deadline,
and reading what the merged rows say (``optimus.tools.bench.distributed``)."""

from __future__ import annotations

import re
from typing import Any

from optimus.tools.bench import distributed as bd

NPROC = 2
# fp32 on the CPU: DDP/FSDP average the two halves' gradients, Inductor and Optimus
# reassociate some sums, so results agree with the 1-process run to rounding
LOSS_TOL = 1e-5
PARAM_TOL = 1e-4
# A first bucket and a bucket cap of ~2 KB cut the ~5 KB of parameters of dist_models.tiny2
# into three DDP buckets, so DDPOptimizer compiles three graphs (two with a block each).
SMALL_BUCKETS = {"bucket_cap_mb": 0.002, "first_bucket_bytes": int(0.002 * 2**20)}
QUICK = {"steps": 3, "time": False, "cold": False}  # compiled kernels shared by the ranks and the tests


def run(rows: list[bd.RowSpec], tmp_path: Any, timeout_s: float) -> list[dict[str, Any]]:
    return bd.run(rows, NPROC, "cpu", timeout_s, workdir=str(tmp_path))


def assert_matches_one_process(row: dict[str, Any], loss_tol: float = LOSS_TOL, param_tol: float = PARAM_TOL) -> None:
    """Losses and parameters after the steps equal the 1-process run's; the ranks agree."""
    assert row["status"] == "ok", row.get("error")
    assert row["loss_max_rel_err"] <= loss_tol, (row["losses"], row["reference"]["losses"])
    assert row["param_max_rel_err"] <= param_tol, row["param_max_rel_err"]
    assert row["ranks_agree"], "the ranks' parameters differ"


def graph_notes(row: dict[str, Any], level: str | None = None) -> list[tuple[str, list[str]]]:
    return [(g["graph"], g["notes"]) for g in row["optimus"]["graphs"] if level is None or g["level"] == level]


def ddp_pieces(notes: list[str]) -> tuple[int, int] | None:
    """(piece, pieces) from a graph's DDPOptimizer note."""
    for note in notes:
        m = re.match(r"graph (\d+) of (\d+) from DDPOptimizer", note)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def rewrites_by_graph(row: dict[str, Any], level: str = "torch_ir") -> dict[str, int]:
    return {g["graph"]: g["rewrites"] for g in row["optimus"]["graphs"] if g["level"] == level and not g["discarded"]}
