"""The eager fast path: an ``autograd.Function`` per kernel family launching the Triton
kernels on the members' own storage, without the dispatcher and the packing copies.

Per call the eager path does O(1) Python work plus one C++-level call per member tensor:

* a *plan* per call signature (activation, grad mode, and per tensor: type, shape, contiguity,
  dtype, device, requires_grad) caches everything that depends only on it: validation (a cached
  plan means the same metadata already passed every check), the kernel signature (tile counts,
  processing orders, packed dW/db offsets), output shapes, the base member of every operand, and
  how a device table is filled from a call's data pointers (``_Fill``: the pointer-independent
  columns as a template, the rest as one precomputed gather/scatter);
* the int64 tables the kernels read encode the pointer offsets of the members relative to a base
  member: they are a pure function of (plan, data pointers), cached on the device by exactly
  that key (``_devtables.TableCache``).  The caching allocator gives a training step the same
  addresses every step, so steady-state steps upload nothing; a miss is one vectorised numpy fill
  and one asynchronous copy.  Buffers this path allocates for itself (the pre-activation z, the
  dx of every member, the dW/db workspace) are one allocation each with packed offsets, so they
  are static columns of the table and not part of the key;
* launches bypass the autotuner once it has chosen (``grouped_linear_kernel._CHOSEN``).

Forward outputs are separate allocations (not views of one buffer), so in-place ops on them stay
legal, as with a loop of F.linear; input gradients are views of one buffer (the autograd engine
accepts views as gradients).  Nothing here synchronises with the device (no .item(), no .cpu(),
no pageable copies); tests check that with the interpreter and with mocks.
"""

import itertools as _it
import math
import warnings

import numpy as np
import torch

from . import _devtables as _dt
from . import reference as _ref
from . import routes as _routes
from ._common import NEEDS_PREACT, USES_OUTPUT
from ._routing import _PLAIN_TYPES, _glk, _lnk, _rows, _triton_ok, _validate_gl, _validate_ln

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


def set_gl_route(name) -> None:
    """Force a grouped-linear route ("triton", "bmm", "grouped_mm"; see ``routes.py``) wherever it
    applies, or None to follow the measured table; clears the plans (they hold the route)."""
    _routes.set_route(name)
    _PLANS.clear()


def set_table_cache(enabled: bool) -> None:
    """Turn the device-table cache off (every call uploads its tables; for benchmarks / tests)."""
    _TABLES.enabled = bool(enabled)
    if not enabled:
        _TABLES.clear()


def _tmeta(t):
    # contiguity instead of the strides: the kernels read every member as a dense row-major block
    # from its data pointer, so all contiguous layouts of one shape share a plan (strides of size-1
    # dims may differ) and a non-contiguous one gets its own key and fails validation
    return None if t is None else (type(t), t.shape, t.is_contiguous(), t.dtype, t.device, t.requires_grad)


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


_unflatten = getattr(torch._C._nn, "unflatten_dense_tensors", None)


def _views_like(flat, templates, shapes):
    """Views of the 1-D ``flat`` with the shapes of ``templates`` (one C++ call), in order."""
    if _unflatten is not None:
        return list(_unflatten(flat, templates))
    return [p.view(s) for p, s in zip(flat.split_with_sizes([math.prod(s) for s in shapes]), shapes)]  # pragma: no cover


class _Fill:
    """How a device table is filled from the data pointers of one call, computed once per plan.

    ``template``: the table with every column that does not depend on pointers (dims, packed
    workspace offsets, offsets into buffers this path allocates itself);  per pointer-dependent
    entry, ``dst`` (flat position in the table), ``src`` and ``base`` (indices into the call's
    pointer list): ``table.flat[dst] = (ptr[src] - ptr[base]) // element_size``.  A miss of the
    table cache is then one numpy gather, subtract, divide and scatter."""

    __slots__ = ("template", "dst", "src", "base", "es", "align_idx")

    def __init__(self, template, entries, es, align_idx):
        self.template = np.ascontiguousarray(template)
        ncol = self.template.shape[-1]
        dst, src, base = [], [], []
        for table, col, srcs, b in entries:  # table: index of the sub-table (stacked tables), col, per row
            for r, si in enumerate(srcs):
                dst.append((table * self.template.shape[-2] + r) * ncol + col)
                src.append(si)
                base.append(b)
        self.dst = np.asarray(dst, dtype=np.int64)
        self.src = np.asarray(src, dtype=np.int64)
        self.base = np.asarray(base, dtype=np.int64)
        self.es = es
        self.align_idx = np.asarray(align_idx, dtype=np.int64)

    def build(self, ptrs):
        """(table, OR of the pointers that the alignment hint depends on)."""
        P = np.asarray(ptrs, dtype=np.int64)
        T = self.template.copy()
        if len(self.dst):
            T.reshape(-1)[self.dst] = (P[self.src] - P[self.base]) // self.es
        por = int(np.bitwise_or.reduce(P[self.align_idx])) if len(self.align_idx) else 0
        return T, por


class _GLPlan:
    """Shape-dependent facts of one grouped-linear call signature (see the section comment)."""

    def __init__(self, xs, weights, biases, act, need_grad):
        K = _glk()
        G = len(xs)
        x0 = xs[0]
        self.id = next(_plan_ids)
        self.G, self.act, self.need_grad = G, act, need_grad
        self.dt, self.dev = x0.dtype, x0.device
        self.es = es = _ESIZE[self.dt]
        ks = [w.shape[1] for w in weights]
        ns = [w.shape[0] for w in weights]
        ms = [_rows(x) for x in xs]
        self.sig = sig = K.signature(ms, ks, ns)
        self.bias_idx = tuple(i for i, b in enumerate(biases) if b is not None) if biases is not None else ()
        self.nb = nb = len(self.bias_idx)
        self.partial_bias = 0 < nb < G
        self.y_shapes = [tuple(x.shape[:-1]) + (n,) for x, n in zip(xs, ns)]
        self.x_shapes = [tuple(x.shape) for x in xs]
        self.w_shapes = [tuple(w.shape) for w in weights]
        self.preact = act in NEEDS_PREACT
        self.uses_output = act in USES_OUTPUT
        self.bx = bx = _first_nonempty(sig.x_sizes)
        self.bw = bw = _first_nonempty(sig.w_sizes)
        self.by = by = _first_nonempty(sig.y_sizes)
        bsz = [ns[i] for i in self.bias_idx]
        self.bb = _first_nonempty(bsz)  # index among the present biases
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
        self.fwd_fill = _Fill(tf, ent, es, ix + iw + iy + ([iz] if self.preact else []))
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
        self.bwd_fill = _Fill(tb, ent, es, ig)

    def zero_bias(self, capture: bool):
        """Zeros standing in for the missing biases (cached; a fresh one while capturing, and a
        cached one used while capturing is kept alive for the graph, see ``_devtables``)."""
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
        K = _glk()
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
            dxs = _views_like(dxb, xs, plan.x_shapes)
        dws = dbs = None
        if need_dw or need_db:
            wsp = torch.zeros(sig.tot_w + sig.tot_b, dtype=torch.float32, device=dev)
            K.launch_dw(sig, tabs[1], gys[plan.by], aux, xs[plan.bx], wsp, need_db, plan.act, align)
            if dt != torch.float32:
                wsp = wsp.to(dt)
            if need_dw:
                dws = _views_like(wsp[: sig.tot_w], ws, plan.w_shapes)
            if need_db:
                parts = wsp[sig.tot_w:].split_with_sizes(sig.ns_list)
                dbs = list(parts) if plan.all_bias else [parts[i] for i in plan.bias_idx]
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


class _TorchPlan:
    """A call signature the Triton kernels must not take (``reason``: a member exceeds their int32
    indexing, see ``grouped_linear_kernel.MAX_MEMBER_ELEMS``): the plain-torch loop runs it."""

    def __init__(self, reason: str):
        self.reason = reason
        warnings.warn(reason + "; this group runs on the plain-torch path", RuntimeWarning, stacklevel=4)


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
               tuple([(type(t), t.shape, t.is_contiguous(), t.dtype, t.device, t.requires_grad)
                      for t in (*xs, *weights)]),
               None if biases is None else tuple([_tmeta(b) for b in biases]))
    except (AttributeError, TypeError):
        return None  # not tensors: the general path raises the proper error
    plan = _PLANS.get(key)
    if plan is None:
        _validate_gl(xs, weights, biases)
        if any(t is not None and type(t) not in _PLAIN_TYPES for t in ts):
            return None  # tensor subclasses (fake / functional tensors): traced path
        need_grad = grad and any(t is not None and t.requires_grad for t in ts)
        ks = [w.shape[1] for w in weights]
        route = _routes.choose(x0.dtype, x0.device, [_rows(x) for x in xs], ks, [w.shape[0] for w in weights])
        if route == "triton":
            reason = _glk().limit_reason([_rows(x) for x in xs], ks, [w.shape[0] for w in weights])
            plan = _TorchPlan(reason) if reason else _GLPlan(xs, weights, biases, act, need_grad)
        else:
            plan = _routes.VendorPlan(route, xs, weights, biases, act, need_grad)
        _put_plan(key, plan)
    if type(plan) is _routes.VendorPlan:
        return _routes.apply(plan, xs, weights, biases)
    if type(plan) is _TorchPlan:
        return _ref.grouped_linear_list(xs, weights, biases, act)
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
        self.es = es = _ESIZE[self.dt]
        widths = [x.shape[-1] for x in xs]
        rows = [_rows(x) for x in xs]
        self.sig = sig = K.signature(rows, widths, x0.device)
        self.w_idx = tuple(i for i, w in enumerate(weights) if w is not None) if weights is not None else ()
        self.b_idx = tuple(i for i, b in enumerate(biases) if b is not None) if biases is not None else ()
        self.nw, self.nb = nw, nb = len(self.w_idx), len(self.b_idx)
        self.shapes = [tuple(x.shape) for x in xs]
        self.bx = bx = _first_nonempty(sig.x_sizes)
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
        self.fwd_fill = _Fill(sig.template[None], ent, es, ix + iy)
        # ---- backward: the forward table plus dy (pointer list: the forward list, then dy * G);
        # dW / dB partials and dx are buffers of this path's own: packed offsets, static ----
        nf = izero + (1 if self.need_zero else 0)
        ig = list(range(nf, nf + G))
        tb = sig.template.copy()
        tb[:, C["DW"]] = sig.off_w
        tb[:, C["DB"]] = sig.off_w
        tb[:, C["DX"]] = sig.off_x
        self.bwd_fill = _Fill(tb[None], ent + [(0, C["DY"], ig, ig[bx])], es, ig + ix)

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
        one used while capturing is kept alive for the graph, see ``_devtables``)."""
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
        K = _lnk()
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
        K = _lnk()
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
        out += _views_like(dxb, xs, plan.shapes) if need_dx else [None] * G
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
        key = (eps, grad, tuple([(type(t), t.shape, t.is_contiguous(), t.dtype, t.device, t.requires_grad)
                                 for t in xs]),
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
        reason = _lnk().limit_reason([_rows(x) for x in xs], [x.shape[-1] for x in xs])
        plan = _TorchPlan(reason) if reason else _LNPlan(xs, weights, biases, eps, need_grad)
        _put_plan(key, plan)
    if type(plan) is _TorchPlan:
        return _ref.batched_layer_norm_list(xs, weights, biases, eps)
    args = list(xs)
    if plan.nw:
        args += [weights[i] for i in plan.w_idx]
    if plan.nb:
        args += [biases[i] for i in plan.b_idx]
    out = _ln_apply(plan, *args)
    return [out] if plan.G == 1 else list(out)


