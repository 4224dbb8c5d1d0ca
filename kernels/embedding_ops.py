"""Grouped embedding bag: the torch.library custom ops, their autograd, and the public function.

Custom ops (namespace ``optimus``; tensors and int/bool lists only, so the ops trace under
FakeTensor / AOTAutograd / Inductor)::

    optimus::grouped_embedding_bag(Tensor[] weights, Tensor indices, Tensor? offsets,
            Tensor? per_sample_weights, SymInt[] modes, SymInt[] padding_idx, SymInt[] bag_sizes,
            bool[] sparse, bool deterministic, SymInt[] index_counts) -> Tensor out

    (``torch.library.custom_op`` infers ``SymInt[]`` for every ``List[int]`` argument, on torch
    2.11, 2.13 and 2.15.)  ``bag_sizes`` may hold symbolic sizes under ``torch.compile(dynamic=True)``:
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

The forward op has autograd registered through the backward op: the registered backward splits
``dense`` into one [N_t, D_t] view per table and builds the sparse COO tensors, so each weight gets
its gradient in its own layout.  Both ops have fake implementations.  Their implementation is the
Triton kernels (``grouped_embedding_bag_kernel``) for CUDA tensors (CPU tensors under
``TRITON_INTERPRET=1``) and the plain torch of ``embedding_reference`` otherwise.

The public function :func:`grouped_embedding_bag` takes either a list of per-table
``F.embedding_bag`` inputs or the packed (KeyedJaggedTensor-style) form, validates everything with
messages that name the table, normalises (mixed index dtypes, per-table offsets, fixed bag sizes)
and calls the op.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import embedding_reference as ref
from ._common import triton_module, use_triton

__all__ = ["grouped_embedding_bag", "MODES"]

FN = "grouped_embedding_bag"
MODES = {"sum": 0, "mean": 1, "embedding": 2}
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ALLOWED_DTYPES = _TRITON_DTYPES + (torch.float64,)
_INDEX_DTYPES = (torch.int32, torch.int64)
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)

_MOD: dict = {}


def _kernel():
    m = _MOD.get("k")
    if m is None:
        m = _MOD["k"] = triton_module("grouped_embedding_bag_kernel")
    return m


def _triton_ok(t: Tensor) -> bool:
    return t.dtype in _TRITON_DTYPES and use_triton(t.device)


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
    if w0.dtype not in _ALLOWED_DTYPES:
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


# ------------------------------------------------------------------------------------------------
# custom ops
# ------------------------------------------------------------------------------------------------
def _op_exists(name: str) -> bool:
    try:
        return hasattr(torch.ops.optimus, name)
    except Exception:  # pragma: no cover
        return False


def _register_ops():
    """Define the optimus:: embedding ops once per process (the package may be imported twice)."""
    if _op_exists("grouped_embedding_bag"):
        return

    @torch.library.custom_op("optimus::grouped_embedding_bag", mutates_args=())
    def geb_op(weights: List[Tensor], indices: Tensor, offsets: Optional[Tensor],
               per_sample_weights: Optional[Tensor], modes: List[int], padding_idx: List[int],
               bag_sizes: List[int], sparse: List[bool], deterministic: bool,
               index_counts: List[int]) -> Tensor:
        _check_op(weights, indices, offsets, per_sample_weights, modes, padding_idx, bag_sizes, sparse,
                  index_counts, "optimus::grouped_embedding_bag")
        weights = [w.contiguous() for w in weights]
        indices = indices.contiguous()
        offsets = offsets.contiguous() if offsets is not None else None
        psw = per_sample_weights.contiguous() if per_sample_weights is not None else None
        if _triton_ok(weights[0]):
            K = _kernel()
            sig = K.signature([w.shape[0] for w in weights], [w.shape[1] for w in weights], modes, padding_idx,
                              bag_sizes if offsets is None else None, weights[0].dtype)
            return K.forward(weights, indices, offsets, psw, sig)
        return ref.forward(weights, indices, offsets, psw, modes, padding_idx, bag_sizes)

    @geb_op.register_fake
    def _(weights, indices, offsets, per_sample_weights, modes, padding_idx, bag_sizes, sparse, deterministic,
          index_counts):
        _check_op(weights, indices, offsets, per_sample_weights, modes, padding_idx, bag_sizes, sparse,
                  index_counts, "optimus::grouped_embedding_bag")
        B = _batch(weights, indices, offsets, bag_sizes)
        return weights[0].new_empty(B, sum(w.shape[1] for w in weights))

    @torch.library.custom_op("optimus::grouped_embedding_bag_backward", mutates_args=())
    def geb_backward_op(grad_out: Tensor, weights: List[Tensor], indices: Tensor, offsets: Optional[Tensor],
                        per_sample_weights: Optional[Tensor], modes: List[int], padding_idx: List[int],
                        bag_sizes: List[int], sparse: List[bool], deterministic: bool, index_counts: List[int],
                        need_weight_grad: List[bool], need_psw_grad: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        weights = [w.contiguous() for w in weights]
        indices = indices.contiguous()
        offsets = offsets.contiguous() if offsets is not None else None
        psw = per_sample_weights.contiguous() if per_sample_weights is not None else None
        need_psw = bool(need_psw_grad and psw is not None)
        if _triton_ok(weights[0]):
            K = _kernel()
            sig = K.signature([w.shape[0] for w in weights], [w.shape[1] for w in weights], modes, padding_idx,
                              bag_sizes if offsets is None else None, weights[0].dtype)
            return K.backward(grad_out, weights, indices, offsets, psw, sig, list(need_weight_grad), list(sparse),
                              bool(deterministic), need_psw, list(index_counts))
        return ref.backward(grad_out, weights, indices, offsets, psw, modes, padding_idx, bag_sizes,
                            need_weight_grad, sparse, need_psw, index_counts)

    @geb_backward_op.register_fake
    def _(grad_out, weights, indices, offsets, per_sample_weights, modes, padding_idx, bag_sizes, sparse,
          deterministic, index_counts, need_weight_grad, need_psw_grad):
        dense, spv, spr = _bwd_sizes(weights, indices, offsets, bag_sizes, sparse, index_counts, need_weight_grad)
        w0 = weights[0]
        need_psw = bool(need_psw_grad and per_sample_weights is not None)
        pdt = per_sample_weights.dtype if per_sample_weights is not None else w0.dtype
        return (w0.new_empty(dense), w0.new_empty(spv), w0.new_empty(spr, dtype=torch.int64),
                w0.new_empty(indices.shape[0] if need_psw else 0, dtype=pdt))

    def geb_setup(ctx, inputs, output):
        weights, indices, offsets, psw, modes, pads, bag_sizes, sparse, deterministic, index_counts = inputs
        T = len(weights)
        needs = ctx.needs_input_grad  # flattened: T weights, indices, offsets, psw, ...
        ctx.geb_need_w = [bool(v) for v in needs[:T]]
        ctx.geb_need_psw = bool(psw is not None and needs[T + 2])
        ctx.save_for_backward(indices, offsets, psw, *weights)
        ctx.geb_meta = (list(modes), list(pads), list(bag_sizes), list(sparse), bool(deterministic),
                        list(index_counts), [tuple(w.shape) for w in weights])

    def geb_backward(ctx, grad_out):
        saved = ctx.saved_tensors
        indices, offsets, psw = saved[:3]
        weights = list(saved[3:])
        modes, pads, bag_sizes, sparse, deterministic, index_counts, shapes = ctx.geb_meta
        need_w, need_psw = ctx.geb_need_w, ctx.geb_need_psw
        T = len(weights)
        # one entry per non-differentiable argument (modes, padding_idx, bag_sizes, sparse,
        # deterministic, index_counts); the autograd wrapper compares the structure with the inputs',
        # in which an empty list is a node, not a leaf
        none_rest = (None, None, None if bag_sizes else [], None, None, None if index_counts else [])
        if grad_out is None or not (any(need_w) or need_psw):
            return [None] * T, None, None, None, *none_rest
        dense, spv, spr, pswg = torch.ops.optimus.grouped_embedding_bag_backward(
            grad_out.contiguous(), weights, indices, offsets, psw, modes, pads, bag_sizes, sparse,
            deterministic, index_counts, need_w, need_psw)
        B = _batch(weights, indices, offsets, bag_sizes)
        grads = _weight_grads(dense, spv, spr, need_w, sparse, shapes,
                              lambda t: index_counts[t] if offsets is not None else B * bag_sizes[t])
        return grads, None, None, (pswg if need_psw else None), *none_rest

    geb_op.register_autograd(geb_backward, setup_context=geb_setup)


_register_ops()


# ------------------------------------------------------------------------------------------------
# public function: validation and normalisation
# ------------------------------------------------------------------------------------------------
def _is_tracing(tensors) -> bool:
    """True under dynamo / make_fx / fake or functional tensors (no data can be read)."""
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    if is_compiling is not None and is_compiling():
        return True
    stack_len = getattr(torch._C, "_len_torch_dispatch_stack", None)
    if stack_len is not None and stack_len() > 0:
        return True
    return any(t is not None and type(t) not in _PLAIN_TYPES for t in tensors)


def _per_table(value, T, name, kinds):
    """A per-table list from a scalar or a length-T sequence."""
    if isinstance(value, (list, tuple)):
        if len(value) != T:
            raise ValueError(f"{FN}: {name} has {len(value)} entries for {T} tables")
        out = list(value)
    else:
        out = [value] * T
    for t, v in enumerate(out):
        if not isinstance(v, kinds) or (bool not in kinds and isinstance(v, bool)):
            raise TypeError(f"{FN}: {name}[{t}] = {v!r} has type {type(v).__name__}")
    return out


def _mode_codes(mode, T) -> List[int]:
    modes = _per_table(mode, T, "mode", (str,))
    codes = []
    for t, m in enumerate(modes):
        ml = m.lower()
        if ml == "max":
            raise ValueError(f"{FN}: mode[{t}] = 'max' is not supported (sum, mean, embedding)")
        if ml not in MODES:
            raise ValueError(f"{FN}: mode[{t}] = {m!r}; expected 'sum', 'mean' or 'embedding'")
        codes.append(MODES[ml])
    return codes


def _pad_codes(padding_idx, weights) -> List[int]:
    T = len(weights)
    if isinstance(padding_idx, (list, tuple)):
        if len(padding_idx) != T:
            raise ValueError(f"{FN}: padding_idx has {len(padding_idx)} entries for {T} tables")
        pads = list(padding_idx)
    else:
        pads = [padding_idx] * T
    out = []
    for t, (p, w) in enumerate(zip(pads, weights)):
        if p is None:
            out.append(-1)
            continue
        if isinstance(p, bool) or not isinstance(p, int):
            raise TypeError(f"{FN}: padding_idx[{t}] must be an int or None, got {type(p).__name__}")
        n = w.shape[0]
        if not (-n <= p < n):
            raise ValueError(f"{FN}: table {t}: padding_idx {p} must be within num_embeddings ({n})")
        out.append(p + n if p < 0 else p)
    return out


def _check_weights(weights):
    if isinstance(weights, Tensor) or not isinstance(weights, (list, tuple)):
        raise TypeError(f"{FN}: weights must be a list or tuple of [N_t, D_t] tensors, got {type(weights).__name__}")
    if len(weights) == 0:
        raise ValueError(f"{FN}: empty list of tables (weights)")
    w0 = weights[0]
    if not isinstance(w0, Tensor):
        raise TypeError(f"{FN}: weights[0] is a {type(w0).__name__}, not a tensor")
    if w0.dtype not in _ALLOWED_DTYPES:
        raise TypeError(f"{FN}: weights[0] has dtype {w0.dtype}; supported: float16, bfloat16, float32 "
                        f"(float64 on the plain-torch path)")
    for t, w in enumerate(weights):
        if not isinstance(w, Tensor):
            raise TypeError(f"{FN}: weights[{t}] is a {type(w).__name__}, not a tensor")
        if w.dim() != 2:
            raise ValueError(f"{FN}: weights[{t}] must be 2-D [num_embeddings, dim], got shape {tuple(w.shape)}")
        if w.dtype != w0.dtype:
            raise TypeError(f"{FN}: weights[{t}] has dtype {w.dtype} but weights[0] has {w0.dtype}; "
                            f"all tables must share one dtype")
        if w.device != w0.device:
            raise ValueError(f"{FN}: weights[{t}] is on {w.device} but weights[0] is on {w0.device}")
        if not w.is_contiguous():
            raise ValueError(f"{FN}: weights[{t}] is not contiguous (stride {w.stride()}); the gradient is "
                             f"produced in the contiguous [N, D] layout")
    return w0


def _check_index_tensor(name, x, device, dims=(1,)):
    if not isinstance(x, Tensor):
        raise TypeError(f"{FN}: {name} is a {type(x).__name__}, not a tensor")
    if x.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{FN}: {name} has dtype {x.dtype}; indices and offsets must be int32 or int64")
    if x.device != device:
        raise ValueError(f"{FN}: {name} is on {x.device} but the weights are on {device}")
    if x.dim() not in dims:
        raise ValueError(f"{FN}: {name} must be {' or '.join(f'{d}-D' for d in dims)}, got shape {tuple(x.shape)}")


def _check_psw(name, p, like_shape, w0):
    if not isinstance(p, Tensor):
        raise TypeError(f"{FN}: {name} is a {type(p).__name__}, not a tensor")
    if p.dtype != w0.dtype:
        raise TypeError(f"{FN}: {name} has dtype {p.dtype}; per-sample weights need the weights' dtype {w0.dtype}")
    if p.device != w0.device:
        raise ValueError(f"{FN}: {name} is on {p.device} but the weights are on {w0.device}")
    if tuple(p.shape) != tuple(like_shape):
        raise ValueError(f"{FN}: {name} has shape {tuple(p.shape)} but its indices have shape {tuple(like_shape)}")


def _from_lists(weights, indices, offsets, psw, modes, include_last_offset):
    """Per-table F.embedding_bag inputs -> (indices, offsets or None, psw, bag_sizes, index_counts)."""
    T = len(weights)
    w0 = weights[0]
    dev = w0.device
    if len(indices) != T:
        raise ValueError(f"{FN}: got {T} tables but {len(indices)} index tensors")
    if offsets is not None and (isinstance(offsets, Tensor) or len(offsets) != T):
        raise ValueError(f"{FN}: with per-table indices, offsets must be None or a list of {T} entries "
                         f"(None for 2-D indices)")
    if psw is not None and (isinstance(psw, Tensor) or len(psw) != T):
        raise ValueError(f"{FN}: with per-table indices, per_sample_weights must be None or a list of {T} entries")
    offs = list(offsets) if offsets is not None else [None] * T
    psws = list(psw) if psw is not None else [None] * T
    B = None
    fixed = []
    for t in range(T):
        x, o = indices[t], offs[t]
        if o is None:
            _check_index_tensor(f"indices[{t}]", x, dev, dims=(2,))
            b, L = x.shape
            fixed.append(L)
        else:
            _check_index_tensor(f"indices[{t}]", x, dev, dims=(1,))
            _check_index_tensor(f"offsets[{t}]", o, dev, dims=(1,))
            b = o.shape[0] - (1 if include_last_offset else 0)
            if include_last_offset and o.shape[0] < 1:
                raise ValueError(f"{FN}: offsets[{t}] is empty but include_last_offset=True needs B + 1 entries")
            fixed.append(None)
        if B is None:
            B = b
        elif b != B:
            raise ValueError(f"{FN}: table {t} has {b} bags but table 0 has {B}; all tables need the same batch")
        if psws[t] is not None:
            _check_psw(f"per_sample_weights[{t}]", psws[t], x.shape, w0)
            if modes[t] != MODES["sum"]:
                raise ValueError(f"{FN}: table {t}: per_sample_weights are only supported with mode 'sum'")
    idx_dtype = indices[0].dtype if all(x.dtype == indices[0].dtype for x in indices) else torch.int64
    flat = [x.reshape(-1) for x in indices]
    counts = [x.numel() for x in flat]
    cat_idx = torch.cat([x.to(idx_dtype) for x in flat]) if T > 1 else flat[0].to(idx_dtype)
    cat_psw = None
    if any(p is not None for p in psws):
        cat_psw = torch.cat([(p.reshape(-1) if p is not None else torch.ones(n, dtype=w0.dtype, device=dev))
                             for p, n in zip(psws, counts)])
    if all(L is not None for L in fixed) and sum(fixed) > 0:
        return cat_idx, None, cat_psw, fixed, counts, B
    # jagged (or every bag size 0): global offsets over the concatenated indices
    parts, base = [], 0
    for t in range(T):
        if fixed[t] is not None:
            parts.append(torch.arange(B, device=dev, dtype=torch.int64) * fixed[t] + base)
        else:
            o = offs[t][:B] if include_last_offset else offs[t]
            parts.append(o.to(torch.int64) + base)
        base += counts[t]
    parts.append(torch.full((1,), base, dtype=torch.int64, device=dev))
    return cat_idx, torch.cat(parts), cat_psw, [], counts, B


def _host_check(weights, indices, offsets, bag_sizes, per_table_offsets, per_table_counts,
                include_last_offset):
    """Offsets and index ranges on the host (reads the data: CPU, or an explicit check on CUDA)."""
    T = len(weights)
    if per_table_offsets is not None:
        # the same messages as F.embedding_bag, per table, before they are merged
        for t, o in enumerate(per_table_offsets):
            if o is None or o.numel() == 0:
                continue
            n = per_table_counts[t]
            if int(o[0]) != 0:
                raise ValueError(f"{FN}: table {t}: offsets[0] has to be 0 (the first bag starts at the first "
                                 f"index), got {int(o[0])}")
            last = int(o[-1])
            if last > n or (include_last_offset and last != n):
                raise ValueError(f"{FN}: table {t}: offsets[-1] = {last} but the table has {n} indices "
                                 f"(with include_last_offset it must equal that number, else not exceed it)")
            if o.numel() > 1 and bool((o[1:] < o[:-1]).any()):
                raise ValueError(f"{FN}: table {t}: offsets must be non-decreasing")
    if offsets is not None:
        ref.check_offsets(offsets, indices.numel(), T)
    B = ref.batch_size(T, indices.numel(), offsets, bag_sizes)
    spans = ref.table_spans(T, B, indices.numel(), offsets, bag_sizes)
    if offsets is not None and per_table_offsets is None and per_table_counts is not None:
        for t, (a, b) in enumerate(spans):
            if int(per_table_counts[t]) != b - a:
                raise ValueError(f"{FN}: index_counts[{t}] = {per_table_counts[t]} but the offsets give table {t} "
                                 f"{b - a} indices")
    ref.check_indices(weights, indices, spans)


def grouped_embedding_bag(
    weights: Sequence[Tensor],
    indices: Union[Tensor, Sequence[Tensor]],
    offsets: Union[Tensor, Sequence[Optional[Tensor]], None] = None,
    per_sample_weights: Union[Tensor, Sequence[Optional[Tensor]], None] = None,
    *,
    mode: Union[str, Sequence[str]] = "mean",
    padding_idx: Union[int, None, Sequence[Optional[int]]] = None,
    sparse: Union[bool, Sequence[bool]] = False,
    bag_size: Union[int, Sequence[int], None] = None,
    include_last_offset: bool = False,
    deterministic: bool = True,
    check_indices: Optional[bool] = None,
    index_counts: Optional[Sequence[int]] = None,
    max_norm: Optional[float] = None,
    scale_grad_by_freq: bool = False,
) -> Tensor:
    """T embedding-bag lookups over tables of different sizes and dims in one kernel.

    Returns ``out`` [B, sum_t D_t]: table t's pooled output is the column slice
    ``out[:, col_t : col_t + D_t]`` (``col_t = D_0 + ... + D_{t-1}``), i.e. ``out`` equals
    ``torch.cat([F.embedding_bag(indices[t], weights[t], offsets[t], mode=mode[t], ...)
    for t in range(T)], dim=1)``; ``out.split(dims, dim=1)`` gives the per-table views.

    Two input forms:

    * **per table** (a list of ``F.embedding_bag`` inputs): ``indices[t]`` is 1-D with
      ``offsets[t]`` (B entries, or B + 1 with ``include_last_offset``), or 2-D [B, L_t] with
      ``offsets[t] = None`` (fixed bag size L_t; [B, 1] with mode "embedding" is ``F.embedding``);
      ``per_sample_weights`` None or a list with entries None or shaped like ``indices[t]``.
      Index tensors of mixed int32 / int64 dtypes are converted to int64.
    * **packed** (TorchRec KeyedJaggedTensor layout, no copies): ``indices`` one 1-D tensor, the
      tables' indices concatenated; ``offsets`` one 1-D tensor of T * B + 1 global bag boundaries
      (``kjt.values()``, ``kjt.offsets()``), or ``offsets=None`` with ``bag_size`` (int or per
      table); ``per_sample_weights`` None or 1-D like ``indices``.

    ``mode`` ("mean" by default, as in ``F.embedding_bag``; "sum"; "embedding"), ``padding_idx``
    (int or None) and ``sparse`` are one value or one per table.  "embedding" follows ``F.embedding``: the padding row is returned in the
    forward and gets no gradient; "sum" / "mean" skip padding entries like ``F.embedding_bag``
    (mean divides by the non-padding count); empty bags give zeros.  Per-sample weights: "sum" only.

    Gradients: each weight gets a dense [N_t, D_t] gradient, or for ``sparse`` tables an
    (uncoalesced) sparse COO gradient with one row per index entry (padding entries are zero rows at
    ``padding_idx``; eager only).  ``deterministic=True`` (default) reduces sorted segments (bitwise
    reproducible); ``False`` uses fp32 atomics (faster when few rows repeat).  Accumulation is fp32
    for 16-bit weights.

    Bad input raises ``ValueError`` / ``TypeError`` / ``IndexError`` naming the table.  Index
    ranges and offsets are checked on the host when the tensors are on the CPU (``check_indices``
    None or True) and on CUDA only with ``check_indices=True`` (one synchronisation); unchecked,
    the kernels never access memory out of bounds: out-of-range indices contribute nothing and get
    no gradient.  ``index_counts`` (packed form with offsets and sparse tables): entries per table;
    computed from ``offsets`` when omitted (one synchronisation on CUDA).  ``max_norm`` and
    ``scale_grad_by_freq`` are not supported (error).
    """
    fast_key = None
    if max_norm is None and not scale_grad_by_freq and isinstance(indices, Tensor):
        fast_key = _fast_key(weights, indices, offsets, per_sample_weights, mode, padding_idx, sparse, bag_size,
                             deterministic, check_indices)
        if fast_key is not None:
            plan = _PLANS.get(fast_key)
            if plan is not None:
                out = _eager_packed(plan, weights, indices, offsets, per_sample_weights, index_counts)
                if out is not None:
                    return out
    if max_norm is not None:
        raise ValueError(f"{FN}: max_norm is not supported (it renormalises weight rows in place during the "
                         f"lookup); use F.embedding_bag")
    if scale_grad_by_freq:
        raise ValueError(f"{FN}: scale_grad_by_freq is not supported; use F.embedding_bag")
    w0 = _check_weights(weights)
    T = len(weights)
    dev = w0.device
    modes = _mode_codes(mode, T)
    pads = _pad_codes(padding_idx, weights)
    sparse_l = [bool(s) for s in _per_table(sparse, T, "sparse", (bool,))]
    if not isinstance(deterministic, bool):
        raise TypeError(f"{FN}: deterministic must be a bool, got {type(deterministic).__name__}")
    per_table_offsets = None
    if isinstance(indices, (list, tuple)):
        if bag_size is not None:
            raise ValueError(f"{FN}: bag_size is for the packed form; per-table fixed bags are 2-D indices")
        per_table_offsets = list(offsets) if isinstance(offsets, (list, tuple)) else None
        idx, off, psw, bag_sizes, counts, B = _from_lists(weights, indices, offsets, per_sample_weights, modes,
                                                          include_last_offset)
    else:
        _check_index_tensor("indices", indices, dev, dims=(1,))
        idx, psw = indices, per_sample_weights
        if psw is not None:
            if isinstance(psw, (list, tuple)):
                raise TypeError(f"{FN}: with packed indices, per_sample_weights must be one tensor like indices")
            _check_psw("per_sample_weights", psw, idx.shape, w0)
            bad = [t for t in range(T) if modes[t] != MODES["sum"]]
            if bad:
                raise ValueError(f"{FN}: table {bad[0]}: per_sample_weights are only supported with mode 'sum'")
        counts = list(index_counts) if index_counts is not None else None
        if offsets is not None:
            if bag_size is not None:
                raise ValueError(f"{FN}: give offsets or bag_size, not both")
            _check_index_tensor("offsets", offsets, dev, dims=(1,))
            if offsets.numel() < 1 or (offsets.numel() - 1) % T:
                raise ValueError(f"{FN}: packed offsets must have T * B + 1 entries (T = {T}), got {offsets.numel()}")
            off, bag_sizes = offsets, []
            B = (offsets.numel() - 1) // T
        else:
            if bag_size is None:
                raise ValueError(f"{FN}: packed indices need offsets (T * B + 1 entries) or bag_size")
            bag_sizes = [int(v) for v in _per_table(bag_size, T, "bag_size", (int,))]
            if any(v < 0 for v in bag_sizes):
                raise ValueError(f"{FN}: bag_size must be >= 0, got {bag_sizes}")
            s = sum(bag_sizes)
            if s == 0 or idx.numel() % s:
                raise ValueError(f"{FN}: {idx.numel()} indices is not B * sum(bag_size) = B * {s}")
            off = None
            B = idx.numel() // s
            counts = [B * v for v in bag_sizes]
        if counts is not None and len(counts) != T:
            raise ValueError(f"{FN}: index_counts has {len(counts)} entries for {T} tables")
    tensors = [*weights, idx, off, psw]
    tracing = _is_tracing(tensors)
    if tracing and any(sparse_l):
        raise ValueError(f"{FN}: sparse gradients are not supported under torch.compile / tracing; use dense "
                         f"gradients (sparse=False) in compiled code")
    if check_indices is None:
        check_indices = dev.type == "cpu"
    if check_indices and not tracing:
        _host_check(weights, idx, off, bag_sizes, per_table_offsets, counts, include_last_offset)
    if any(sparse_l) and off is not None and counts is None:
        bnd = off[:: B].tolist() if B else [0] * (T + 1)  # one synchronisation on CUDA
        counts = [int(bnd[t + 1]) - int(bnd[t]) for t in range(T)]
    ic = [int(c) for c in counts] if (any(sparse_l) and off is not None) else []
    if off is None and not idx.is_contiguous():
        idx = idx.contiguous()
    if not tracing and _triton_ok(w0) and all(t is None or type(t) in _PLAIN_TYPES for t in tensors):
        plan = _EagerPlan(weights, modes, pads, bag_sizes, sparse_l, deterministic, bool(check_indices))
        if fast_key is not None:
            _put_plan(fast_key, plan)
        return _geb_apply(plan, ic, idx, off, psw, weights)
    return torch.ops.optimus.grouped_embedding_bag(list(weights), idx, off, psw, modes, pads, bag_sizes, sparse_l,
                                                   deterministic, ic)


# ------------------------------------------------------------------------------------------------
# eager path: an autograd.Function around the kernels, plans cached per call signature
# ------------------------------------------------------------------------------------------------
# In eager mode with the Triton kernels (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1) the
# public function skips the dispatcher and the custom op's Python wrapper (argument flattening,
# schema checks): validation, normalisation and the kernel signature are cached per call signature
# (weights' metadata, index / offset / per-sample-weight dtypes and devices, options), so a
# steady-state packed-form call costs a dictionary lookup, a few shape checks and the launches.
# The device tables are cached in the kernel module by (signature, weight pointers, batch size).
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
    if type(weights) not in (list, tuple) or not weights or _is_tracing(()):
        return None
    if type(indices) not in _PLAIN_TYPES or (offsets is not None and type(offsets) not in _PLAIN_TYPES):
        return None
    if psw is not None and type(psw) not in _PLAIN_TYPES:
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
        _host_check(weights, indices, offsets, plan.bag_sizes, None, None, False)
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
