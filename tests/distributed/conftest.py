"""The default (not ``slow``) DDP and FSDP2 rows run in one launch, shared by
test_ddp.py and test_fsdp.py: every launch spends seconds starting its two ranks
(importing torch, the first Inductor compile in each process) before a row runs.
The rows run one after the other, each with its own model, Dynamo reset and 1-process
reference (``optimus.tools.bench.distributed.run_rows``)."""

from __future__ import annotations

import pytest

from optimus.tools.bench.distributed import RowSpec

from dist_support import QUICK, SMALL_BUCKETS, run

DEFAULT_ROWS = {
    "ddp": RowSpec("dist_models:tiny2", "ddp", "optimus", **SMALL_BUCKETS, **QUICK),
    "fsdp2": RowSpec("dist_models:tiny", "fsdp2", "optimus", **QUICK),
}


@pytest.fixture(scope="session")
def default_rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """wrapper -> its merged row (``DEFAULT_ROWS``)."""
    rows = run(list(DEFAULT_ROWS.values()), tmp_path_factory.mktemp("default-rows"), timeout_s=840)
    return dict(zip(DEFAULT_ROWS, rows))
