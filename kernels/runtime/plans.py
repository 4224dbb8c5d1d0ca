"""What the eager paths of the families share: per-signature plans, device tables filled
from data pointers, and a lean ``autograd.Function.apply``.

An eager path (``<family>/eager.py``) caches a *plan* per call signature (the arguments'
types, shapes, contiguity, dtypes, devices and ``requires_grad``, and the options): a cached
plan means the same metadata already passed every check, and it holds everything that
depends only on the signature (the kernel signature, output shapes, the base member of every
operand, and how a device table is filled from a call's data pointers: :class:`Fill`). The
int64 tables the kernels read encode the pointer offsets of the members relative to a base
member: a pure function of (plan, data pointers), cached on the device by exactly that key
(``TABLES``). The caching allocator gives a training step the same addresses every step, so
steady-state steps upload nothing.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import torch

from . import tables as _dt

__all__ = ["ESIZE", "SEQ", "PLANS", "TABLES", "next_plan_id", "put_plan", "tensor_key", "first_nonempty",
           "eager_cache_info", "clear_eager_caches", "set_table_cache", "views_like", "Fill", "fast_apply",
           "TorchPlan"]

ESIZE = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}
SEQ = (list, tuple)
TABLES = _dt.TableCache()
PLANS: dict = {}  # call signature -> plan, shared by the families' eager paths
PLAN_CAP = 1024
next_plan_id = itertools.count(1).__next__


def eager_cache_info() -> dict:
    """Sizes of the eager-path caches and the table upload counters (for tests and benchmarks)."""
    return dict(plans=len(PLANS), tables=len(TABLES), **_dt.stats())


def clear_eager_caches() -> None:
    PLANS.clear()
    TABLES.clear()


def set_table_cache(enabled: bool) -> None:
    """Turn the device-table cache off (every call uploads its tables; for benchmarks / tests)."""
    TABLES.enabled = bool(enabled)
    if not enabled:
        TABLES.clear()


def put_plan(key, plan) -> None:
    if len(PLANS) >= PLAN_CAP:
        PLANS.clear()
    PLANS[key] = plan


def tensor_key(t):
    """The part of a plan key one optional tensor contributes.

    Contiguity instead of the strides: the kernels read every member as a dense row-major block
    from its data pointer, so all contiguous layouts of one shape share a plan (strides of size-1
    dims may differ) and a non-contiguous one gets its own key and fails validation."""
    return None if t is None else (type(t), t.shape, t.is_contiguous(), t.dtype, t.device, t.requires_grad)


def first_nonempty(sizes) -> int:
    """Index of the first nonzero size (0 when all are zero): the base member of an operand."""
    for i, s in enumerate(sizes):
        if s:
            return i
    return 0


_unflatten = getattr(torch._C._nn, "unflatten_dense_tensors", None)


def views_like(flat, templates, shapes):
    """Views of the 1-D ``flat`` with the shapes of ``templates`` (one C++ call), in order."""
    if _unflatten is not None:
        return list(_unflatten(flat, templates))
    return [p.view(s) for p, s in zip(flat.split_with_sizes([math.prod(s) for s in shapes]), shapes)]  # pragma: no cover


class Fill:
    """How a device table is filled from the data pointers of one call, computed once per plan.

    ``template``: the table with every column that does not depend on pointers (dims, packed
    workspace offsets, offsets into buffers this path allocates itself);  per pointer-dependent
    entry, ``dst`` (flat position in the table), ``src`` and ``base`` (indices into the call's
    pointer list): ``table.flat[dst] = (ptr[src] - ptr[base]) // element_size``.  A miss of the
    table cache is then one numpy gather, subtract, divide and scatter."""

    __slots__ = ("template", "dst", "src", "base", "es", "align_idx")

    def __init__(self, template, entries, es, align_idx):
        self.template = np.ascontiguousarray(template)
        ncol = self.template.shape[-1]
        dst, src, base = [], [], []
        for table, col, srcs, b in entries:  # table: index of the sub-table (stacked tables), col, per row
            for r, si in enumerate(srcs):
                dst.append((table * self.template.shape[-2] + r) * ncol + col)
                src.append(si)
                base.append(b)
        self.dst = np.asarray(dst, dtype=np.int64)
        self.src = np.asarray(src, dtype=np.int64)
        self.base = np.asarray(base, dtype=np.int64)
        self.es = es
        self.align_idx = np.asarray(align_idx, dtype=np.int64)

    def build(self, ptrs):
        """(table, OR of the pointers that the alignment hint depends on)."""
        P = np.asarray(ptrs, dtype=np.int64)
        T = self.template.copy()
        if len(self.dst):
            T.reshape(-1)[self.dst] = (P[self.src] - P[self.base]) // self.es
        por = int(np.bitwise_or.reduce(P[self.align_idx])) if len(self.align_idx) else 0
        return T, por


def fast_apply(fn_cls):
    """``fn_cls.apply`` without the Python wrapper of ``torch.autograd.Function.apply`` (which maps a
    functorch helper over every argument) when no functorch transform is active; the wrapper
    otherwise.  Falls back to the wrapper on torch versions where the C entry point is not found."""
    try:
        c_apply = super(torch.autograd.Function, fn_cls).apply
        active = torch._C._are_functorch_transforms_active
    except AttributeError:  # pragma: no cover - other torch versions
        return fn_cls.apply
    if getattr(fn_cls, "setup_context", None) is not torch.autograd.Function.setup_context:
        return fn_cls.apply  # pragma: no cover - forward(ctx, ...) style only
    py_apply = fn_cls.apply

    def apply(*args):
        if active():
            return py_apply(*args)
        return c_apply(*args)

    return apply


class TorchPlan:
    """A call signature the Triton kernels must not take (``reason``: a member exceeds their int32
    indexing, see ``linear/kernel.py``'s ``MAX_MEMBER_ELEMS``): the plain-torch loop runs it."""

    def __init__(self, reason: str):
        self.reason = reason
        warnings.warn(reason + "; this group runs on the plain-torch path", RuntimeWarning, stacklevel=4)
