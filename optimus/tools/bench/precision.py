"""The precisions a bench step runs in (``optimus bench --precision``), as users train and
serve, and as PyTorch's own benchmark harness (``benchmarks/dynamo``) runs and judges each.

==========  ==========================================================================
``fp32``    the fp32 model, TF32 off (the default)
``tf32``    the fp32 model; the timed steps with TF32 matmuls and convolutions (CUDA)
``amp-bf16`` the forward and the loss under ``torch.autocast(device, torch.bfloat16)``,
            the backward outside it (autocast's documented use); parameters stay fp32
``amp-fp16`` the same with ``torch.float16``
``bf16``    the model's floating parameters and buffers and its floating inputs cast to
            bfloat16, no autocast (the harness's ``--bfloat16``)
==========  ==========================================================================

Accuracy (``optimus.tools.bench.accuracy``): each configuration's first step is judged against
eager in the same precision (``ref``) and an fp64 copy of the model (``fp64_ref``; of the
bf16 model for ``bf16``, so the reference sees the same rounded weights and inputs) by
``torch._dynamo.utils.same``, whose RMSE multiplier is 3 for bf16/fp16 results (2 for
fp32 ones, such as gradients of fp32 parameters under autocast). TF32 is off for that
step in every precision, as in the harness; ``tf32`` turns it on for the timed steps only
(Dynamo guards on the flag: one untimed step recompiles). ``tol`` as the harness sets it:
1e-3 under autocast; else 1e-4, 1e-3 for CUDA training.

No ``GradScaler`` in ``amp-fp16`` training, as in the harness: one step is judged, a
scaler's state would differ between the eager and the compiled run, and its unscale and
inf check run outside the compiled graph, the same work in every configuration.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager, Sequence

import torch

__all__ = ["PRECISIONS", "PRECISION_NAMES", "Precision", "get", "parse", "row_precision"]


@dataclass(frozen=True)
class Precision:
    name: str
    summary: str
    autocast_dtype: torch.dtype | None = None  # the forward and loss under torch.autocast(device, dtype)
    model_dtype: torch.dtype | None = None  # floating parameters, buffers and inputs cast to it
    tf32: bool = False  # the timed steps with TF32 (CUDA); accuracy is judged with TF32 off

    def autocast(self, device: str | torch.device) -> ContextManager[Any]:
        """``torch.autocast`` of this precision on ``device``'s type (nothing without one)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(device).type, dtype=self.autocast_dtype)

    def cast(self, model: torch.nn.Module, inputs: Sequence[Any]) -> tuple[Any, ...]:
        """Cast ``model`` in place to ``model_dtype`` (its floating parameters and buffers) and
        return the inputs with their floating tensors cast; integer inputs (embedding ids)
        and other objects unchanged. Without a ``model_dtype``: the inputs as they are."""
        if self.model_dtype is None:
            return tuple(inputs)
        model.to(self.model_dtype)
        return tuple(t.to(self.model_dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                     for t in inputs)

    def tolerance(self, device: str | torch.device, mode: str) -> float:
        """The ``tol`` of PyTorch's harness: 1e-3 under autocast, else 1e-4 (1e-3 for CUDA training)."""
        if self.autocast_dtype is not None:
            return 1e-3
        return 1e-3 if torch.device(device).type == "cuda" and mode == "train" else 1e-4

    def record(self) -> dict[str, Any]:
        """What a result row records of the precision."""
        return {"precision": self.name,
                "autocast": None if self.autocast_dtype is None else str(self.autocast_dtype).replace("torch.", ""),
                "model_dtype": None if self.model_dtype is None else str(self.model_dtype).replace("torch.", "")}


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in [
        Precision("fp32", "TF32 off"),
        Precision("tf32", "TF32 matmuls in the timed steps (CUDA)", tf32=True),
        Precision("amp-bf16", "forward and loss under torch.autocast(bfloat16)", autocast_dtype=torch.bfloat16),
        Precision("amp-fp16", "forward and loss under torch.autocast(float16), no GradScaler",
                  autocast_dtype=torch.float16),
        Precision("bf16", "the model and its floating inputs in bfloat16, no autocast", model_dtype=torch.bfloat16),
    ]
}
PRECISION_NAMES = list(PRECISIONS)


def get(precision: "str | Precision") -> Precision:
    """The precision named ``precision`` (a ``Precision`` passes through)."""
    if isinstance(precision, Precision):
        return precision
    try:
        return PRECISIONS[precision]
    except KeyError:
        raise ValueError(f"unknown precision {precision!r}; choose from: {', '.join(PRECISION_NAMES)} "
                         "(or a comma list)") from None


def parse(value: str) -> list[str]:
    """The precisions of a comma list (``all``: every one), checked, in the order given, once each."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    if items == ["all"]:
        return list(PRECISION_NAMES)
    if not items:
        raise ValueError(f"no precision in {value!r}; choose from: {', '.join(PRECISION_NAMES)}")
    for item in items:
        get(item)
    return list(dict.fromkeys(items))


def row_precision(row: dict[str, Any]) -> str:
    """A result row's precision; rows written before the field existed say ``tf32`` by their flag."""
    return row.get("precision") or ("tf32" if row.get("tf32") else "fp32")
