"""The eager fast path of the grouped embedding bag: an ``autograd.Function`` around the kernels.

In eager mode with the Triton kernels (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1) the
public function skips the dispatcher and the op's Python layer: validation, normalisation and the
kernel signature are cached per call signature (weights' metadata, index / offset /
per-sample-weight dtypes and devices, options), so a steady-state packed-form call costs a
dictionary lookup, a few shape checks and the launches. The device tables are cached in
``kernel.py`` by (signature, weight pointers, batch size).
"""

from __future__ import annotations

import torch

from ..runtime.backend import lazy_module
from ..runtime.checks import PLAIN_TYPES, is_tracing
from .op import _weight_grads
from .reference import host_check

_kernel = lazy_module(__package__)  # kernel.py, imported on the first Triton launch
_PLANS: dict = {}
_PLAN_CAP = 256


def eager_cache_info() -> dict:
    return {"plans": len(_PLANS)}


def clear_eager_caches() -> None:
    _PLANS.clear()


def _put_plan(key, plan) -> None:
    if len(_PLANS) >= _PLAN_CAP:
        _PLANS.clear()
    _PLANS[key] = plan


def _tkey(t):
    return None if t is None else (type(t), t.dtype, t.device, t.dim(), t.requires_grad)


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _fast_key(weights, indices, offsets, psw, mode, padding_idx, sparse, bag_size, deterministic, check_indices):
    """Cache key of a packed-form call, or None (not cacheable: the full path handles it)."""
    if type(weights) not in (list, tuple) or not weights or is_tracing(()):
        return None
    if type(indices) not in PLAIN_TYPES or (offsets is not None and type(offsets) not in PLAIN_TYPES):
        return None
    if psw is not None and type(psw) not in PLAIN_TYPES:
        return None
    try:
        wk = tuple([(type(w), w.shape, w.dtype, w.device, w.requires_grad, w.is_contiguous()) for w in weights])
        key = (wk, _tkey(indices), _tkey(offsets), _tkey(psw), _hashable(mode), _hashable(padding_idx),
               _hashable(sparse), _hashable(bag_size), deterministic, check_indices)
        hash(key)
    except (AttributeError, TypeError):
        return None
    return key


class _EagerPlan:
    """Normalised options and the kernel signature of one call signature."""

    def __init__(self, weights, modes, pads, bag_sizes, sparse, deterministic, check):
        self.T = len(weights)
        self.shapes = [tuple(w.shape) for w in weights]
        self.modes, self.pads, self.bag_sizes = list(modes), list(pads), list(bag_sizes)
        self.sparse, self.any_sparse = list(sparse), any(sparse)
        self.deterministic, self.check = bool(deterministic), check
        self.sum_bag = sum(bag_sizes)
        self.sig = _kernel().signature([s[0] for s in self.shapes], [s[1] for s in self.shapes], modes, pads,
                                       bag_sizes if bag_sizes else None, weights[0].dtype)


def _eager_packed(plan, weights, indices, offsets, psw, index_counts):
    """A cached packed-form call; None when a per-call shape check fails (the full path raises)."""
    T = plan.T
    if offsets is not None:
        n = offsets.numel()
        if n < 1 or (n - 1) % T or plan.bag_sizes:
            return None
        B = (n - 1) // T
    else:
        if not plan.bag_sizes or indices.numel() % plan.sum_bag:
            return None
        B = indices.numel() // plan.sum_bag
    if indices.dim() != 1 or (psw is not None and psw.shape != indices.shape):
        return None
    if plan.check:
        host_check(weights, indices, offsets, plan.bag_sizes, None, None, False)
    ic = []
    if plan.any_sparse and offsets is not None:
        if index_counts is None:
            bnd = offsets[:: B].tolist() if B else [0] * (T + 1)  # one synchronisation on CUDA
            ic = [int(bnd[t + 1]) - int(bnd[t]) for t in range(T)]
        else:
            if len(index_counts) != T:
                return None
            ic = [int(c) for c in index_counts]
    if offsets is None and not indices.is_contiguous():
        indices = indices.contiguous()
    return _geb_apply(plan, ic, indices, offsets, psw, weights)


class _GroupedEmbeddingBagFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, index_counts, indices, offsets, psw, *weights):
        K = _kernel()
        offsets = offsets.contiguous() if offsets is not None else None
        indices = indices.contiguous()
        out = K.forward(weights, indices, offsets, psw, plan.sig)
        ctx.save_for_backward(indices, offsets, psw, *weights)
        ctx.geb = (plan, index_counts)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        plan, index_counts = ctx.geb
        saved = ctx.saved_tensors
        indices, offsets, psw = saved[:3]
        weights = saved[3:]
        needs = ctx.needs_input_grad
        need_w = list(needs[5:])
        need_psw = psw is not None and bool(needs[4])
        if not (any(need_w) or need_psw):
            return (None,) * (5 + plan.T)
        dense, spv, spr, pswg = _kernel().backward(grad_out, weights, indices, offsets, psw, plan.sig, need_w,
                                                   plan.sparse, plan.deterministic, need_psw, index_counts)
        B = plan.sig.batch_size(indices.numel(), offsets.numel() if offsets is not None else 0)
        grads = _weight_grads(dense, spv, spr, need_w, plan.sparse, plan.shapes,
                              lambda t: index_counts[t] if offsets is not None else B * plan.bag_sizes[t])
        return (None, None, None, None, pswg if need_psw else None, *grads)


def _geb_apply(plan, index_counts, indices, offsets, psw, weights):
    return _GroupedEmbeddingBagFn.apply(plan, index_counts, indices, offsets, psw, *weights)
