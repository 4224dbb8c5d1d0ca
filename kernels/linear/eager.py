"""The eager fast path of the grouped linear: an ``autograd.Function`` launching the Triton
kernels on the members' own storage, without the dispatcher and the packing copies.

Per call it does O(1) Python work plus one C++-level call per member tensor:

* a *plan* per call signature (activation, grad mode, and per tensor: type, shape, contiguity,
  dtype, device, requires_grad) caches everything that depends only on it
  (:mod:`optimus.kernels.runtime.plans`): validation (a cached plan means the same metadata
  already passed every check, :func:`validate`), the route (the Triton kernels, or a vendor GEMM
  where the measured table says so: ``vendor.py``), the kernel signature (tile counts,
  processing orders, packed dW/db offsets), output shapes, the base member of every operand,
  and how a device table is filled from a call's data pointers;
* the int64 tables the kernels read are cached on the device by (plan, data pointers), so
  steady-state steps upload nothing; a miss is one vectorised numpy fill and one asynchronous
  copy. Buffers this path allocates for itself (the pre-activation z, the dx of every member,
  the dW/db workspace) are one allocation each with packed offsets, so they are static columns
  of the table and not part of the key;
* launches bypass the autotuner once it has chosen (``kernel.py``'s ``_CHOSEN``).

Forward outputs are separate allocations (not views of one buffer), so in-place ops on them stay
legal, as with a loop of F.linear; input gradients are views of one buffer (the autograd engine
accepts views as gradients). Nothing here synchronises with the device (no .item(), no .cpu(),
no pageable copies); tests check that with the interpreter and with mocks.
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
from . import vendor
from .reference import NEEDS_PREACT, USES_OUTPUT

_kernel = lazy_module(__package__)  # kernel.py, imported on the first Triton launch
_PLANS, _TABLES = PLANS, TABLES


def set_gl_route(name) -> None:
    """Force a grouped-linear route ("triton", "bmm", "grouped_mm"; see ``vendor.py``) wherever it
    applies, or None to follow the measured table; clears the plans (they hold the route)."""
    vendor.set_route(name)
    PLANS.clear()


# ------------------------------------------------------------------------------------------------
# validation of the list API (run once per call signature: a cached plan has passed it)
# ------------------------------------------------------------------------------------------------
def validate(xs, weights, biases):
    fn = "grouped_linear"
    check_seq(fn, "xs", xs)
    check_seq(fn, "weights", weights)
    dtype, device = check_first(fn, xs)
    if len(weights) != len(xs):
        raise ValueError(f"{fn}: got {len(xs)} inputs but {len(weights)} weights")
    if biases is not None:
        check_seq(fn, "biases", biases)
        if len(biases) != len(xs):
            raise ValueError(f"{fn}: got {len(xs)} inputs but {len(biases)} biases")
    if _fast_ok(xs, weights, biases, dtype, device):
        return dtype, device
    for i in range(len(xs)):
        x, w = xs[i], weights[i]
        check_tensor(fn, f"xs[{i}]", x, dtype, device)
        check_tensor(fn, f"weights[{i}]", w, dtype, device)
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
            check_tensor(fn, f"biases[{i}]", b, dtype, device)
            if b.dim() != 1 or b.shape[0] != w.shape[0]:
                raise ValueError(f"{fn}: member {i}: biases[{i}] has shape {tuple(b.shape)} but weights[{i}] "
                                 f"has {w.shape[0]} output features")
    return dtype, device


def _fast_ok(xs, weights, biases, dtype, device) -> bool:
    """Cheap all-members check; on failure the caller re-checks member by member for the message."""
    if len(weights) != len(xs):
        return False
    dev = dev_key(xs[0])
    try:
        for x, w in zip(xs, weights):
            if (x.dtype is not dtype or w.dtype is not dtype or dev_key(x) != dev or dev_key(w) != dev
                    or w.dim() != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1]
                    or not x.is_contiguous() or not w.is_contiguous()):
                return False
        if biases is not None:
            for b, w in zip(biases, weights):
                if b is not None and (b.dtype is not dtype or dev_key(b) != dev or b.dim() != 1
                                      or b.shape[0] != w.shape[0] or not b.is_contiguous()):
                    return False
    except (AttributeError, TypeError):
        return False
    return True


# ------------------------------------------------------------------------------------------------
# the plan and the autograd.Function
# ------------------------------------------------------------------------------------------------
class _GLPlan:
    """Shape-dependent facts of one grouped-linear call signature (see the section comment)."""

    def __init__(self, xs, weights, biases, act, need_grad):
        K = _kernel()
        G = len(xs)
        x0 = xs[0]
        self.id = next_plan_id()
        self.G, self.act, self.need_grad = G, act, need_grad
        self.dt, self.dev = x0.dtype, x0.device
        self.es = es = ESIZE[self.dt]
        ks = [w.shape[1] for w in weights]
        ns = [w.shape[0] for w in weights]
        ms = [rows_of(x) for x in xs]
        self.sig = sig = K.signature(ms, ks, ns)
        self.bias_idx = tuple(i for i, b in enumerate(biases) if b is not None) if biases is not None else ()
        self.nb = nb = len(self.bias_idx)
        self.partial_bias = 0 < nb < G
        self.y_shapes = [tuple(x.shape[:-1]) + (n,) for x, n in zip(xs, ns)]
        self.x_shapes = [tuple(x.shape) for x in xs]
        self.w_shapes = [tuple(w.shape) for w in weights]
        self.preact = act in NEEDS_PREACT
        self.uses_output = act in USES_OUTPUT
        self.bx = bx = first_nonempty(sig.x_sizes)
        self.bw = bw = first_nonempty(sig.w_sizes)
        self.by = by = first_nonempty(sig.y_sizes)
        bsz = [ns[i] for i in self.bias_idx]
        self.bb = first_nonempty(bsz)  # index among the present biases
        self.bb_in_zero = self.partial_bias and not any(bsz)
        self.max_n = max(ns) if ns else 0
        self._zero = None
        self.C = C = K.COL
        self.all_bias = nb == G
        # ---- forward pointer list: x * G, w * G, present biases, y * G, [z], [zero] ----
        ix, iw, iy = list(range(G)), list(range(G, 2 * G)), list(range(2 * G + nb, 3 * G + nb))
        iz = 3 * G + nb
        izero = iz + (1 if self.preact else 0)
        o0, o1, o2 = sig.orders
        tf = sig.eager_base[0].copy()
        tf[:, C["Z"]] = sig.off_y[o0]  # z is one buffer of this path's own: packed offsets
        ent = [(0, C["X"], [ix[g] for g in o0], ix[bx]), (0, C["W"], [iw[g] for g in o0], iw[bw]),
               (0, C["Y"], [iy[g] for g in o0], iy[by])]
        self.bias_base = -1  # index into ts of the bias base tensor; -2: the zero buffer
        if nb:
            of = {i: 2 * G + j for j, i in enumerate(self.bias_idx)}
            srcs = [of.get(g, izero) for g in o0]
            if self.bb_in_zero:
                base, self.bias_base = izero, -2
            else:
                base, self.bias_base = 2 * G + self.bb, 2 * G + self.bb
            ent.append((0, C["B"], srcs, base))
        self.fwd_fill = Fill(tf, ent, es, ix + iw + iy + ([iz] if self.preact else []))
        # ---- backward pointer list: the forward list, then dy * G ----
        nf = 3 * G + nb + (1 if self.preact else 0) + (1 if self.partial_bias else 0)
        ig = list(range(nf, nf + G))
        tb = sig.eager_base[1:].copy()
        tb[0, :, C["DX"]] = sig.off_x[o1]  # dx is one buffer of this path's own
        ent = [(0, C["W"], [iw[g] for g in o1], iw[bw]), (0, C["DY"], [ig[g] for g in o1], ig[by]),
               (1, C["X"], [ix[g] for g in o2], ix[bx]), (1, C["DY"], [ig[g] for g in o2], ig[by])]
        if self.uses_output:  # aux = y, read where the outputs live
            ent += [(0, C["Z"], [iy[g] for g in o1], iy[by]), (1, C["Z"], [iy[g] for g in o2], iy[by])]
        else:  # aux = z (one buffer) or unused
            tb[0, :, C["Z"]] = sig.off_y[o1]
            tb[1, :, C["Z"]] = sig.off_y[o2]
        self.bwd_fill = Fill(tb, ent, es, ig)

    def zero_bias(self, capture: bool):
        """Zeros standing in for the missing biases (cached; a fresh one while capturing, and a
        cached one used while capturing is kept alive for the graph, see ``runtime/tables.py``)."""
        if self._zero is not None:
            return _dt.keep_for_graphs(self._zero, capture)
        z = torch.zeros(max(1, self.max_n), dtype=self.dt, device=self.dev)
        if not capture:
            self._zero = z
        return z


class _GroupedLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, *ts):
        G = plan.G
        K = _kernel()
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
            T, por = plan.fwd_fill.build(ptrs)
            ent = (_dt.upload(T, dev, cap), K.align_from_or(plan.sig, dt, por))
            if not cap:
                _TABLES.put(key, ent)
        tab, align = ent
        bias_base = plan.bias_base
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
        G, sig = plan.G, plan.sig
        K = _kernel()
        saved = ctx.saved_tensors
        needs = ctx.needs_input_grad
        need_dx = any(needs[1:1 + G])
        need_dw = any(needs[1 + G:1 + 2 * G])
        need_db = plan.nb > 0 and any(needs[1 + 2 * G:])
        dt, dev = plan.dt, plan.dev
        gys = [g.contiguous() for g in gys]
        cap = _dt.capturing(dev)
        pg = [g.data_ptr() for g in gys]
        key = (plan.id, _dt.stream_key(dev), *fptrs, *pg)
        ent = None if cap else _TABLES.get(key)
        if ent is None:
            T, por = plan.bwd_fill.build(fptrs + pg)
            ent = (_dt.upload(T, dev, cap), falign if por % 16 == 0 else 1)
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
        dxs = None
        if need_dx:
            # one buffer for all members (gradients may be views); its offsets are in the table
            dxb = torch.empty(sig.tot_x, dtype=dt, device=dev)
            K.launch_dx(sig, tabs[0], gys[plan.by], aux, ws[plan.bw], dxb, plan.act,
                        align if dxb.data_ptr() % 16 == 0 else 1)
            dxs = views_like(dxb, xs, plan.x_shapes)
        dws = dbs = None
        if need_dw or need_db:
            wsp = torch.zeros(sig.tot_w + sig.tot_b, dtype=torch.float32, device=dev)
            K.launch_dw(sig, tabs[1], gys[plan.by], aux, xs[plan.bx], wsp, need_db, plan.act, align)
            if dt != torch.float32:
                wsp = wsp.to(dt)
            if need_dw:
                dws = views_like(wsp[: sig.tot_w], ws, plan.w_shapes)
            if need_db:
                parts = wsp[sig.tot_w:].split_with_sizes(sig.ns_list)
                dbs = list(parts) if plan.all_bias else [parts[i] for i in plan.bias_idx]
        out = [None]
        out += dxs if dxs is not None else [None] * G
        out += dws if dws is not None else [None] * G
        out += dbs if dbs is not None else [None] * plan.nb
        return tuple(out)


_gl_apply = fast_apply(_GroupedLinearFn)


def run(xs, weights, biases, act):
    """The eager Triton path, or None when the call has to take another path."""
    if compiling_or_dispatching() or type(xs) not in SEQ or type(weights) not in SEQ or not xs:
        return None
    x0 = xs[0]
    if type(x0) not in PLAIN_TYPES or not triton_ok(x0):
        return None
    if biases is not None and type(biases) not in SEQ:
        return None
    ts = [*xs, *weights] if biases is None else [*xs, *weights, *biases]
    grad = torch.is_grad_enabled()
    try:
        key = (act, grad, len(xs), len(weights),
               tuple([(type(t), t.shape, t.is_contiguous(), t.dtype, t.device, t.requires_grad)
                      for t in (*xs, *weights)]),
               None if biases is None else tuple([tensor_key(b) for b in biases]))
    except (AttributeError, TypeError):
        return None  # not tensors: the general path raises the proper error
    plan = _PLANS.get(key)
    if plan is None:
        validate(xs, weights, biases)
        if any(t is not None and type(t) not in PLAIN_TYPES for t in ts):
            return None  # tensor subclasses (fake / functional tensors): traced path
        need_grad = grad and any(t is not None and t.requires_grad for t in ts)
        ks = [w.shape[1] for w in weights]
        route = vendor.choose(x0.dtype, x0.device, [rows_of(x) for x in xs], ks, [w.shape[0] for w in weights])
        if route == "triton":
            reason = _kernel().limit_reason([rows_of(x) for x in xs], ks, [w.shape[0] for w in weights])
            plan = TorchPlan(reason) if reason else _GLPlan(xs, weights, biases, act, need_grad)
        else:
            plan = vendor.VendorPlan(route, xs, weights, biases, act, need_grad)
        put_plan(key, plan)
    if type(plan) is vendor.VendorPlan:
        return vendor.apply(plan, xs, weights, biases)
    if type(plan) is TorchPlan:
        return ref.grouped_linear_list(xs, weights, biases, act)
    if plan.nb == len(ts) - 2 * plan.G:
        out = _gl_apply(plan, *ts)
    else:
        out = _gl_apply(plan, *xs, *weights, *[biases[i] for i in plan.bias_idx])
    return [out] if plan.G == 1 else list(out)
