"""Validation and routing shared by the public functions, the custom ops and the eager path.

The checks of the list API (one dtype and device, contiguous members, matching shapes;
the error names the member), whether a call is being traced, whether a tensor runs on
Triton, and the lazily imported kernel modules (imported on the first Triton launch, so
``optimus.kernels`` imports without Triton or CUDA).
"""

import math

import torch
from torch import Tensor

from ._common import triton_module, use_triton

_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ALLOWED_DTYPES = _TRITON_DTYPES + (torch.float64,)
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


_MODS = {}


def _glk():
    """The grouped-linear Triton module (imported on first use)."""
    m = _MODS.get("gl")
    if m is None:
        m = _MODS["gl"] = triton_module("grouped_linear_kernel")
    return m


def _lnk():
    """The batched-layer-norm Triton module (imported on first use)."""
    m = _MODS.get("ln")
    if m is None:
        m = _MODS["ln"] = triton_module("batched_layer_norm_kernel")
    return m


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------
def _check_seq(fn, name, seq):
    if isinstance(seq, Tensor) or not isinstance(seq, (list, tuple)):
        raise TypeError(f"{fn}: {name} must be a list or tuple of tensors, got {type(seq).__name__}")


def _check_tensor(fn, name, t, dtype, device):
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


def _check_first(fn, xs):
    if len(xs) == 0:
        raise ValueError(f"{fn}: empty list of inputs (xs); need at least one member")
    x0 = xs[0]
    if not isinstance(x0, Tensor):
        raise TypeError(f"{fn}: xs[0] is a {type(x0).__name__}, not a tensor")
    if x0.dtype not in _ALLOWED_DTYPES:
        raise TypeError(f"{fn}: xs[0] has dtype {x0.dtype}; supported dtypes are float16, bfloat16, float32 "
                        f"(and float64 on the plain-torch path)")
    return x0.dtype, x0.device


def _validate_gl(xs, weights, biases):
    fn = "grouped_linear"
    _check_seq(fn, "xs", xs)
    _check_seq(fn, "weights", weights)
    dtype, device = _check_first(fn, xs)
    if len(weights) != len(xs):
        raise ValueError(f"{fn}: got {len(xs)} inputs but {len(weights)} weights")
    if biases is not None:
        _check_seq(fn, "biases", biases)
        if len(biases) != len(xs):
            raise ValueError(f"{fn}: got {len(xs)} inputs but {len(biases)} biases")
    if _gl_fast_ok(xs, weights, biases, dtype, device):
        return dtype, device
    for i in range(len(xs)):
        x, w = xs[i], weights[i]
        _check_tensor(fn, f"xs[{i}]", x, dtype, device)
        _check_tensor(fn, f"weights[{i}]", w, dtype, device)
        if x.dim() < 1:
            raise ValueError(f"{fn}: xs[{i}] is 0-dimensional; inputs need a feature (last) dimension")
        if w.dim() != 2:
            raise ValueError(f"{fn}: weights[{i}] must be 2-D (out_features, in_features), "
                             f"got shape {tuple(w.shape)}")
        if x.shape[-1] != w.shape[1]:
            raise ValueError(f"{fn}: member {i}: xs[{i}] has {x.shape[-1]} input features (shape "
                             f"{tuple(x.shape)}) but weights[{i}] has shape {tuple(w.shape)}, which expects "
                             f"{w.shape[1]}")
        if biases is not None and biases[i] is not None:
            b = biases[i]
            _check_tensor(fn, f"biases[{i}]", b, dtype, device)
            if b.dim() != 1 or b.shape[0] != w.shape[0]:
                raise ValueError(f"{fn}: member {i}: biases[{i}] has shape {tuple(b.shape)} but weights[{i}] "
                                 f"has {w.shape[0]} output features")
    return dtype, device


def _dev_key(t):
    return (t.get_device(), t.is_cuda, t.is_meta)


def _gl_fast_ok(xs, weights, biases, dtype, device) -> bool:
    """Cheap all-members check; on failure the caller re-checks member by member for the message."""
    if len(weights) != len(xs):
        return False
    dev = _dev_key(xs[0])
    try:
        for x, w in zip(xs, weights):
            if (x.dtype is not dtype or w.dtype is not dtype or _dev_key(x) != dev or _dev_key(w) != dev
                    or w.dim() != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1]
                    or not x.is_contiguous() or not w.is_contiguous()):
                return False
        if biases is not None:
            for b, w in zip(biases, weights):
                if b is not None and (b.dtype is not dtype or _dev_key(b) != dev or b.dim() != 1
                                      or b.shape[0] != w.shape[0] or not b.is_contiguous()):
                    return False
    except (AttributeError, TypeError):
        return False
    return True


def _ln_fast_ok(xs, weights, biases, dtype) -> bool:
    dev = _dev_key(xs[0])
    try:
        for x in xs:
            if x.dtype is not dtype or _dev_key(x) != dev or x.dim() < 1 or not x.is_contiguous():
                return False
        for seq in (weights, biases):
            if seq is not None:
                for p, x in zip(seq, xs):
                    if p is not None and (p.dtype is not dtype or _dev_key(p) != dev or p.dim() != 1
                                          or p.shape[0] != x.shape[-1] or not p.is_contiguous()):
                        return False
    except (AttributeError, TypeError):
        return False
    return True


def _validate_ln(xs, weights, biases, eps):
    fn = "batched_layer_norm"
    _check_seq(fn, "xs", xs)
    dtype, device = _check_first(fn, xs)
    for name, seq in (("weights", weights), ("biases", biases)):
        if seq is not None:
            _check_seq(fn, name, seq)
            if len(seq) != len(xs):
                raise ValueError(f"{fn}: got {len(xs)} inputs but {len(seq)} {name}")
    if not isinstance(eps, (float, int)) or isinstance(eps, bool):
        raise TypeError(f"{fn}: eps must be a float, got {type(eps).__name__}")
    if _ln_fast_ok(xs, weights, biases, dtype):
        return dtype, device
    for i in range(len(xs)):
        x = xs[i]
        _check_tensor(fn, f"xs[{i}]", x, dtype, device)
        if x.dim() < 1:
            raise ValueError(f"{fn}: xs[{i}] is 0-dimensional; need a last dimension to normalize over")
        for name, seq in (("weights", weights), ("biases", biases)):
            if seq is not None and seq[i] is not None:
                p = seq[i]
                _check_tensor(fn, f"{name}[{i}]", p, dtype, device)
                if p.dim() != 1 or p.shape[0] != x.shape[-1]:
                    raise ValueError(f"{fn}: member {i}: {name}[{i}] has shape {tuple(p.shape)} but xs[{i}] "
                                     f"has width {x.shape[-1]} (shape {tuple(x.shape)})")
    return dtype, device


def _tracing(tensors) -> bool:
    """True when the call is being traced (dynamo, make_fx, fake/functional tensors)."""
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    if is_compiling is not None and is_compiling():
        return True
    stack_len = getattr(torch._C, "_len_torch_dispatch_stack", None)
    if stack_len is not None and stack_len() > 0:
        return True
    for t in tensors:
        if t is not None and type(t) not in _PLAIN_TYPES:
            return True
    return False


def _rows(x: Tensor):
    k = x.shape[-1]
    return x.numel() // k if k else math.prod(x.shape[:-1])


def _triton_ok(t: Tensor) -> bool:
    return t.dtype in _TRITON_DTYPES and use_triton(t.device)

