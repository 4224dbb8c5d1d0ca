"""The ``optimus::`` ops (``torch.library``, through ``_library.define``): registration, fake
implementations, autograd, and the checks of their packed arguments.

Every op is on the *packed* convention: every member's tensor is flattened and the members
are concatenated into one contiguous 1-D buffer per operand, in member order; the shapes
travel as int lists, so the ops have static output sizes and trace under FakeTensor /
torch.compile::

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

Every op also takes ``str layout="packed"``. With ``layout="columns"`` every member has the same
rows M and x, y (and dx, dy) are one (M, sum widths) matrix instead, member g in columns
[sum_<g, sum_<=g): what ``torch.cat(..., dim=1)`` of the members would be, and what a
``split(x, widths, -1)`` reads from. The rules use it where the members' inputs are the chunks
of one split (towers over one input's features), so nothing is packed and the results are
column blocks of one buffer a following cat reads in place. W, b, stats and dW / db are packed
in both layouts.

The forward ops have an autograd formula (``_library.define``) through the backward ops, and
fake implementations, so ``torch.compile(fullgraph=True)`` traces them (Inductor treats them as
opaque extern kernels).  Their implementation is the Triton kernels for CUDA tensors (or CPU
tensors under ``TRITON_INTERPRET=1``) and the plain-torch code of ``reference.py`` otherwise.
Importing this module registers them (once per process).
"""

from typing import Optional

import torch
from torch import Tensor

from . import reference as ref
from ._common import NEEDS_PREACT, activation_code, saved_activation
from ._library import define
from ._routing import _ALLOWED_DTYPES, _glk, _lnk, _triton_ok


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


def _check_columns(fn, name, t, rows, widths, dtype, device):
    """The column layout's operand: one contiguous (rows[0], sum widths) matrix, every member
    with the same rows."""
    if len(set(rows)) > 1:
        raise ValueError(f"{fn}: the column layout needs every member to have the same rows, got {list(rows)}")
    shape = (rows[0], sum(widths))
    if t.dim() != 2:
        raise ValueError(f"{fn}: {name} in the column layout must be 2-D {shape}, got shape {tuple(t.shape)}")
    torch._check(t.shape[0] == shape[0] and t.shape[1] == shape[1],
                 lambda: f"{fn}: {name} has shape {tuple(t.shape)} but the shape lists need {shape}")
    if t.dtype != dtype:
        raise TypeError(f"{fn}: {name} has dtype {t.dtype}, expected {dtype}")
    if t.device != device:
        raise ValueError(f"{fn}: {name} is on {t.device}, expected {device}")


def _dense(t: Optional[Tensor], layout: str) -> Optional[Tensor]:
    """A column-layout operand as the kernels read it: row-major (a copy only where it is not)."""
    return t.contiguous() if (t is not None and layout == "columns") else t


def _check_layout(fn, layout):
    if layout not in ("packed", "columns"):
        raise ValueError(f"{fn}: layout must be 'packed' or 'columns', got {layout!r}")


def _check_gl_packed(x, w, b, ms, ks, ns, layout="packed"):
    fn = "optimus::grouped_linear"
    if not (len(ms) == len(ks) == len(ns)) or len(ms) == 0:
        raise ValueError(f"{fn}: ms, ks, ns must be non-empty and of equal length, got "
                         f"{len(ms)}, {len(ks)}, {len(ns)}")
    if x.dtype not in _ALLOWED_DTYPES:
        raise TypeError(f"{fn}: unsupported dtype {x.dtype}")
    _check_layout(fn, layout)
    if layout == "columns":
        _check_columns(fn, "x", x, ms, ks, x.dtype, x.device)
    else:
        _check_packed(fn, "x", x, sum(m * k for m, k in zip(ms, ks)), x.dtype, x.device)
    _check_packed(fn, "w", w, sum(n * k for n, k in zip(ns, ks)), x.dtype, x.device)
    if b is not None:
        _check_packed(fn, "b", b, sum(ns), x.dtype, x.device)


def _check_ln_packed(x, w, b, rows, widths, layout="packed"):
    fn = "optimus::batched_layer_norm"
    if len(rows) != len(widths) or len(rows) == 0:
        raise ValueError(f"{fn}: rows and widths must be non-empty and of equal length, got "
                         f"{len(rows)}, {len(widths)}")
    if x.dtype not in _ALLOWED_DTYPES:
        raise TypeError(f"{fn}: unsupported dtype {x.dtype}")
    _check_layout(fn, layout)
    if layout == "columns":
        _check_columns(fn, "x", x, rows, widths, x.dtype, x.device)
    else:
        _check_packed(fn, "x", x, sum(r * d for r, d in zip(rows, widths)), x.dtype, x.device)
    for name, p in (("w", w), ("b", b)):
        if p is not None:
            _check_packed(fn, name, p, sum(widths), x.dtype, x.device)


# ------------------------------------------------------------------------------------------------
# implementations (shared by these ops and the parameter-list ops of param_ops.py)
# ------------------------------------------------------------------------------------------------
def gl_forward(x, w, b, ms, ks, ns, activation, layout):
    act = activation_code(activation)
    _check_gl_packed(x, w, b, ms, ks, ns, layout)
    x = _dense(x, layout)
    if _triton_ok(x):
        return _glk().forward_packed(x, w, b, list(ms), list(ks), list(ns), act, layout)
    return ref.grouped_linear_layout(x, w, b, ms, ks, ns, act, layout)


def gl_forward_fake(x, w, b, ms, ks, ns, activation, layout):
    act = activation_code(activation)
    _check_gl_packed(x, w, b, ms, ks, ns, layout)
    y_shape = (ms[0], sum(ns)) if layout == "columns" else (sum(m * n for m, n in zip(ms, ns)),)
    return x.new_empty(y_shape), x.new_empty(y_shape if act in NEEDS_PREACT else (0,))


def gl_backward(dy, x, w, aux, ms, ks, ns, activation, has_bias, need_dx, need_dw, need_db, layout):
    act = activation_code(activation)
    x, aux = _dense(x, layout), _dense(aux, layout)
    if _triton_ok(x):
        return _glk().backward_packed(dy.contiguous(), x, w, aux, list(ms), list(ks), list(ns), act,
                                      has_bias, need_dx, need_dw, need_db, layout)
    return ref.grouped_linear_backward_layout(dy, x, w, aux, ms, ks, ns, act, has_bias,
                                              need_dx, need_dw, need_db, layout)


def gl_backward_fake(dy, x, w_dtype, ms, ks, ns, has_bias, need_dx, need_dw, need_db, layout):
    x_shape = (ms[0], sum(ks)) if layout == "columns" else (sum(m * k for m, k in zip(ms, ks)),)
    tw = sum(n * k for n, k in zip(ns, ks))
    tb = sum(ns)
    return (x.new_empty(x_shape if need_dx else (0,)), x.new_empty(tw if need_dw else 0, dtype=w_dtype),
            x.new_empty(tb if (need_db and has_bias) else 0, dtype=w_dtype))


def ln_forward(x, w, b, rows, widths, eps, layout):
    _check_ln_packed(x, w, b, rows, widths, layout)
    x = _dense(x, layout)
    if _triton_ok(x):
        return _lnk().forward_packed(x, w, b, list(rows), list(widths), eps, layout)
    return ref.batched_layer_norm_layout(x, w, b, rows, widths, eps, layout)


def ln_forward_fake(x, w, b, rows, widths, eps, layout):
    _check_ln_packed(x, w, b, rows, widths, layout)
    y_shape = (rows[0], sum(widths)) if layout == "columns" else (sum(r * d for r, d in zip(rows, widths)),)
    return x.new_empty(y_shape), x.new_empty(2, sum(rows), dtype=torch.float32)


def ln_backward(dy, x, w, stats, rows, widths, has_bias, need_dx, need_dw, need_db, layout):
    x = _dense(x, layout)
    if _triton_ok(x):
        return _lnk().backward_packed(dy.contiguous(), x, w, stats, list(rows), list(widths), has_bias,
                                      need_dx, need_dw, need_db, layout)
    return ref.batched_layer_norm_backward_layout(dy, x, w, stats, rows, widths, has_bias,
                                                  need_dx, need_dw, need_db, layout)


def ln_backward_fake(dy, x, has_w, pdt, rows, widths, has_bias, need_dx, need_dw, need_db, layout):
    x_shape = (rows[0], sum(widths)) if layout == "columns" else (sum(r * d for r, d in zip(rows, widths)),)
    tw = sum(widths)
    return (x.new_empty(x_shape if need_dx else (0,)),
            x.new_empty(tw if (need_dw and has_w) else 0, dtype=pdt),
            x.new_empty(tw if (need_db and has_bias) else 0, dtype=pdt))


# ------------------------------------------------------------------------------------------------
# the ops (registered through ``_library.define``: see there why not ``torch.library.custom_op``)
# ------------------------------------------------------------------------------------------------
GL_SCHEMA = ("(Tensor x, Tensor w, Tensor? b, SymInt[] ms, SymInt[] ks, SymInt[] ns, str activation, "
             "str layout=\"packed\") -> (Tensor, Tensor)")
GL_BACKWARD_SCHEMA = ("(Tensor dy, Tensor x, Tensor w, Tensor? aux, SymInt[] ms, SymInt[] ks, SymInt[] ns, "
                      "str activation, bool has_bias, bool need_dx, bool need_dw, bool need_db, "
                      "str layout=\"packed\") -> (Tensor, Tensor, Tensor)")
LN_SCHEMA = ("(Tensor x, Tensor? w, Tensor? b, SymInt[] rows, SymInt[] widths, float eps, "
             "str layout=\"packed\") -> (Tensor, Tensor)")
LN_BACKWARD_SCHEMA = ("(Tensor dy, Tensor x, Tensor? w, Tensor stats, SymInt[] rows, SymInt[] widths, "
                      "bool has_bias, bool need_dx, bool need_dw, bool need_db, "
                      "str layout=\"packed\") -> (Tensor, Tensor, Tensor)")


def _gl_setup(ctx, inputs, output):
    x, w, b, ms, ks, ns, activation, layout = inputs
    y, pre = output
    act = activation_code(activation)
    aux = saved_activation(act, y, pre)
    ctx.save_for_backward(x, w, aux)
    ctx.gl_meta = (list(ms), list(ks), list(ns), act, b is not None, layout)
    ctx.mark_non_differentiable(pre)


def _gl_autograd(ctx, gy, gpre):
    x, w, aux = ctx.saved_tensors
    ms, ks, ns, act, has_bias, layout = ctx.gl_meta
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    if gy is None:
        return (None,) * 8
    dx, dw, db = torch.ops.optimus.grouped_linear_backward(
        gy.contiguous(), x, w, aux, ms, ks, ns, act, has_bias, bool(need_dx), bool(need_dw),
        bool(need_db and has_bias), layout)
    return (dx if need_dx else None, dw if need_dw else None, db if (need_db and has_bias) else None,
            None, None, None, None, None)


def _ln_setup(ctx, inputs, output):
    x, w, b, rows, widths, eps, layout = inputs
    y, stats = output
    ctx.save_for_backward(x, w, stats)
    ctx.ln_meta = (list(rows), list(widths), b is not None, layout)
    ctx.mark_non_differentiable(stats)


def _ln_autograd(ctx, gy, gstats):
    x, w, stats = ctx.saved_tensors
    rows, widths, has_bias, layout = ctx.ln_meta
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    if gy is None:
        return (None,) * 7
    dx, dw, db = torch.ops.optimus.batched_layer_norm_backward(
        gy.contiguous(), x, w, stats, rows, widths, has_bias, bool(need_dx),
        bool(need_dw and w is not None), bool(need_db and has_bias), layout)
    return (dx if need_dx else None, dw if (need_dw and w is not None) else None,
            db if (need_db and has_bias) else None, None, None, None, None)


def _register_ops():
    """Define the optimus:: ops once per process (the package may be imported under two names)."""
    define("grouped_linear", GL_SCHEMA, gl_forward, gl_forward_fake, _gl_autograd, _gl_setup)
    define("grouped_linear_backward", GL_BACKWARD_SCHEMA, gl_backward,
           lambda dy, x, w, aux, ms, ks, ns, activation, has_bias, need_dx, need_dw, need_db, layout="packed":
           gl_backward_fake(dy, x, w.dtype, ms, ks, ns, has_bias, need_dx, need_dw, need_db, layout))
    define("batched_layer_norm", LN_SCHEMA, ln_forward, ln_forward_fake, _ln_autograd, _ln_setup)
    define("batched_layer_norm_backward", LN_BACKWARD_SCHEMA, ln_backward,
           lambda dy, x, w, stats, rows, widths, has_bias, need_dx, need_dw, need_db, layout="packed":
           ln_backward_fake(dy, x, w is not None, w.dtype if w is not None else x.dtype, rows, widths,
                            has_bias, need_dx, need_dw, need_db, layout))


_register_ops()
