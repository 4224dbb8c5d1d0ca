"""The eager fast path of the batched layer norm: an ``autograd.Function`` launching the Triton
kernels on the members' own storage, without the dispatcher and the packing copies.

As the grouped linear's (``linear/eager.py``, :mod:`optimus.kernels.runtime.plans`): a plan per
call signature (eps, grad mode, and per tensor: type, shape, contiguity, dtype, device,
requires_grad) caches validation (:func:`validate`), the kernel signature and how the device
table is filled from the data pointers; the table is cached on the device by (plan, pointers).
Missing weights / biases of some members read a cached buffer of ones / zeros. Forward outputs
are separate allocations; input gradients are views of one buffer. Nothing here synchronises
with the device.
"""

from __future__ import annotations

import torch

from ..runtime import tables as _dt
from ..runtime.backend import lazy_module
from ..runtime.checks import (PLAIN_TYPES, check_first, check_seq, check_tensor, compiling_or_dispatching, dev_key,
                              rows_of, triton_ok)
from ..runtime.plans import (ESIZE, PLANS, SEQ, TABLES, Fill, TorchPlan, fast_apply, first_nonempty, next_plan_id,
                             put_plan, tensor_key, views_like)
from . import reference as ref

_kernel = lazy_module(__package__)  # kernel.py, imported on the first Triton launch
_PLANS, _TABLES = PLANS, TABLES


# ------------------------------------------------------------------------------------------------
# validation of the list API (run once per call signature: a cached plan has passed it)
# ------------------------------------------------------------------------------------------------
def _fast_ok(xs, weights, biases, dtype) -> bool:
    dev = dev_key(xs[0])
    try:
        for x in xs:
            if x.dtype is not dtype or dev_key(x) != dev or x.dim() < 1 or not x.is_contiguous():
                return False
        for seq in (weights, biases):
            if seq is not None:
                for p, x in zip(seq, xs):
                    if p is not None and (p.dtype is not dtype or dev_key(p) != dev or p.dim() != 1
                                          or p.shape[0] != x.shape[-1] or not p.is_contiguous()):
                        return False
    except (AttributeError, TypeError):
        return False
    return True


def validate(xs, weights, biases, eps):
    fn = "batched_layer_norm"
    check_seq(fn, "xs", xs)
    dtype, device = check_first(fn, xs)
    for name, seq in (("weights", weights), ("biases", biases)):
        if seq is not None:
            check_seq(fn, name, seq)
            if len(seq) != len(xs):
                raise ValueError(f"{fn}: got {len(xs)} inputs but {len(seq)} {name}")
    if not isinstance(eps, (float, int)) or isinstance(eps, bool):
        raise TypeError(f"{fn}: eps must be a float, got {type(eps).__name__}")
    if _fast_ok(xs, weights, biases, dtype):
        return dtype, device
    for i in range(len(xs)):
        x = xs[i]
        check_tensor(fn, f"xs[{i}]", x, dtype, device)
        if x.dim() < 1:
            raise ValueError(f"{fn}: xs[{i}] is 0-dimensional; need a last dimension to normalize over")
        for name, seq in (("weights", weights), ("biases", biases)):
            if seq is not None and seq[i] is not None:
                p = seq[i]
                check_tensor(fn, f"{name}[{i}]", p, dtype, device)
                if p.dim() != 1 or p.shape[0] != x.shape[-1]:
                    raise ValueError(f"{fn}: member {i}: {name}[{i}] has shape {tuple(p.shape)} but xs[{i}] "
                                     f"has width {x.shape[-1]} (shape {tuple(x.shape)})")
    return dtype, device


# ------------------------------------------------------------------------------------------------
# the plan and the autograd.Function
# ------------------------------------------------------------------------------------------------
class _LNPlan:
    def __init__(self, xs, weights, biases, eps, need_grad):
        K = _kernel()
        G = len(xs)
        x0 = xs[0]
        self.id = next_plan_id()
        self.G, self.eps, self.need_grad = G, float(eps), need_grad
        self.dt, self.dev = x0.dtype, x0.device
        self.es = es = ESIZE[self.dt]
        widths = [x.shape[-1] for x in xs]
        rows = [rows_of(x) for x in xs]
        self.sig = sig = K.signature(rows, widths, x0.device)
        self.w_idx = tuple(i for i, w in enumerate(weights) if w is not None) if weights is not None else ()
        self.b_idx = tuple(i for i, b in enumerate(biases) if b is not None) if biases is not None else ()
        self.nw, self.nb = nw, nb = len(self.w_idx), len(self.b_idx)
        self.shapes = [tuple(x.shape) for x in xs]
        self.bx = bx = first_nonempty(sig.x_sizes)
        self.max_d = max(widths) if widths else 0
        self._fill = {}
        self.C = C = K.COL
        self.need_one, self.need_zero = 0 < nw < G, 0 < nb < G
        # ---- forward pointer list: x * G, present weights, present biases, y * G, [one], [zero] ----
        ix, iy = list(range(G)), list(range(G + nw + nb, 2 * G + nw + nb))
        ione = 2 * G + nw + nb
        izero = ione + (1 if self.need_one else 0)
        ent = [(0, C["X"], ix, ix[bx]), (0, C["Y"], iy, iy[bx])]
        self.wj = self.bj = -1  # index (among the present ones) of the weight / bias base; -2: the fill buffer
        if nw:
            self.wj, e = self._param_entry(self.w_idx, G, ione, C["W"], sig.widths_list)
            ent.append(e)
        if nb:
            self.bj, e = self._param_entry(self.b_idx, G + nw, izero, C["B"], sig.widths_list)
            ent.append(e)
        self.fwd_fill = Fill(sig.template[None], ent, es, ix + iy)
        # ---- backward: the forward table plus dy (pointer list: the forward list, then dy * G);
        # dW / dB partials and dx are buffers of this path's own: packed offsets, static ----
        nf = izero + (1 if self.need_zero else 0)
        ig = list(range(nf, nf + G))
        tb = sig.template.copy()
        tb[:, C["DW"]] = sig.off_w
        tb[:, C["DB"]] = sig.off_w
        tb[:, C["DX"]] = sig.off_x
        self.bwd_fill = Fill(tb[None], ent + [(0, C["DY"], ig, ig[bx])], es, ig + ix)

    @staticmethod
    def _param_entry(idx, first, fill_i, col, widths):
        """Table entry of one optional parameter list: member i reads its own parameter (pointer
        ``first + j`` for the j-th present one) or the fill buffer; the base is the first present
        parameter of nonzero width, else the fill buffer (-2)."""
        pos = {i: first + j for j, i in enumerate(idx)}
        srcs = [pos.get(g, fill_i) for g in range(len(widths))]
        bj = next((j for j, i in enumerate(idx) if widths[i]), -2)
        return bj, (0, col, srcs, first + bj if bj >= 0 else fill_i)

    def fill(self, value: float, capture: bool):
        """ones (missing weights) / zeros (missing biases), cached (fresh while capturing; a cached
        one used while capturing is kept alive for the graph, see ``runtime/tables.py``)."""
        t = self._fill.get(value)
        if t is None:
            t = torch.full((max(1, self.max_d),), value, dtype=self.dt, device=self.dev)
            if not capture:
                self._fill[value] = t
            return t
        return _dt.keep_for_graphs(t, capture)


class _BatchedLayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, *ts):
        G, nw, nb = plan.G, plan.nw, plan.nb
        K = _kernel()
        sig = plan.sig
        dt, dev = plan.dt, plan.dev
        ys = [torch.empty(s, dtype=dt, device=dev) for s in plan.shapes]
        stats = torch.empty(2, sig.tot_rows, dtype=torch.float32, device=dev)
        cap = _dt.capturing(dev)
        one = plan.fill(1.0, cap) if plan.need_one else None
        zero = plan.fill(0.0, cap) if plan.need_zero else None
        ptrs = [t.data_ptr() for t in ts]
        ptrs += [y.data_ptr() for y in ys]
        if one is not None:
            ptrs.append(one.data_ptr())
        if zero is not None:
            ptrs.append(zero.data_ptr())
        key = (plan.id, _dt.stream_key(dev), *ptrs)
        ent = None if cap else _TABLES.get(key)
        if ent is None:
            T, por = plan.fwd_fill.build(ptrs)
            ent = (_dt.upload(T[0], dev, cap), K.alignment(sig, dt, por))
            if not cap:
                _TABLES.put(key, ent)
        tab, align = ent
        wj, bj = plan.wj, plan.bj
        wb = None if not nw else (one if wj == -2 else ts[G + wj])
        bb = None if not nb else (zero if bj == -2 else ts[G + nw + bj])
        K.launch_forward(sig, tab, ts[plan.bx], ys[plan.bx], wb, bb, stats, plan.eps, align)
        if plan.need_grad:
            if nw:
                ctx.save_for_backward(*ts[:G], wb, stats)
            else:
                ctx.save_for_backward(*ts[:G], stats)
            ctx.ln = (plan, ptrs)
        if G == 1:
            return ys[0]
        return tuple(ys)

    @staticmethod
    def backward(ctx, *gys):
        plan, fptrs = ctx.ln
        G, nw, nb = plan.G, plan.nw, plan.nb
        K = _kernel()
        sig = plan.sig
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
        cap = _dt.capturing(dev)
        pg = [g.data_ptr() for g in gys]
        # dx is one buffer of this path's own: its packed offsets (forward table's DX column,
        # static) are relative to the buffer, so the table depends on the inputs and dy only
        key = (plan.id, _dt.stream_key(dev), *fptrs, *pg)
        ent = None if cap else _TABLES.get(key)
        if ent is None:
            T, por = plan.bwd_fill.build(fptrs + pg)
            ent = (_dt.upload(T[0], dev, cap), K.alignment(sig, dt, por))
            if not cap:
                _TABLES.put(key, ent)
        tab, align = ent
        dxb = torch.empty(sig.tot_x if need_dx else 0, dtype=dt, device=dev)
        if need_dx and dxb.data_ptr() % 16:
            align = 1
        # dW is accumulated whenever there is a weight (it is needed for dx anyway)
        dwp = torch.empty(sig.tot_w if nw else 0, dtype=dt, device=dev)
        dbp = torch.empty(sig.tot_w if need_db else 0, dtype=dt, device=dev)
        K.launch_backward(sig, tab, xs[plan.bx], gys[plan.bx], dxb if need_dx else None,
                          wb, stats, dwp, dbp, need_db, align)
        out = [None]
        out += views_like(dxb, xs, plan.shapes) if need_dx else [None] * G
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


_ln_apply = fast_apply(_BatchedLayerNormFn)


def run(xs, weights, biases, eps):
    if compiling_or_dispatching() or type(xs) not in SEQ or not xs:
        return None
    x0 = xs[0]
    if type(x0) not in PLAIN_TYPES or not triton_ok(x0):
        return None
    if (weights is not None and type(weights) not in SEQ) or (biases is not None and type(biases) not in SEQ):
        return None
    ts = list(xs)
    if weights is not None:
        ts += weights
    if biases is not None:
        ts += biases
    grad = torch.is_grad_enabled()
    try:
        key = (eps, grad, tuple([(type(t), t.shape, t.is_contiguous(), t.dtype, t.device, t.requires_grad)
                                 for t in xs]),
               None if weights is None else tuple([tensor_key(t) for t in weights]),
               None if biases is None else tuple([tensor_key(t) for t in biases]))
        hash(key)
    except (AttributeError, TypeError):
        return None
    plan = _PLANS.get(key)
    if plan is None:
        validate(xs, weights, biases, eps)
        if any(t is not None and type(t) not in PLAIN_TYPES for t in ts):
            return None
        need_grad = grad and any(t is not None and t.requires_grad for t in ts)
        reason = _kernel().limit_reason([rows_of(x) for x in xs], [x.shape[-1] for x in xs])
        plan = TorchPlan(reason) if reason else _LNPlan(xs, weights, biases, eps, need_grad)
        put_plan(key, plan)
    if type(plan) is TorchPlan:
        return ref.batched_layer_norm_list(xs, weights, biases, eps)
    args = list(xs)
    if plan.nw:
        args += [weights[i] for i in plan.w_idx]
    if plan.nb:
        args += [biases[i] for i in plan.b_idx]
    out = _ln_apply(plan, *args)
    return [out] if plan.G == 1 else list(out)
