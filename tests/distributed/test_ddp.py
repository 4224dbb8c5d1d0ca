"""Optimus under DistributedDataParallel on 2 CPU processes (gloo).

Every row trains for 3 steps on its half of the batch and is compared with a 1-process
eager run on the whole batch (``optimus.tools.bench.distributed``). The fast test uses a tiny
split/cat model; the zoo models and the bad-input cases are ``slow``.
"""

from __future__ import annotations

import pytest

from optimus.tools.bench.distributed import RowSpec

from dist_support import (QUICK, SMALL_BUCKETS, assert_matches_one_process, ddp_pieces, graph_notes, rewrites_by_graph,
                          run)


def test_ddp_optimizer_pieces_match_one_process_and_lose_their_junk(default_rows) -> None:
    row = default_rows["ddp"]  # dist_models:tiny2 under DDP with SMALL_BUCKETS (conftest.py)
    assert_matches_one_process(row)
    # DDPOptimizer cut the graph at the bucket boundaries; every graph Optimus saw (the
    # pieces' forward and backward at each level) says which piece it is
    pieces = [ddp_pieces(notes) for _, notes in graph_notes(row)]
    assert all(p is not None for p in pieces), graph_notes(row)
    count = pieces[0][1]
    assert count >= 2 and {p for p in pieces} == {(i, count) for i in range(1, count + 1)}
    assert all("limited to this bucket" in n for _, notes in graph_notes(row) for n in notes if "DDPOptimizer" in n)
    # Optimus still removes the split/cat junk inside each piece that holds a block, on both ranks
    torch_ir = rewrites_by_graph(row)
    assert sum(1 for n in torch_ir.values() if n > 0) >= 2, torch_ir
    assert all(n and n > 0 for n in row["rewrites_per_rank"])
    assert row["optimus"]["rules"].get("unbind_cat_to_view", 0) + row["optimus"]["rules"].get("cat_split_to_inputs", 0) > 0


# ------------------------------------------------------------------ slow
ZOO = {  # model -> DDP bucket cap (MB) that cuts its small config's parameters into 2-4 buckets
    "dlrm": 0.02,
    "dcnv2": 0.015,
    "dhen": 0.05,
}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(ZOO))
def test_zoo_models_under_ddp(model: str, tmp_path) -> None:
    cap = {"bucket_cap_mb": ZOO[model], "first_bucket_bytes": int(ZOO[model] * 2**20)}
    rows = [RowSpec(model, w, c, **cap, **QUICK) for w in ("ddp", "ddp-whole") for c in ("optimus", "inductor")]
    results = run(rows, tmp_path, timeout_s=1800)
    for row in results:
        assert_matches_one_process(row, param_tol=2e-4)
    by = {(r["spec"]["wrapper"], r["spec"]["config"]): r for r in results}
    split, whole = by[("ddp", "optimus")], by[("ddp-whole", "optimus")]
    assert split["optimus"]["rewrites"] > 0 and whole["optimus"]["rewrites"] > 0
    counts = {ddp_pieces(n) for _, n in graph_notes(split, "torch_ir")}
    assert all(c is not None for c in counts) and max(c[1] for c in counts) >= 2, counts
    assert all(any("optimize_ddp off" in n for n in notes) for _, notes in graph_notes(whole))


@pytest.mark.slow
def test_find_unused_parameters(tmp_path) -> None:
    """A parameter no forward uses: DDP with find_unused_parameters=True, both modes."""
    rows = [RowSpec("dist_models:tiny_unused", w, "optimus", find_unused_parameters=True, **SMALL_BUCKETS, **QUICK)
            for w in ("ddp", "ddp-whole")]
    for row in run(rows, tmp_path, timeout_s=900):
        assert_matches_one_process(row)
        assert row["optimus"]["rewrites"] > 0


@pytest.mark.slow
def test_graph_break_inside_a_bucket(tmp_path) -> None:
    """Two Dynamo graphs, each cut by DDPOptimizer on its own (its buckets are not DDP's)."""
    rows = [RowSpec("dist_models:tiny_graph_break", "ddp", c, **SMALL_BUCKETS, **QUICK) for c in ("optimus", "inductor")]
    optimus_row, inductor_row = run(rows, tmp_path, timeout_s=900)
    assert_matches_one_process(optimus_row)
    assert_matches_one_process(inductor_row)
    torch_ir = graph_notes(optimus_row, "torch_ir")
    assert len(torch_ir) >= 2 and all(ddp_pieces(n) is not None for _, n in torch_ir)
    assert sum(1 for n in rewrites_by_graph(optimus_row).values() if n > 0) >= 2


@pytest.mark.slow
def test_collectives_in_the_graph_are_barriers(tmp_path) -> None:
    """A forward that all-reduces itself (a functional collective in the compiled graph):
    Optimus gives the eager result on both ranks, keeps the collective where it was, and
    says what it did not merge across it."""
    rows = [RowSpec("dist_models:with_collective", "ddp-whole", c, reference=False, **QUICK) for c in ("eager", "optimus")]
    eager, opt = run(rows, tmp_path, timeout_s=900)
    assert eager["status"] == "ok" and opt["status"] == "ok", (eager.get("error"), opt.get("error"))
    for got, want in zip(opt["losses"], eager["losses"]):
        assert abs(got - want) <= 1e-5 * abs(want)
    assert opt["ranks_agree"]
    notes = [n for _, ns in graph_notes(opt, "torch_ir") for n in ns]
    assert any("collective op(s) in this graph (all_reduce x1, wait_tensor x1)" in n for n in notes), notes
    declined = opt["optimus"]["declined"]
    assert any("sides of a collective" in reason for d in declined.values() for reason in d), declined
    assert opt["optimus"]["rewrites"] > 0
