"""Which implementation a grouped-linear call uses, by measurement: the Triton kernels, or a
vendor GEMM (``torch.bmm`` / ``torch._grouped_mm``) where the group's shapes allow one and the
measured routing table says it is faster.

Routes (``ROUTES``):

* ``"triton"``: the grouped kernels of ``kernel.py`` (any shapes; the default);
* ``"bmm"``: every member has the same (M, K, N): ``torch.stack`` the inputs and weights,
  ``torch.baddbmm``, activation;
* ``"grouped_mm"``: every member has the same (K, N), M may differ: ``torch.cat`` the inputs,
  ``torch.stack`` the weights, ``torch._grouped_mm`` with the members' row offsets (a device
  table built once per call signature), bias and activation.  Only where this torch has
  ``torch._grouped_mm`` and K, N are multiples of 16 bytes; the fast kernel is bf16 on sm90+.

The choice is a measured fact: ``routes.json`` in this folder (written by
``python -m optimus.tools.bench.kernels.overhead`` on the GPU and copied here) maps (device name, dtype,
uniformity, size class, G class) to the fastest route of an eager forward + backward step.
Without the file, for shapes it does not list, or when the route does not apply (another
dtype, no ``torch._grouped_mm``, ragged K / N), a call takes ``"triton"``.
:func:`set_route` forces a route for benchmarks and tests (``None``: back to the table).

Both vendor routes are one ``autograd.Function`` (``_VendorLinearFn``): the outputs alias the
result buffer through ``Tensor.set_`` (not autograd views), so in-place ops on them are allowed
exactly as on the Triton path's outputs; the backward stacks the upstream gradients once and runs
the two GEMMs (dX, dW) with the same vendor op, db as one row sum.  Operands that already lie
back to back in one storage (the outputs of a previous vendor-routed group, weights packed into
one buffer) are used as views of it, without the stack / cat copy (``_joined``).  The pre-activation is kept
in a buffer of its own, so an in-place op on an output cannot change the gradient.
"""

from __future__ import annotations

import json
import math
import os
from typing import Optional, Sequence

import numpy as np
import torch

from ..runtime import tables as _dt
from .reference import activation_grad as _act_grad, apply_activation as _act

ROUTES = ("triton", "bmm", "grouped_mm")
TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "routes.json")

_forced: Optional[str] = None
_table: Optional[dict] = None
_HAS_GMM = hasattr(torch, "_grouped_mm")


def set_route(name: Optional[str]) -> None:
    """Force ``name`` for every call where it applies (others take "triton"); None: use the table."""
    global _forced
    if name is not None and name not in ROUTES:
        raise ValueError(f"route must be None or one of {ROUTES}, got {name!r}")
    _forced = name


def get_route() -> Optional[str]:
    return _forced


def load_table(path: Optional[str] = None) -> dict:
    """The measured routing table ({key: route}); empty when the file is absent or unreadable."""
    global _table
    if path is None and _table is not None:
        return _table
    p = path or TABLE_PATH
    tab = {}
    try:
        with open(p) as f:
            data = json.load(f)
        for e in data.get("routes", []):
            tab[(e["device"], e["dtype"], e["uniformity"], e["size"], e["G"])] = e["best"]
    except (OSError, ValueError, KeyError, TypeError):
        tab = {}
    if path is None:
        _table = tab
    return tab


def uniformity(ms: Sequence[int], ks: Sequence[int], ns: Sequence[int]) -> str:
    """"uniform" (same M, K, N), "uniform-kn" (same K, N; M ragged) or "ragged"."""
    if len(set(ks)) != 1 or len(set(ns)) != 1:
        return "ragged"
    return "uniform" if len(set(ms)) == 1 else "uniform-kn"


def size_class(ms, ks, ns) -> int:
    """log2 of the mean FLOPs per member, rounded down to an even number (buckets of 4x)."""
    f = sum(2 * m * k * n for m, k, n in zip(ms, ks, ns)) / max(1, len(ms))
    return int(math.log2(max(f, 1.0))) // 2 * 2


def g_class(G: int) -> int:
    """G rounded up to a power of two."""
    return 1 << max(0, (G - 1).bit_length())


_names: dict = {}


def _device_name(device: torch.device) -> str:
    if device.type != "cuda":
        return device.type
    idx = device.index if device.index is not None else torch.cuda.current_device()
    n = _names.get(idx)
    if n is None:
        n = _names[idx] = torch.cuda.get_device_name(idx)
    return n


def applies(route: str, dtype: torch.dtype, ms, ks, ns) -> bool:
    """Whether ``route`` can compute this group (shapes, dtype, this torch)."""
    if route == "triton":
        return True
    u = uniformity(ms, ks, ns)
    if not ms or min(ks) == 0 or min(ns) == 0:
        return False
    if route == "bmm":
        return u == "uniform"
    if route == "grouped_mm":
        es = torch.empty((), dtype=dtype).element_size()
        return _HAS_GMM and u != "ragged" and (ks[0] * es) % 16 == 0 and (ns[0] * es) % 16 == 0
    return False


def choose(dtype: torch.dtype, device: torch.device, ms, ks, ns) -> str:
    """The route of a call signature: the forced one, else the measured table's, else "triton";
    always one that applies."""
    if _forced is not None:
        return _forced if applies(_forced, dtype, ms, ks, ns) else "triton"
    tab = load_table()
    if not tab:
        return "triton"
    key = (_device_name(device), str(dtype).split(".")[-1], uniformity(ms, ks, ns), size_class(ms, ks, ns),
           g_class(len(ms)))
    r = tab.get(key, "triton")
    return r if r in ROUTES and applies(r, dtype, ms, ks, ns) else "triton"


# ------------------------------------------------------------------------------------------------
# the vendor routes
# ------------------------------------------------------------------------------------------------
class VendorPlan:
    """Per call signature: route, shapes, bias layout and (grouped_mm) the row-offset table."""

    def __init__(self, route, xs, weights, biases, act, need_grad):
        self.route, self.act, self.need_grad = route, act, need_grad
        self.G = G = len(xs)
        self.dt, self.dev = xs[0].dtype, xs[0].device
        self.k, self.n = weights[0].shape[1], weights[0].shape[0]
        self.ms = [x.numel() // self.k for x in xs]
        self.bias_idx = tuple(i for i, b in enumerate(biases) if b is not None) if biases is not None else ()
        self.nb = len(self.bias_idx)
        self.y_shapes = [tuple(x.shape[:-1]) + (self.n,) for x in xs]
        self.x_shapes = [tuple(x.shape) for x in xs]
        self.row_off = [0] + list(np.cumsum(self.ms)[:-1].tolist()) if G else []
        self.tot_m = sum(self.ms)
        self._dev_tabs = {}
        self._zero = None

    def _table(self, name, make):
        """A device table of this signature, uploaded once per stream (an asynchronous copy is only
        known to be ready on its stream); during CUDA-graph capture a cached one is kept alive for
        good (the graph outlives this plan) and a missing one is staged fresh, uncached."""
        cap = _dt.capturing(self.dev)
        key = (name, _dt.stream_key(self.dev))
        t = self._dev_tabs.get(key)
        if t is None:
            t = _dt.upload(make(), self.dev, cap)
            if not cap:
                self._dev_tabs[key] = t
            return t
        return _dt.keep_for_graphs(t, cap)

    def offs(self) -> torch.Tensor:
        """int32 end offsets of the members' rows (``torch._grouped_mm``'s ``offs``)."""
        return self._table("offs", lambda: np.cumsum(np.asarray(self.ms, dtype=np.int64)).astype(np.int32))

    def member_of_row(self) -> torch.Tensor:
        """int64 member index of every row of the concatenated inputs (bias gather, db scatter)."""
        return self._table("rows", lambda: np.repeat(np.arange(self.G, dtype=np.int64), self.ms))

    def bias_rows(self, bs):
        """The G bias rows in member order, zeros where a member has none."""
        if self.nb == self.G:
            return list(bs)
        if self._zero is None:
            self._zero = torch.zeros(self.n, dtype=self.dt, device=self.dev)
        rows = [_dt.keep_for_graphs(self._zero, _dt.capturing(self.dev))] * self.G
        for j, i in enumerate(self.bias_idx):
            rows[i] = bs[j]
        return rows


def _aliases(buf: torch.Tensor, shapes, row_off, n):
    """Tensors sharing ``buf``'s storage, one per member (rows ``row_off[g]`` on), that autograd does
    not see as views: in-place ops on them are legal, as on separately allocated outputs."""
    st = buf.untyped_storage()
    base = buf.storage_offset()
    out = []
    for s, r in zip(shapes, row_off):
        t = torch.empty(0, dtype=buf.dtype, device=buf.device)
        t.set_(st, base + r * n, s, _contig_strides(s))
        out.append(t)
    return out


def _contig_strides(shape):
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return tuple(reversed(st))


def _gemm_fwd(plan, X, W):
    """Z = X @ W^T per member; X: (G, M, K) for bmm, (sum M, K) for grouped_mm; W: (G, N, K)."""
    if plan.route == "bmm":
        return torch.bmm(X, W.transpose(1, 2))
    return torch._grouped_mm(X, W.transpose(-2, -1), offs=plan.offs())


def _joined(ts, rows, cols: int, stack: bool):
    """The members as one ``(G, rows, cols)`` (``stack``) or ``(sum rows, cols)`` tensor, and whether
    it is a view: when they lie back to back in member order in one storage (outputs of a
    previous vendor-routed group, parameters packed into one buffer) it is a view of that storage
    (free), otherwise a copy (``torch.stack`` / ``torch.cat``)."""
    G = len(ts)
    es = ts[0].element_size()
    p = ts[0].data_ptr()
    adjacent = p != 0
    for t, r in zip(ts, rows):
        if not adjacent or t.data_ptr() != p:
            adjacent = False
            break
        p += r * cols * es
    if adjacent and (G == 1 or ts[0].untyped_storage().data_ptr() == ts[-1].untyped_storage().data_ptr()):
        # every member lies between the first and the last, inside their one storage
        if stack:
            return ts[0].as_strided((G, rows[0], cols), (rows[0] * cols, cols, 1)), True
        return ts[0].as_strided((sum(rows), cols), (cols, 1)), True
    flat = [t.view(-1, cols) for t in ts]
    return (torch.stack(flat) if stack else torch.cat(flat)), False


class _VendorLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, *ts):
        G, k, n = plan.G, plan.k, plan.n
        xs, ws, bs = ts[:G], ts[G:2 * G], ts[2 * G:]
        bmm = plan.route == "bmm"
        X, x_view = _joined(xs, plan.ms, k, stack=bmm)                   # (G, M, K) or (sum M, K)
        W, w_view = _joined(ws, [n] * G, k, stack=True)                  # (G, N, K)
        Z = _gemm_fwd(plan, X, W)
        if plan.nb:
            B = torch.stack(plan.bias_rows(bs))                          # (G, N), zeros for missing biases
            if bmm:
                Z = Z.add_(B.unsqueeze(1))
            else:
                Z = Z.add_(B.index_select(0, plan.member_of_row()))
        Y = _act(Z, plan.act) if plan.act != "none" else Z
        if plan.need_grad:
            # views of the inputs are saved as the inputs themselves (autograd then checks that
            # nothing modified them in place before the backward); copies as they are
            saved = (list(xs) if x_view else [X]) + (list(ws) if w_view else [W])
            ctx.save_for_backward(*saved, Z if plan.act != "none" else None)
            ctx.plan, ctx.views = plan, (x_view, w_view)
        ys = _aliases(Y.view(-1, n), plan.y_shapes, plan.row_off, n)
        return ys[0] if G == 1 else tuple(ys)

    @staticmethod
    def backward(ctx, *gys):
        plan = ctx.plan
        G, k, n = plan.G, plan.k, plan.n
        saved = ctx.saved_tensors
        x_view, w_view = ctx.views
        bmm = plan.route == "bmm"
        if x_view:
            X, saved = _joined(saved[:G], plan.ms, k, stack=bmm)[0], saved[G:]
        else:
            X, saved = saved[0], saved[1:]
        W = _joined(saved[:G], [n] * G, k, stack=True)[0] if w_view else saved[0]
        Z = saved[-1]
        needs = ctx.needs_input_grad
        GY = _joined([g.contiguous() for g in gys], plan.ms, n, stack=bmm)[0]  # (G, M, N) or (sum M, N)
        if plan.act != "none":
            aux = Z if plan.act in ("gelu", "silu") else _act(Z, plan.act)
            GY = _act_grad(GY.float(), aux.float(), plan.act).to(plan.dt)
        out = [None]
        if any(needs[1:1 + G]):
            if plan.route == "bmm":
                dX = torch.bmm(GY, W)
            else:
                dX = torch._grouped_mm(GY, W, offs=plan.offs())
            out += [d.view(s) for d, s in zip(dX.reshape(-1, k).split(plan.ms), plan.x_shapes)]
        else:
            out += [None] * G
        if any(needs[1 + G:1 + 2 * G]):
            if plan.route == "bmm":
                dW = torch.bmm(GY.transpose(1, 2), X)
            else:
                dW = torch._grouped_mm(GY.t(), X, offs=plan.offs())  # (G, N, K), contraction over rows
            out += list(dW.unbind(0))
        else:
            out += [None] * G
        if plan.nb and any(needs[1 + 2 * G:]):
            if plan.route == "bmm":
                dB = GY.sum(1)
            else:
                dB = torch.zeros(G, n, dtype=torch.float32, device=plan.dev).index_add_(
                    0, plan.member_of_row(), GY.float()).to(plan.dt)
            out += [dB[i] for i in plan.bias_idx]
        else:
            out += [None] * plan.nb
        return tuple(out)


def apply(plan: VendorPlan, xs, weights, biases):
    """Run a vendor route (validated inputs); returns the list of outputs."""
    args = [*xs, *weights, *([biases[i] for i in plan.bias_idx] if plan.nb else [])]
    out = _VendorLinearFn.apply(plan, *args)
    return [out] if plan.G == 1 else list(out)
