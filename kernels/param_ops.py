"""The grouped kernels' ops that take their parameters as lists, and read them in place
when they lie concatenated.

``optimus::grouped_linear`` and ``optimus::batched_layer_norm`` take every operand packed:
the weights as one 1-D buffer, ``cat(w_i.reshape(-1))``. In a graph that pack is a copy of
every weight on every step, because the parameters are separate graph inputs and the
concatenation of separate inputs is a new tensor. These ops take the parameters themselves::

    optimus::grouped_linear_params(Tensor x, Tensor[] weights, Tensor[] biases, SymInt[] ms,
                                   SymInt[] ks, SymInt[] ns, str activation, str layout)
        -> (Tensor y, Tensor preact)
    optimus::grouped_linear_params_backward(Tensor dy, Tensor x, Tensor[] weights, Tensor? aux,
                                   ..., bool has_bias, bool need_dx, bool need_dw, bool need_db,
                                   str layout) -> (Tensor dx, Tensor dw, Tensor db)
    optimus::batched_layer_norm_params(Tensor x, Tensor[] weights, Tensor[] biases,
                                   SymInt[] rows, SymInt[] widths, float eps, str layout)
        -> (Tensor y, Tensor stats)
    optimus::batched_layer_norm_params_backward(Tensor dy, Tensor x, Tensor[] weights,
                                   Tensor stats, ..., str layout) -> (Tensor dx, Tensor dw, Tensor db)

(``biases`` / ``weights`` may be ``[]``: no bias, no affine weight), with the same x / y
layouts and results as the packed ops (``custom_ops.py``). Inside, ``concatenated(ts)``
is the packed operand: a view of the members' common storage when they lie one after another
in it, exactly as ``cat`` would lay them out (``optimus.pack_parameters`` packs sibling
parameters of different shapes that way), else the ``cat``. The same values either way, so
an unpacked or repacked model stays correct and only pays the copy.

Why this is safe (as for ``packed_ops.py``): the view never leaves the op (outputs are fresh
tensors; a custom op must not return an alias of an input); the ops write nothing they read;
the weight gradient is one packed buffer, which the autograd formula hands out as views in
each parameter's own shape (contiguous rows of one buffer: AccumulateGrad takes them without
a copy).

``STATS`` counts which path each call took (the tests read it).
"""

from __future__ import annotations

import collections
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from torch.multiprocessing.reductions import StorageWeakRef

from . import custom_ops as co
from ._common import activation_code, saved_activation
from ._library import define

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


def _fake_concatenated(ts: Sequence[Tensor]) -> Tensor:
    """What ``concatenated`` returns, for the fake implementations (shape and dtype only)."""
    return ts[0].new_empty(sum(t.numel() for t in ts))


def _check_members(fn: str, name: str, ts: Sequence[Tensor], shapes: Sequence[tuple], like: Tensor) -> None:
    if len(ts) != len(shapes):
        raise ValueError(f"{fn}: {len(ts)} {name} for {len(shapes)} members")
    for i, (t, shape) in enumerate(zip(ts, shapes)):
        if tuple(t.shape) != tuple(shape) or t.dtype != like.dtype or t.device != like.device:
            raise ValueError(f"{fn}: {name}[{i}] is {tuple(t.shape)} {t.dtype} on {t.device}; "
                             f"expected {tuple(shape)} {like.dtype} on {like.device}")


def _split_like(flat: Tensor, ts: Sequence[Tensor]) -> List[Tensor]:
    """Views of the packed ``flat`` in the shapes of ``ts`` (contiguous, consecutive)."""
    sizes = [t.numel() for t in ts]
    return [c.view(t.shape) for c, t in zip(flat.split(sizes), ts)]


GLP_SCHEMA = ("(Tensor x, Tensor[] weights, Tensor[] biases, SymInt[] ms, SymInt[] ks, SymInt[] ns, "
              "str activation, str layout) -> (Tensor, Tensor)")
GLP_BACKWARD_SCHEMA = ("(Tensor dy, Tensor x, Tensor[] weights, Tensor? aux, SymInt[] ms, SymInt[] ks, "
                       "SymInt[] ns, str activation, bool has_bias, bool need_dx, bool need_dw, bool need_db, "
                       "str layout) -> (Tensor, Tensor, Tensor)")
LNP_SCHEMA = ("(Tensor x, Tensor[] weights, Tensor[] biases, SymInt[] rows, SymInt[] widths, float eps, "
              "str layout) -> (Tensor, Tensor)")
LNP_BACKWARD_SCHEMA = ("(Tensor dy, Tensor x, Tensor[] weights, Tensor stats, SymInt[] rows, SymInt[] widths, "
                       "bool has_bias, bool need_dx, bool need_dw, bool need_db, str layout) "
                       "-> (Tensor, Tensor, Tensor)")


# ---------------- grouped linear ----------------
def _gl_check(x, weights, biases, ks, ns):
    fn = "optimus::grouped_linear_params"
    if not weights:
        raise ValueError(f"{fn}: no weights")
    _check_members(fn, "weights", weights, list(zip(ns, ks)), x)
    if biases:
        _check_members(fn, "biases", biases, [(n,) for n in ns], x)


def _glp(x, weights, biases, ms, ks, ns, activation, layout):
    w = concatenated(weights, "weight")
    b = concatenated(biases, "bias") if biases else None
    return co.gl_forward(x, w, b, ms, ks, ns, activation, layout)


def _glp_fake(x, weights, biases, ms, ks, ns, activation, layout):
    _gl_check(x, weights, biases, ks, ns)
    b = _fake_concatenated(biases) if biases else None
    return co.gl_forward_fake(x, _fake_concatenated(weights), b, ms, ks, ns, activation, layout)


def _glp_backward(dy, x, weights, aux, ms, ks, ns, activation, has_bias, need_dx, need_dw, need_db, layout):
    # the weights are read only for dx
    w = concatenated(weights, "backward_weight") if need_dx else weights[0].new_empty(sum(t.numel() for t in weights))
    return co.gl_backward(dy, x, w, aux, ms, ks, ns, activation, has_bias, need_dx, need_dw, need_db, layout)


def _glp_backward_fake(dy, x, weights, aux, ms, ks, ns, activation, has_bias, need_dx, need_dw, need_db, layout):
    return co.gl_backward_fake(dy, x, weights[0].dtype, ms, ks, ns, has_bias, need_dx, need_dw, need_db, layout)


def _glp_setup(ctx, inputs, output):
    x, weights, biases, ms, ks, ns, activation, layout = inputs
    y, pre = output
    act = activation_code(activation)
    aux = saved_activation(act, y, pre)
    ctx.save_for_backward(x, aux, *weights)
    ctx.gl_meta = (list(ms), list(ks), list(ns), act, len(biases) > 0, layout)
    ctx.mark_non_differentiable(pre)


def _glp_autograd(ctx, gy, gpre):
    x, aux, *weights = ctx.saved_tensors
    ms, ks, ns, act, has_bias, layout = ctx.gl_meta
    need = ctx.needs_input_grad
    need_dx, need_dw, need_db = bool(need[0]), bool(need[1]), bool(need[2]) and has_bias
    if gy is None:
        return (None,) * 8
    dx, dw, db = torch.ops.optimus.grouped_linear_params_backward(
        gy.contiguous(), x, weights, aux, ms, ks, ns, act, has_bias, need_dx, need_dw, need_db, layout)
    dws = _split_like(dw, weights) if need_dw else None
    dbs = [c for c in db.split(list(ns))] if need_db else ([] if not has_bias else None)
    return (dx if need_dx else None, dws, dbs, None, None, None, None, None)


# ---------------- batched layer norm ----------------
def _ln_check(x, weights, biases, widths):
    fn = "optimus::batched_layer_norm_params"
    for name, ts in (("weights", weights), ("biases", biases)):
        if ts:
            _check_members(fn, name, ts, [(d,) for d in widths], x)


def _lnp(x, weights, biases, rows, widths, eps, layout):
    w = concatenated(weights, "norm_weight") if weights else None
    b = concatenated(biases, "norm_bias") if biases else None
    return co.ln_forward(x, w, b, rows, widths, eps, layout)


def _lnp_fake(x, weights, biases, rows, widths, eps, layout):
    _ln_check(x, weights, biases, widths)
    w = _fake_concatenated(weights) if weights else None
    b = _fake_concatenated(biases) if biases else None
    return co.ln_forward_fake(x, w, b, rows, widths, eps, layout)


def _lnp_backward(dy, x, weights, stats, rows, widths, has_bias, need_dx, need_dw, need_db, layout):
    w = concatenated(weights, "backward_norm_weight") if weights else None
    return co.ln_backward(dy, x, w, stats, rows, widths, has_bias, need_dx, need_dw, need_db, layout)


def _lnp_backward_fake(dy, x, weights, stats, rows, widths, has_bias, need_dx, need_dw, need_db, layout):
    pdt = weights[0].dtype if weights else x.dtype
    return co.ln_backward_fake(dy, x, bool(weights), pdt, rows, widths, has_bias, need_dx, need_dw, need_db, layout)


def _lnp_setup(ctx, inputs, output):
    x, weights, biases, rows, widths, eps, layout = inputs
    y, stats = output
    ctx.save_for_backward(x, stats, *weights)
    ctx.ln_meta = (list(rows), list(widths), len(weights) > 0, len(biases) > 0, layout)
    ctx.mark_non_differentiable(stats)


def _lnp_autograd(ctx, gy, gstats):
    x, stats, *weights = ctx.saved_tensors
    rows, widths, has_w, has_bias, layout = ctx.ln_meta
    need = ctx.needs_input_grad
    need_dx, need_dw, need_db = bool(need[0]), bool(need[1]) and has_w, bool(need[2]) and has_bias
    if gy is None:
        return (None,) * 7
    dx, dw, db = torch.ops.optimus.batched_layer_norm_params_backward(
        gy.contiguous(), x, weights, stats, rows, widths, has_bias, need_dx, need_dw, need_db, layout)
    dws = list(dw.split(list(widths))) if need_dw else ([] if not has_w else None)
    dbs = list(db.split(list(widths))) if need_db else ([] if not has_bias else None)
    return (dx if need_dx else None, dws, dbs, None, None, None, None)


def _register() -> None:
    """Define the parameter-list ops once per process (``_library.define``)."""
    define("grouped_linear_params", GLP_SCHEMA, _glp, _glp_fake, _glp_autograd, _glp_setup)
    define("grouped_linear_params_backward", GLP_BACKWARD_SCHEMA, _glp_backward, _glp_backward_fake)
    define("batched_layer_norm_params", LNP_SCHEMA, _lnp, _lnp_fake, _lnp_autograd, _lnp_setup)
    define("batched_layer_norm_params_backward", LNP_BACKWARD_SCHEMA, _lnp_backward, _lnp_backward_fake)


_register()
