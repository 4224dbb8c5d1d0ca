"""Parameters read in place: the grouped ops' parameter-list variants take the members'
parameters as lists and read them as one packed operand, through a view when they lie
concatenated in one storage.

``optimus::grouped_linear`` and ``optimus::batched_layer_norm`` take every operand packed: the
weights as one 1-D buffer, ``cat(w_i.reshape(-1))``. In a graph that pack is a copy of every
weight on every step, because the parameters are separate graph inputs and the concatenation of
separate inputs is a new tensor. Their ``*_params`` variants (``linear/op.py``,
``layer_norm/op.py``) take the parameters themselves, and :func:`concatenated` gives the packed
operand: a view of the members' common storage when they lie one after another in it, exactly
as ``cat`` would lay them out (``optimus.pack_parameters`` packs sibling parameters of different
shapes that way), else the ``cat``. The same values either way, so an unpacked or repacked model
stays correct and only pays the copy.

Why the view is safe: it never leaves the op (outputs are fresh tensors; a custom op must not
return an alias of an input); the ops write nothing they read; the weight gradient is one packed
buffer, which the autograd formula hands out as views in each parameter's own shape
(:func:`split_like`: contiguous rows of one buffer, which AccumulateGrad takes without a copy).

``STATS`` counts which path each call took (the tests read it).
"""

from __future__ import annotations

import collections
from typing import List, Optional, Sequence

import torch
from torch import Tensor
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["STATS", "lies_concatenated", "concatenated", "fake_concatenated", "check_members", "split_like"]

STATS: collections.Counter = collections.Counter()


def lies_concatenated(tensors: Sequence[Tensor]) -> bool:
    """Whether ``tensors`` (two or more) lie one after another in one storage, contiguous, as
    ``cat([t.reshape(-1) for t in tensors])`` would lay them out: what ``concatenated`` then
    reads through a view. From storages and offsets, so it works on real and fake tensors
    (``optimus.pack_parameters`` asks it of parameters, the rules of Dynamo's fake ones)."""
    if len(tensors) < 2:
        return False
    try:
        storage, offset = StorageWeakRef(tensors[0].untyped_storage()), tensors[0].storage_offset()
        for t in tensors:
            if not t.is_contiguous() or StorageWeakRef(t.untyped_storage()) != storage or t.storage_offset() != offset:
                return False
            offset += t.numel()
    except Exception:  # a tensor without storage (a functional or symbolic one)
        return False
    return True


def _in_place(ts: Sequence[Tensor]) -> Optional[Tensor]:
    """The 1-D view of ``cat(t.reshape(-1) for t in ts)`` when the members lie that way in one
    storage (contiguous, each starting where the previous ends), else ``None``. Checked from
    the data pointers on every call: a few attribute reads per member, no device work."""
    first = ts[0]
    size, dtype = first.element_size(), first.dtype
    expect = start = first.data_ptr()
    for t in ts:
        if t.data_ptr() != expect or t.dtype is not dtype or not t.is_contiguous():
            return None
        expect += t.numel() * size
    total = (expect - start) // size
    # the whole run lies inside the first member's storage: one allocation (so one device), and
    # the bytes read are the members' own
    if (first.storage_offset() + total) * size > first.untyped_storage().nbytes():
        return None
    return first.as_strided((total,), (1,), first.storage_offset())


def concatenated(ts: Sequence[Tensor], kind: str) -> Tensor:
    """``torch.cat([t.reshape(-1) for t in ts])``'s values: a view when they lie so, else the cat."""
    view = _in_place(ts) if len(ts) > 1 else None
    STATS[f"{kind}_view" if view is not None else f"{kind}_cat"] += 1
    if view is not None:
        return view
    return torch.cat([t.reshape(-1) for t in ts]) if len(ts) > 1 else ts[0].reshape(-1)


def fake_concatenated(ts: Sequence[Tensor]) -> Tensor:
    """What ``concatenated`` returns, for the fake implementations (shape and dtype only)."""
    return ts[0].new_empty(sum(t.numel() for t in ts))


def check_members(fn: str, name: str, ts: Sequence[Tensor], shapes: Sequence[tuple], like: Tensor) -> None:
    if len(ts) != len(shapes):
        raise ValueError(f"{fn}: {len(ts)} {name} for {len(shapes)} members")
    for i, (t, shape) in enumerate(zip(ts, shapes)):
        if tuple(t.shape) != tuple(shape) or t.dtype != like.dtype or t.device != like.device:
            raise ValueError(f"{fn}: {name}[{i}] is {tuple(t.shape)} {t.dtype} on {t.device}; "
                             f"expected {tuple(shape)} {like.dtype} on {like.device}")


def split_like(flat: Tensor, ts: Sequence[Tensor]) -> List[Tensor]:
    """Views of the packed ``flat`` in the shapes of ``ts`` (contiguous, consecutive)."""
    sizes = [t.numel() for t in ts]
    return [c.view(t.shape) for c, t in zip(flat.split(sizes), ts)]
