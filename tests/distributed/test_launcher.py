"""The launcher never hangs, and bad distributed input gives a clear error on every rank.

Two gloo processes on the CPU with a ``file://`` rendezvous (no network). Nothing here
compiles, so each test takes seconds (process start-up mostly); the launches that end
normally share one pair of ranks (``clean_launch``), the failing ones have their own.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch import nn

import optimus
from optimus import distributed as odist


# ------------------------------------------------------------------ workers (run in the ranks)
def sum_of_ranks(ctx: odist.RankContext, payload: dict) -> dict:
    import torch.distributed as dist

    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return {"rank": ctx.rank, "world": ctx.world_size, "sum": t.item(), "backend": dist.get_backend(),
            "nvls": os.environ.get("NCCL_NVLS_ENABLE"), "multicast": os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST")}


def rank1_raises_while_rank0_waits(ctx: odist.RankContext, payload: dict) -> dict:
    import torch.distributed as dist

    if ctx.rank == 1:
        raise ValueError("rank one is broken")
    dist.all_reduce(torch.ones(1))  # never completes: rank 1 is gone
    return {}


def sleeps(ctx: odist.RankContext, payload: dict) -> dict:
    time.sleep(600)
    return {}


def ddp_without_process_group(ctx: odist.RankContext, payload: dict) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    optimus.compile(DDP(nn.Linear(4, 4)))
    return {}


def devices_differ(ctx: odist.RankContext, payload: dict) -> dict:
    model = nn.Linear(4, 4).to("cpu" if ctx.rank == 0 else "meta")
    try:
        odist.check_consistent(model, passes="all")
    except ValueError as e:
        return {"error": str(e)}
    return {"error": None}


def wrapped_twice(ctx: odist.RankContext, payload: dict) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from optimus.tools.bench.distributed import fully_shard_fn

    out: dict = {}

    def attempt(name: str, build) -> None:
        try:
            build()
            out[name] = None
        except ValueError as e:
            out[name] = str(e)

    attempt("ddp(ddp)", lambda: optimus.compile(DDP(DDP(nn.Linear(4, 4)))))
    attempt("fully_shard(ddp)", lambda: optimus.compile(fully_shard_fn()(DDP(nn.Linear(4, 4)))))

    def nested_fsdp() -> None:  # blocks and the root: FSDP as it is meant to be used
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        fully_shard_fn()(m[0])
        fully_shard_fn()(m)
        optimus.compile(m)

    attempt("nested fully_shard", nested_fsdp)

    return out


CLEAN_WORKERS = {"sum_of_ranks": sum_of_ranks, "devices_differ": devices_differ, "wrapped_twice": wrapped_twice}


def clean_workers(ctx: odist.RankContext, payload: dict) -> dict:
    """The workers that end normally, one after another on the same ranks (a launch costs
    seconds of process start-up); one that raises is recorded, so its test alone fails."""
    import traceback

    out: dict = {}
    for name, worker in CLEAN_WORKERS.items():
        try:
            out[name] = worker(ctx, payload)
        except Exception:
            out[name] = {"raised": traceback.format_exc()}
    return out


@pytest.fixture(scope="module")
def clean_launch(tmp_path_factory) -> dict[str, list[dict]]:
    """worker name -> each rank's result, from one launch of ``clean_workers``."""
    ranks = odist.launch(clean_workers, {}, 2, str(tmp_path_factory.mktemp("clean")), timeout_s=300)
    return {name: [r[name] for r in ranks] for name in CLEAN_WORKERS}


def _results(clean_launch: dict[str, list[dict]], name: str) -> list[dict]:
    results = clean_launch[name]
    assert not any("raised" in r for r in results), [r.get("raised") for r in results]
    return results


# ------------------------------------------------------------------ tests
def test_ranks_run_and_report(clean_launch) -> None:
    results = _results(clean_launch, "sum_of_ranks")
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["sum"] == 3.0 and r["world"] == 2 and r["backend"] == "gloo" for r in results)
    # every process the launcher starts has NVLink multicast off (required on the GPU hosts)
    assert all(r["nvls"] == "0" and r["multicast"] == "1" for r in results)


def test_a_failing_rank_ends_the_launch_at_once(tmp_path) -> None:
    t0 = time.monotonic()
    with pytest.raises(odist.LaunchError, match="rank 1 failed") as info:
        odist.launch(rank1_raises_while_rank0_waits, {}, 2, str(tmp_path), timeout_s=300)
    assert "rank one is broken" in str(info.value)
    assert time.monotonic() - t0 < 120  # not the 300 s deadline, not gloo's own timeout


def test_a_hang_ends_at_the_deadline(tmp_path) -> None:
    t0 = time.monotonic()
    with pytest.raises(odist.LaunchError, match="did not finish within 10 s") as info:
        odist.launch(sleeps, {}, 2, str(tmp_path), timeout_s=10)
    elapsed = time.monotonic() - t0
    assert elapsed < 60
    assert "rank 0: " in str(info.value) and "rank 1: " in str(info.value)  # each rank's log tail


def test_process_group_not_initialized(tmp_path) -> None:
    with pytest.raises(odist.LaunchError, match="process group has not been initialized"):
        odist.launch(ddp_without_process_group, {}, 2, str(tmp_path), timeout_s=120, init_pg=False)


def test_check_consistent_needs_a_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    with pytest.raises(ValueError, match="init_process_group"):
        odist.check_consistent(nn.Linear(2, 2))


def test_ranks_on_different_devices_get_the_same_error(clean_launch) -> None:
    results = _results(clean_launch, "devices_differ")
    errors = [r["error"] for r in results]
    assert errors[0] is not None and errors[0] == errors[1]  # both ranks stop, the same way
    assert "devices: rank 0 cpu, rank 1 meta" in errors[0]


def test_a_model_wrapped_twice_is_refused(clean_launch) -> None:
    [out, _] = _results(clean_launch, "wrapped_twice")
    assert "wrapped twice" in out["ddp(ddp)"] and "DistributedDataParallel at module inside DistributedDataParallel" in out["ddp(ddp)"]
    assert "wrapped twice" in out["fully_shard(ddp)"]
    assert out["nested fully_shard"] is None


def test_the_rank_that_raised_first_is_named_not_the_peer_that_lost_it(tmp_path) -> None:
    import pickle
    import types

    files = [str(tmp_path / f"err{i}") for i in range(3)]
    for path, text in zip(files, ["RuntimeError: [gloo] Connection closed by peer", "", "ValueError: rank two is broken"]):
        if text:
            with open(path, "wb") as f:
                pickle.dump(text, f)
    ctx = types.SimpleNamespace(error_files=files)
    index, message = odist._root_cause(ctx, 0, "RuntimeError: [gloo] Connection closed by peer")
    assert index == 2 and "rank two is broken" in message
    assert odist._root_cause(ctx, 1, "KeyError: real") == (1, "KeyError: real")  # not a peer failure: as reported
