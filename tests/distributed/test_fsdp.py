"""Optimus under FSDP2 (``fully_shard``) on 2 CPU processes (gloo).

FSDP2's all-gathers and reduce-scatters run in hooks Dynamo does not trace (torch 2.13
disables them for Dynamo; 2.11 does too unless ``torch._dynamo.config.skip_fsdp_hooks`` is
turned off), so each compiled graph lies between two of them and Optimus rewrites inside
it. Parameters after the steps are gathered whole (``full_tensor``) and compared with a
1-process eager run.
"""

from __future__ import annotations

import pytest

from optimus.tools.bench.distributed import RowSpec

from dist_support import QUICK, assert_matches_one_process, graph_notes, rewrites_by_graph, run


def _fsdp_noted(row) -> bool:
    return all(any("compiled under FSDP" in n for n in notes) for _, notes in graph_notes(row))


def test_fully_shard_whole_model_matches_one_process_and_loses_its_junk(default_rows) -> None:
    row = default_rows["fsdp2"]  # dist_models:tiny under fully_shard (conftest.py)
    assert_matches_one_process(row)
    assert _fsdp_noted(row), graph_notes(row)
    assert all(n and n > 0 for n in row["rewrites_per_rank"])
    rules = row["optimus"]["rules"]
    assert rules.get("unbind_cat_to_view", 0) + rules.get("cat_split_to_inputs", 0) > 0, rules


@pytest.mark.slow
def test_fully_shard_per_block(tmp_path) -> None:
    """Each block compiled, then sharded (its FSDP hooks run outside its graph), then the root."""
    rows = [RowSpec("dist_models:tiny2", "fsdp2-blocks", c, **QUICK) for c in ("optimus", "inductor")]
    optimus_row, inductor_row = run(rows, tmp_path, timeout_s=900)
    assert_matches_one_process(optimus_row)
    assert_matches_one_process(inductor_row)
    assert _fsdp_noted(optimus_row)
    assert all(n > 0 for n in rewrites_by_graph(optimus_row).values())


@pytest.mark.slow
@pytest.mark.parametrize("model", ["dcnv2", "dhen", "dlrm"])
def test_zoo_models_under_fsdp2(model: str, tmp_path) -> None:
    wrappers = ("fsdp2", "fsdp2-blocks") if model != "dlrm" else ("fsdp2",)  # dlrm has no list of blocks
    rows = [RowSpec(model, w, c, **QUICK) for w in wrappers for c in ("optimus", "inductor")]
    for row in run(rows, tmp_path, timeout_s=1800):
        assert_matches_one_process(row, param_tol=2e-4)
        if row["spec"]["config"] == "optimus":
            assert row["optimus"]["rewrites"] > 0 and _fsdp_noted(row)
