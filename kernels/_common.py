"""Shared helpers for optimus.kernels: Triton availability, backend choice, small utilities.

Nothing in this module imports Triton at import time, so ``optimus.kernels`` imports cleanly on a
machine without CUDA and without Triton.  The Triton kernel modules (``*_kernel.py``) are imported
lazily, the first time a Triton launch is needed (:func:`triton_module`).  That also decides
whether they run compiled or in Triton's CPU interpreter: ``triton.jit`` reads ``TRITON_INTERPRET``
when a kernel is *defined*, so the environment at first use is what counts.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import warnings
from typing import Any, Optional

import torch

__all__ = [
    "ACTIVATIONS",
    "activation_code",
    "set_backend",
    "get_backend",
    "triton_available",
    "interpret_mode",
    "use_triton",
    "triton_module",
    "num_sms",
    "next_pow2",
    "cdiv",
    "torch_allows_tf32",
    "device_guard",
]

# activation name -> code used by the kernels (constexpr ACT)
ACTIVATIONS = {"none": 0, "relu": 1, "gelu": 2, "silu": 3, "sigmoid": 4, "tanh": 5}
# activations whose derivative needs the pre-activation z (saved by the forward);
# the others differentiate from the output y.
NEEDS_PREACT = ("gelu", "silu")
USES_OUTPUT = ("relu", "sigmoid", "tanh")



def saved_activation(act: str, y, pre):
    """What a grouped linear's backward needs of its activation ``act`` (a normalised name):
    the pre-activation, the output, or nothing."""
    return pre if act in NEEDS_PREACT else (y if act in USES_OUTPUT else None)


_BACKENDS = ("auto", "triton", "torch")
_backend = os.environ.get("OPTIMUS_KERNELS_BACKEND", "auto")
if _backend not in _BACKENDS:  # pragma: no cover - bad env var
    _backend = "auto"

_triton_ok: Optional[bool] = None


def activation_code(activation) -> str:
    """Normalise the ``activation`` argument to one of ``ACTIVATIONS``' names."""
    if activation is None:
        return "none"
    if not isinstance(activation, str) or activation.lower() not in ACTIVATIONS:
        raise ValueError(
            f"activation must be None or one of {sorted(k for k in ACTIVATIONS if k != 'none')}, "
            f"got {activation!r}"
        )
    return activation.lower()


def set_backend(name: str) -> None:
    """Choose the implementation used by the public functions and the custom ops.

    ``"auto"`` (default): Triton on CUDA tensors (and on CPU tensors when ``TRITON_INTERPRET=1``),
    plain torch otherwise.  ``"triton"``: always Triton (CPU tensors need ``TRITON_INTERPRET=1``).
    ``"torch"``: always the plain-torch implementation.  The environment variable
    ``OPTIMUS_KERNELS_BACKEND`` sets the initial value.
    """
    global _backend
    if name not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {name!r}")
    _backend = name


def get_backend() -> str:
    return _backend


def triton_available() -> bool:
    """True when the ``triton`` package can be imported (checked once, without importing it)."""
    global _triton_ok
    if _triton_ok is None:
        try:
            _triton_ok = importlib.util.find_spec("triton") is not None
        except (ImportError, ValueError):  # pragma: no cover
            _triton_ok = False
    return _triton_ok


def interpret_mode() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


def use_triton(device: torch.device) -> bool:
    """Whether tensors on ``device`` go through the Triton kernels."""
    if _backend == "torch" or not triton_available():
        return False
    if device.type == "cuda":
        return True
    if device.type == "cpu":
        return interpret_mode()
    return False


def triton_module(name: str):
    """Import a Triton kernel module of this package lazily (``name`` without the leading dot)."""
    return importlib.import_module("." + name, __package__)


_sms: dict = {}


def num_sms(device: torch.device) -> int:
    """Number of streaming multiprocessors of ``device`` (a small number in interpreter mode)."""
    if device.type != "cuda":
        return 2
    idx = device.index if device.index is not None else torch.cuda.current_device()
    n = _sms.get(idx)
    if n is None:
        n = _sms[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n


def torch_allows_tf32() -> bool:
    """Whether torch's own fp32 CUDA matmuls may run in TF32 right now (read at each call).

    torch >= 2.9 has two APIs for this flag: the legacy ``torch.backends.cuda.matmul.allow_tf32``
    and ``torch.backends.cuda.matmul.fp32_precision`` ("ieee" / "tf32"; "none" inherits
    ``torch.backends.fp32_precision``, the getter returns the resolved value).  Once TF32 was set
    through the new one, *reading* ``allow_tf32`` raises RuntimeError ("mix of the legacy and
    new APIs"), so the new getter is read first; ``allow_tf32`` only on a torch without it.
    """
    matmul = torch.backends.cuda.matmul
    try:
        precision = matmul.fp32_precision
    except AttributeError:  # pragma: no cover - torch < 2.9
        return bool(matmul.allow_tf32)
    return precision == "tf32"


_NO_GUARD = contextlib.nullcontext()


def device_guard(device: torch.device):
    """A context that makes ``device`` the current CUDA device while a kernel is launched.

    Triton launches on the *current* device and its current stream, not on the device of the
    tensors (Inductor's generated code sets a device guard; the eager path and direct calls do
    not).  With tensors on ``cuda:1`` while ``cuda:0`` is current, a launch would run on the wrong
    GPU with foreign pointers.  A no-op context (no device switch) in the common case."""
    if device.type != "cuda" or device.index is None or device.index == torch.cuda.current_device():
        return _NO_GUARD
    return torch.cuda.device(device.index)


def next_pow2(n: int) -> int:
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def past_int32_limits(sig: Any) -> bool:
    """Whether a kernel signature exceeds the kernels' int32 indexing (its ``limit_reason``);
    warned once per signature, since such a group then runs on the plain-torch path."""
    if sig.limit_reason is None:
        return False
    if not getattr(sig, "_warned", False):
        sig._warned = True
        warnings.warn(sig.limit_reason + "; this group runs on the plain-torch path", RuntimeWarning, stacklevel=3)
    return True
