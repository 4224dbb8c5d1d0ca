"""TorchRec's DistributedModelParallel, where TorchRec is installed (it is not in CI).

REFERENCE.md section 6: on CPU, ``pip install --no-deps torchrec==1.8.0
fbgemm-gpu-cpu==1.8.0`` (their metadata would pull CUDA builds), then ``tensordict``,
``torchmetrics==1.0.3``, ``tqdm``, ``pyre-extensions``; torchrec, fbgemm and torch versions
must match (1.9.x fails to load on torch 2.13).

NOT RUN YET: TorchRec is not installed on the development machine or in CI, so this test
has only ever skipped. What it checks: a ``torchrec.models.dlrm.DLRM`` sharded by
``DistributedModelParallel`` on 2 gloo ranks trains to the same losses with
``optimus.compile`` as eagerly, and Optimus rewrites its dense part (Dynamo skips
TorchRec's own modules, ``torch._dynamo.config.skip_torchrec``, so the sharded embedding
lookups and their all-to-alls run eagerly between the compiled graphs).
"""

from __future__ import annotations

import importlib.util

import pytest

from optimus import distributed as odist


def _torchrec_missing() -> str | None:
    if importlib.util.find_spec("torchrec") is None:
        return "torchrec is not installed (see REFERENCE.md section 6 for a CPU install)"
    try:
        import torchrec.distributed  # noqa: F401
    except Exception as e:  # an fbgemm/torch mismatch fails at import
        return f"torchrec does not load here: {type(e).__name__}: {e}"
    return None


MISSING = _torchrec_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def dmp_worker(ctx: odist.RankContext, config: str) -> dict:
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.models.dlrm import DLRM

    import optimus

    torch.manual_seed(0)
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=64, feature_names=[f"f{i}"]) for i in range(4)]
    model = DLRM(embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
                 dense_in_features=6, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1])
    dmp = DistributedModelParallel(model, device=torch.device("cpu"))
    fn = optimus.compile(dmp) if config == "optimus" else dmp
    g = torch.Generator().manual_seed(100 + ctx.rank)
    dense = torch.randn(8, 6, generator=g)
    lengths = torch.ones(4 * 8, dtype=torch.int32)
    sparse = KeyedJaggedTensor.from_lengths_sync(keys=[f"f{i}" for i in range(4)],
                                                 values=torch.randint(0, 64, (32,), generator=g), lengths=lengths)
    target = torch.randint(0, 2, (8,), generator=g).float()
    opt = torch.optim.SGD(dmp.parameters(), lr=0.05)
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(fn(dense, sparse).squeeze(-1), target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    report = getattr(fn, "optimus_report", None)
    return {"losses": losses, "rewrites": sum(s.matched for s in report.rule_totals().values()) if report else None}


@pytest.mark.slow
def test_distributed_model_parallel(tmp_path) -> None:
    eager = odist.launch(dmp_worker, "eager", 2, str(tmp_path / "eager"), timeout_s=900)
    opt = odist.launch(dmp_worker, "optimus", 2, str(tmp_path / "optimus"), timeout_s=900)
    for e, o in zip(eager, opt):
        for got, want in zip(o["losses"], e["losses"]):
            assert abs(got - want) <= 1e-5 * abs(want)
        assert o["rewrites"] > 0
