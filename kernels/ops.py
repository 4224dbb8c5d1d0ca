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
  storage; validation and shape work are cached per call signature and the offset tables on the
  device per (signature, pointers), so a steady-state step does O(1) Python work plus one
  C++-level call per member tensor and uploads nothing (see the eager-path section below);
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


def _fill_missing(params, sizes, like: Tensor, value: float):
    """List of params with None members replaced (ones / zeros); None if all are None."""
    if params is None or all(p is None for p in params):
        return None
    return [p if p is not None else torch.full((n,), value, dtype=like.dtype, device=like.device)
            for p, n in zip(params, sizes)]


# ------------------------------------------------------------------------------------------------
# eager fast path: autograd.Function launching the kernels on the members' own storage
# ------------------------------------------------------------------------------------------------
# Per call the eager path does O(1) Python work plus one C++-level call per member tensor:
#
# * a *plan* per call signature (activation, grad mode, and per tensor: type, shape, stride,
#   dtype, device, requires_grad) caches everything that depends only on it: validation (a cached
#   plan means the same metadata already passed every check), the kernel signature (tile counts,
#   processing orders, packed dW/db offsets), output shapes, the base member of every operand;
# * the int64 tables the kernels read encode the pointer offsets of the members relative to a base
#   member: they are a pure function of (plan, data pointers), cached on the device by exactly
#   that key (``_devtables.TableCache``).  The caching allocator gives a training step the same
#   addresses every step, so steady-state steps upload nothing; a miss is one asynchronous copy;
# * launches bypass the autotuner once it has chosen (``grouped_linear_kernel._CHOSEN``).
#
# Outputs are separate allocations (not views of one buffer), so in-place ops on them stay legal,
# as with a loop of F.linear.  Nothing here synchronises with the device (no .item(), no .cpu(),
# no pageable copies); tests check that with the interpreter and with mocks.
import itertools as _it

from . import _devtables as _dt

_ESIZE = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}
_TABLES = _dt.TableCache()
_PLANS: dict = {}
_PLAN_CAP = 1024
_plan_ids = _it.count(1)
_SEQ = (list, tuple)


def eager_cache_info() -> dict:
    """Sizes of the eager-path caches and the table upload counters (for tests and benchmarks)."""
    return dict(plans=len(_PLANS), tables=len(_TABLES), **_dt.stats())


def clear_eager_caches() -> None:
    _PLANS.clear()
    _TABLES.clear()


def set_table_cache(enabled: bool) -> None:
    """Turn the device-table cache off (every call uploads its tables; for benchmarks / tests)."""
    _TABLES.enabled = bool(enabled)
    if not enabled:
        _TABLES.clear()


def _tmeta(t):
    return None if t is None else (type(t), t.shape, t.stride(), t.dtype, t.device, t.requires_grad)


def _compiling_or_dispatching() -> bool:
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    if is_compiling is not None and is_compiling():
        return True
    stack_len = getattr(torch._C, "_len_torch_dispatch_stack", None)
    return stack_len is not None and stack_len() > 0


def _first_nonempty(sizes) -> int:
    for i, s in enumerate(sizes):
        if s:
            return i
    return 0


def _put_plan(key, plan):
    if len(_PLANS) >= _PLAN_CAP:
        _PLANS.clear()
    _PLANS[key] = plan


def _offsets(ptrs, base: int, es: int) -> np.ndarray:
    return (np.asarray(ptrs, dtype=np.int64) - np.int64(base)) // es


def _or(ptrs) -> int:
    acc = 0
    for p in ptrs:
        acc |= p
    return acc


class _GLPlan:
    """Shape-dependent facts of one grouped-linear call signature (see the section comment)."""

    def __init__(self, xs, weights, biases, act, need_grad):
        K = _glk()
        G = len(xs)
        x0 = xs[0]
        self.id = next(_plan_ids)
        self.G, self.act, self.need_grad = G, act, need_grad
        self.dt, self.dev = x0.dtype, x0.device
        self.es = _ESIZE[self.dt]
        ks = [w.shape[1] for w in weights]
        ns = [w.shape[0] for w in weights]
        ms = [_rows(x) for x in xs]
        self.sig = sig = K.signature(ms, ks, ns)
        self.bias_idx = tuple(i for i, b in enumerate(biases) if b is not None) if biases is not None else ()
        self.nb = len(self.bias_idx)
        self.partial_bias = 0 < self.nb < G
        self.y_shapes = [tuple(x.shape[:-1]) + (n,) for x, n in zip(xs, ns)]
        self.x_shapes = [tuple(x.shape) for x in xs]
        self.w_shapes = [tuple(w.shape) for w in weights]
        self.preact = act in NEEDS_PREACT
        self.uses_output = act in USES_OUTPUT
        self.bx = _first_nonempty(sig.x_sizes)
        self.bw = _first_nonempty(sig.w_sizes)
        self.by = _first_nonempty(sig.y_sizes)
        bsz = [ns[i] for i in self.bias_idx]
        self.bb = _first_nonempty(bsz)  # index among the present biases
        self.bb_in_zero = self.partial_bias and not any(bsz)
        self.max_n = max(ns) if ns else 0
        self._zero = None
        self.C = K.COL

    def zero_bias(self, capture: bool):
        """Zeros standing in for the missing biases (cached; a fresh one while capturing)."""
        if self._zero is not None:
            return self._zero
        z = torch.zeros(max(1, self.max_n), dtype=self.dt, device=self.dev)
        if not capture:
            self._zero = z
        return z

    # pointer layout of a forward call: ts (x * G, w * G, present biases), ys (G), [z], [zero]
    def fwd_entry(self, ptrs, capture):
        G, C, sig, es = self.G, self.C, self.sig, self.es
        o0, o1, o2 = sig.orders
        px, pw = ptrs[:G], ptrs[G:2 * G]
        pb = ptrs[2 * G:2 * G + self.nb]
        py = ptrs[2 * G + self.nb:3 * G + self.nb]
        rest = ptrs[3 * G + self.nb:]
        pz = rest[0] if self.preact else 0
        offx = _offsets(px, px[self.bx], es)
        offw = _offsets(pw, pw[self.bw], es)
        offy = _offsets(py, py[self.by], es)
        T = sig.eager_base[0].copy()
        T[:, C["X"]] = offx[o0]
        T[:, C["W"]] = offw[o0]
        T[:, C["Y"]] = offy[o0]
        T[:, C["Z"]] = sig.off_y[o0]
        bias_base = -1  # index into ts of the bias base tensor; -2: the zero buffer
        if self.nb:
            zero_ptr = rest[-1] if self.partial_bias else 0
            full = np.full(G, zero_ptr, dtype=np.int64)
            for j, i in enumerate(self.bias_idx):
                full[i] = pb[j]
            if self.bb_in_zero:
                base, bias_base = zero_ptr, -2
            else:
                base, bias_base = pb[self.bb], 2 * G + self.bb
            T[:, C["B"]] = _offsets(full, base, es)[o0]
        align = _glk().align_from_or(sig, self.dt, _or(px) | _or(pw) | _or(py) | pz)
        return _dt.upload(T, self.dev, capture), align, bias_base


class _GroupedLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, *ts):
        G = plan.G
        K = _glk()
        dt, dev = plan.dt, plan.dev
        ys = [torch.empty(s, dtype=dt, device=dev) for s in plan.y_shapes]
        z = torch.empty(plan.sig.tot_y, dtype=dt, device=dev) if plan.preact else None
        cap = _dt.capturing(dev)
        zero = plan.zero_bias(cap) if plan.partial_bias else None
        ptrs = [t.data_ptr() for t in ts]
        ptrs += [y.data_ptr() for y in ys]
        if z is not None:
            ptrs.append(z.data_ptr())
        if zero is not None:
            ptrs.append(zero.data_ptr())
        key = (plan.id, _dt.stream_key(dev), *ptrs)
        ent = None if cap else _TABLES.get(key)
        if ent is None:
            ent = plan.fwd_entry(ptrs, cap)
            if not cap:
                _TABLES.put(key, ent)
        tab, align, bias_base = ent
        b = None if bias_base == -1 else (zero if bias_base == -2 else ts[bias_base])
        K.launch_forward(plan.sig, tab, ts[plan.bx], ts[G + plan.bw], b, ys[plan.by], z, plan.act, align)
        if plan.need_grad:
            if plan.preact:
                ctx.save_for_backward(*ts[:2 * G], z)
            elif plan.uses_output:
                ctx.save_for_backward(*ts[:2 * G], *ys)
            else:
                ctx.save_for_backward(*ts[:2 * G])
            ctx.gl = (plan, ptrs, align)
        if G == 1:
            return ys[0]
        return tuple(ys)

    @staticmethod
    def backward(ctx, *gys):
        plan, fptrs, falign = ctx.gl
        G, C, sig, es = plan.G, plan.C, plan.sig, plan.es
        K = _glk()
        saved = ctx.saved_tensors
        needs = ctx.needs_input_grad
        need_dx = any(needs[1:1 + G])
        need_dw = any(needs[1 + G:1 + 2 * G])
        need_db = plan.nb > 0 and any(needs[1 + 2 * G:])
        dt, dev = plan.dt, plan.dev
        gys = [g.contiguous() for g in gys]
        dxs = [torch.empty(s, dtype=dt, device=dev) for s in plan.x_shapes] if need_dx else None
        cap = _dt.capturing(dev)
        pg = [g.data_ptr() for g in gys]
        pdx = [d.data_ptr() for d in dxs] if need_dx else []
        key = (plan.id, _dt.stream_key(dev), need_dx, need_dw or need_db, *fptrs, *pg, *pdx)
        ent = None if cap else _TABLES.get(key)
        if ent is None:
            o1, o2 = sig.orders[1], sig.orders[2]
            offg = _offsets(pg, pg[plan.by], es)
            nb = plan.nb
            px, pw = fptrs[:G], fptrs[G:2 * G]
            py = fptrs[2 * G + nb:3 * G + nb]
            offx = _offsets(px, px[plan.bx], es)
            offw = _offsets(pw, pw[plan.bw], es)
            aux_off = _offsets(py, py[plan.by], es) if plan.uses_output else sig.off_y
            T = sig.eager_base[1:].copy()
            T[0, :, C["W"]] = offw[o1]
            T[0, :, C["Z"]] = aux_off[o1]
            T[0, :, C["DY"]] = offg[o1]
            T[1, :, C["X"]] = offx[o2]
            T[1, :, C["Z"]] = aux_off[o2]
            T[1, :, C["DY"]] = offg[o2]
            por = _or(pg)
            if need_dx:
                T[0, :, C["DX"]] = _offsets(pdx, pdx[plan.bx], es)[o1]
                por |= _or(pdx)
            align = falign if por % 16 == 0 else 1
            ent = (_dt.upload(T, dev, cap), align)
            if not cap:
                _TABLES.put(key, ent)
        tabs, align = ent
        if plan.preact:
            aux = saved[2 * G]
        elif plan.uses_output:
            aux = saved[2 * G + plan.by]
        else:
            aux = None
        xs, ws = saved[:G], saved[G:2 * G]
        if need_dx:
            K.launch_dx(sig, tabs[0], gys[plan.by], aux, ws[plan.bw], dxs[plan.bx], plan.act, align)
        dws = dbs = None
        if need_dw or need_db:
            wsp = torch.zeros(sig.tot_w + sig.tot_b, dtype=torch.float32, device=dev)
            K.launch_dw(sig, tabs[1], gys[plan.by], aux, xs[plan.bx], wsp, need_db, plan.act, align)
            if dt != torch.float32:
                wsp = wsp.to(dt)
            if need_dw:
                dws = [p.view(s) for p, s in zip(wsp[: sig.tot_w].split_with_sizes(sig.w_sizes), plan.w_shapes)]
            if need_db:
                parts = wsp[sig.tot_w:].split_with_sizes(sig.ns_list)
                dbs = [parts[i] for i in plan.bias_idx]
        out = [None]
        out += dxs if dxs is not None else [None] * G
        out += dws if dws is not None else [None] * G
        out += dbs if dbs is not None else [None] * plan.nb
        return tuple(out)


def _fast_apply(fn_cls):
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


def _gl_eager(xs, weights, biases, act):
    """The eager Triton path, or None when the call has to take another path."""
    if _compiling_or_dispatching() or type(xs) not in _SEQ or type(weights) not in _SEQ or not xs:
        return None
    x0 = xs[0]
    if type(x0) not in _PLAIN_TYPES or not _triton_ok(x0):
        return None
    if biases is not None and type(biases) not in _SEQ:
        return None
    ts = [*xs, *weights] if biases is None else [*xs, *weights, *biases]
    grad = torch.is_grad_enabled()
    try:
        key = (act, grad, len(xs), len(weights),
               tuple([(type(t), t.shape, t.stride(), t.dtype, t.device, t.requires_grad) for t in (*xs, *weights)]),
               None if biases is None else tuple([_tmeta(b) for b in biases]))
    except (AttributeError, TypeError):
        return None  # not tensors: the general path raises the proper error
    plan = _PLANS.get(key)
    if plan is None:
        _validate_gl(xs, weights, biases)
        if any(t is not None and type(t) not in _PLAIN_TYPES for t in ts):
            return None  # tensor subclasses (fake / functional tensors): traced path
        need_grad = grad and any(t is not None and t.requires_grad for t in ts)
        plan = _GLPlan(xs, weights, biases, act, need_grad)
        _put_plan(key, plan)
    if plan.nb == len(ts) - 2 * plan.G:
        out = _gl_apply(plan, *ts)
    else:
        out = _gl_apply(plan, *xs, *weights, *[biases[i] for i in plan.bias_idx])
    return [out] if plan.G == 1 else list(out)


class _LNPlan:
    def __init__(self, xs, weights, biases, eps, need_grad):
        K = _lnk()
        G = len(xs)
        x0 = xs[0]
        self.id = next(_plan_ids)
        self.G, self.eps, self.need_grad = G, float(eps), need_grad
        self.dt, self.dev = x0.dtype, x0.device
        self.es = _ESIZE[self.dt]
        widths = [x.shape[-1] for x in xs]
        rows = [_rows(x) for x in xs]
        self.sig = sig = K.signature(rows, widths, x0.device)
        self.w_idx = tuple(i for i, w in enumerate(weights) if w is not None) if weights is not None else ()
        self.b_idx = tuple(i for i, b in enumerate(biases) if b is not None) if biases is not None else ()
        self.nw, self.nb = len(self.w_idx), len(self.b_idx)
        self.shapes = [tuple(x.shape) for x in xs]
        self.bx = _first_nonempty(sig.x_sizes)
        self.max_d = max(widths) if widths else 0
        self._fill = {}
        self.C = K.COL

    def fill(self, value: float, capture: bool):
        """ones (missing weights) / zeros (missing biases), cached (fresh while capturing)."""
        t = self._fill.get(value)
        if t is None:
            t = torch.full((max(1, self.max_d),), value, dtype=self.dt, device=self.dev)
            if not capture:
                self._fill[value] = t
        return t

    def _param_col(self, ptrs, idx, fill_ptr, T, col):
        """Offsets of one optional parameter list; returns the index (into idx) of the base, or -2
        when the base is the fill buffer."""
        G = self.G
        full = np.full(G, fill_ptr, dtype=np.int64)
        for j, i in enumerate(idx):
            full[i] = ptrs[j]
        widths = self.sig.widths_list
        bj = -2
        for j, i in enumerate(idx):
            if widths[i]:
                bj = j
                break
        base = ptrs[bj] if bj >= 0 else fill_ptr
        T[:, self.C[col]] = _offsets(full, base, self.es)
        return bj


class _BatchedLayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, *ts):
        G, nw, nb = plan.G, plan.nw, plan.nb
        K = _lnk()
        C, sig, es = plan.C, plan.sig, plan.es
        dt, dev = plan.dt, plan.dev
        ys = [torch.empty(s, dtype=dt, device=dev) for s in plan.shapes]
        stats = torch.empty(2, sig.tot_rows, dtype=torch.float32, device=dev)
        cap = _dt.capturing(dev)
        one = plan.fill(1.0, cap) if 0 < nw < G else None
        zero = plan.fill(0.0, cap) if 0 < nb < G else None
        ptrs = [t.data_ptr() for t in ts]
        ptrs += [y.data_ptr() for y in ys]
        if one is not None:
            ptrs.append(one.data_ptr())
        if zero is not None:
            ptrs.append(zero.data_ptr())
        key = (plan.id, _dt.stream_key(dev), *ptrs)
        ent = None if cap else _TABLES.get(key)
        if ent is None:
            px = ptrs[:G]
            py = ptrs[G + nw + nb:2 * G + nw + nb]
            T = sig.template.copy()
            T[:, C["X"]] = _offsets(px, px[plan.bx], es)
            T[:, C["Y"]] = _offsets(py, py[plan.bx], es)
            wj = bj = -1
            if nw:
                wj = plan._param_col(ptrs[G:G + nw], plan.w_idx, one.data_ptr() if one is not None else 0, T, "W")
            if nb:
                bj = plan._param_col(ptrs[G + nw:G + nw + nb], plan.b_idx,
                                     zero.data_ptr() if zero is not None else 0, T, "B")
            align = K.alignment(sig, dt, _or(px) | _or(py))
            ent = (_dt.upload(T, dev, cap), align, wj, bj, T)
            if not cap:
                _TABLES.put(key, ent)
        tab, align, wj, bj, T = ent
        wb = None if not nw else (one if wj == -2 else ts[G + wj])
        bb = None if not nb else (zero if bj == -2 else ts[G + nw + bj])
        K.launch_forward(sig, tab, ts[plan.bx], ys[plan.bx], wb, bb, stats, plan.eps, align)
        if plan.need_grad:
            if nw:
                ctx.save_for_backward(*ts[:G], wb, stats)
            else:
                ctx.save_for_backward(*ts[:G], stats)
            ctx.ln = (plan, ptrs, T, align)
        if G == 1:
            return ys[0]
        return tuple(ys)

    @staticmethod
    def backward(ctx, *gys):
        plan, fptrs, fT, falign = ctx.ln
        G, nw, nb = plan.G, plan.nw, plan.nb
        K = _lnk()
        C, sig, es = plan.C, plan.sig, plan.es
        saved = ctx.saved_tensors
        xs = saved[:G]
        wb = saved[G] if nw else None
        stats = saved[-1]
        needs = ctx.needs_input_grad
        need_dx = any(needs[1:1 + G])
        need_dw = nw > 0 and any(needs[1 + G:1 + G + nw])
        need_db = nb > 0 and any(needs[1 + G + nw:])
        dt, dev = plan.dt, plan.dev
        gys = [g.contiguous() for g in gys]
        dxs = [torch.empty(s, dtype=dt, device=dev) for s in plan.shapes] if need_dx else None
        cap = _dt.capturing(dev)
        pg = [g.data_ptr() for g in gys]
        pdx = [d.data_ptr() for d in dxs] if need_dx else []
        key = (plan.id, _dt.stream_key(dev), need_dx, *fptrs, *pg, *pdx)
        ent = None if cap else _TABLES.get(key)
        if ent is None:
            T = fT.copy()
            T[:, C["DY"]] = _offsets(pg, pg[plan.bx], es)
            T[:, C["DW"]] = sig.off_w
            T[:, C["DB"]] = sig.off_w
            por = _or(pg) | _or(fptrs[:G])
            if need_dx:
                T[:, C["DX"]] = _offsets(pdx, pdx[plan.bx], es)
                por |= _or(pdx)
            ent = (_dt.upload(T, dev, cap), K.alignment(sig, dt, por))
            if not cap:
                _TABLES.put(key, ent)
        tab, align = ent
        # dW is accumulated whenever there is a weight (it is needed for dx anyway)
        dwp = torch.empty(sig.tot_w if nw else 0, dtype=dt, device=dev)
        dbp = torch.empty(sig.tot_w if need_db else 0, dtype=dt, device=dev)
        K.launch_backward(sig, tab, xs[plan.bx], gys[plan.bx], dxs[plan.bx] if need_dx else None,
                          wb, stats, dwp, dbp, need_db, align)
        out = [None]
        out += dxs if dxs is not None else [None] * G
        if need_dw:
            parts = dwp.split_with_sizes(sig.widths_list)
            out += [parts[i] for i in plan.w_idx]
        else:
            out += [None] * nw
        if need_db:
            parts = dbp.split_with_sizes(sig.widths_list)
            out += [parts[i] for i in plan.b_idx]
        else:
            out += [None] * nb
        return tuple(out)


_gl_apply = _fast_apply(_GroupedLinearFn)
_ln_apply = _fast_apply(_BatchedLayerNormFn)


def _ln_eager(xs, weights, biases, eps):
    if _compiling_or_dispatching() or type(xs) not in _SEQ or not xs:
        return None
    x0 = xs[0]
    if type(x0) not in _PLAIN_TYPES or not _triton_ok(x0):
        return None
    if (weights is not None and type(weights) not in _SEQ) or (biases is not None and type(biases) not in _SEQ):
        return None
    ts = list(xs)
    if weights is not None:
        ts += weights
    if biases is not None:
        ts += biases
    grad = torch.is_grad_enabled()
    try:
        key = (eps, grad, tuple([(type(t), t.shape, t.stride(), t.dtype, t.device, t.requires_grad) for t in xs]),
               None if weights is None else tuple([_tmeta(t) for t in weights]),
               None if biases is None else tuple([_tmeta(t) for t in biases]))
        hash(key)
    except (AttributeError, TypeError):
        return None
    plan = _PLANS.get(key)
    if plan is None:
        _validate_ln(xs, weights, biases, eps)
        if any(t is not None and type(t) not in _PLAIN_TYPES for t in ts):
            return None
        need_grad = grad and any(t is not None and t.requires_grad for t in ts)
        plan = _LNPlan(xs, weights, biases, eps, need_grad)
        _put_plan(key, plan)
    args = list(xs)
    if plan.nw:
        args += [weights[i] for i in plan.w_idx]
    if plan.nb:
        args += [biases[i] for i in plan.b_idx]
    out = _ln_apply(plan, *args)
    return [out] if plan.G == 1 else list(out)


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
    out = _gl_eager(xs, weights, biases, act)  # eager Triton path (validation cached per call signature)
    if out is not None:
        return out
    _validate_gl(xs, weights, biases)
    tensors = list(xs) + list(weights) + (list(biases) if biases is not None else [])
    if _tracing(tensors) or _triton_ok(xs[0]):
        # traced, or Triton tensors that the eager path declined (tensor subclasses): the custom op
        return _gl_via_op(xs, weights, biases, act)
    return ref.grouped_linear_list(xs, weights, biases, act)


def batched_layer_norm(xs: Sequence[Tensor], weights: Optional[Sequence[Optional[Tensor]]] = None,
                       biases: Optional[Sequence[Optional[Tensor]]] = None, eps: float = 1e-5) -> List[Tensor]:
    """``[F.layer_norm(x, (x.shape[-1],), w, b, eps) for ...]`` as one batched kernel.

    Each xs[g] (..., D_g) is normalised over its last dim; weights / biases: None or lists of
    (D_g,) tensors (entries may be None).  Statistics in fp32.  Same dtype / device / contiguity
    rules as :func:`grouped_linear`.  Returns the list of outputs, differentiable.
    """
    out = _ln_eager(xs, weights, biases, eps)
    if out is not None:
        return out
    _validate_ln(xs, weights, biases, eps)
    tensors = list(xs) + (list(weights) if weights is not None else []) + \
        (list(biases) if biases is not None else [])
    if _tracing(tensors) or _triton_ok(xs[0]):
        return _ln_via_op(xs, weights, biases, eps)
    return ref.batched_layer_norm_list(xs, weights, biases, eps)
