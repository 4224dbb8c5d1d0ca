"""The grouped-linear ops: schemas, checks, implementations, fake implementations, autograd.

On the packed convention (:mod:`optimus.kernels.runtime.layout`)::

    optimus::grouped_linear(Tensor x, Tensor w, Tensor? b, SymInt[] ms, SymInt[] ks, SymInt[] ns,
                            str activation, str layout="packed") -> (Tensor y, Tensor preact)
        x: cat_g x_g.reshape(-1) (M_g*K_g each)   w: cat_g W_g.reshape(-1) (N_g*K_g, F.linear layout)
        b: cat_g b_g (N_g) or None                y: cat_g y_g.reshape(-1) (M_g*N_g)
        preact: the pre-activation (same layout as y) when activation is gelu/silu, else empty; it
        is saved for backward and is not differentiable.
    optimus::grouped_linear_backward(Tensor dy, Tensor x, Tensor w, Tensor? aux, SymInt[] ms,
                            SymInt[] ks, SymInt[] ns, str activation, bool has_bias,
                            bool need_dx, bool need_dw, bool need_db, str layout="packed")
                            -> (Tensor dx, Tensor dw, Tensor db)

and the parameter-list variants, which take the weights and biases as the parameters themselves
and read them in place when they lie concatenated (:mod:`optimus.kernels.runtime.params`)::

    optimus::grouped_linear_params(Tensor x, Tensor[] weights, Tensor[] biases, SymInt[] ms,
                                   SymInt[] ks, SymInt[] ns, str activation, str layout)
        -> (Tensor y, Tensor preact)
    optimus::grouped_linear_params_backward(Tensor dy, Tensor x, Tensor[] weights, Tensor? aux,
                                   SymInt[] ms, SymInt[] ks, SymInt[] ns, str activation,
                                   bool has_bias, bool need_dx, bool need_dw, bool need_db,
                                   str layout) -> (Tensor dx, Tensor dw, Tensor db)

(``biases`` may be ``[]``: no bias). With ``layout="columns"`` every member has the same rows M
and x, y (and dx, dy) are one (M, sum K) / (M, sum N) matrix; W, b and dW / db are packed in
both layouts. The rules use it where the members' inputs are the chunks of one split, so
nothing is packed and the results are column blocks of one buffer a following cat reads in place.

The forward ops have an autograd formula through the backward ops, and fake implementations,
so ``torch.compile(fullgraph=True)`` traces them (Inductor treats them as opaque extern
kernels). Their implementation is the Triton kernels (``kernel.py``) for CUDA tensors (or CPU
tensors under ``TRITON_INTERPRET=1``) and the plain torch of ``reference.py`` otherwise.
Importing this module registers them (once per process, :func:`~optimus.kernels.runtime.registration.define`).
"""

from __future__ import annotations

import torch

from ..runtime.backend import lazy_module
from ..runtime.checks import ALLOWED_DTYPES, check_columns, check_layout, check_packed, triton_ok
from ..runtime.layout import dense
from ..runtime.params import check_members, concatenated, fake_concatenated, split_like
from ..runtime.registration import define
from . import reference as ref
from .reference import NEEDS_PREACT, activation_code, saved_activation

_kernel = lazy_module(__package__)  # kernel.py, imported on the first Triton launch


# ------------------------------------------------------------------------------------------------
# checks of the packed arguments
# ------------------------------------------------------------------------------------------------
def _check_gl_packed(x, w, b, ms, ks, ns, layout="packed"):
    fn = "optimus::grouped_linear"
    if not (len(ms) == len(ks) == len(ns)) or len(ms) == 0:
        raise ValueError(f"{fn}: ms, ks, ns must be non-empty and of equal length, got "
                         f"{len(ms)}, {len(ks)}, {len(ns)}")
    if x.dtype not in ALLOWED_DTYPES:
        raise TypeError(f"{fn}: unsupported dtype {x.dtype}")
    check_layout(fn, layout)
    if layout == "columns":
        check_columns(fn, "x", x, ms, ks, x.dtype, x.device)
    else:
        check_packed(fn, "x", x, sum(m * k for m, k in zip(ms, ks)), x.dtype, x.device)
    check_packed(fn, "w", w, sum(n * k for n, k in zip(ns, ks)), x.dtype, x.device)
    if b is not None:
        check_packed(fn, "b", b, sum(ns), x.dtype, x.device)


# ------------------------------------------------------------------------------------------------
# implementations (shared by the packed ops and the parameter-list ops)
# ------------------------------------------------------------------------------------------------
def gl_forward(x, w, b, ms, ks, ns, activation, layout):
    act = activation_code(activation)
    _check_gl_packed(x, w, b, ms, ks, ns, layout)
    x = dense(x, layout)
    if triton_ok(x):
        return _kernel().forward_packed(x, w, b, list(ms), list(ks), list(ns), act, layout)
    return ref.grouped_linear_layout(x, w, b, ms, ks, ns, act, layout)


def gl_forward_fake(x, w, b, ms, ks, ns, activation, layout):
    act = activation_code(activation)
    _check_gl_packed(x, w, b, ms, ks, ns, layout)
    y_shape = (ms[0], sum(ns)) if layout == "columns" else (sum(m * n for m, n in zip(ms, ns)),)
    return x.new_empty(y_shape), x.new_empty(y_shape if act in NEEDS_PREACT else (0,))


def gl_backward(dy, x, w, aux, ms, ks, ns, activation, has_bias, need_dx, need_dw, need_db, layout):
    act = activation_code(activation)
    x, aux = dense(x, layout), dense(aux, layout)
    if triton_ok(x):
        return _kernel().backward_packed(dy.contiguous(), x, w, aux, list(ms), list(ks), list(ns), act,
                                      has_bias, need_dx, need_dw, need_db, layout)
    return ref.grouped_linear_backward_layout(dy, x, w, aux, ms, ks, ns, act, has_bias,
                                              need_dx, need_dw, need_db, layout)


def gl_backward_fake(dy, x, w_dtype, ms, ks, ns, has_bias, need_dx, need_dw, need_db, layout):
    x_shape = (ms[0], sum(ks)) if layout == "columns" else (sum(m * k for m, k in zip(ms, ks)),)
    tw = sum(n * k for n, k in zip(ns, ks))
    tb = sum(ns)
    return (x.new_empty(x_shape if need_dx else (0,)), x.new_empty(tw if need_dw else 0, dtype=w_dtype),
            x.new_empty(tb if (need_db and has_bias) else 0, dtype=w_dtype))


# ------------------------------------------------------------------------------------------------
# autograd
# ------------------------------------------------------------------------------------------------
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


def _gl_check(x, weights, biases, ks, ns):
    fn = "optimus::grouped_linear_params"
    if not weights:
        raise ValueError(f"{fn}: no weights")
    check_members(fn, "weights", weights, list(zip(ns, ks)), x)
    if biases:
        check_members(fn, "biases", biases, [(n,) for n in ns], x)


def _glp(x, weights, biases, ms, ks, ns, activation, layout):
    w = concatenated(weights, "weight")
    b = concatenated(biases, "bias") if biases else None
    return gl_forward(x, w, b, ms, ks, ns, activation, layout)


def _glp_fake(x, weights, biases, ms, ks, ns, activation, layout):
    _gl_check(x, weights, biases, ks, ns)
    b = fake_concatenated(biases) if biases else None
    return gl_forward_fake(x, fake_concatenated(weights), b, ms, ks, ns, activation, layout)


def _glp_backward(dy, x, weights, aux, ms, ks, ns, activation, has_bias, need_dx, need_dw, need_db, layout):
    # the weights are read only for dx
    w = concatenated(weights, "backward_weight") if need_dx else weights[0].new_empty(sum(t.numel() for t in weights))
    return gl_backward(dy, x, w, aux, ms, ks, ns, activation, has_bias, need_dx, need_dw, need_db, layout)


def _glp_backward_fake(dy, x, weights, aux, ms, ks, ns, activation, has_bias, need_dx, need_dw, need_db, layout):
    return gl_backward_fake(dy, x, weights[0].dtype, ms, ks, ns, has_bias, need_dx, need_dw, need_db, layout)


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
    need_dx, need_dw, need_db = bool(need[0]), any(need[1]), any(need[2]) and has_bias  # lists: one flag per member
    if gy is None:
        return (None,) * 8
    dx, dw, db = torch.ops.optimus.grouped_linear_params_backward(
        gy.contiguous(), x, weights, aux, ms, ks, ns, act, has_bias, need_dx, need_dw, need_db, layout)
    dws = split_like(dw, weights) if need_dw else None
    dbs = [c for c in db.split(list(ns))] if need_db else ([] if not has_bias else None)
    return (dx if need_dx else None, dws, dbs, None, None, None, None, None)


# ------------------------------------------------------------------------------------------------
# the ops
# ------------------------------------------------------------------------------------------------
GL_SCHEMA = ("(Tensor x, Tensor w, Tensor? b, SymInt[] ms, SymInt[] ks, SymInt[] ns, str activation, "
             "str layout=\"packed\") -> (Tensor, Tensor)")
GL_BACKWARD_SCHEMA = ("(Tensor dy, Tensor x, Tensor w, Tensor? aux, SymInt[] ms, SymInt[] ks, SymInt[] ns, "
                      "str activation, bool has_bias, bool need_dx, bool need_dw, bool need_db, "
                      "str layout=\"packed\") -> (Tensor, Tensor, Tensor)")
GLP_SCHEMA = ("(Tensor x, Tensor[] weights, Tensor[] biases, SymInt[] ms, SymInt[] ks, SymInt[] ns, "
              "str activation, str layout) -> (Tensor, Tensor)")
GLP_BACKWARD_SCHEMA = ("(Tensor dy, Tensor x, Tensor[] weights, Tensor? aux, SymInt[] ms, SymInt[] ks, "
                       "SymInt[] ns, str activation, bool has_bias, bool need_dx, bool need_dw, bool need_db, "
                       "str layout) -> (Tensor, Tensor, Tensor)")


def _register() -> None:
    define("grouped_linear", GL_SCHEMA, gl_forward, gl_forward_fake, _gl_autograd, _gl_setup)
    define("grouped_linear_backward", GL_BACKWARD_SCHEMA, gl_backward,
           lambda dy, x, w, aux, ms, ks, ns, activation, has_bias, need_dx, need_dw, need_db, layout="packed":
           gl_backward_fake(dy, x, w.dtype, ms, ks, ns, has_bias, need_dx, need_dw, need_db, layout))
    define("grouped_linear_params", GLP_SCHEMA, _glp, _glp_fake, _glp_autograd, _glp_setup)
    define("grouped_linear_params_backward", GLP_BACKWARD_SCHEMA, _glp_backward, _glp_backward_fake)


_register()
