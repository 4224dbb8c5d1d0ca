"""Public functions and torch.library custom ops for the grouped kernels.

Custom ops (namespace ``optimus``), all on the *packed* convention: every member's tensor is
flattened and the members are concatenated into one contiguous 1-D buffer per operand, in member
order; the shapes travel as int lists, so the ops have static output sizes and trace under
FakeTensor / torch.compile::

    optimus::grouped_linear(Tensor x, Tensor w, Tensor? b, SymInt[] ms, SymInt[] ks, SymInt[] ns,
                            str activation) -> (Tensor y, Tensor preact)
        x: cat_g x_g.reshape(-1) (M_g*K_g each)   w: cat_g W_g.reshape(-1) (N_g*K_g, F.linear layout)
        b: cat_g b_g (N_g) or None                y: cat_g y_g.reshape(-1) (M_g*N_g)
        preact: the pre-activation (same layout as y) when activation is gelu/silu, else empty; it
        is saved for backward and is not differentiable.
    optimus::grouped_linear_backward(Tensor dy, Tensor x, Tensor w, Tensor? aux, SymInt[] ms,
                            SymInt[] ks, SymInt[] ns, str activation, bool has_bias,
                            bool need_dx, bool need_dw, bool need_db) -> (Tensor dx, Tensor dw, Tensor db)
    optimus::batched_layer_norm(Tensor x, Tensor? w, Tensor? b, SymInt[] rows, SymInt[] widths,
                            float eps) -> (Tensor y, Tensor stats)
        x, y: cat_g x_g.reshape(-1) (R_g*D_g)     w, b: cat_g w_g (D_g) or None
        stats: fp32 [2, sum R_g] (mean, rstd per row), saved for backward, not differentiable.
    optimus::batched_layer_norm_backward(Tensor dy, Tensor x, Tensor? w, Tensor stats,
                            SymInt[] rows, SymInt[] widths, bool has_bias, bool need_dx,
                            bool need_dw, bool need_db) -> (Tensor dx, Tensor dw, Tensor db)

The forward ops have autograd registered (``register_autograd``) through the backward ops, and
fake implementations, so ``torch.compile(fullgraph=True)`` traces them (Inductor treats them as
opaque extern kernels).  Their implementation is the Triton kernels for CUDA tensors (or CPU
tensors under ``TRITON_INTERPRET=1``) and the plain-torch code of ``reference.py`` otherwise.

The user-facing ``grouped_linear`` / ``batched_layer_norm`` take lists and return lists:

* under tracing (dynamo, make_fx, fake tensors) they pack, call the op, and split: that is the
  graph the horizontal rules produce;
* in eager mode with Triton available they skip the dispatcher and the packing copies: an
  ``autograd.Function`` launches the same kernels with offsets taken from the members' own
  storage (one small table copy per call);
* otherwise (CPU, no Triton, float64) a loop of ``F.linear`` / ``F.layer_norm``.
"""

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from . import reference as ref
from ._common import NEEDS_PREACT, USES_OUTPUT, activation_code, triton_module, use_triton

_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ALLOWED_DTYPES = _TRITON_DTYPES + (torch.float64,)
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


_MODS = {}


def _glk():
    m = _MODS.get("gl")
    if m is None:
        m = _MODS["gl"] = triton_module("grouped_linear_kernel")
    return m


def _lnk():
    m = _MODS.get("ln")
    if m is None:
        m = _MODS["ln"] = triton_module("batched_layer_norm_kernel")
    return m


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------
def _check_seq(fn, name, seq):
    if isinstance(seq, Tensor) or not isinstance(seq, (list, tuple)):
        raise TypeError(f"{fn}: {name} must be a list or tuple of tensors, got {type(seq).__name__}")


def _check_tensor(fn, name, t, dtype, device):
    if not isinstance(t, Tensor):
        raise TypeError(f"{fn}: {name} is a {type(t).__name__}, not a tensor")
    if t.dtype != dtype:
        raise TypeError(f"{fn}: {name} has dtype {t.dtype} but xs[0] has dtype {dtype}; "
                        f"all members must share one dtype")
    if t.device != device:
        raise ValueError(f"{fn}: {name} is on device {t.device} but xs[0] is on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{fn}: {name} is not contiguous (shape {tuple(t.shape)}, stride {t.stride()}); "
                         f"call .contiguous() on it first")


def _check_first(fn, xs):
    if len(xs) == 0:
        raise ValueError(f"{fn}: empty list of inputs (xs); need at least one member")
    x0 = xs[0]
    if not isinstance(x0, Tensor):
        raise TypeError(f"{fn}: xs[0] is a {type(x0).__name__}, not a tensor")
    if x0.dtype not in _ALLOWED_DTYPES:
        raise TypeError(f"{fn}: xs[0] has dtype {x0.dtype}; supported dtypes are float16, bfloat16, float32 "
                        f"(and float64 on the plain-torch path)")
    return x0.dtype, x0.device


def _validate_gl(xs, weights, biases):
    fn = "grouped_linear"
    _check_seq(fn, "xs", xs)
    _check_seq(fn, "weights", weights)
    dtype, device = _check_first(fn, xs)
    if len(weights) != len(xs):
        raise ValueError(f"{fn}: got {len(xs)} inputs but {len(weights)} weights")
    if biases is not None:
        _check_seq(fn, "biases", biases)
        if len(biases) != len(xs):
            raise ValueError(f"{fn}: got {len(xs)} inputs but {len(biases)} biases")
    if _gl_fast_ok(xs, weights, biases, dtype, device):
        return dtype, device
    for i in range(len(xs)):
        x, w = xs[i], weights[i]
        _check_tensor(fn, f"xs[{i}]", x, dtype, device)
        _check_tensor(fn, f"weights[{i}]", w, dtype, device)
        if x.dim() < 1:
            raise ValueError(f"{fn}: xs[{i}] is 0-dimensional; inputs need a feature (last) dimension")
        if w.dim() != 2:
            raise ValueError(f"{fn}: weights[{i}] must be 2-D (out_features, in_features), "
                             f"got shape {tuple(w.shape)}")
        if x.shape[-1] != w.shape[1]:
            raise ValueError(f"{fn}: member {i}: xs[{i}] has {x.shape[-1]} input features (shape "
                             f"{tuple(x.shape)}) but weights[{i}] has shape {tuple(w.shape)}, which expects "
                             f"{w.shape[1]}")
        if biases is not None and biases[i] is not None:
            b = biases[i]
            _check_tensor(fn, f"biases[{i}]", b, dtype, device)
            if b.dim() != 1 or b.shape[0] != w.shape[0]:
                raise ValueError(f"{fn}: member {i}: biases[{i}] has shape {tuple(b.shape)} but weights[{i}] "
                                 f"has {w.shape[0]} output features")
    return dtype, device


def _dev_key(t):
    return (t.get_device(), t.is_cuda, t.is_meta)


def _gl_fast_ok(xs, weights, biases, dtype, device) -> bool:
    """Cheap all-members check; on failure the caller re-checks member by member for the message."""
    if len(weights) != len(xs):
        return False
    dev = _dev_key(xs[0])
    try:
        for x, w in zip(xs, weights):
            if (x.dtype is not dtype or w.dtype is not dtype or _dev_key(x) != dev or _dev_key(w) != dev
                    or w.dim() != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1]
                    or not x.is_contiguous() or not w.is_contiguous()):
                return False
        if biases is not None:
            for b, w in zip(biases, weights):
                if b is not None and (b.dtype is not dtype or _dev_key(b) != dev or b.dim() != 1
                                      or b.shape[0] != w.shape[0] or not b.is_contiguous()):
                    return False
    except (AttributeError, TypeError):
        return False
    return True


def _ln_fast_ok(xs, weights, biases, dtype) -> bool:
    dev = _dev_key(xs[0])
    try:
        for x in xs:
            if x.dtype is not dtype or _dev_key(x) != dev or x.dim() < 1 or not x.is_contiguous():
                return False
        for seq in (weights, biases):
            if seq is not None:
                for p, x in zip(seq, xs):
                    if p is not None and (p.dtype is not dtype or _dev_key(p) != dev or p.dim() != 1
                                          or p.shape[0] != x.shape[-1] or not p.is_contiguous()):
                        return False
    except (AttributeError, TypeError):
        return False
    return True


def _validate_ln(xs, weights, biases, eps):
    fn = "batched_layer_norm"
    _check_seq(fn, "xs", xs)
    dtype, device = _check_first(fn, xs)
    for name, seq in (("weights", weights), ("biases", biases)):
        if seq is not None:
            _check_seq(fn, name, seq)
            if len(seq) != len(xs):
                raise ValueError(f"{fn}: got {len(xs)} inputs but {len(seq)} {name}")
    if not isinstance(eps, (float, int)) or isinstance(eps, bool):
        raise TypeError(f"{fn}: eps must be a float, got {type(eps).__name__}")
    if _ln_fast_ok(xs, weights, biases, dtype):
        return dtype, device
    for i in range(len(xs)):
        x = xs[i]
        _check_tensor(fn, f"xs[{i}]", x, dtype, device)
        if x.dim() < 1:
            raise ValueError(f"{fn}: xs[{i}] is 0-dimensional; need a last dimension to normalize over")
        for name, seq in (("weights", weights), ("biases", biases)):
            if seq is not None and seq[i] is not None:
                p = seq[i]
                _check_tensor(fn, f"{name}[{i}]", p, dtype, device)
                if p.dim() != 1 or p.shape[0] != x.shape[-1]:
                    raise ValueError(f"{fn}: member {i}: {name}[{i}] has shape {tuple(p.shape)} but xs[{i}] "
                                     f"has width {x.shape[-1]} (shape {tuple(x.shape)})")
    return dtype, device


def _tracing(tensors) -> bool:
    """True when the call is being traced (dynamo, make_fx, fake/functional tensors)."""
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    if is_compiling is not None and is_compiling():
        return True
    stack_len = getattr(torch._C, "_len_torch_dispatch_stack", None)
    if stack_len is not None and stack_len() > 0:
        return True
    for t in tensors:
        if t is not None and type(t) not in _PLAIN_TYPES:
            return True
    return False


def _rows(x: Tensor):
    k = x.shape[-1]
    return x.numel() // k if k else math.prod(x.shape[:-1])


# ------------------------------------------------------------------------------------------------
# packed-argument checks (custom ops)
# ------------------------------------------------------------------------------------------------
def _check_packed(fn, name, t, numel, dtype, device):
    if t.dim() != 1:
        raise ValueError(f"{fn}: packed {name} must be 1-D, got shape {tuple(t.shape)}")
    torch._check(t.numel() == numel,
                 lambda: f"{fn}: packed {name} has {t.numel()} elements but the shape lists need {numel}")
    if t.dtype != dtype:
        raise TypeError(f"{fn}: packed {name} has dtype {t.dtype}, expected {dtype}")
    if t.device != device:
        raise ValueError(f"{fn}: packed {name} is on {t.device}, expected {device}")
    if not t.is_contiguous():
        raise ValueError(f"{fn}: packed {name} is not contiguous")


def _check_gl_packed(x, w, b, ms, ks, ns):
    fn = "optimus::grouped_linear"
    if not (len(ms) == len(ks) == len(ns)) or len(ms) == 0:
        raise ValueError(f"{fn}: ms, ks, ns must be non-empty and of equal length, got "
                         f"{len(ms)}, {len(ks)}, {len(ns)}")
    if x.dtype not in _ALLOWED_DTYPES:
        raise TypeError(f"{fn}: unsupported dtype {x.dtype}")
    _check_packed(fn, "x", x, sum(m * k for m, k in zip(ms, ks)), x.dtype, x.device)
    _check_packed(fn, "w", w, sum(n * k for n, k in zip(ns, ks)), x.dtype, x.device)
    if b is not None:
        _check_packed(fn, "b", b, sum(ns), x.dtype, x.device)


def _check_ln_packed(x, w, b, rows, widths):
    fn = "optimus::batched_layer_norm"
    if len(rows) != len(widths) or len(rows) == 0:
        raise ValueError(f"{fn}: rows and widths must be non-empty and of equal length, got "
                         f"{len(rows)}, {len(widths)}")
    if x.dtype not in _ALLOWED_DTYPES:
        raise TypeError(f"{fn}: unsupported dtype {x.dtype}")
    _check_packed(fn, "x", x, sum(r * d for r, d in zip(rows, widths)), x.dtype, x.device)
    for name, p in (("w", w), ("b", b)):
        if p is not None:
            _check_packed(fn, name, p, sum(widths), x.dtype, x.device)


def _triton_ok(t: Tensor) -> bool:
    return t.dtype in _TRITON_DTYPES and use_triton(t.device)


# ------------------------------------------------------------------------------------------------
# custom ops
# ------------------------------------------------------------------------------------------------
def _op_exists(name: str) -> bool:
    try:
        return hasattr(torch.ops.optimus, name)
    except Exception:  # pragma: no cover
        return False


def _register_ops():
    """Define the optimus:: ops once per process (the package may be imported under two names)."""
    if _op_exists("grouped_linear"):
        return

    # ---------------- grouped linear ----------------
    @torch.library.custom_op("optimus::grouped_linear", mutates_args=())
    def grouped_linear_op(x: Tensor, w: Tensor, b: Optional[Tensor], ms: List[int], ks: List[int],
                          ns: List[int], activation: str) -> Tuple[Tensor, Tensor]:
        act = activation_code(activation)
        _check_gl_packed(x, w, b, ms, ks, ns)
        if _triton_ok(x):
            return _glk().forward_packed(x, w, b, list(ms), list(ks), list(ns), act)
        return ref.grouped_linear_packed(x, w, b, ms, ks, ns, act)

    @grouped_linear_op.register_fake
    def _(x, w, b, ms, ks, ns, activation):
        act = activation_code(activation)
        _check_gl_packed(x, w, b, ms, ks, ns)
        tot_y = sum(m * n for m, n in zip(ms, ns))
        return x.new_empty(tot_y), x.new_empty(tot_y if act in NEEDS_PREACT else 0)

    @torch.library.custom_op("optimus::grouped_linear_backward", mutates_args=())
    def grouped_linear_backward_op(dy: Tensor, x: Tensor, w: Tensor, aux: Optional[Tensor], ms: List[int],
                                   ks: List[int], ns: List[int], activation: str, has_bias: bool,
                                   need_dx: bool, need_dw: bool, need_db: bool) -> Tuple[Tensor, Tensor, Tensor]:
        act = activation_code(activation)
        if _triton_ok(x):
            return _glk().backward_packed(dy.contiguous(), x, w, aux, list(ms), list(ks), list(ns), act,
                                          has_bias, need_dx, need_dw, need_db)
        return ref.grouped_linear_backward_packed(dy, x, w, aux, ms, ks, ns, act, has_bias,
                                                  need_dx, need_dw, need_db)

    @grouped_linear_backward_op.register_fake
    def _(dy, x, w, aux, ms, ks, ns, activation, has_bias, need_dx, need_dw, need_db):
        tx = sum(m * k for m, k in zip(ms, ks))
        tw = sum(n * k for n, k in zip(ns, ks))
        tb = sum(ns)
        return (x.new_empty(tx if need_dx else 0), w.new_empty(tw if need_dw else 0),
                w.new_empty(tb if (need_db and has_bias) else 0))

    def gl_setup(ctx, inputs, output):
        x, w, b, ms, ks, ns, activation = inputs
        y, pre = output
        act = activation_code(activation)
        aux = pre if act in NEEDS_PREACT else (y if act in USES_OUTPUT else None)
        ctx.save_for_backward(x, w, aux)
        ctx.gl_meta = (list(ms), list(ks), list(ns), act, b is not None)
        ctx.mark_non_differentiable(pre)

    def gl_backward(ctx, gy, gpre):
        x, w, aux = ctx.saved_tensors
        ms, ks, ns, act, has_bias = ctx.gl_meta
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        if gy is None:
            return None, None, None, None, None, None, None
        dx, dw, db = torch.ops.optimus.grouped_linear_backward(
            gy.contiguous(), x, w, aux, ms, ks, ns, act, has_bias, bool(need_dx), bool(need_dw),
            bool(need_db and has_bias))
        return (dx if need_dx else None, dw if need_dw else None, db if (need_db and has_bias) else None,
                None, None, None, None)

    grouped_linear_op.register_autograd(gl_backward, setup_context=gl_setup)

    # ---------------- batched layer norm ----------------
    @torch.library.custom_op("optimus::batched_layer_norm", mutates_args=())
    def batched_layer_norm_op(x: Tensor, w: Optional[Tensor], b: Optional[Tensor], rows: List[int],
                              widths: List[int], eps: float) -> Tuple[Tensor, Tensor]:
        _check_ln_packed(x, w, b, rows, widths)
        if _triton_ok(x):
            return _lnk().forward_packed(x, w, b, list(rows), list(widths), eps)
        return ref.batched_layer_norm_packed(x, w, b, rows, widths, eps)

    @batched_layer_norm_op.register_fake
    def _(x, w, b, rows, widths, eps):
        _check_ln_packed(x, w, b, rows, widths)
        return x.new_empty(sum(r * d for r, d in zip(rows, widths))), \
            x.new_empty(2, sum(rows), dtype=torch.float32)

    @torch.library.custom_op("optimus::batched_layer_norm_backward", mutates_args=())
    def batched_layer_norm_backward_op(dy: Tensor, x: Tensor, w: Optional[Tensor], stats: Tensor,
                                       rows: List[int], widths: List[int], has_bias: bool, need_dx: bool,
                                       need_dw: bool, need_db: bool) -> Tuple[Tensor, Tensor, Tensor]:
        if _triton_ok(x):
            return _lnk().backward_packed(dy.contiguous(), x, w, stats, list(rows), list(widths), has_bias,
                                          need_dx, need_dw, need_db)
        return ref.batched_layer_norm_backward_packed(dy, x, w, stats, rows, widths, has_bias,
                                                      need_dx, need_dw, need_db)

    @batched_layer_norm_backward_op.register_fake
    def _(dy, x, w, stats, rows, widths, has_bias, need_dx, need_dw, need_db):
        tx = sum(r * d for r, d in zip(rows, widths))
        tw = sum(widths)
        pdt = w.dtype if w is not None else x.dtype
        return (x.new_empty(tx if need_dx else 0),
                x.new_empty(tw if (need_dw and w is not None) else 0, dtype=pdt),
                x.new_empty(tw if (need_db and has_bias) else 0, dtype=pdt))

    def ln_setup(ctx, inputs, output):
        x, w, b, rows, widths, eps = inputs
        y, stats = output
        ctx.save_for_backward(x, w, stats)
        ctx.ln_meta = (list(rows), list(widths), b is not None)
        ctx.mark_non_differentiable(stats)

    def ln_backward(ctx, gy, gstats):
        x, w, stats = ctx.saved_tensors
        rows, widths, has_bias = ctx.ln_meta
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        if gy is None:
            return None, None, None, None, None, None
        dx, dw, db = torch.ops.optimus.batched_layer_norm_backward(
            gy.contiguous(), x, w, stats, rows, widths, has_bias, bool(need_dx),
            bool(need_dw and w is not None), bool(need_db and has_bias))
        return (dx if need_dx else None, dw if (need_dw and w is not None) else None,
                db if (need_db and has_bias) else None, None, None, None)

    batched_layer_norm_op.register_autograd(ln_backward, setup_context=ln_setup)


_register_ops()


# ------------------------------------------------------------------------------------------------
# packed helpers (what the horizontal rules emit)
# ------------------------------------------------------------------------------------------------
def pack(tensors: Sequence[Tensor]) -> Tensor:
    """Concatenate the flattened tensors into one 1-D buffer (the ops' packed convention)."""
    return torch.cat([t.reshape(-1) for t in tensors])


def unpack(packed: Tensor, shapes: Sequence[Sequence[int]]) -> List[Tensor]:
    """Split a packed 1-D buffer back into views of the given shapes."""
    sizes = [math.prod(s) for s in shapes]
    return [p.view(tuple(s)) for p, s in zip(torch.split(packed, sizes), shapes)]


def grouped_linear_packed(x: Tensor, w: Tensor, b: Optional[Tensor], ms: Sequence[int], ks: Sequence[int],
                          ns: Sequence[int], activation: Optional[str] = None) -> Tensor:
    """``optimus::grouped_linear`` on packed buffers; returns the packed output only."""
    return torch.ops.optimus.grouped_linear(x, w, b, list(ms), list(ks), list(ns), activation_code(activation))[0]


def batched_layer_norm_packed(x: Tensor, w: Optional[Tensor], b: Optional[Tensor], rows: Sequence[int],
                              widths: Sequence[int], eps: float = 1e-5) -> Tensor:
    """``optimus::batched_layer_norm`` on packed buffers; returns the packed output only."""
    return torch.ops.optimus.batched_layer_norm(x, w, b, list(rows), list(widths), float(eps))[0]


# ------------------------------------------------------------------------------------------------
# eager fast path: autograd.Function launching the kernels on the members' own storage
# ------------------------------------------------------------------------------------------------
# Inputs and outputs are separate tensors (the outputs are not views, so in-place ops on them stay
# legal).  Every kernel reads them where they live: a member's offset is its pointer difference to
# a base member of the same list, written into the int64 table that goes to the device with one
# asynchronous copy per pass.  Internal buffers (pre-activation, dW/db workspace) are packed.
_ESIZE = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}


def _deltas(ts: Sequence[Tensor], esize: int):
    """(index of the base member, element offsets of every member relative to it, OR of pointers).

    The base is the first non-empty member; offsets of empty members are never dereferenced."""
    pl = [t.data_ptr() for t in ts]
    bi = 0
    if ts[0].numel() == 0:
        for i, t in enumerate(ts):
            if t.numel():
                bi = i
                break
    por = 0
    for p in pl:
        por |= p
    return bi, (np.array(pl, dtype=np.int64) - pl[bi]) // esize, por


def _fill_missing(params, sizes, like: Tensor, value: float):
    """List of params with None members replaced (ones / zeros); None if all are None."""
    if params is None or all(p is None for p in params):
        return None
    return [p if p is not None else torch.full((n,), value, dtype=like.dtype, device=like.device)
            for p, n in zip(params, sizes)]


def _to_device(arr: np.ndarray, device: torch.device) -> Tensor:
    """Host table -> device, asynchronously: staged through (cached) pinned memory, so the copy is
    ordered on the current stream and the host never waits for the GPU."""
    t = torch.from_numpy(arr)
    if device.type == "cpu":
        return t
    pinned = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    pinned.copy_(t)
    return pinned.to(device, non_blocking=True)


def _views(packed: Tensor, sizes, shapes) -> List[Tensor]:
    return [p.view(s) for p, s in zip(packed.split_with_sizes(sizes), shapes)]


_C = None


def _cols():
    global _C
    if _C is None:
        _C = _glk().COL
    return _C


class _GroupedLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, meta, *tensors):
        G, act, bias_idx, sig, need_grad = meta
        K = _glk()
        C = _cols()
        xs, ws = tensors[:G], tensors[G:2 * G]
        x0 = xs[0]
        dt, dev = x0.dtype, x0.device
        es = _ESIZE[dt]
        ys = [torch.empty(tuple(x.shape[:-1]) + (n,), dtype=dt, device=dev) for x, n in zip(xs, sig.ns_list)]
        z = torch.empty(sig.tot_y, dtype=dt, device=dev) if act in NEEDS_PREACT else None
        bix, dx_, por = _deltas(xs, es)
        biw, dw_, p2 = _deltas(ws, es)
        biy, dy_, p3 = _deltas(ys, es)
        por |= p2 | p3 | (z.data_ptr() if z is not None else 0)
        o0, o1, o2 = sig.orders
        T = sig.eager_base[:3 if need_grad else 1].copy()
        T[0, :, C["X"]] = dx_[o0]
        T[0, :, C["W"]] = dw_[o0]
        T[0, :, C["Y"]] = dy_[o0]
        T[0, :, C["Z"]] = sig.off_y[o0]
        bb = None
        if bias_idx:
            bl = [None] * G
            for j, i in enumerate(bias_idx):
                bl[i] = tensors[2 * G + j]
            bs = _fill_missing(bl, sig.ns_list, x0, 0.0)
            bib, db_, _ = _deltas(bs, es)
            bb = bs[bib]
            T[0, :, C["B"]] = db_[o0]
        align = K.align_from_or(sig, dt, por)
        K.launch_forward(sig, _to_device(T[0], dev), xs[bix], ws[biw], bb, ys[biy], z, act, align)
        if need_grad:
            # backward tables, completed with the dy / dx offsets once the gradients exist
            zcol = dy_ if act in USES_OUTPUT else sig.off_y
            T[1, :, C["W"]] = dw_[o1]
            T[1, :, C["Z"]] = zcol[o1]
            T[2, :, C["X"]] = dx_[o2]
            T[2, :, C["Z"]] = zcol[o2]
            if act in NEEDS_PREACT:
                aux, auxi = [z], 0
            elif act in USES_OUTPUT:
                aux, auxi = ys, biy
            else:
                aux, auxi = [], -1
            ctx.save_for_backward(*xs, *ws, *aux)
            ctx.gl = (G, act, bias_idx, sig, T[1:], align, bix, biw, auxi)
        if G == 1:
            return ys[0]
        return tuple(ys)

    @staticmethod
    def backward(ctx, *gys):
        G, act, bias_idx, sig, T, align, bix, biw, auxi = ctx.gl
        K = _glk()
        C = _cols()
        saved = ctx.saved_tensors
        xs, ws = saved[:G], saved[G:2 * G]
        aux = saved[2 * G + auxi] if auxi >= 0 else None
        needs = ctx.needs_input_grad
        need_dx = any(needs[1:1 + G])
        need_dw = any(needs[1 + G:1 + 2 * G])
        need_db = any(needs[1 + 2 * G:])
        x0 = xs[0]
        dt, dev = x0.dtype, x0.device
        es = _ESIZE[dt]
        gys = [g.contiguous() for g in gys]
        big, dg_, por = _deltas(gys, es)
        _, o1, o2 = sig.orders
        T[0, :, C["DY"]] = dg_[o1]
        T[1, :, C["DY"]] = dg_[o2]
        dxs = None
        if need_dx:
            dxs = [torch.empty_like(x) for x in xs]
            bidx, ddx_, p2 = _deltas(dxs, es)
            por |= p2
            T[0, :, C["DX"]] = ddx_[o1]
        if por % 16:
            align = 1
        tabs = _to_device(T, dev)
        if need_dx:
            K.launch_dx(sig, tabs[0], gys[big], aux, ws[biw], dxs[bidx], act, align)
        dws = dbs = None
        if need_dw or need_db:
            wsp = torch.zeros(sig.tot_w + sig.tot_b, dtype=torch.float32, device=dev)
            K.launch_dw(sig, tabs[1], gys[big], aux, xs[bix], wsp, bool(bias_idx) and need_db, act, align)
            if dt != torch.float32:
                wsp = wsp.to(dt)
            if need_dw:
                dws = _views(wsp[: sig.tot_w], sig.w_sizes, [w.shape for w in ws])
            if need_db and bias_idx:
                parts = wsp[sig.tot_w:].split_with_sizes(sig.ns_list)
                dbs = [parts[i] for i in bias_idx]
        out = [None]
        out += dxs if dxs is not None else [None] * G
        out += dws if dws is not None else [None] * G
        out += dbs if dbs is not None else [None] * len(bias_idx)
        return tuple(out)


class _BatchedLayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, meta, *tensors):
        G, eps, w_idx, b_idx, sig, need_grad = meta
        K = _lnk()
        C = K.COL
        xs = tensors[:G]
        x0 = xs[0]
        dt, dev = x0.dtype, x0.device
        es = _ESIZE[dt]
        ys = [torch.empty_like(x) for x in xs]
        stats = torch.empty(2, sig.tot_rows, dtype=torch.float32, device=dev)

        def full(idx, start, value):
            if not idx:
                return None
            lst = [None] * G
            for j, i in enumerate(idx):
                lst[i] = tensors[start + j]
            return _fill_missing(lst, sig.widths_list, x0, value)

        ws = full(w_idx, G, 1.0)
        bs = full(b_idx, G + len(w_idx), 0.0)
        bix, dx_, por = _deltas(xs, es)
        biy, dy_, p2 = _deltas(ys, es)
        T = sig.template.copy()
        T[:, C["X"]] = dx_
        T[:, C["Y"]] = dy_
        wb = bb = None
        biw = 0
        if ws is not None:
            biw, dw_, _ = _deltas(ws, es)
            wb = ws[biw]
            T[:, C["W"]] = dw_
        if bs is not None:
            bib, db_, _ = _deltas(bs, es)
            bb = bs[bib]
            T[:, C["B"]] = db_
        align = K.alignment(sig, dt, por | p2)
        K.launch_forward(sig, _to_device(T, dev), xs[bix], ys[biy], wb, bb, stats, eps, align)
        if need_grad:
            ctx.save_for_backward(*xs, *(ws if ws is not None else []), stats)
            ctx.ln = (G, w_idx, b_idx, sig, ws is not None, T, bix, biw)
        if G == 1:
            return ys[0]
        return tuple(ys)

    @staticmethod
    def backward(ctx, *gys):
        G, w_idx, b_idx, sig, has_w, T, bix, biw = ctx.ln
        K = _lnk()
        C = K.COL
        saved = ctx.saved_tensors
        xs = saved[:G]
        ws = saved[G:2 * G] if has_w else None
        stats = saved[-1]
        needs = ctx.needs_input_grad
        need_dx = any(needs[1:1 + G])
        need_dw = any(needs[1 + G:1 + G + len(w_idx)])
        need_db = any(needs[1 + G + len(w_idx):])
        x0 = xs[0]
        dt, dev = x0.dtype, x0.device
        es = _ESIZE[dt]
        gys = [g.contiguous() for g in gys]
        big, dg_, por = _deltas(gys, es)
        _, _, p2 = _deltas(xs, es)
        por |= p2
        T[:, C["DY"]] = dg_
        T[:, C["DW"]] = sig.off_w
        T[:, C["DB"]] = sig.off_w
        dxs = None
        bidx = 0
        if need_dx:
            dxs = [torch.empty_like(x) for x in xs]
            bidx, ddx_, p3 = _deltas(dxs, es)
            por |= p3
            T[:, C["DX"]] = ddx_
        align = K.alignment(sig, dt, por)
        dwp = torch.empty(sig.tot_w if has_w else 0, dtype=dt, device=dev)
        has_b = bool(b_idx) and need_db
        dbp = torch.empty(sig.tot_w if has_b else 0, dtype=dt, device=dev)
        K.launch_backward(sig, _to_device(T, dev), xs[bix], gys[big], dxs[bidx] if need_dx else None,
                          ws[biw] if has_w else None, stats, dwp, dbp, has_b, align)
        out = [None]
        out += dxs if dxs is not None else [None] * G
        if need_dw and has_w:
            parts = dwp.split_with_sizes(sig.widths_list)
            out += [parts[i] for i in w_idx]
        else:
            out += [None] * len(w_idx)
        if has_b:
            parts = dbp.split_with_sizes(sig.widths_list)
            out += [parts[i] for i in b_idx]
        else:
            out += [None] * len(b_idx)
        return tuple(out)


# ------------------------------------------------------------------------------------------------
# public functions
# ------------------------------------------------------------------------------------------------
def _gl_via_op(xs, weights, biases, act):
    ks = [x.shape[-1] for x in xs]
    ns = [w.shape[0] for w in weights]
    ms = [_rows(x) for x in xs]
    xp = pack(xs)
    wp = pack(weights)
    bl = _fill_missing(biases, ns, xs[0], 0.0) if biases is not None else None
    bp = torch.cat(list(bl)) if bl is not None else None
    y, _ = torch.ops.optimus.grouped_linear(xp, wp, bp, ms, ks, ns, act)
    outs = torch.split(y, [m * n for m, n in zip(ms, ns)])
    return [o.view(tuple(x.shape[:-1]) + (n,)) for o, x, n in zip(outs, xs, ns)]


def _ln_via_op(xs, weights, biases, eps):
    widths = [x.shape[-1] for x in xs]
    rows = [_rows(x) for x in xs]
    xp = pack(xs)
    wl = _fill_missing(weights, widths, xs[0], 1.0) if weights is not None else None
    bl = _fill_missing(biases, widths, xs[0], 0.0) if biases is not None else None
    wp = torch.cat(list(wl)) if wl is not None else None
    bp = torch.cat(list(bl)) if bl is not None else None
    y, _ = torch.ops.optimus.batched_layer_norm(xp, wp, bp, rows, widths, float(eps))
    outs = torch.split(y, [r * d for r, d in zip(rows, widths)])
    return [o.view(x.shape) for o, x in zip(outs, xs)]


def grouped_linear(xs: Sequence[Tensor], weights: Sequence[Tensor],
                   biases: Optional[Sequence[Optional[Tensor]]] = None,
                   activation: Optional[str] = None) -> List[Tensor]:
    """``[act(F.linear(x, w, b)) for x, w, b in zip(xs, weights, biases)]`` as one grouped kernel.

    xs[g]: (..., K_g); weights[g]: (N_g, K_g) (``nn.Linear.weight`` layout); biases: None or a list
    whose entries are (N_g,) tensors or None; activation: None, "relu", "gelu", "silu", "sigmoid",
    "tanh" (fused into the kernel epilogue).  All members share one dtype (float16, bfloat16,
    float32; float64 on the plain-torch path) and one device, and must be contiguous.  Returns the
    list of (..., N_g) outputs; differentiable with respect to xs, weights and biases.
    """
    act = activation_code(activation)
    _validate_gl(xs, weights, biases)
    tensors = list(xs) + list(weights) + (list(biases) if biases is not None else [])
    if _tracing(tensors):
        return _gl_via_op(xs, weights, biases, act)
    x0 = xs[0]
    if _triton_ok(x0):
        G = len(xs)
        ks = [w.shape[1] for w in weights]
        ns = [w.shape[0] for w in weights]
        ms = [_rows(x) for x in xs]
        sig = _glk().signature(ms, ks, ns)
        bias_idx = tuple(i for i, b in enumerate(biases) if b is not None) if biases is not None else ()
        present = [biases[i] for i in bias_idx]
        need_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
        out = _GroupedLinearFn.apply((G, act, bias_idx, sig, need_grad), *xs, *weights, *present)
        return [out] if G == 1 else list(out)
    return ref.grouped_linear_list(xs, weights, biases, act)


def batched_layer_norm(xs: Sequence[Tensor], weights: Optional[Sequence[Optional[Tensor]]] = None,
                       biases: Optional[Sequence[Optional[Tensor]]] = None, eps: float = 1e-5) -> List[Tensor]:
    """``[F.layer_norm(x, (x.shape[-1],), w, b, eps) for ...]`` as one batched kernel.

    Each xs[g] (..., D_g) is normalised over its last dim; weights / biases: None or lists of
    (D_g,) tensors (entries may be None).  Statistics in fp32.  Same dtype / device / contiguity
    rules as :func:`grouped_linear`.  Returns the list of outputs, differentiable.
    """
    _validate_ln(xs, weights, biases, eps)
    tensors = list(xs) + (list(weights) if weights is not None else []) + \
        (list(biases) if biases is not None else [])
    if _tracing(tensors):
        return _ln_via_op(xs, weights, biases, eps)
    x0 = xs[0]
    if _triton_ok(x0):
        G = len(xs)
        widths = [x.shape[-1] for x in xs]
        rows = [_rows(x) for x in xs]
        sig = _lnk().signature(rows, widths, x0.device)
        w_idx = tuple(i for i, w in enumerate(weights) if w is not None) if weights is not None else ()
        b_idx = tuple(i for i, b in enumerate(biases) if b is not None) if biases is not None else ()
        need_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
        out = _BatchedLayerNormFn.apply((G, float(eps), w_idx, b_idx, sig, need_grad), *xs,
                                        *[weights[i] for i in w_idx], *[biases[i] for i in b_idx])
        return [out] if G == 1 else list(out)
    return ref.batched_layer_norm_list(xs, weights, biases, eps)
