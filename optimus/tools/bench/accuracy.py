"""Accuracy as PyTorch's own benchmark harness judges it.

PyTorch's dynamo benchmarks (``benchmarks/dynamo/common.py``, ``check_accuracy``) run
three versions of a model from the same initial state: eager fp32 (``ref``), an fp64
copy (``fp64_ref``) and the compiled one (``res``), and call
``torch._dynamo.utils.same(ref, res, fp64_ref, tol=tol)`` on every output and gradient.
For one tensor that rule is

    pass  if allclose(ref, res, rtol=tol, atol=tol)
    else  pass iff RMSE(fp64_ref, res) <= multiplier * RMSE(fp64_ref, ref) + tol / 10

with ``multiplier`` 2 for fp32 results, 3 for fp16/bf16 results, tensors of fewer than
1,000 elements, or ``tol >= 2e-2``. In words: the compiled result may be at most about
twice as far from the exact (fp64) answer as eager fp32 itself is. ``tol`` is 1e-4,
1e-3 for CUDA training, and TF32 is off while the three run. In another precision
(``optimus.tools.bench.precision``: autocast, a bf16 model) ``ref`` is eager in that precision
and ``tol`` the harness's for it (1e-3 under autocast).

``torch._dynamo.utils.same`` is the judge; its import and signature are checked once,
here (``dynamo_same``). The RMSE figures reported next to its verdict are recomputed
alongside it (``same`` returns only a bool); should ``same`` be missing from a future
torch, the same rule is applied from those figures and the row says so.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "RULE",
    "FALLBACK_RULE",
    "Reference",
    "TensorVerdict",
    "accuracy_tolerance",
    "dynamo_same",
    "eager_reference",
    "fp64_copy",
    "judge",
    "judge_tensor",
    "rmse",
    "tf32_disabled",
    "tf32_mode",
]

RULE = "dynamo-same-fp64"  # torch._dynamo.utils.same with an fp64 reference
FALLBACK_RULE = "rmse-fp64"  # the same rule, applied here (torch._dynamo.utils.same unavailable)
RULE_TEXT = ("torch._dynamo.utils.same(eager_fp32, result, fp64_ref, tol): allclose(tol), else "
             "RMSE(fp64, result) <= m * RMSE(fp64, eager_fp32) + tol/10, m = 2 (3 for < 1000 elements)")


def accuracy_tolerance(device: str | torch.device, mode: str, precision: str = "fp32") -> float:
    """The dynamo benchmarks' default tolerance: 1e-3 for CUDA training, else 1e-4; 1e-3
    under autocast (``optimus.tools.bench.precision``)."""
    from .precision import get

    return get(precision).tolerance(device, mode)


_SAME: Callable[..., bool] | None = None
_SAME_CHECKED = False
_SAME_PARAMS = ("ref", "res", "fp64_ref", "cos_similarity", "tol", "log_error")


def dynamo_same() -> Callable[..., bool] | None:
    """``torch._dynamo.utils.same`` if it exists with the parameters we pass, else None."""
    global _SAME, _SAME_CHECKED
    if not _SAME_CHECKED:
        _SAME_CHECKED = True
        try:
            from torch._dynamo.utils import same

            params = inspect.signature(same).parameters
            if all(p in params for p in _SAME_PARAMS):
                _SAME = same
        except (ImportError, TypeError, ValueError):  # pragma: no cover - a future torch
            _SAME = None
    return _SAME


def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    """Root mean square of ``a - b`` in fp64 (``torch._dynamo.utils.rmse``'s definition)."""
    if a.numel() == 0:
        return 0.0
    return torch.sqrt(torch.mean(torch.square(a.detach().double() - b.detach().double()))).item()


def _multiplier(res: torch.Tensor, fp64_ref: torch.Tensor, ref: torch.Tensor, tol: float) -> float:
    """The RMSE multiplier ``same`` uses (its default options, as the dynamo benchmarks call it)."""
    if fp64_ref.numel() < 1000 or (ref.ndim == 4 and ref.shape[-1] == ref.shape[-2] == 1) or tol >= 2e-2:
        return 3.0
    return 3.0 if res.dtype in (torch.float16, torch.bfloat16) else 2.0


@dataclass
class TensorVerdict:
    """One tensor judged: ``how`` is "allclose", "rmse" (passed on the RMSE rule) or "fail"."""

    name: str
    ok: bool
    how: str
    res_rmse: float  # RMSE(fp64, result)
    ref_rmse: float  # RMSE(fp64, eager fp32)
    multiplier: float
    message: str = ""

    @property
    def ratio(self) -> float:
        """RMSE(fp64, result) / RMSE(fp64, eager fp32): 2 (3 for small tensors) is the limit."""
        if math.isnan(self.res_rmse) or math.isnan(self.ref_rmse):
            return math.nan  # not compared (shape mismatch, missing gradient)
        if self.ref_rmse > 0:
            return self.res_rmse / self.ref_rmse
        return 1.0 if self.res_rmse == 0 else math.inf


def judge_tensor(name: str, ref: torch.Tensor, res: torch.Tensor, fp64_ref: torch.Tensor, tol: float) -> TensorVerdict:
    """``same(ref, res, fp64_ref, tol=tol)`` on one tensor, with the RMSE figures beside it."""
    ref, res, fp64_ref = ref.detach(), res.detach(), fp64_ref.detach()
    if res.shape != ref.shape:
        return TensorVerdict(name, False, "fail", math.nan, math.nan, math.nan,
                             f"shape {tuple(res.shape)} != eager {tuple(ref.shape)}")
    if res.device != ref.device:
        res = res.to(ref.device)
    fp64_ref = fp64_ref.to(ref.device)
    res_err, ref_err = rmse(fp64_ref, res), rmse(fp64_ref, ref)
    mult = _multiplier(res, fp64_ref, ref, tol)
    close = bool(torch.allclose(ref, res, atol=tol, rtol=tol)) if ref.dtype == res.dtype else False
    messages: list[str] = []
    same = dynamo_same()
    if same is not None:
        ok = bool(same(ref, res, fp64_ref, cos_similarity=False, tol=tol,
                       log_error=lambda msg, *args: messages.append(msg % args if args else msg)))
    else:
        ok = ref.dtype == res.dtype and (close or res_err <= mult * ref_err + tol / 10.0)
        if not ok:
            messages.append(f"RMSE (res-fp64): {res_err:.5g}, (ref-fp64): {ref_err:.5g}, multiplier {mult}, tol {tol}")
    how = "allclose" if ok and close else ("rmse" if ok else "fail")
    return TensorVerdict(name, ok, how, res_err, ref_err, mult, "; ".join(messages)[:300])


@dataclass
class Reference:
    """Eager fp32 and fp64 results of one step from the same initial state.

    ``grads`` / ``grads64`` follow the model's trainable parameters in order (empty in
    inference); ``names`` are their parameter names.
    """

    output: torch.Tensor
    grads: list[torch.Tensor | None]
    output64: torch.Tensor
    grads64: list[torch.Tensor | None]
    names: list[str]

    def to(self, device: str | torch.device) -> "Reference":
        def mv(ts: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
            return [None if t is None else t.to(device) for t in ts]

        return Reference(self.output.to(device), mv(self.grads), self.output64.to(device), mv(self.grads64),
                         list(self.names))


def judge(ref: Reference, out: torch.Tensor, grads: Sequence[torch.Tensor | None] | None, tol: float) -> dict[str, Any]:
    """Judge a step's output (and, in training, its parameter gradients) by the rule above.

    Returns the row's accuracy record: the rule, ``ok``, the worst ratio
    RMSE(fp64, result) / RMSE(fp64, eager fp32) over the tensors the RMSE rule judged
    (those not allclose; None when every tensor was), over outputs and over gradients,
    with the tensor it came from and its limit (the multiplier); how many tensors passed
    by allclose and by the RMSE rule; the failing tensors; and, for information, the max
    absolute and relative error against eager fp32.
    """
    verdicts = [judge_tensor("output", ref.output, out, ref.output64, tol)]
    result: dict[str, Any] = {
        "rule": RULE if dynamo_same() is not None else FALLBACK_RULE,
        "tol": tol,
        "tf32": False,
    }
    missing = 0
    if grads is not None:
        for name, g, r, r64 in zip(ref.names, grads, ref.grads, ref.grads64):
            if (g is None) != (r is None):
                missing += 1
                verdicts.append(TensorVerdict(f"grad {name}", False, "fail", math.nan, math.nan, math.nan,
                                              "gradient missing" if g is None else "unexpected gradient"))
            elif g is not None and r is not None and r64 is not None:
                verdicts.append(judge_tensor(f"grad {name}", r, g, r64, tol))
    # Ratios matter where allclose failed and the RMSE rule judged; a tensor that is
    # allclose can show any ratio (both errors are rounding noise near zero).
    judged = [v for v in verdicts if v.how != "allclose" and not math.isnan(v.ratio)]
    out_v, grad_v = verdicts[0], [v for v in judged if v is not verdicts[0]]
    result["out_ok"] = out_v.ok
    result["out_rmse_ratio"] = out_v.ratio if any(v is out_v for v in judged) else None
    if grads is not None:
        worst_g = max(grad_v, key=lambda v: v.ratio, default=None)
        result["grads_ok"] = all(v.ok for v in verdicts[1:])
        result["grad_rmse_ratio"] = worst_g.ratio if worst_g is not None else None
        result["grads_missing"] = missing
    worst = max(judged, key=lambda v: v.ratio, default=None)
    result["worst_rmse_ratio"] = worst.ratio if worst is not None else None
    result["worst_tensor"] = worst.name if worst is not None else None
    result["worst_multiplier"] = worst.multiplier if worst is not None else None
    result["tensors"] = len(verdicts)
    result["passed_allclose"] = sum(v.how == "allclose" for v in verdicts)
    result["passed_rmse"] = sum(v.how == "rmse" for v in verdicts)
    failed = [v for v in verdicts if not v.ok]
    result["failed"] = [f"{v.name}: {v.message}" if v.message else v.name for v in failed[:5]]
    result["failed_count"] = len(failed)
    result.update(_max_errors(ref, out, grads))
    result["ok"] = not failed
    return result


def _max_errors(ref: Reference, out: torch.Tensor, grads: Sequence[torch.Tensor | None] | None) -> dict[str, float]:
    """Max |result - eager fp32|, absolute and relative to max|eager| (informative only)."""

    def err(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
        if got.shape != want.shape or not want.numel():
            return (math.nan, math.nan) if got.shape != want.shape else (0.0, 0.0)
        a = (got.detach().double().to(want.device) - want.detach().double()).abs().max().item()
        return a, a / max(want.detach().abs().max().item(), 1e-12)

    out_abs, out_rel = err(out, ref.output)
    errors = {"out_max_abs": out_abs, "out_max_rel": out_rel}
    if grads is not None:
        pairs = [err(g, r) for g, r in zip(grads, ref.grads) if g is not None and r is not None]
        errors["grad_max_abs"] = max((a for a, _ in pairs), default=0.0)
        errors["grad_max_rel"] = max((r for _, r in pairs), default=0.0)
    return errors


# --- the references -------------------------------------------------------------------


@contextlib.contextmanager
def tf32_mode(enabled: bool) -> Iterator[None]:
    """TF32 on or off for CUDA matmuls and cuDNN inside, restored after (no effect on CPU math).

    Dynamo guards on the matmul flag: a function compiled under one setting recompiles
    when called under the other.
    """
    from ... import torch_api

    with torch_api.tf32(enabled, cudnn=True):
        yield


def tf32_disabled() -> ContextManager[None]:
    """TF32 off inside, as for every accuracy run."""
    return tf32_mode(False)


def fp64_copy(model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The model with floating parameters and buffers in fp64, and its floating inputs cast
    (integer inputs such as embedding indices, and inputs that are not tensors, such as
    TorchRec's ``KeyedJaggedTensor`` of ids, unchanged). Casts ``model`` in place."""
    return model.double(), tuple(t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                                 for t in inputs)


def fp64_loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The zoo's binary cross-entropy computed in the output's own precision (fp64 here;
    ``ZooModel.loss`` casts the output to fp32, which would round the reference)."""
    return F.binary_cross_entropy_with_logits(output, targets.to(output.dtype))


def _trainable(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _one_step(model: torch.nn.Module, inputs: Sequence[torch.Tensor], loss: Callable[[torch.Tensor], torch.Tensor],
              mode: str, autocast: ContextManager[Any] | None = None) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """One step; ``autocast`` (if any) holds the forward and the loss, not the backward."""
    region = autocast if autocast is not None else contextlib.nullcontext()
    if mode != "train":
        with torch.no_grad(), region:
            return model(*inputs).detach().clone(), []
    params = _trainable(model)
    for _, p in params:
        p.grad = None
    with region:
        out = model(*inputs)
        value = loss(out)
    value.backward()
    return out.detach().clone(), [None if p.grad is None else p.grad.detach().clone() for _, p in params]


def eager_reference(name: str, mode: str, size: str = "small", device: str | torch.device = "cpu",
                    seed: int = 0, precision: str = "fp32") -> Reference:
    """Eager results of one step of zoo or external model ``name`` in ``precision``
    (``optimus.tools.bench.precision``), and fp64 ones, TF32 off.

    The fp64 copy is made from the model as that precision runs it (a bf16 model's
    rounded weights), and runs without autocast (autocast leaves fp64 tensors alone).
    The fp64 loss is the model's ``exact_loss`` when it has one (external models), else
    the zoo's binary cross-entropy in fp64."""
    from .external import get_bench_model as get_model
    from .precision import get

    prec = get(precision)
    with tf32_disabled():
        zoo = get_model(name, size, device, seed)
        inputs = prec.cast(zoo.model, zoo.inputs)
        names = [n for n, _ in _trainable(zoo.model)] if mode == "train" else []
        out, grads = _one_step(zoo.model, inputs, zoo.loss, mode, prec.autocast(device))
        del zoo, inputs
        zoo = get_model(name, size, device, seed)
        model64, inputs64 = fp64_copy(zoo.model, prec.cast(zoo.model, zoo.inputs))
        targets = zoo.targets
        loss64 = getattr(zoo, "exact_loss", None) or (lambda o: fp64_loss(o, targets))
        out64, grads64 = _one_step(model64, inputs64, loss64, mode)
        del zoo, model64, inputs64
    return Reference(out, grads, out64, grads64, names)
