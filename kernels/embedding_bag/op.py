"""The grouped embedding-bag ops: schemas, checks, implementations, fake implementations, autograd.

The ops (namespace ``optimus``; tensors and int/bool lists only, so they trace under FakeTensor /
AOTAutograd / Inductor)::

    optimus::grouped_embedding_bag(Tensor[] weights, Tensor indices, Tensor? offsets,
            Tensor? per_sample_weights, SymInt[] modes, SymInt[] padding_idx, SymInt[] bag_sizes,
            bool[] sparse, bool deterministic, SymInt[] index_counts) -> Tensor out

    ``bag_sizes`` may hold symbolic sizes under ``torch.compile(dynamic=True)``:
    the bag length L of [B, L] indices is then a symbol, which the rule passes as a graph value
    (``aten.sym_size.int``).  The fake implementations never add a guard on them (``_require``:
    a check raises only where it is provably false; B = len(indices) // sum(L) simplifies to the
    batch symbol); the real implementations (CPU, Triton) get plain ints when the graph runs and
    check everything again.

        weights[t]: [N_t, D_t], one dtype (fp16 / bf16 / fp32; fp64 on the plain-torch path) and
            device, contiguous
        indices: 1-D int32 / int64, the tables' indices concatenated table-major (table 0's, then
            table 1's, ...), bag-major inside a table
        offsets: 1-D int32 / int64 with T * B + 1 entries: bag b of table t is
            indices[offsets[t*B + b] : offsets[t*B + b + 1]] (TorchRec's KeyedJaggedTensor
            ``offsets()`` layout); or None with ``bag_sizes`` (fixed bag size L_t per table:
            table t's entries are the B * L_t after the previous tables', bag b = entries
            [b*L_t, (b+1)*L_t) of them)
        per_sample_weights: None or 1-D like indices (weights dtype); applied to "sum" tables
        modes[t]: 0 sum, 1 mean, 2 embedding (F.embedding semantics: the padding row counts in the
            forward, gets no gradient)
        padding_idx[t]: row index in [0, N_t) or -1; entries equal to it are skipped (sum / mean,
            not counted by mean) and never get a gradient
        sparse[t]: the backward returns a sparse COO gradient for table t (eager only)
        deterministic: sorted-segment backward (default) or fp32 atomics
        index_counts: entries per table; only needed (offsets mode) when a table is sparse
        out: [B, sum_t D_t]; table t's pooled output is out[:, col_t : col_t + D_t] with
            col_t = D_0 + ... + D_{t-1}; empty bags give zeros.

    optimus::grouped_embedding_bag_backward(Tensor grad_out, Tensor[] weights, Tensor indices,
            Tensor? offsets, Tensor? per_sample_weights, SymInt[] modes, SymInt[] padding_idx,
            SymInt[] bag_sizes, bool[] sparse, bool deterministic, SymInt[] index_counts,
            bool[] need_weight_grad, bool need_psw_grad)
            -> (Tensor dense, Tensor sparse_values, Tensor sparse_rows, Tensor psw_grad)

        dense: the dense tables that need a gradient, in table order, N_t * D_t elements each (the
            weights' own [N_t, D_t] layout); sparse_values / sparse_rows: L_t rows of D_t values /
            L_t int64 row indices per sparse table; psw_grad: like per_sample_weights, or empty.
        grad_out is read at its row stride: the slice of a ``cat``'s gradient that the grouped
            lookup's output gets when a concatenation reads it is not copied.

The forward op has autograd registered through the backward op: the registered backward splits
``dense`` into one [N_t, D_t] view per table and builds the sparse COO tensors, so each weight gets
its gradient in its own layout.  Both ops have fake implementations.  Their implementation is the
Triton kernels (``kernel.py``) for CUDA tensors (CPU tensors under
``TRITON_INTERPRET=1``) and the plain torch of ``reference.py`` otherwise.
Importing this module registers them (once per process,
:func:`~optimus.kernels.runtime.registration.define`).
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor

from ..runtime.backend import lazy_module
from ..runtime.checks import ALLOWED_DTYPES, triton_ok
from ..runtime.registration import define
from ..runtime.layout import unit_stride_rows
from . import reference as ref

_kernel = lazy_module(__package__)  # kernel.py, imported on the first Triton launch
_INDEX_DTYPES = (torch.int32, torch.int64)


# ------------------------------------------------------------------------------------------------
# op-level checks (cheap, shape-only: run by the real and the fake implementations)
# ------------------------------------------------------------------------------------------------
def _require(cond, message, exc=RuntimeError) -> None:
    """Raise ``exc(message())`` unless ``cond`` holds.

    ``cond`` is a bool when the op runs (every size an int), and may be a ``SymBool`` in
    the fake implementation under symbolic shapes (``bag_sizes`` are ``SymInt[]``): then it
    raises only where the condition is provably false and never adds a guard (a check that
    needs one would specialize the caller's dynamic dims). What the fake cannot decide, the
    op itself checks again with ints when it runs."""
    if isinstance(cond, torch.SymBool):
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        if not statically_known_true(torch.sym_not(cond)):
            return
        cond = False
    if not cond:
        raise exc(message())


def _check_op(weights, indices, offsets, psw, modes, pads, bag_sizes, sparse, index_counts, fn):
    T = len(weights)
    if T == 0:
        raise ValueError(f"{fn}: need at least one table")
    for name, lst in (("modes", modes), ("padding_idx", pads), ("sparse", sparse)):
        if len(lst) != T:
            raise ValueError(f"{fn}: {name} has {len(lst)} entries for {T} tables")
    w0 = weights[0]
    if w0.dtype not in ALLOWED_DTYPES:
        raise TypeError(f"{fn}: weights have dtype {w0.dtype}; supported: float16, bfloat16, float32 "
                        f"(float64 on the plain-torch path)")
    for t, w in enumerate(weights):
        if w.dim() != 2:
            raise ValueError(f"{fn}: weights[{t}] must be 2-D [num_embeddings, dim], got shape {tuple(w.shape)}")
        if w.dtype != w0.dtype or w.device != w0.device:
            raise ValueError(f"{fn}: weights[{t}] is {w.dtype} on {w.device} but weights[0] is {w0.dtype} on "
                             f"{w0.device}; all tables must share one dtype and device")
        if modes[t] not in (0, 1, 2):
            raise ValueError(f"{fn}: modes[{t}] = {modes[t]}; expected 0 (sum), 1 (mean) or 2 (embedding)")
        if not (-1 <= pads[t] < max(1, w.shape[0])):
            raise ValueError(f"{fn}: padding_idx[{t}] = {pads[t]} is outside [0, {w.shape[0]}) (use -1 for none)")
    if indices.dim() != 1 or indices.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{fn}: indices must be a 1-D int32/int64 tensor, got {indices.dtype} of shape "
                         f"{tuple(indices.shape)}")
    if offsets is not None:
        if offsets.dim() != 1 or offsets.dtype not in _INDEX_DTYPES:
            raise ValueError(f"{fn}: offsets must be a 1-D int32/int64 tensor, got {offsets.dtype} of shape "
                             f"{tuple(offsets.shape)}")
        torch._check(offsets.shape[0] >= 1, lambda: f"{fn}: offsets must have T * B + 1 >= 1 entries")
        torch._check((offsets.shape[0] - 1) % T == 0,
                     lambda: f"{fn}: offsets has {offsets.shape[0]} entries, not T * B + 1 for T = {T}")
        if bag_sizes:
            raise ValueError(f"{fn}: give offsets or bag_sizes, not both")
    else:
        if len(bag_sizes) != T:
            raise ValueError(f"{fn}: without offsets, bag_sizes needs one entry per table, got {len(bag_sizes)}")
        for v in bag_sizes:
            _require(v >= 0, lambda: f"{fn}: bag sizes must be >= 0, got {list(bag_sizes)}", ValueError)
        s = sum(bag_sizes)
        _require(s > 0, lambda: f"{fn}: fixed bag sizes must not all be 0 (pass offsets instead)")
        # B * sum(bag_sizes) == len(indices), not len(indices) % sum == 0: for symbolic bag
        # sizes the product expands to the indices' own size (B is their exact quotient),
        # where the remainder of a sum of symbols does not simplify
        n = indices.shape[0]
        _require(n // s * s == n, lambda: f"{fn}: {n} indices is not B * sum(bag_sizes) = B * {s}")
    if psw is not None:
        if psw.dim() != 1 or psw.dtype != w0.dtype:
            raise ValueError(f"{fn}: per_sample_weights must be 1-D with the weights' dtype {w0.dtype}, got "
                             f"{psw.dtype} of shape {tuple(psw.shape)}")
        torch._check(psw.shape[0] == indices.shape[0],
                     lambda: f"{fn}: per_sample_weights has {psw.shape[0]} entries, indices {indices.shape[0]}")
    if offsets is not None and any(sparse) and len(index_counts) != T:
        raise ValueError(f"{fn}: sparse tables with offsets need index_counts (entries per table)")


def _batch(weights, indices, offsets, bag_sizes):
    T = len(weights)
    if offsets is not None:
        return (offsets.shape[0] - 1) // T
    return indices.shape[0] // sum(bag_sizes)


def _sparse_rows(t, weights, indices, offsets, bag_sizes, index_counts):
    B = _batch(weights, indices, offsets, bag_sizes)
    return index_counts[t] if offsets is not None else B * bag_sizes[t]


def _bwd_sizes(weights, indices, offsets, bag_sizes, sparse, index_counts, need_w):
    dense = spv = spr = 0
    for t, w in enumerate(weights):
        if not need_w[t]:
            continue
        if sparse[t]:
            n = _sparse_rows(t, weights, indices, offsets, bag_sizes, index_counts)
            spv += n * w.shape[1]
            spr += n
        else:
            dense += w.shape[0] * w.shape[1]
    return dense, spv, spr


def _weight_grads(dense, spv, spr, need_w, sparse, shapes, rows_of) -> List[Optional[Tensor]]:
    """One gradient per table from the backward's packed outputs: a [N_t, D_t] view of ``dense``,
    or a sparse COO tensor over ``rows_of(t)`` entries of ``spv`` / ``spr`` (None: no gradient)."""
    grads: List[Optional[Tensor]] = [None] * len(shapes)
    od = ov = orow = 0
    for t, (n, d) in enumerate(shapes):
        if not need_w[t]:
            continue
        if sparse[t]:
            rows = rows_of(t)
            vals = spv[ov: ov + rows * d].view(rows, d)
            idx = spr[orow: orow + rows].view(1, rows)
            grads[t] = torch.sparse_coo_tensor(idx, vals, (n, d), is_coalesced=False, check_invariants=False)
            ov += rows * d
            orow += rows
        else:
            grads[t] = dense[od: od + n * d].view(n, d)
            od += n * d
    return grads


def _geb(weights, indices, offsets, per_sample_weights, modes, padding_idx, bag_sizes, sparse, deterministic,
         index_counts):
    _check_op(weights, indices, offsets, per_sample_weights, modes, padding_idx, bag_sizes, sparse,
              index_counts, "optimus::grouped_embedding_bag")
    weights = [w.contiguous() for w in weights]
    indices = indices.contiguous()
    offsets = offsets.contiguous() if offsets is not None else None
    psw = per_sample_weights.contiguous() if per_sample_weights is not None else None
    if triton_ok(weights[0]):
        K = _kernel()
        sig = K.signature([w.shape[0] for w in weights], [w.shape[1] for w in weights], modes, padding_idx,
                          bag_sizes if offsets is None else None, weights[0].dtype)
        return K.forward(weights, indices, offsets, psw, sig)
    return ref.forward(weights, indices, offsets, psw, modes, padding_idx, bag_sizes)


def _geb_fake(weights, indices, offsets, per_sample_weights, modes, padding_idx, bag_sizes, sparse, deterministic,
              index_counts):
    _check_op(weights, indices, offsets, per_sample_weights, modes, padding_idx, bag_sizes, sparse,
              index_counts, "optimus::grouped_embedding_bag")
    B = _batch(weights, indices, offsets, bag_sizes)
    return weights[0].new_empty(B, sum(w.shape[1] for w in weights))


def _geb_backward(grad_out, weights, indices, offsets, per_sample_weights, modes, padding_idx, bag_sizes, sparse,
                  deterministic, index_counts, need_weight_grad, need_psw_grad):
    weights = [w.contiguous() for w in weights]
    indices = indices.contiguous()
    offsets = offsets.contiguous() if offsets is not None else None
    psw = per_sample_weights.contiguous() if per_sample_weights is not None else None
    need_psw = bool(need_psw_grad and psw is not None)
    if triton_ok(weights[0]):
        K = _kernel()
        sig = K.signature([w.shape[0] for w in weights], [w.shape[1] for w in weights], modes, padding_idx,
                          bag_sizes if offsets is None else None, weights[0].dtype)
        return K.backward(grad_out, weights, indices, offsets, psw, sig, list(need_weight_grad), list(sparse),
                          bool(deterministic), need_psw, list(index_counts))
    return ref.backward(grad_out, weights, indices, offsets, psw, modes, padding_idx, bag_sizes,
                        need_weight_grad, sparse, need_psw, index_counts)


def _geb_backward_fake(grad_out, weights, indices, offsets, per_sample_weights, modes, padding_idx, bag_sizes,
                       sparse, deterministic, index_counts, need_weight_grad, need_psw_grad):
    dense, spv, spr = _bwd_sizes(weights, indices, offsets, bag_sizes, sparse, index_counts, need_weight_grad)
    w0 = weights[0]
    need_psw = bool(need_psw_grad and per_sample_weights is not None)
    pdt = per_sample_weights.dtype if per_sample_weights is not None else w0.dtype
    return (w0.new_empty(dense), w0.new_empty(spv), w0.new_empty(spr, dtype=torch.int64),
            w0.new_empty(indices.shape[0] if need_psw else 0, dtype=pdt))


# ------------------------------------------------------------------------------------------------
# autograd
# ------------------------------------------------------------------------------------------------
def _geb_setup(ctx, inputs, output):
    weights, indices, offsets, psw, modes, pads, bag_sizes, sparse, deterministic, index_counts = inputs
    ctx.save_for_backward(indices, offsets, psw, *weights)
    ctx.geb_meta = (list(modes), list(pads), list(bag_sizes), list(sparse), bool(deterministic),
                    list(index_counts), [tuple(w.shape) for w in weights])


def _geb_autograd(ctx, grad_out):
    saved = ctx.saved_tensors
    indices, offsets, psw = saved[:3]
    weights = list(saved[3:])
    modes, pads, bag_sizes, sparse, deterministic, index_counts, shapes = ctx.geb_meta
    needs = ctx.needs_input_grad  # weights: one flag per table
    need_w = [bool(v) for v in needs[0]]
    need_psw = bool(psw is not None and needs[3])
    T = len(weights)
    if grad_out is None or not (any(need_w) or need_psw):
        return [None] * T, None, None, None, None, None, None, None, None, None
    dense, spv, spr, pswg = torch.ops.optimus.grouped_embedding_bag_backward(
        unit_stride_rows(grad_out), weights, indices, offsets, psw, modes, pads, bag_sizes, sparse,
        deterministic, index_counts, need_w, need_psw)
    B = _batch(weights, indices, offsets, bag_sizes)
    grads = _weight_grads(dense, spv, spr, need_w, sparse, shapes,
                          lambda t: index_counts[t] if offsets is not None else B * bag_sizes[t])
    return grads, None, None, (pswg if need_psw else None), None, None, None, None, None, None


# ------------------------------------------------------------------------------------------------
# the ops
# ------------------------------------------------------------------------------------------------
GEB_SCHEMA = ("(Tensor[] weights, Tensor indices, Tensor? offsets, Tensor? per_sample_weights, SymInt[] modes, "
              "SymInt[] padding_idx, SymInt[] bag_sizes, bool[] sparse, bool deterministic, SymInt[] index_counts) "
              "-> Tensor")
GEB_BACKWARD_SCHEMA = ("(Tensor grad_out, Tensor[] weights, Tensor indices, Tensor? offsets, Tensor? per_sample_weights, "
                       "SymInt[] modes, SymInt[] padding_idx, SymInt[] bag_sizes, bool[] sparse, bool deterministic, "
                       "SymInt[] index_counts, bool[] need_weight_grad, bool need_psw_grad) "
                       "-> (Tensor, Tensor, Tensor, Tensor)")


def _register() -> None:
    define("grouped_embedding_bag", GEB_SCHEMA, _geb, _geb_fake, _geb_autograd, _geb_setup)
    define("grouped_embedding_bag_backward", GEB_BACKWARD_SCHEMA, _geb_backward, _geb_backward_fake)


_register()
