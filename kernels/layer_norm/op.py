"""The batched-layer-norm ops: schemas, checks, implementations, fake implementations, autograd.

On the packed convention (:mod:`optimus.kernels.runtime.layout`)::

    optimus::batched_layer_norm(Tensor x, Tensor? w, Tensor? b, SymInt[] rows, SymInt[] widths,
                            float eps, str layout="packed", str activation="none")
                            -> (Tensor y, Tensor stats)
        x, y: cat_g x_g.reshape(-1) (R_g*D_g)     w, b: cat_g w_g (D_g) or None
        stats: fp32 [2, sum R_g] (mean, rstd per row), saved for backward, not differentiable.
        activation: "none", "relu", "gelu", "silu", "sigmoid" or "tanh", applied to the affine
        result (an epilogue: y = act(layer_norm(x) * w + b)); the backward recomputes the
        pre-activation from x, stats, w and b, so nothing more is saved for it.
    optimus::batched_layer_norm_backward(Tensor dy, Tensor x, Tensor? w, Tensor stats,
                            SymInt[] rows, SymInt[] widths, bool has_bias, bool need_dx,
                            bool need_dw, bool need_db, str layout="packed", Tensor? b=None,
                            str activation="none") -> (Tensor dx, Tensor dw, Tensor db)

and the parameter-list variants, which take the affine weights and biases as the parameters
themselves and read them in place when they lie concatenated
(:mod:`optimus.kernels.runtime.params`)::

    optimus::batched_layer_norm_params(Tensor x, Tensor[] weights, Tensor[] biases,
                                   SymInt[] rows, SymInt[] widths, float eps, str layout,
                                   str activation="none") -> (Tensor y, Tensor stats)
    optimus::batched_layer_norm_params_backward(Tensor dy, Tensor x, Tensor[] weights,
                                   Tensor stats, SymInt[] rows, SymInt[] widths, bool has_bias,
                                   bool need_dx, bool need_dw, bool need_db, str layout,
                                   Tensor[] biases, str activation="none")
                                   -> (Tensor dx, Tensor dw, Tensor db)

(``weights`` / ``biases`` may be ``[]``: no affine weight, no bias). With ``layout="columns"``
every member has the same rows and x, y (and dx, dy) are one (R, sum widths) matrix; w, b,
stats and dW / db are packed in both layouts.

The forward ops have an autograd formula through the backward ops, and fake implementations,
so ``torch.compile(fullgraph=True)`` traces them. Their implementation is the Triton kernels
(``kernel.py``) for CUDA tensors (or CPU tensors under ``TRITON_INTERPRET=1``) and the plain
torch of ``reference.py`` otherwise. Importing this module registers them (once per process).
"""

from __future__ import annotations

import torch

from ..runtime.activation import activation_code
from ..runtime.backend import lazy_module
from ..runtime.checks import ALLOWED_DTYPES, check_columns, check_layout, check_packed, triton_ok
from ..runtime.layout import dense
from ..runtime.params import check_members, concatenated, fake_concatenated
from ..runtime.registration import define
from . import reference as ref

_kernel = lazy_module(__package__)  # kernel.py, imported on the first Triton launch


# ------------------------------------------------------------------------------------------------
# checks of the packed arguments
# ------------------------------------------------------------------------------------------------
def _check_ln_packed(x, w, b, rows, widths, layout="packed"):
    fn = "optimus::batched_layer_norm"
    if len(rows) != len(widths) or len(rows) == 0:
        raise ValueError(f"{fn}: rows and widths must be non-empty and of equal length, got "
                         f"{len(rows)}, {len(widths)}")
    if x.dtype not in ALLOWED_DTYPES:
        raise TypeError(f"{fn}: unsupported dtype {x.dtype}")
    check_layout(fn, layout)
    if layout == "columns":
        check_columns(fn, "x", x, rows, widths, x.dtype, x.device)
    else:
        check_packed(fn, "x", x, sum(r * d for r, d in zip(rows, widths)), x.dtype, x.device)
    for name, p in (("w", w), ("b", b)):
        if p is not None:
            check_packed(fn, name, p, sum(widths), x.dtype, x.device)


# ------------------------------------------------------------------------------------------------
# implementations (shared by the packed ops and the parameter-list ops)
# ------------------------------------------------------------------------------------------------
def ln_forward(x, w, b, rows, widths, eps, layout, activation="none"):
    _check_ln_packed(x, w, b, rows, widths, layout)
    act = activation_code(activation)
    x = dense(x, layout)
    if triton_ok(x):
        return _kernel().forward_packed(x, w, b, list(rows), list(widths), eps, layout, act)
    return ref.batched_layer_norm_layout(x, w, b, rows, widths, eps, layout, act)


def ln_forward_fake(x, w, b, rows, widths, eps, layout, activation="none"):
    _check_ln_packed(x, w, b, rows, widths, layout)
    activation_code(activation)
    y_shape = (rows[0], sum(widths)) if layout == "columns" else (sum(r * d for r, d in zip(rows, widths)),)
    return x.new_empty(y_shape), x.new_empty(2, sum(rows), dtype=torch.float32)


def ln_backward(dy, x, w, stats, rows, widths, has_bias, need_dx, need_dw, need_db, layout, b=None,
                activation="none"):
    act = activation_code(activation)
    x = dense(x, layout)
    if triton_ok(x):
        return _kernel().backward_packed(dy.contiguous(), x, w, stats, list(rows), list(widths), has_bias,
                                         need_dx, need_dw, need_db, layout, b, act)
    return ref.batched_layer_norm_backward_layout(dy, x, w, stats, rows, widths, has_bias,
                                                  need_dx, need_dw, need_db, layout, b, act)


def ln_backward_fake(dy, x, has_w, pdt, rows, widths, has_bias, need_dx, need_dw, need_db, layout):
    x_shape = (rows[0], sum(widths)) if layout == "columns" else (sum(r * d for r, d in zip(rows, widths)),)
    tw = sum(widths)
    return (x.new_empty(x_shape if need_dx else (0,)),
            x.new_empty(tw if (need_dw and has_w) else 0, dtype=pdt),
            x.new_empty(tw if (need_db and has_bias) else 0, dtype=pdt))


# ------------------------------------------------------------------------------------------------
# autograd
# ------------------------------------------------------------------------------------------------
def _ln_setup(ctx, inputs, output):
    x, w, b, rows, widths, eps, layout, *activation = inputs
    act = activation_code(activation[0] if activation else "none")
    y, stats = output
    ctx.save_for_backward(x, w, stats, b if act != "none" else None)  # the epilogue's pre-activation needs b
    ctx.ln_meta = (list(rows), list(widths), b is not None, layout, act)
    ctx.mark_non_differentiable(stats)


def _ln_autograd(ctx, gy, gstats):
    x, w, stats, b = ctx.saved_tensors
    rows, widths, has_bias, layout, act = ctx.ln_meta
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    if gy is None:
        return (None,) * 8
    dx, dw, db = torch.ops.optimus.batched_layer_norm_backward(
        gy.contiguous(), x, w, stats, rows, widths, has_bias, bool(need_dx),
        bool(need_dw and w is not None), bool(need_db and has_bias), layout, b, act)
    return (dx if need_dx else None, dw if (need_dw and w is not None) else None,
            db if (need_db and has_bias) else None, None, None, None, None, None)


def _ln_check(x, weights, biases, widths):
    fn = "optimus::batched_layer_norm_params"
    for name, ts in (("weights", weights), ("biases", biases)):
        if ts:
            check_members(fn, name, ts, [(d,) for d in widths], x)


def _lnp(x, weights, biases, rows, widths, eps, layout, activation="none"):
    w = concatenated(weights, "norm_weight") if weights else None
    b = concatenated(biases, "norm_bias") if biases else None
    return ln_forward(x, w, b, rows, widths, eps, layout, activation)


def _lnp_fake(x, weights, biases, rows, widths, eps, layout, activation="none"):
    _ln_check(x, weights, biases, widths)
    w = fake_concatenated(weights) if weights else None
    b = fake_concatenated(biases) if biases else None
    return ln_forward_fake(x, w, b, rows, widths, eps, layout, activation)


def _lnp_backward(dy, x, weights, stats, rows, widths, has_bias, need_dx, need_dw, need_db, layout, biases=(),
                  activation="none"):
    w = concatenated(weights, "backward_norm_weight") if weights else None
    b = concatenated(biases, "backward_norm_bias") if biases else None
    return ln_backward(dy, x, w, stats, rows, widths, has_bias, need_dx, need_dw, need_db, layout, b, activation)


def _lnp_backward_fake(dy, x, weights, stats, rows, widths, has_bias, need_dx, need_dw, need_db, layout, biases=(),
                       activation="none"):
    pdt = weights[0].dtype if weights else x.dtype
    return ln_backward_fake(dy, x, bool(weights), pdt, rows, widths, has_bias, need_dx, need_dw, need_db, layout)


def _lnp_setup(ctx, inputs, output):
    x, weights, biases, rows, widths, eps, layout, *activation = inputs
    act = activation_code(activation[0] if activation else "none")
    y, stats = output
    kept = list(biases) if act != "none" else []  # the epilogue's pre-activation needs the biases
    ctx.save_for_backward(x, stats, *weights, *kept)
    ctx.ln_meta = (list(rows), list(widths), len(weights), len(biases) > 0, layout, act)
    ctx.mark_non_differentiable(stats)


def _lnp_autograd(ctx, gy, gstats):
    x, stats, *params = ctx.saved_tensors
    rows, widths, n_w, has_bias, layout, act = ctx.ln_meta
    weights, kept, has_w = params[:n_w], params[n_w:], n_w > 0
    need = ctx.needs_input_grad
    need_dx, need_dw, need_db = bool(need[0]), any(need[1]) and has_w, any(need[2]) and has_bias  # lists: one flag per member
    if gy is None:
        return (None,) * 8
    dx, dw, db = torch.ops.optimus.batched_layer_norm_params_backward(
        gy.contiguous(), x, weights, stats, rows, widths, has_bias, need_dx, need_dw, need_db, layout, kept, act)
    dws = list(dw.split(list(widths))) if need_dw else ([] if not has_w else None)
    dbs = list(db.split(list(widths))) if need_db else ([] if not has_bias else None)
    return (dx if need_dx else None, dws, dbs, None, None, None, None, None)


# ------------------------------------------------------------------------------------------------
# the ops
# ------------------------------------------------------------------------------------------------
LN_SCHEMA = ("(Tensor x, Tensor? w, Tensor? b, SymInt[] rows, SymInt[] widths, float eps, "
             "str layout=\"packed\", str activation=\"none\") -> (Tensor, Tensor)")
LN_BACKWARD_SCHEMA = ("(Tensor dy, Tensor x, Tensor? w, Tensor stats, SymInt[] rows, SymInt[] widths, "
                      "bool has_bias, bool need_dx, bool need_dw, bool need_db, "
                      "str layout=\"packed\", Tensor? b=None, str activation=\"none\") -> (Tensor, Tensor, Tensor)")
LNP_SCHEMA = ("(Tensor x, Tensor[] weights, Tensor[] biases, SymInt[] rows, SymInt[] widths, float eps, "
              "str layout, str activation=\"none\") -> (Tensor, Tensor)")
LNP_BACKWARD_SCHEMA = ("(Tensor dy, Tensor x, Tensor[] weights, Tensor stats, SymInt[] rows, SymInt[] widths, "
                       "bool has_bias, bool need_dx, bool need_dw, bool need_db, str layout, "
                       "Tensor[] biases, str activation=\"none\") -> (Tensor, Tensor, Tensor)")


def _register() -> None:
    define("batched_layer_norm", LN_SCHEMA, ln_forward, ln_forward_fake, _ln_autograd, _ln_setup)
    define("batched_layer_norm_backward", LN_BACKWARD_SCHEMA, ln_backward,
           lambda dy, x, w, stats, rows, widths, has_bias, need_dx, need_dw, need_db, layout="packed", b=None,
           activation="none": ln_backward_fake(dy, x, w is not None, w.dtype if w is not None else x.dtype, rows,
                                               widths, has_bias, need_dx, need_dw, need_db, layout))
    define("batched_layer_norm_params", LNP_SCHEMA, _lnp, _lnp_fake, _lnp_autograd, _lnp_setup)
    define("batched_layer_norm_params_backward", LNP_BACKWARD_SCHEMA, _lnp_backward, _lnp_backward_fake)


_register()
