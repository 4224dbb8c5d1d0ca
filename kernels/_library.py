"""Lean registration of the hot ``optimus::`` ops: ``torch.library.Library`` with our own
autograd kernel, instead of ``torch.library.custom_op``.

Why: a compiled graph calls ``torch.ops.optimus.grouped_linear.default`` once per step and
group, so every microsecond of the call path is paid every step. ``custom_op`` wraps the
implementation in three Python layers: an autograd kernel that redispatches below autograd
(a second trip through the dispatcher, converting the arguments again), and a backend wrapper
that checks the outputs for aliasing on every call. On the H200's host (run 26,
``docs/results/gpu-op-host.py``) that cost 105 us of a 243 us ``grouped_linear`` call, and 130
of 393 us for its backward. Here:

* the schema is defined with ``Library.define`` (tagged ``pt2_compliant_tag``, as ``custom_op``
  does) and the implementation registered for ``CompositeExplicitAutograd`` (every device: the
  implementations route CUDA tensors to Triton and the rest to plain torch);
* the fake (meta) implementation with ``torch.library.register_fake``;
* one Python kernel at the ``Autograd`` key. With gradients wanted (grad mode on and an input
  that requires grad) it runs a generated ``torch.autograd.Function`` whose forward redispatches
  below autograd and whose backward is the op's formula. Otherwise (inference, and every call
  from a compiled graph, which runs under no-grad) it calls the implementation directly when
  nothing but the device's own kernel is left to dispatch to, and redispatches otherwise
  (fake tensors, functionalization, tensor subclasses, modes: the ``Python`` and other keys).

The implementations promise what the aliasing check verified: outputs are fresh tensors, never
views of an input (tests run ``torch.library.opcheck`` on every op, which checks it).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

__all__ = ["define"]

_LIB = None
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_ADIV = torch._C.DispatchKey.ADInplaceOrView
# dense device kernels: what is left to dispatch to when nothing intercepts the call
_DIRECT = {torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA}


def _lib() -> torch.library.Library:
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library("optimus", "FRAGMENT")  # noqa: TOR901 (kept for the process)
    return _LIB


def _flatten(args):
    """The tensors of ``args`` (top level, or inside a top-level list) and where they came from."""
    tensors, where = [], []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            tensors.append(a)
            where.append((i, None))
        elif isinstance(a, (list, tuple)):
            for j, t in enumerate(a):
                if isinstance(t, torch.Tensor):
                    tensors.append(t)
                    where.append((i, j))
    return tensors, where


def _unflatten(args, where, tensors):
    out = [list(a) if isinstance(a, (list, tuple)) else a for a in args]
    for (i, j), t in zip(where, tensors):
        if j is None:
            out[i] = t
        else:
            out[i][j] = t
    return out


def define(name: str, schema: str, impl: Callable, fake: Callable,
           backward: Optional[Callable] = None, setup_context: Optional[Callable] = None):
    """Define ``optimus::<name><schema>`` with ``impl`` (real tensors, any device), ``fake``
    (FakeTensor / meta) and, when given, the autograd formula in ``custom_op``'s convention:
    ``setup_context(ctx, inputs, output)`` and ``backward(ctx, *grads)`` returning one gradient
    per input (a list for a tensor-list input, None where there is none). Returns the overload.
    A no-op returning the existing overload when the op is already defined (the package may be
    imported under two names)."""
    ns = torch.ops.optimus
    if hasattr(ns, name):
        return getattr(ns, name).default
    lib = _lib()
    lib.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
    op = getattr(ns, name).default
    # Python kernels receive the arguments without the trailing ones left at their defaults:
    # put those back, so the implementation and the formula always see every argument
    schema_args = op._schema.arguments
    n_args = len(schema_args)
    defaults = [a.default_value if a.has_default_value() else None for a in schema_args]

    def full(args):
        return args if len(args) == n_args else (*args, *defaults[len(args):])

    lib.impl(name, lambda *args: impl(*full(args)), "CompositeExplicitAutograd")
    torch.library.register_fake(f"optimus::{name}", lambda *args: fake(*full(args)), lib=lib)
    if backward is None:
        return op

    def forward(ctx, args, where, *tensors):
        inputs = tuple(_unflatten(args, where, tensors))
        with torch._C._AutoDispatchBelowAutograd():
            out = op(*inputs)
        setup_context(ctx, inputs, out)
        ctx._optimus_where, ctx._optimus_nargs = where, len(inputs)
        return out

    def backward_(ctx, *grads):
        # the formula sees custom_op's convention: one flag per input of the op (a
        # tensor-list input: whether any of its tensors needs a gradient)
        needs = [False] * ctx._optimus_nargs
        for (i, _), flag in zip(ctx._optimus_where, ctx.needs_input_grad[2:]):
            needs[i] = needs[i] or flag
        ctx.needs_input_grad = tuple(needs)
        got = backward(ctx, *grads)
        flat = []
        for i, j in ctx._optimus_where:
            g = got[i]
            flat.append(g if j is None else (g[j] if g is not None else None))
        return (None, None, *flat)

    # named after the op, so grad_fn reads e.g. GroupedLinearBackward
    Fn = type("".join(p.title() for p in name.split("_")), (torch.autograd.Function,),
              {"forward": staticmethod(forward), "backward": staticmethod(backward_)})

    def autograd_kernel(keyset, *args):
        args = full(args)
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            tensors, where = _flatten(args)
            skeleton = _unflatten(args, where, [None] * len(tensors))  # no tensor outside autograd's view
            return Fn.apply(skeleton, where, *tensors)
        below = keyset & _AFTER_AUTOGRAD
        if below.remove(_ADIV).highestPriorityTypeId() in _DIRECT:
            return impl(*args)
        return op.redispatch(below, *args)

    lib.impl(name, autograd_kernel, "Autograd", with_keyset=True)
    return op
