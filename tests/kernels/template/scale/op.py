"""The scale op::

    optimus::toy_scale(Tensor x, Tensor s, SymInt[] sizes) -> Tensor y
        x, y: cat_g x_g.reshape(-1)      s: one scale per member (G,)

Implementation: the Triton kernel for CUDA tensors (CPU tensors under ``TRITON_INTERPRET=1``),
plain torch otherwise; a fake implementation; autograd through the op itself
(dx = toy_scale(dy, s), ds_g = sum(dy_g * x_g)). Importing this module registers it.
"""

from __future__ import annotations

import torch

from ..runtime.backend import lazy_module
from ..runtime.checks import check_packed, triton_ok
from ..runtime.registration import define
from . import reference as ref

_kernel = lazy_module(__package__)  # kernel.py, imported on the first Triton launch

SCHEMA = "(Tensor x, Tensor s, SymInt[] sizes) -> Tensor"


def _check(x, s, sizes):
    fn = "optimus::toy_scale"
    check_packed(fn, "x", x, sum(sizes), x.dtype, x.device)
    check_packed(fn, "s", s, len(sizes), x.dtype, x.device)


def _forward(x, s, sizes):
    _check(x, s, sizes)
    if triton_ok(x):
        return _kernel().forward_packed(x, s, list(sizes))
    return ref.scale_packed(x, s, sizes)


def _forward_fake(x, s, sizes):
    _check(x, s, sizes)
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    x, s, sizes = inputs
    ctx.save_for_backward(x, s)
    ctx.sizes = list(sizes)


def _backward(ctx, dy):
    x, s = ctx.saved_tensors
    need_dx, need_ds, _ = ctx.needs_input_grad
    dy = dy.contiguous()  # an upstream gradient may be any view (expand of ones, ...)
    dx = torch.ops.optimus.toy_scale(dy, s, ctx.sizes) if need_dx else None
    ds = ref.member_sums(dy * x, ctx.sizes) if need_ds else None
    return dx, ds, None


define("toy_scale", SCHEMA, _forward, _forward_fake, _backward, _setup)
