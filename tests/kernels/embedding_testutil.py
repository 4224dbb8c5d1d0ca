"""Helpers for the grouped-embedding-bag tests: random cases and a float64 F.embedding_bag oracle."""

from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn.functional as F

from kernels_testutil import K, rel_err


@dataclass
class Case:
    weights: List[torch.Tensor]
    indices: List[torch.Tensor]                 # per table: 1-D (with offsets) or 2-D [B, L]
    offsets: List[Optional[torch.Tensor]]       # per table: B entries (no last offset) or None
    psw: List[Optional[torch.Tensor]]
    modes: List[str]
    pads: List[Optional[int]]
    B: int
    dims: List[int] = field(default_factory=list)


def make_case(ns, ds, B, modes, pads=None, bag=None, max_bag=4, dtype=torch.float32, psw=False, seed=0,
              idx_dtype=torch.int64, requires_grad=True, hot=None, pad_frac=0.2):
    """T tables [N_t, D_t]; ``bag``: per table None (jagged, lengths 0..max_bag, empty bags
    included) or a fixed bag size L (2-D [B, L] indices).  ``hot``: per table None or a row that
    half of the entries hit (segments that cross chunk boundaries in the sorted backward)."""
    g = torch.Generator().manual_seed(seed)
    T = len(ns)
    bag = bag if bag is not None else [None] * T
    pads = pads if pads is not None else [None] * T
    ws, idx, offs, psws = [], [], [], []
    for t in range(T):
        n, d = ns[t], ds[t]
        w = torch.randn(n, d, generator=g).to(dtype)
        ws.append(w.requires_grad_(requires_grad))
        if bag[t] is None:
            lens = torch.randint(0, max_bag + 1, (B,), generator=g)
            if B > 1:
                lens[1] = 0  # an empty bag in every jagged table
            cnt = int(lens.sum())
            o = torch.zeros(B, dtype=idx_dtype)
            if B > 1:
                o[1:] = lens.cumsum(0)[:-1].to(idx_dtype)
            shape = (cnt,)
        else:
            o = None
            shape = (B, bag[t])
        x = torch.randint(0, max(n, 1), shape, generator=g)
        p = pads[t]
        if p is not None and x.numel():
            pr = p + n if p < 0 else p
            m = torch.rand(shape, generator=g) < pad_frac
            x[m] = pr
        if hot is not None and hot[t] is not None and x.numel():
            m = torch.rand(shape, generator=g) < 0.5
            x[m] = hot[t]
        idx.append(x.to(idx_dtype))
        offs.append(o)
        psws.append((torch.rand(shape, generator=g) + 0.5).to(dtype).requires_grad_(requires_grad)
                    if psw and modes[t] == "sum" else None)
    return Case(ws, idx, offs, psws, list(modes), list(pads), B, list(ds))


def _bag_ids(o, n, B):
    full = torch.cat([o.long(), torch.tensor([n], device=o.device)])
    return torch.repeat_interleave(torch.arange(B, device=o.device), full[1:] - full[:-1])


def oracle(case: Case, weights=None, psws=None):
    """float64 [B, sum D] from F.embedding_bag / F.embedding, differentiable w.r.t. ``weights``
    (default: float64 leaf copies of the case's weights) and ``psws``."""
    ws = weights if weights is not None else [w.detach().double().requires_grad_() for w in case.weights]
    ps = psws if psws is not None else [p.detach().double().requires_grad_() if p is not None else None
                                        for p in case.psw]
    outs = []
    for t, w in enumerate(ws):
        x, o, p, m, pad = case.indices[t], case.offsets[t], ps[t], case.modes[t], case.pads[t]
        if m == "embedding":
            rows = F.embedding(x, w, padding_idx=pad)
            if o is None:
                outs.append(rows.sum(1))
            else:
                outs.append(torch.zeros(case.B, w.shape[1], dtype=w.dtype, device=w.device).index_add(
                    0, _bag_ids(o, x.numel(), case.B), rows))
        else:
            outs.append(F.embedding_bag(x, w, o, mode=m, per_sample_weights=p, padding_idx=pad))
    return torch.cat(outs, 1), ws, ps


def packed(case: Case):
    """The case in the packed (KeyedJaggedTensor) form: (indices, offsets T*B+1, psw)."""
    flat = [x.reshape(-1) for x in case.indices]
    idx = torch.cat(flat)
    dev = idx.device
    parts, base = [], 0
    for x, o in zip(flat, case.offsets):
        if o is None:
            L = x.numel() // case.B if case.B else 0
            parts.append(torch.arange(case.B, device=dev) * L + base)
        else:
            parts.append(o.long() + base)
        base += x.numel()
    parts.append(torch.tensor([base], device=dev))
    off = torch.cat(parts).to(case.indices[0].dtype)
    psw = None
    if any(p is not None for p in case.psw):
        psw = torch.cat([p.reshape(-1) if p is not None else torch.ones(x.numel(), dtype=case.weights[0].dtype,
                                                                         device=dev)
                         for p, x in zip(case.psw, flat)]).detach().requires_grad_(case.weights[0].requires_grad)
    return idx, off, psw


def check_case(case: Case, tol: float, form: str = "list", sparse=False, deterministic=True, grads=True,
               **kw):
    """Our forward (and the gradients of the weights and per-sample weights) against the oracle."""
    if form == "list":
        psw_arg = case.psw if any(p is not None for p in case.psw) else None
        out = K.grouped_embedding_bag(case.weights, case.indices, case.offsets, psw_arg, mode=case.modes,
                                      padding_idx=case.pads, sparse=sparse, deterministic=deterministic, **kw)
        psw_leaves = [p for p in case.psw if p is not None]
    else:
        idx, off, psw = packed(case)
        out = K.grouped_embedding_bag(case.weights, idx, off, psw, mode=case.modes, padding_idx=case.pads,
                                      sparse=sparse, deterministic=deterministic, **kw)
        psw_leaves = [psw] if psw is not None else []
    ref, ws64, ps64 = oracle(case)
    assert out.shape == (case.B, sum(w.shape[1] for w in case.weights)), out.shape
    assert out.dtype == case.weights[0].dtype
    errs = {"out": rel_err(out, ref)}
    if grads:
        gy = torch.randn(out.shape, generator=torch.Generator().manual_seed(99)).to(out.dtype).to(out.device)
        leaves = list(case.weights) + psw_leaves
        got = torch.autograd.grad(out, leaves, gy, allow_unused=True)
        p64 = [p for p in ps64 if p is not None]
        want = torch.autograd.grad(ref, ws64 + p64, gy.double(), allow_unused=True)
        T = len(case.weights)
        sp = sparse if isinstance(sparse, (list, tuple)) else [sparse] * T
        for t in range(T):
            g, r = got[t], want[t]
            r = torch.zeros_like(ws64[t]) if r is None else r
            if sp[t]:
                assert g.is_sparse, f"table {t}: expected a sparse gradient"
                assert g._nnz() == case.indices[t].numel(), (g._nnz(), case.indices[t].numel())
                # one entry per index, as eager's sparse gradient: sum the duplicates in fp64, so
                # a hot row's hundreds of bf16 entries judge the kernel, not to_dense's bf16 sum
                g = g.double().to_dense()
            else:
                assert g.layout == torch.strided and g.shape == case.weights[t].shape and g.is_contiguous()
            errs[f"dw{t}"] = rel_err(g, r)
        if psw_leaves:
            if form == "list":
                wp = [r for r, p in zip(want[T:], p64)]
                errs["dpsw"] = rel_err(torch.cat([g.reshape(-1) for g in got[T:]]),
                                       torch.cat([r.reshape(-1) for r in wp]))
            else:
                r_full = []
                j = 0
                for t, p in enumerate(case.psw):
                    if p is not None:
                        r_full.append(want[T + j].reshape(-1))
                        j += 1
                    else:
                        r_full.append(torch.zeros(case.indices[t].numel(), dtype=torch.float64, device=got[T].device))
                errs["dpsw"] = rel_err(got[T], torch.cat(r_full))
    for k, v in errs.items():
        assert v <= tol, f"{k}: relative error {v:.3e} > {tol:.1e} ({errs})"
    return errs


def to_device(case: Case, device) -> Case:
    """The same case on another device (leaf tensors again)."""
    def leaf(t):
        return None if t is None else t.detach().to(device).requires_grad_(t.requires_grad)

    return Case([leaf(w) for w in case.weights], [x.to(device) for x in case.indices],
                [o.to(device) if o is not None else None for o in case.offsets], [leaf(p) for p in case.psw],
                case.modes, case.pads, case.B, case.dims)
