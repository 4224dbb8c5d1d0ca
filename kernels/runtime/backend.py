"""Backend selection and device facts shared by every kernel family.

Which implementation a call takes (:func:`set_backend`, :func:`use_triton`), whether Triton is
there, the device's SM count, the device guard of a launch, and the lazy import of a family's
Triton module.

Nothing in this module imports Triton at import time, so ``optimus.kernels`` imports cleanly on a
machine without CUDA and without Triton.  A family's Triton module (``<family>/kernel.py``) is
imported lazily, the first time a Triton launch is needed (:func:`lazy_module`).  That also decides
whether it runs compiled or in Triton's CPU interpreter: ``triton.jit`` reads ``TRITON_INTERPRET``
when a kernel is *defined*, so the environment at first use is what counts.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from types import ModuleType
from typing import Callable, Optional

import torch

__all__ = [
    "set_backend",
    "get_backend",
    "triton_available",
    "interpret_mode",
    "use_triton",
    "lazy_module",
    "num_sms",
    "next_pow2",
    "cdiv",
    "torch_allows_tf32",
    "device_guard",
]

_BACKENDS = ("auto", "triton", "torch")
_backend = os.environ.get("OPTIMUS_KERNELS_BACKEND", "auto")
if _backend not in _BACKENDS:  # pragma: no cover - bad env var
    _backend = "auto"

_triton_ok: Optional[bool] = None


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


def lazy_module(package: str, name: str = "kernel") -> Callable[[], ModuleType]:
    """A function that returns the module ``package.name``, imported on its first call (a
    family's Triton module: ``lazy_module(__package__)`` in the family's own modules)."""
    loaded: list = []

    def load() -> ModuleType:
        if loaded:
            return loaded[0]
        module = importlib.import_module("." + name, package)
        loaded.append(module)
        return module

    return load


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

