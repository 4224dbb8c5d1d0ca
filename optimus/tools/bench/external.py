"""Models nobody here wrote: TorchRec's DLRM, DLRM_DCN and DeepFM, Hugging Face's BERT and GPT-2.

``optimus bench --suite external`` (or any of these names in ``--model``) runs them
through the same configurations, steps and accuracy rule as the zoo. Each is built
from its library's public constructors with random weights drawn from the seed; no
weights, tokenizers or configs are downloaded.

* ``torchrec_dlrm``, ``torchrec_dlrm_dcn``, ``torchrec_deepfm``:
  ``torchrec.models.dlrm.DLRM``, ``DLRM_DCN`` and ``torchrec.models.deepfm.SimpleDeepFMNN``
  over an ``EmbeddingBagCollection`` with one table per sparse feature; inputs are
  ``(dense, KeyedJaggedTensor)`` with bags of 1..``max_bag`` ids; one logit per example,
  binary cross-entropy. The realistic size follows MLPerf's DLRM-DCNv2 (embedding dim
  128, bottom MLP 512-256-128, top 1024-1024-512-256-1, 3 cross layers of rank 512).
* ``hf_bert``: ``BertForSequenceClassification`` (one label, binary cross-entropy);
  realistic is BERT-base (12 layers, hidden 768, 12 heads, sequence 128).
* ``hf_gpt2``: ``GPT2LMHeadModel`` with next-token cross-entropy; realistic is GPT-2
  124M (12 layers, hidden 768, 12 heads, vocabulary 50257, sequence 512).

Dropout is configured to 0 in the HF models so that every configuration computes the
same function (parity is checked against eager). They are optional: ``pip install -e
".[torchrec]"`` / ``".[hf]"``; ``unavailable(name)`` says why one cannot run here.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..models import MODELS, ZooModel, get_model
from ..models import _common as c

SUITES = ("zoo", "external", "all")


@dataclass
class ExternalModel(ZooModel):
    """A ``ZooModel`` whose objective is binary (BCE on logits shaped like ``targets``)
    or ``next_token`` (language-model cross-entropy, ``targets`` are the token ids)."""

    objective: str = "binary"

    def loss(self, output: torch.Tensor) -> torch.Tensor:
        return self._loss(output.float())

    def exact_loss(self, output: torch.Tensor) -> torch.Tensor:
        """The loss in the output's own precision (the fp64 reference of the accuracy rule)."""
        return self._loss(output)

    def _loss(self, logits: torch.Tensor) -> torch.Tensor:
        if self.objective == "next_token":
            return F.cross_entropy(logits[:, :-1].flatten(0, 1), self.targets[:, 1:].flatten())
        return F.binary_cross_entropy_with_logits(logits, self.targets.to(logits.dtype))


# --- TorchRec -------------------------------------------------------------------------


@dataclass(frozen=True)
class TorchRecConfig:
    batch: int
    num_dense: int
    num_sparse: int
    rows: int
    dim: int
    max_bag: int
    dense_arch: tuple[int, ...]  # DLRM bottom MLP; its last size is ``dim``
    over_arch: tuple[int, ...]  # DLRM top MLP; its last size is 1
    dcn_layers: int
    dcn_rank: int
    deepfm_hidden: int
    deepfm_dim: int


TORCHREC_CONFIGS = {
    "small": TorchRecConfig(batch=32, num_dense=13, num_sparse=6, rows=100, dim=16, max_bag=4,
                            dense_arch=(32, 16), over_arch=(32, 1), dcn_layers=2, dcn_rank=8,
                            deepfm_hidden=32, deepfm_dim=8),
    "realistic": TorchRecConfig(batch=2048, num_dense=13, num_sparse=26, rows=20_000, dim=128, max_bag=8,
                                dense_arch=(512, 256, 128), over_arch=(1024, 1024, 512, 256, 1),
                                dcn_layers=3, dcn_rank=512, deepfm_hidden=1024, deepfm_dim=16),
}


def _embedding_bags(cfg: TorchRecConfig) -> nn.Module:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=cfg.dim, num_embeddings=cfg.rows,
                                 feature_names=[f"f{i}"]) for i in range(cfg.num_sparse)]
    return EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))


def _torchrec_module(kind: str, cfg: TorchRecConfig) -> nn.Module:
    from torchrec.models.deepfm import SimpleDeepFMNN
    from torchrec.models.dlrm import DLRM, DLRM_DCN

    ebc = _embedding_bags(cfg)
    if kind == "dlrm":
        return DLRM(ebc, cfg.num_dense, list(cfg.dense_arch), list(cfg.over_arch))
    if kind == "dlrm_dcn":
        return DLRM_DCN(ebc, cfg.num_dense, list(cfg.dense_arch), list(cfg.over_arch),
                        dcn_num_layers=cfg.dcn_layers, dcn_low_rank_dim=cfg.dcn_rank)
    if kind == "deepfm":
        return SimpleDeepFMNN(cfg.num_dense, ebc, hidden_layer_size=cfg.deepfm_hidden,
                              deep_fm_dimension=cfg.deepfm_dim)
    raise ValueError(f"unknown TorchRec model kind {kind!r}")


def sparse_features(gen: torch.Generator, cfg: TorchRecConfig) -> Any:
    """A ``KeyedJaggedTensor`` of ``cfg.num_sparse`` features over ``cfg.batch`` examples,
    each bag 1..``cfg.max_bag`` ids (lengths are feature-major, as TorchRec lays them out)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    lengths = torch.randint(1, cfg.max_bag + 1, (cfg.num_sparse * cfg.batch,), generator=gen)
    values = torch.randint(0, cfg.rows, (int(lengths.sum()),), generator=gen)
    return KeyedJaggedTensor.from_lengths_sync(keys=[f"f{i}" for i in range(cfg.num_sparse)], values=values,
                                               lengths=lengths)


def _build_torchrec(kind: str) -> Callable[..., ExternalModel]:
    name = f"torchrec_{kind}"

    def build(size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> ExternalModel:
        cfg = c.pick(TORCHREC_CONFIGS, name, size)
        model = c.seeded(seed, lambda: _torchrec_module(kind, cfg))
        g = c.input_generator(seed)
        dense = c.randn(g, cfg.batch, cfg.num_dense)
        sparse = sparse_features(g, cfg)
        targets = c.binary_targets(g, cfg.batch, 1)  # the models return (B, 1) logits
        dev = torch.device(device)
        return ExternalModel(name=name, size=size, model=model.to(dev), inputs=(dense.to(dev), sparse.to(dev)),
                             batch_size=cfg.batch, targets=targets.to(dev), config=cfg)

    return build


# --- Hugging Face transformers --------------------------------------------------------


@dataclass(frozen=True)
class TransformerConfig:
    batch: int
    seq: int
    vocab: int
    hidden: int
    layers: int
    heads: int
    ffn: int


BERT_CONFIGS = {
    "small": TransformerConfig(batch=4, seq=32, vocab=1000, hidden=64, layers=2, heads=2, ffn=256),
    "realistic": TransformerConfig(batch=32, seq=128, vocab=30522, hidden=768, layers=12, heads=12, ffn=3072),
}
GPT2_CONFIGS = {
    "small": TransformerConfig(batch=4, seq=32, vocab=1000, hidden=64, layers=2, heads=2, ffn=256),
    "realistic": TransformerConfig(batch=8, seq=512, vocab=50257, hidden=768, layers=12, heads=12, ffn=3072),
}


class Logits(nn.Module):
    """A Hugging Face model called on token ids, returning only its ``logits`` tensor."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits


def _bert(cfg: TransformerConfig) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=cfg.vocab, hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
                        num_attention_heads=cfg.heads, intermediate_size=cfg.ffn,
                        max_position_embeddings=max(512, cfg.seq), hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, classifier_dropout=0.0, num_labels=1)
    return Logits(BertForSequenceClassification(config))


def _gpt2(cfg: TransformerConfig) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=cfg.vocab, n_positions=max(1024, cfg.seq), n_embd=cfg.hidden,
                        n_layer=cfg.layers, n_head=cfg.heads, n_inner=cfg.ffn, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, bos_token_id=cfg.vocab - 1, eos_token_id=cfg.vocab - 1)
    return Logits(GPT2LMHeadModel(config))


def _build_hf(name: str, configs: dict[str, TransformerConfig], make: Callable[[TransformerConfig], nn.Module],
              objective: str) -> Callable[..., ExternalModel]:
    def build(size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> ExternalModel:
        cfg = c.pick(configs, name, size)
        model = c.seeded(seed, lambda: make(cfg))
        g = c.input_generator(seed)
        ids = c.randint(g, cfg.vocab, cfg.batch, cfg.seq)
        targets = ids if objective == "next_token" else c.binary_targets(g, cfg.batch, 1)
        dev = torch.device(device)
        return ExternalModel(name=name, size=size, model=model.to(dev), inputs=(ids.to(dev),), batch_size=cfg.batch,
                             targets=targets.to(dev), config=cfg, objective=objective)

    return build


# --- the registry ---------------------------------------------------------------------


@dataclass(frozen=True)
class ExternalSpec:
    name: str
    summary: str
    package: str  # the library it needs
    modules: tuple[str, ...]  # what must import for it to run
    extra: str  # the pyproject extra that installs the library
    build: Callable[..., ExternalModel]
    configs: dict[str, Any]


_TORCHREC_MODULES = ("torchrec.models.dlrm", "torchrec.models.deepfm", "torchrec.sparse.jagged_tensor")
_HF_MODULES = ("transformers",)

EXTERNAL: dict[str, ExternalSpec] = {
    spec.name: spec
    for spec in [
        ExternalSpec("torchrec_dlrm", "TorchRec DLRM: EmbeddingBagCollection over a KeyedJaggedTensor, dot interaction",
                     "torchrec", _TORCHREC_MODULES, "torchrec", _build_torchrec("dlrm"), TORCHREC_CONFIGS),
        ExternalSpec("torchrec_dlrm_dcn", "TorchRec DLRM_DCN: DLRM with a low-rank DCNv2 interaction",
                     "torchrec", _TORCHREC_MODULES, "torchrec", _build_torchrec("dlrm_dcn"), TORCHREC_CONFIGS),
        ExternalSpec("torchrec_deepfm", "TorchRec SimpleDeepFMNN: factorization machine + deep arch",
                     "torchrec", _TORCHREC_MODULES, "torchrec", _build_torchrec("deepfm"), TORCHREC_CONFIGS),
        ExternalSpec("hf_bert", "Hugging Face BertForSequenceClassification built from a BertConfig",
                     "transformers", _HF_MODULES, "hf", _build_hf("hf_bert", BERT_CONFIGS, _bert, "binary"),
                     BERT_CONFIGS),
        ExternalSpec("hf_gpt2", "Hugging Face GPT2LMHeadModel built from a GPT2Config (next-token loss)",
                     "transformers", _HF_MODULES, "hf", _build_hf("hf_gpt2", GPT2_CONFIGS, _gpt2, "next_token"),
                     GPT2_CONFIGS),
    ]
}


@functools.lru_cache(maxsize=None)
def _import_problem(modules: tuple[str, ...]) -> str | None:
    """Why ``modules`` do not all import (the package absent, or installed but broken), else None."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as e:  # a broken install (e.g. a torch/fbgemm ABI mismatch) must not crash the bench
            missing = getattr(e, "name", None) if isinstance(e, ImportError) else None
            if missing and (module == missing or module.startswith(missing + ".")):
                return f"{missing} is not installed"
            first = str(e).strip().splitlines()
            return f"{module} failed to import: {type(e).__name__}: {first[0] if first else ''}"
    return None


# torchrec's metadata pulls the CUDA fbgemm-gpu: it and the fbgemm matching torch go in without dependencies
TORCHREC_NO_DEPS = "pip install --no-deps torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0"


def install_hint(extra: str) -> str:
    first = f"{TORCHREC_NO_DEPS} (versions matching torch 2.13), then " if extra == "torchrec" else ""
    return f'{first}pip install -e ".[{extra}]" (see docs/models.md, "External models")'


@functools.lru_cache(maxsize=None)
def _fbgemm_device_problem(device_type: str) -> str | None:
    """TorchRec's ``KeyedJaggedTensor`` computes offsets with ``fbgemm::asynchronous_complete_cumsum``:
    the CPU-only build (``fbgemm-gpu-cpu``) has no CUDA kernel for it."""
    if device_type == "cpu":
        return None
    try:
        torch.ops.fbgemm.asynchronous_complete_cumsum(torch.ones(2, dtype=torch.int64, device=device_type))
    except Exception as e:  # noqa: BLE001 - any failure means the rows cannot run
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return (f"fbgemm_gpu has no {device_type} kernels here ({type(e).__name__}: {first[:120]}); "
                f"install the fbgemm-gpu build matching torch")
    return None


def unavailable(name: str, device: str | torch.device = "cpu") -> str | None:
    """Why external model ``name`` cannot run here on ``device`` (its library missing or
    broken, or TorchRec's fbgemm without kernels for the device), else None. Zoo models
    are always available."""
    spec = EXTERNAL.get(name)
    if spec is None:
        return None
    problem = _import_problem(spec.modules)
    if problem is not None:
        return f"{problem}; install it with {install_hint(spec.extra)}"
    if spec.package == "torchrec":
        return _fbgemm_device_problem(torch.device(device).type)
    return None


def suite_models(suite: str) -> list[str]:
    """The models ``--model all`` means in ``suite``: zoo, external, or all of both."""
    if suite == "zoo":
        return list(MODELS)
    if suite == "external":
        return list(EXTERNAL)
    if suite == "all":
        return list(MODELS) + list(EXTERNAL)
    raise ValueError(f"unknown suite {suite!r}; choose from: {', '.join(SUITES)}")


def all_model_names() -> list[str]:
    return list(MODELS) + list(EXTERNAL)


# --- the user's own models (``--model MODULE:FACTORY``) ---------------------------------


@dataclass
class UserBenchModel(ZooModel):
    """A model of the user's (``optimus.tools.user_model``). It must return one tensor; training
    minimizes the mean of its square (a stand-in loss whose gradient reaches every
    parameter the output depends on). ``size`` does not apply: the factory decides."""

    def loss(self, output: torch.Tensor) -> torch.Tensor:
        return self.exact_loss(output.float())

    def exact_loss(self, output: torch.Tensor) -> torch.Tensor:
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"{self.name} returned {type(output).__name__}: optimus bench needs a model returning one "
                            "tensor (wrap it in a module that returns the tensor to measure)")
        return output.pow(2).mean()


def user_model_name(spec: str, inputs: str | None) -> str:
    """The bench's name of a user model: ``MODULE:FACTORY``, with ``[INPUTS]`` when
    ``--inputs`` gave them (the name travels to worker processes and into every row)."""
    return f"{spec}[{inputs}]" if inputs is not None else spec


def user_spec(name: str) -> tuple[str, str | None]:
    """``MODULE:FACTORY[INPUTS]`` -> ``("MODULE:FACTORY", "INPUTS")`` (``None`` without inputs)."""
    if name.endswith("]") and "[" in name:
        spec, _, inputs = name[:-1].partition("[")
        return spec, inputs
    return name, None


def user_bench_model(name: str, device: str | torch.device = "cpu", seed: int = 0) -> UserBenchModel:
    """Build user model ``name`` (``user_model_name``) with inputs and weights from ``seed``."""
    from .. import user_model

    spec, inputs = user_spec(name)
    model, args = user_model.load(spec, inputs, device, seed)
    first = next((a for a in args if isinstance(a, torch.Tensor) and a.dim() > 0), None)
    batch = int(first.shape[0]) if first is not None else 1
    return UserBenchModel(name=name, size="user", model=model, inputs=args, batch_size=batch,
                          targets=torch.zeros((), device=torch.device(device)))


def check_user_model(name: str, device: str | torch.device = "cpu") -> None:
    """Build user model ``name`` and run it once eagerly: a ``ValueError`` saying what is
    wrong (the name, the factory, the inputs, an output that is not one tensor) before
    any configuration is measured."""
    zoo = user_bench_model(name, device)
    try:
        with torch.no_grad():
            out = zoo.model(*zoo.inputs)
    except Exception as e:
        raise ValueError(f"{name}: the model fails on its example inputs: {type(e).__name__}: {e}") from None
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"{name} returns {type(out).__name__}; optimus bench needs a model returning one tensor "
                         "(wrap it in a module that returns the tensor to measure)")


def get_bench_model(name: str, size: str = "small", device: str | torch.device = "cpu", seed: int = 0) -> ZooModel:
    """Build zoo, external or user model ``name``; an external one whose library is missing
    raises ``ModuleNotFoundError`` naming the extra to install."""
    if ":" in name:
        return user_bench_model(name, device, seed)
    spec = EXTERNAL.get(name)
    if spec is None:
        return get_model(name, size, device, seed)
    problem = unavailable(name, device)
    if problem is not None:
        raise ModuleNotFoundError(f"{name}: {problem}")
    if size not in spec.configs:
        raise ValueError(f"unknown size {size!r} for model {name!r}; choose from: {', '.join(spec.configs)}")
    return spec.build(size=size, device=device, seed=seed)
