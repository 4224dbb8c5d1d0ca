"""How every ``optimus::`` op is registered: :func:`define`, a lean ``torch.library.Library``
registration with our own autograd kernel, instead of ``torch.library.custom_op``.

Why: a compiled graph calls an op such as ``torch.ops.optimus.grouped_linear.default`` once per
step and group, so every microsecond of the call path is paid every step. ``custom_op`` wraps the
implementation in three Python layers: an autograd kernel that redispatches below autograd
(a second trip through the dispatcher, converting the arguments again), and a backend wrapper
that checks the outputs for aliasing on every call. On an H200's host those layers were 105 us
of a 243 us ``grouped_linear`` call, and 130 of 393 us of its backward (docs/kernels.md, host
overhead). Here:

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

The autograd formula follows ``custom_op``'s convention, so a formula reads the same under
either: ``setup_context(ctx, inputs, output)`` sees every input (defaults filled in), and in
``backward(ctx, *grads)`` ``ctx.needs_input_grad`` has one entry per input of the op: a bool,
or for a tensor-list input a list of one bool per tensor; the backward returns one gradient per
input (a list for a tensor-list input, None where there is none).

The implementations promise what the aliasing check verified: outputs are fresh tensors, never
views of an input (every op's tests run ``torch.library.opcheck``, which checks it).
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
    """The tensors of ``args`` (top level, or inside a top-level list) and where they came from:
    ``(i, None)`` for argument i, ``(i, j)`` for tensor j of the list argument i."""
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
    (FakeTensor / meta) and, when given, the autograd formula in ``custom_op``'s convention
    (``setup_context(ctx, inputs, output)``, ``backward(ctx, *grads)``: see the module
    docstring). Returns the overload. A no-op returning the existing overload when the op is
    already defined (the package may be imported under two names)."""
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
    tensor_lists = frozenset(i for i, a in enumerate(schema_args) if str(a.type) == "List[Tensor]")

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
        # the formula sees custom_op's convention: one entry per input of the op, a list of
        # flags for a tensor-list input
        flat_needs = ctx.needs_input_grad
        needs: list = [[] if i in tensor_lists else False for i in range(ctx._optimus_nargs)]
        for (i, j), flag in zip(ctx._optimus_where, flat_needs[2:]):
            if j is None:
                needs[i] = flag
            else:
                needs[i].append(flag)
        # restored afterwards: a graph kept for a second backward (retain_graph) reads them again
        ctx.needs_input_grad = tuple(needs)
        try:
            got = backward(ctx, *grads)
        finally:
            ctx.needs_input_grad = flat_needs
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
