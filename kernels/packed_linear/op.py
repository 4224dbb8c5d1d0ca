"""The packed-linear ops: a batched linear that reads packed weights where they lie.

``batch_linear`` (optimus/rules/horizontal.py) turns G identical linears into
``baddbmm(stack(b_i)[:, None], stack(x_i), stack(w_i).mT)``. The ``stack(w_i)`` is a copy
of every weight on every step unless the weights are *packed*: views of one storage,
member ``i`` at ``offset_0 + i * slot`` (``optimus.pack_parameters``). A graph cannot
express "this stack is a view of the storage its inputs share": every parameter is a
separate graph input, and the stack of separate inputs is a new tensor. So the view is
taken at run time, inside an op::

    optimus::packed_linear(Tensor x, Tensor[] weights, Tensor[] biases) -> Tensor
        x: (G, M, K)   weights: G x (N, K)   biases: G x (N,), or [] for none   ->   y: (G, M, N)
        y = baddbmm(B[:, None], x, W.mT)  with W = stacked(weights), B = stacked(biases)
    optimus::packed_linear_backward(Tensor dy, Tensor x, Tensor[] weights, bool need_dx,
                                    bool need_dw, bool need_db) -> (Tensor dx, Tensor dw, Tensor db)
        dx = bmm(dy, W) (G, M, K)   dw = bmm(dy.mT, x) (G, N, K)   db = dy.sum(1) (G, N)

``stacked(ts)`` is ``ts[0].as_strided((G, *shape), (slot, *strides))`` when the members are
consecutive, equally strided slots of one storage (checked on every call from the data
pointers: a few attribute reads per member, no device work; about 1 us per member on the
development CPU, docs/packing.md), else ``torch.stack(ts)``:
the same values either way, so an unpacked or repacked model stays correct, it only pays
the copy. Why this is safe:

* the strided view never leaves the op: outputs are fresh tensors from bmm / baddbmm
  (a custom op must not return an alias of its inputs; Inductor treats an op's outputs
  as buffers it owns and may reuse them);
* the op reads its inputs and writes nothing (``mutates_args=()``), so functionalization
  and Inductor may reorder it like any pure op; the weights are read at the time the op
  runs, exactly as the stack it replaces read them;
* the backward's ``dw`` is one ``(G, N, K)`` row-major buffer; the autograd formula hands
  each weight its row ``dw[i]`` (a view with the parameter's own strides), so
  AccumulateGrad takes it as the gradient without a copy (for the first accumulation).

``STATS`` counts which path each forward / backward call took (the tests read it).
"""

from __future__ import annotations

import collections
from typing import Optional, Sequence

import torch
from torch import Tensor
from torch.multiprocessing.reductions import StorageWeakRef

from ..runtime.registration import define

STATS: collections.Counter = collections.Counter()


def packed_slot(tensors: Sequence[Tensor]) -> Optional[int]:
    """The slot (elements between consecutive members) if ``tensors`` are contiguous, equally
    shaped views of one storage, member ``i`` at ``offset_0 + i * slot`` with
    ``slot >= numel`` (no overlap); else ``None``. Works on real and fake tensors (the rules
    ask it of Dynamo's fake parameters at compile time)."""
    if len(tensors) < 2:
        return None
    first = tensors[0]
    if not all(t.is_contiguous() and t.shape == first.shape and t.dtype == first.dtype and t.device == first.device for t in tensors):
        return None
    storage = StorageWeakRef(first.untyped_storage())
    if any(StorageWeakRef(t.untyped_storage()) != storage for t in tensors[1:]):
        return None
    slot = tensors[1].storage_offset() - first.storage_offset()
    if slot < max(first.numel(), 1):
        return None
    if any(t.storage_offset() != first.storage_offset() + i * slot for i, t in enumerate(tensors)):
        return None
    return slot


def _strided_stack(ts: Sequence[Tensor]) -> Optional[Tensor]:
    """The (G, *shape) view of the members' common storage, or ``None`` when they are not
    consecutive equal slots of it (the run-time check: data pointers, not storages; one
    pass of a few attribute reads per member)."""
    first = ts[0]
    if len(ts) < 2 or not first.is_contiguous():
        return None
    numel, size = first.numel(), first.element_size()
    ptr, step = first.data_ptr(), ts[1].data_ptr() - first.data_ptr()
    if numel == 0 or step <= 0 or step % size or step < numel * size:
        return None
    shape, strides, dtype, device = first.shape, first.stride(), first.dtype, first.get_device()
    for i in range(1, len(ts)):
        t = ts[i]
        if t.data_ptr() != ptr + i * step or t.shape != shape or t.stride() != strides or t.dtype != dtype or t.get_device() != device:
            return None
    slot = step // size
    # every member lies in the first one's storage (then the bytes are the members' own)
    if (first.storage_offset() + (len(ts) - 1) * slot + numel) * size > first.untyped_storage().nbytes():
        return None
    return first.as_strided((len(ts),) + tuple(shape), (slot,) + tuple(strides), first.storage_offset())


def stacked(ts: Sequence[Tensor], kind: str) -> Tensor:
    """``torch.stack(ts)``'s values: a view when the members lie packed, else the stack."""
    view = _strided_stack(ts)
    STATS[f"{kind}_view" if view is not None else f"{kind}_stack"] += 1
    return view if view is not None else torch.stack(list(ts))


def _check(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor]) -> None:
    fn = "optimus::packed_linear"
    if x.dim() != 3 or len(weights) != x.shape[0]:
        raise ValueError(f"{fn}: x must be (G, M, K) with G = len(weights), got {tuple(x.shape)} and {len(weights)} weights")
    for i, w in enumerate(weights):
        if w.dim() != 2 or w.shape != weights[0].shape or w.shape[1] != x.shape[2] or w.dtype != x.dtype or w.device != x.device:
            raise ValueError(f"{fn}: weight {i} is {tuple(w.shape)} {w.dtype} on {w.device}; expected ({weights[0].shape[0]}, {x.shape[2]}) {x.dtype} on {x.device}")
    if biases:
        if len(biases) != len(weights):
            raise ValueError(f"{fn}: {len(biases)} biases for {len(weights)} weights")
        for i, b in enumerate(biases):
            if b.shape != (weights[0].shape[0],) or b.dtype != x.dtype or b.device != x.device:
                raise ValueError(f"{fn}: bias {i} is {tuple(b.shape)} {b.dtype} on {b.device}; expected ({weights[0].shape[0]},) {x.dtype}")


PL_SCHEMA = "(Tensor x, Tensor[] weights, Tensor[] biases) -> Tensor"
PL_BACKWARD_SCHEMA = ("(Tensor dy, Tensor x, Tensor[] weights, bool need_dx, bool need_dw, bool need_db) "
                      "-> (Tensor, Tensor, Tensor)")


def _packed_linear(x, weights, biases):
    # the shapes were checked when the op was traced (fake implementation); here a
    # mismatch makes stack / bmm raise, and the view path checks every member itself
    w = stacked(weights, "weight")
    if not biases:
        return torch.bmm(x, w.mT)
    return torch.baddbmm(stacked(biases, "bias").unsqueeze(1), x, w.mT)


def _packed_linear_fake(x, weights, biases):
    _check(x, weights, biases)
    return x.new_empty((x.shape[0], x.shape[1], weights[0].shape[0]))


def _packed_linear_backward(dy, x, weights, need_dx, need_dw, need_db):
    dx = torch.bmm(dy, stacked(weights, "backward_weight")) if need_dx else dy.new_empty(0)
    dw = torch.bmm(dy.mT, x) if need_dw else dy.new_empty(0)
    db = dy.sum(1) if need_db else dy.new_empty(0)
    return dx, dw, db


def _packed_linear_backward_fake(dy, x, weights, need_dx, need_dw, need_db):
    g, m, n = dy.shape
    k = x.shape[2]
    return (dy.new_empty((g, m, k)) if need_dx else dy.new_empty(0),
            dy.new_empty((g, n, k)) if need_dw else dy.new_empty(0),
            dy.new_empty((g, n)) if need_db else dy.new_empty(0))


def _setup(ctx, inputs, output):
    x, weights, biases = inputs
    ctx.save_for_backward(x, *weights)
    ctx.has_bias = len(biases) > 0


def _backward(ctx, dy):
    x, *weights = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_dx, need_dw, need_db = bool(need[0]), any(need[1]), any(need[2]) and ctx.has_bias  # lists: one flag per member
    if dy is None:
        return None, None, None
    dx, dw, db = torch.ops.optimus.packed_linear_backward(dy, x, weights, need_dx, need_dw, need_db)
    # rows of one (G, N, K) buffer: each in its parameter's strides
    return (dx if need_dx else None,
            list(dw.unbind(0)) if need_dw else None,
            list(db.unbind(0)) if need_db else ([] if not ctx.has_bias else None))


def _register() -> None:
    define("packed_linear", PL_SCHEMA, _packed_linear, _packed_linear_fake, _backward, _setup)
    define("packed_linear_backward", PL_BACKWARD_SCHEMA, _packed_linear_backward, _packed_linear_backward_fake)


_register()
