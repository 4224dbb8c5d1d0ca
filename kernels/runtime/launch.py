"""Launch a ``@triton.jit`` kernel without the JIT's per-call work once it has compiled.

``kernel[grid](*args, **constexprs)`` binds every argument, computes its specialization, looks
the compiled kernel up, and compares every module-level global the kernel reads with the value
it was compiled with (``tl.constexpr`` objects, compared in Python). For our kernels (11 to 14
runtime arguments, 8 to 14 constexprs, a dozen ``C_*`` column globals) that was 57 us of a 75 us
launch on an H200's host, against 18 us for a kernel of three arguments (docs/kernels.md, host
overhead).

:func:`launch` makes the first launch of each (kernel, constexprs, options, specialization)
through the JIT, keeps the compiled kernel it returns, and later launches call that compiled
kernel directly (``CompiledKernel[grid](*all_args)``, Triton's launcher, with its launch hooks).
The specialization is computed here the way Triton does: per tensor its dtype and whether its
address is 16-byte aligned, per int whether it is 1, whether it is a multiple of 16 and whether
it fits 32 bits. A kernel compiled for other facts is never reused.

Falls back to the JIT's own launch, for good for that cache entry, where the compiled kernel
does not have the expected shape (another Triton version: the parameter names of the compiled source
must equal the jitted function's); ``OPTIMUS_KERNELS_DIRECT_LAUNCH=0`` turns it off; never under
the interpreter. ``STATS`` counts both paths (tests and diagnostics read it).
"""

from __future__ import annotations

import collections
import os

import numpy as np
import torch

from .backend import interpret_mode

__all__ = ["launch", "STATS", "set_direct"]

STATS: collections.Counter = collections.Counter()
_DIRECT = os.environ.get("OPTIMUS_KERNELS_DIRECT_LAUNCH", "1") != "0" and not interpret_mode()
_CACHE: dict = {}
_CAPACITY = 4096
_UNSUPPORTED = object()  # the compiled kernel of this entry cannot be called directly
_I32 = (-(2 ** 31), 2 ** 31)


def set_direct(flag: bool) -> None:
    """Turn direct launches on (default) or off (every launch through the JIT)."""
    global _DIRECT
    _DIRECT = bool(flag) and not interpret_mode()
    _CACHE.clear()


def _spec(args) -> tuple:
    """What Triton specializes a launch on, for the runtime arguments ``args``."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append((a.dtype, a.data_ptr() % 16 == 0))
        elif isinstance(a, bool):
            out.append(("b", a))
        elif isinstance(a, (int, np.integer)):
            a = int(a)
            out.append((a == 1, a % 16 == 0, _I32[0] <= a < _I32[1], a < 2 ** 63))
        elif isinstance(a, float):
            out.append("f")
        else:
            out.append(a)  # None
    return tuple(out)


def _tail(fn, compiled, n_runtime: int, named: dict):
    """The values of ``fn``'s parameters after the runtime ones, in order (what the compiled
    kernel's launcher takes after them), or ``_UNSUPPORTED``."""
    names = list(fn.arg_names)
    src = getattr(compiled, "src", None)
    sig = getattr(src, "signature", None)
    if not hasattr(compiled, "__getitem__") or not isinstance(sig, dict) or list(sig) != names:
        return _UNSUPPORTED
    tail = []
    for p in fn.params[n_runtime:]:
        if p.name in named:
            tail.append(named[p.name])
        elif getattr(p, "has_default", False):
            tail.append(p.default)
        else:
            return _UNSUPPORTED
    return tuple(tail)


def launch(fn, grid, args, constexprs: dict, options: dict) -> None:
    """``fn[grid](*args, **constexprs, **options)``: ``args`` are the leading (runtime)
    parameters of ``fn``; ``constexprs`` name the rest; ``options`` are launch options and
    constexpr tile sizes (``num_warps``, ``num_stages``, ``BLOCK_M`` ...)."""
    if not _DIRECT:
        fn[grid](*args, **constexprs, **options)
        return
    # the callers launch under a guard of their first tensor's device (compiled kernels are
    # loaded per device)
    key = (fn, tuple(constexprs.values()), tuple(options.items()), _spec(args), args[0].device)
    entry = _CACHE.get(key)
    if entry is None or entry[1] is _UNSUPPORTED:
        compiled = fn[grid](*args, **constexprs, **options)
        STATS["jit"] += 1
        if entry is None:
            if len(_CACHE) >= _CAPACITY:  # bounded (a compiled kernel stays in the JIT's own cache)
                _CACHE.clear()
            named = {**constexprs, **options}
            _CACHE[key] = (compiled, _tail(fn, compiled, len(args), named) if compiled is not None else _UNSUPPORTED)
        return
    compiled, tail = entry
    g = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
    compiled[g](*args, *tail)
    STATS["direct"] += 1
