"""Checks shared by the families: the list API's member checks, the packed and column
operands of the ops, tracing detection, and which tensors run on Triton.

The list API (``grouped_linear(xs, weights, ...)``, ``batched_layer_norm(xs, ...)``) takes one
dtype and device for every member, contiguous members, and says which member is wrong. The ops
take their operands *packed* (every member flattened, the members concatenated into one 1-D
buffer, the shapes as int lists) or, with ``layout="columns"``, as one (rows, sum widths)
matrix whose column blocks are the members (see :mod:`optimus.kernels.runtime.layout`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Optional

import torch
from torch import Tensor

from .backend import use_triton

__all__ = ["TRITON_DTYPES", "ALLOWED_DTYPES", "PLAIN_TYPES", "check_seq", "check_tensor", "check_first", "dev_key",
           "is_tracing", "compiling_or_dispatching", "rows_of", "triton_ok", "past_int32_limits", "check_packed",
           "check_columns", "check_layout"]

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ALLOWED_DTYPES = TRITON_DTYPES + (torch.float64,)  # float64: the plain-torch path only
PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


# ------------------------------------------------------------------------------------------------
# the list API
# ------------------------------------------------------------------------------------------------
def check_seq(fn: str, name: str, seq: Any) -> None:
    if isinstance(seq, Tensor) or not isinstance(seq, (list, tuple)):
        raise TypeError(f"{fn}: {name} must be a list or tuple of tensors, got {type(seq).__name__}")


def check_tensor(fn: str, name: str, t: Any, dtype: torch.dtype, device: torch.device) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{fn}: {name} is a {type(t).__name__}, not a tensor")
    if t.dtype != dtype:
        raise TypeError(f"{fn}: {name} has dtype {t.dtype} but xs[0] has dtype {dtype}; "
                        f"all members must share one dtype")
    if t.device != device:
        raise ValueError(f"{fn}: {name} is on device {t.device} but xs[0] is on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{fn}: {name} is not contiguous (shape {tuple(t.shape)}, stride {t.stride()}); "
                         f"call .contiguous() on it first")


def check_first(fn: str, xs) -> tuple:
    """The (dtype, device) every member must have: those of ``xs[0]``."""
    if len(xs) == 0:
        raise ValueError(f"{fn}: empty list of inputs (xs); need at least one member")
    x0 = xs[0]
    if not isinstance(x0, Tensor):
        raise TypeError(f"{fn}: xs[0] is a {type(x0).__name__}, not a tensor")
    if x0.dtype not in ALLOWED_DTYPES:
        raise TypeError(f"{fn}: xs[0] has dtype {x0.dtype}; supported dtypes are float16, bfloat16, float32 "
                        f"(and float64 on the plain-torch path)")
    return x0.dtype, x0.device


def dev_key(t: Tensor) -> tuple:
    """A cheap stand-in for ``t.device`` in equality checks (no device object built)."""
    return (t.get_device(), t.is_cuda, t.is_meta)


def compiling_or_dispatching() -> bool:
    """True under dynamo or while a torch-dispatch mode is active (no data can be read)."""
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    if is_compiling is not None and is_compiling():
        return True
    stack_len = getattr(torch._C, "_len_torch_dispatch_stack", None)
    return stack_len is not None and stack_len() > 0


def is_tracing(tensors) -> bool:
    """True when the call is being traced (dynamo, make_fx, fake/functional tensors)."""
    if compiling_or_dispatching():
        return True
    for t in tensors:
        if t is not None and type(t) not in PLAIN_TYPES:
            return True
    return False


def rows_of(x: Tensor) -> int:
    """Rows of ``x`` seen as a (rows, last dim) matrix."""
    k = x.shape[-1]
    return x.numel() // k if k else math.prod(x.shape[:-1])


def triton_ok(t: Tensor) -> bool:
    """Whether a call with ``t`` as its first operand runs on the Triton kernels."""
    return t.dtype in TRITON_DTYPES and use_triton(t.device)


def past_int32_limits(sig: Any) -> bool:
    """Whether a kernel signature exceeds the kernels' int32 indexing (its ``limit_reason``);
    warned once per signature, since such a group then runs on the plain-torch path."""
    if sig.limit_reason is None:
        return False
    if not getattr(sig, "_warned", False):
        sig._warned = True
        warnings.warn(sig.limit_reason + "; this group runs on the plain-torch path", RuntimeWarning, stacklevel=3)
    return True


# ------------------------------------------------------------------------------------------------
# the ops' packed and column operands
# ------------------------------------------------------------------------------------------------
def check_packed(fn: str, name: str, t: Tensor, numel, dtype: torch.dtype, device: torch.device) -> None:
    """``t`` is one contiguous 1-D buffer of ``numel`` elements (a SymInt under tracing)."""
    if t.dim() != 1:
        raise ValueError(f"{fn}: packed {name} must be 1-D, got shape {tuple(t.shape)}")
    torch._check(t.numel() == numel,
                 lambda: f"{fn}: packed {name} has {t.numel()} elements but the shape lists need {numel}")
    if t.dtype != dtype:
        raise TypeError(f"{fn}: packed {name} has dtype {t.dtype}, expected {dtype}")
    if t.device != device:
        raise ValueError(f"{fn}: packed {name} is on {t.device}, expected {device}")
    if not t.is_contiguous():
        raise ValueError(f"{fn}: packed {name} is not contiguous")


def check_columns(fn: str, name: str, t: Tensor, rows, widths, dtype: torch.dtype, device: torch.device) -> None:
    """The column layout's operand: one (rows[0], sum widths) matrix, every member with the
    same rows."""
    first = rows[0]
    for r in rows[1:]:
        if r is first:  # one symbolic row count passed for every member
            continue
        if isinstance(r, int) and isinstance(first, int):
            if r != first:
                raise ValueError(f"{fn}: the column layout needs every member to have the same rows, got {list(rows)}")
        else:
            torch._check(r == first, lambda: f"{fn}: the column layout needs every member to have the same rows, got {list(rows)}")
    shape = (first, sum(widths))
    if t.dim() != 2:
        raise ValueError(f"{fn}: {name} in the column layout must be 2-D {shape}, got shape {tuple(t.shape)}")
    torch._check(t.shape[0] == shape[0] and t.shape[1] == shape[1],
                 lambda: f"{fn}: {name} has shape {tuple(t.shape)} but the shape lists need {shape}")
    if t.dtype != dtype:
        raise TypeError(f"{fn}: {name} has dtype {t.dtype}, expected {dtype}")
    if t.device != device:
        raise ValueError(f"{fn}: {name} is on {t.device}, expected {device}")


def check_layout(fn: str, layout: Optional[str]) -> None:
    if layout not in ("packed", "columns"):
        raise ValueError(f"{fn}: layout must be 'packed' or 'columns', got {layout!r}")
