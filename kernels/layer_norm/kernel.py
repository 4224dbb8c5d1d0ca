"""Batched layernorm: G inputs of widths D_g normalised over their last dim in one launch.

Math
----
For each row r of member g (width D = D_g)::

    mean_r = sum_j x_rj / D          var_r = sum_j (x_rj - mean_r)^2 / D       (fp32, two-pass)
    rstd_r = 1 / sqrt(var_r + eps)
    xhat   = (x - mean_r) * rstd_r
    z      = xhat * w_g + b_g                                     (w, b optional)
    y      = act(z)                                  (the epilogue: none, relu, gelu, silu, sigmoid, tanh)

Backward with ``wdy = dy * w_g`` (or dy without affine), after ``dy <- dy * act'(z)``, z
recomputed from x, the row statistics, w and b (nothing more is saved for the epilogue)::

    c1_r = sum_j xhat_rj * wdy_rj / D        c2_r = sum_j wdy_rj / D
    dx   = (wdy - (xhat * c1_r + c2_r)) * rstd_r
    dw_g = sum_r dy * xhat                   db_g = sum_r dy

Memory plan
-----------
* One launch for all rows of all members.  The host cuts the rows into *chunks* of roughly equal
  size in elements (about ``8 x #SMs`` chunks in all) so that wide and narrow members are balanced
  across the SMs; a chunk never straddles two members.  The chunk table (member, first row, row
  count, slot) depends only on the shapes and is cached on the device per shape signature.
* Each member has a *width class*: its row is held in registers as a ``BLOCK_R x BLOCK_D`` tile
  with ``BLOCK_D = MIN_D << k >= D`` and ``BLOCK_R = TILE / BLOCK_D`` rows (k = 0..6), or one row
  of ``2*TILE`` / ``4*TILE`` elements (k = 7, 8); wider rows (k = 9) loop over the row in TILE-sized
  pieces (three passes, re-reading the row from L2).  The kernel branches on the class at run time,
  so a narrow member does not pay for the widest member's tile: every class moves ~TILE elements
  per step.  x is read once and y written once; per-row mean and rstd (fp32) are stored for the
  backward (8 bytes per row).
* Backward: each chunk recomputes xhat from x, mean and rstd, writes dx, and accumulates its
  members' dW/db column sums in registers; at the end of the chunk it stores them to its own slot
  of an fp32 partials buffer (no atomics, deterministic).  A second small kernel sums the slots of
  each member per column block and writes dW/db in the parameter dtype.
* ``ALIGN``: 16-byte alignment of every row (all D_g and offsets multiples of 16 bytes) lets the
  compiler use 16-byte vector loads and stores.

Compiled (GPU) numerics: statistics and all arithmetic in fp32, two-pass variance; the backward is
deterministic (no atomics).  ``rsqrt`` and ``/`` compile to the GPU's approximate forms (a few
ulps; torch's own CUDA layer norm uses ``rsqrtf`` too), the interpreter computes with NumPy.

Launch count: forward 1; backward 2.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from ..runtime import tables as _dt
from ..runtime.activation import ACTIVATIONS
from ..runtime.activation_jit import act_bwd as _act_bwd, act_fwd as _act_fwd
from ..runtime.backend import cdiv, device_guard, interpret_mode, num_sms
from ..runtime.checks import past_int32_limits
from ..runtime.launch import launch as _launch_direct
from . import reference as ref

NCOL = 16
L_D = tl.constexpr(0)
L_R = tl.constexpr(1)
L_RS = tl.constexpr(2)    # first global row (index into the stats vectors)
L_CLS = tl.constexpr(3)   # width class
L_X = tl.constexpr(4)
L_Y = tl.constexpr(5)
L_W = tl.constexpr(6)
L_B = tl.constexpr(7)
L_DY = tl.constexpr(8)
L_DX = tl.constexpr(9)
L_P = tl.constexpr(10)    # partials offset (elements, per half)
L_NCH = tl.constexpr(11)  # number of chunks (= partial slots) of the member
L_DW = tl.constexpr(12)
L_DB = tl.constexpr(13)
L_S = tl.constexpr(14)    # row stride of x, y, dy, dx (D when packed, sum D in the column layout)
NCOL_C = tl.constexpr(NCOL)
COL = dict(D=0, R=1, RS=2, CLS=3, X=4, Y=5, W=6, B=7, DY=8, DX=9, P=10, NCH=11, DW=12, DB=13, S=14)

_INTERPRET = interpret_mode()
# GPU: 4096-element tiles, classes 64 .. 4096 multi-row, 8192 / 16384 single row, wider: loop.
# Interpreter: tiny tiles so that the tests reach every class, the single-row ones and the loop.
TILE, MIN_D = (256, 4) if _INTERPRET else (4096, 64)
LOOP_CLS = 9
CHUNKS_PER_SM = 8


# Only Triton builtins and our own jitted helpers are called inside the kernels (no tl.sum /
# tl.zeros / tl.cdiv, which are @jit functions of triton.language): that keeps the kernels usable
# by Triton's CPU interpreter even when triton itself was imported before TRITON_INTERPRET was set.
# The reduction uses triton's own sum combiner, which the interpreter maps to numpy.sum.
@triton.jit
def _sum(x, AXIS: tl.constexpr):
    return tl.reduce(x, AXIS, tl.standard._sum_combine)


# ---------------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------------
@triton.jit
def _ln_fwd_tile(xb, yb, wb, bb, mb, rb, D, S, r0, nr, eps,
                 HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACT: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    cols = tl.arange(0, BD)
    cmask = cols < D
    if HAS_W:
        w = tl.load(wb + cols, mask=cmask, other=0.0).to(tl.float32)
    if HAS_B:
        b = tl.load(bb + cols, mask=cmask, other=0.0).to(tl.float32)
    rloc = tl.arange(0, BR)
    r_end = r0 + nr
    for i in range(0, (nr + BR - 1) // BR):
        rows = r0 + i * BR + rloc
        rmask = rows < r_end
        m2 = rmask[:, None] & cmask[None, :]
        offs = rows[:, None] * S + cols[None, :]
        x = tl.load(xb + offs, mask=m2, other=0.0).to(tl.float32)
        mean = _sum(x, 1) / D
        xc = tl.where(m2, x - mean[:, None], 0.0)
        var = _sum(xc * xc, 1) / D
        rstd = tl.math.rsqrt(var + eps)
        y = xc * rstd[:, None]
        if HAS_W:
            y = y * w[None, :]
        if HAS_B:
            y = y + b[None, :]
        y = _act_fwd(y, ACT)
        tl.store(yb + offs, y.to(yb.dtype.element_ty), mask=m2)
        tl.store(mb + rows, mean, mask=rmask)
        tl.store(rb + rows, rstd, mask=rmask)


@triton.jit
def _ln_fwd_loop(xb, yb, wb, bb, mb, rb, D, S, r0, nr, eps,
                 HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACT: tl.constexpr, BD: tl.constexpr):
    cols0 = tl.arange(0, BD)
    for r in range(r0, r0 + nr):
        xr = xb + r * S
        yr = yb + r * S
        s = tl.full((BD,), 0.0, tl.float32)
        for c0 in range(0, D, BD):
            cols = c0 + cols0
            s += tl.load(xr + cols, mask=cols < D, other=0.0).to(tl.float32)
        mean = _sum(s, 0) / D
        v = tl.full((BD,), 0.0, tl.float32)
        for c0 in range(0, D, BD):
            cols = c0 + cols0
            cm = cols < D
            x = tl.load(xr + cols, mask=cm, other=0.0).to(tl.float32)
            d = tl.where(cm, x - mean, 0.0)
            v += d * d
        rstd = tl.math.rsqrt(_sum(v, 0) / D + eps)
        for c0 in range(0, D, BD):
            cols = c0 + cols0
            cm = cols < D
            x = tl.load(xr + cols, mask=cm, other=0.0).to(tl.float32)
            y = (x - mean) * rstd
            if HAS_W:
                y = y * tl.load(wb + cols, mask=cm, other=0.0).to(tl.float32)
            if HAS_B:
                y = y + tl.load(bb + cols, mask=cm, other=0.0).to(tl.float32)
            y = _act_fwd(y, ACT)
            tl.store(yr + cols, y.to(yb.dtype.element_ty), mask=cm)
        tl.store(mb + r, mean)
        tl.store(rb + r, rstd)


@triton.jit
def _ln_fwd_kernel(x_ptr, y_ptr, w_ptr, b_ptr, stats_ptr, gtab_ptr, ctab_ptr, eps, TOT_ROWS,
                   HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACT: tl.constexpr, ALIGN: tl.constexpr,
                   MIN_D: tl.constexpr, TILE: tl.constexpr, MAX_CLS: tl.constexpr):
    c = tl.program_id(0)
    crow = ctab_ptr + c * 4
    g = tl.load(crow + 0)
    r0 = tl.load(crow + 1)
    nr = tl.load(crow + 2)
    row = gtab_ptr + g * NCOL_C
    D = tl.load(row + L_D).to(tl.int32)
    cls = tl.load(row + L_CLS).to(tl.int32)
    rs = tl.load(row + L_RS)
    x_off = tl.load(row + L_X)
    y_off = tl.load(row + L_Y)
    S = tl.load(row + L_S).to(tl.int32)
    if ALIGN > 1:
        D = tl.multiple_of(D, ALIGN)
        S = tl.multiple_of(S, ALIGN)
        x_off = tl.multiple_of(x_off, ALIGN)
        y_off = tl.multiple_of(y_off, ALIGN)
    xb = x_ptr + x_off
    yb = y_ptr + y_off
    wb = w_ptr
    bb = b_ptr
    if HAS_W:
        wb = w_ptr + tl.load(row + L_W)
    if HAS_B:
        bb = b_ptr + tl.load(row + L_B)
    mb = stats_ptr + rs
    rb = stats_ptr + TOT_ROWS + rs
    if cls == 0:
        _ln_fwd_tile(xb, yb, wb, bb, mb, rb, D, S, r0, nr, eps, HAS_W, HAS_B, ACT, TILE // MIN_D, MIN_D)
    if MAX_CLS >= 1:
        if cls == 1:
            _ln_fwd_tile(xb, yb, wb, bb, mb, rb, D, S, r0, nr, eps, HAS_W, HAS_B, ACT, TILE // (MIN_D * 2), MIN_D * 2)
    if MAX_CLS >= 2:
        if cls == 2:
            _ln_fwd_tile(xb, yb, wb, bb, mb, rb, D, S, r0, nr, eps, HAS_W, HAS_B, ACT, TILE // (MIN_D * 4), MIN_D * 4)
    if MAX_CLS >= 3:
        if cls == 3:
            _ln_fwd_tile(xb, yb, wb, bb, mb, rb, D, S, r0, nr, eps, HAS_W, HAS_B, ACT, TILE // (MIN_D * 8), MIN_D * 8)
    if MAX_CLS >= 4:
        if cls == 4:
            _ln_fwd_tile(xb, yb, wb, bb, mb, rb, D, S, r0, nr, eps, HAS_W, HAS_B, ACT, TILE // (MIN_D * 16), MIN_D * 16)
    if MAX_CLS >= 5:
        if cls == 5:
            _ln_fwd_tile(xb, yb, wb, bb, mb, rb, D, S, r0, nr, eps, HAS_W, HAS_B, ACT, TILE // (MIN_D * 32), MIN_D * 32)
    if MAX_CLS >= 6:
        if cls == 6:
            _ln_fwd_tile(xb, yb, wb, bb, mb, rb, D, S, r0, nr, eps, HAS_W, HAS_B, ACT, 1, TILE)
    if MAX_CLS >= 7:
        if cls == 7:
            _ln_fwd_tile(xb, yb, wb, bb, mb, rb, D, S, r0, nr, eps, HAS_W, HAS_B, ACT, 1, TILE * 2)
    if MAX_CLS >= 8:
        if cls == 8:
            _ln_fwd_tile(xb, yb, wb, bb, mb, rb, D, S, r0, nr, eps, HAS_W, HAS_B, ACT, 1, TILE * 4)
    if MAX_CLS >= 9:
        if cls == 9:
            _ln_fwd_loop(xb, yb, wb, bb, mb, rb, D, S, r0, nr, eps, HAS_W, HAS_B, ACT, TILE)


# ---------------------------------------------------------------------------------------------
# backward: dx per row, dW/db column sums per chunk -> partial slots
# ---------------------------------------------------------------------------------------------
@triton.jit
def _epilogue_grad(dy, z, ACT: tl.constexpr):
    """dy of the norm's affine result from dy of the activation's output, at pre-activation z."""
    aux = z  # act_bwd takes the output for relu / sigmoid / tanh, the pre-activation for gelu / silu
    if ACT == 1 or ACT == 4 or ACT == 5:
        aux = _act_fwd(z, ACT)
    return _act_bwd(dy, aux, ACT)


@triton.jit
def _affine(xhat, wb, zbb, cols, cm, HAS_W: tl.constexpr, ACT_B: tl.constexpr):
    z = xhat
    if HAS_W:
        z = z * tl.load(wb + cols, mask=cm, other=0.0).to(tl.float32)
    if ACT_B:
        z = z + tl.load(zbb + cols, mask=cm, other=0.0).to(tl.float32)
    return z


@triton.jit
def _ln_bwd_tile(xb, dyb, dxb, wb, zbb, mb, rb, pw, pb, D, S, r0, nr,
                 HAS_W: tl.constexpr, HAS_B: tl.constexpr, NEED_DX: tl.constexpr, ACT: tl.constexpr,
                 ACT_B: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    cols = tl.arange(0, BD)
    cmask = cols < D
    if HAS_W:
        w = tl.load(wb + cols, mask=cmask, other=0.0).to(tl.float32)
    if ACT_B:
        zb = tl.load(zbb + cols, mask=cmask, other=0.0).to(tl.float32)
    dw_acc = tl.full((BD,), 0.0, tl.float32)
    db_acc = tl.full((BD,), 0.0, tl.float32)
    rloc = tl.arange(0, BR)
    r_end = r0 + nr
    for i in range(0, (nr + BR - 1) // BR):
        rows = r0 + i * BR + rloc
        rmask = rows < r_end
        m2 = rmask[:, None] & cmask[None, :]
        offs = rows[:, None] * S + cols[None, :]
        x = tl.load(xb + offs, mask=m2, other=0.0).to(tl.float32)
        dy = tl.load(dyb + offs, mask=m2, other=0.0).to(tl.float32)
        mean = tl.load(mb + rows, mask=rmask, other=0.0)
        rstd = tl.load(rb + rows, mask=rmask, other=0.0)
        xhat = tl.where(m2, (x - mean[:, None]) * rstd[:, None], 0.0)
        if ACT != 0:  # the epilogue's gradient, at the pre-activation recomputed from xhat
            z = xhat
            if HAS_W:
                z = z * w[None, :]
            if ACT_B:
                z = z + zb[None, :]
            dy = _epilogue_grad(dy, z, ACT)
        if HAS_W:
            wdy = dy * w[None, :]
            dw_acc += _sum(dy * xhat, 0)
        else:
            wdy = dy
        if HAS_B:
            db_acc += _sum(dy, 0)
        if NEED_DX:
            c1 = _sum(xhat * wdy, 1) / D
            c2 = _sum(wdy, 1) / D
            dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
            tl.store(dxb + offs, dx.to(dxb.dtype.element_ty), mask=m2)
    if HAS_W:
        tl.store(pw + cols, dw_acc, mask=cmask)
    if HAS_B:
        tl.store(pb + cols, db_acc, mask=cmask)


@triton.jit
def _ln_bwd_loop(xb, dyb, dxb, wb, zbb, mb, rb, pw, pb, D, S, r0, nr,
                 HAS_W: tl.constexpr, HAS_B: tl.constexpr, NEED_DX: tl.constexpr, ACT: tl.constexpr,
                 ACT_B: tl.constexpr, BD: tl.constexpr):
    cols0 = tl.arange(0, BD)
    # this chunk owns its partial slot: zero it, then accumulate row by row
    for c0 in range(0, D, BD):
        cols = c0 + cols0
        cm = cols < D
        if HAS_W:
            tl.store(pw + cols, tl.full((BD,), 0.0, tl.float32), mask=cm)
        if HAS_B:
            tl.store(pb + cols, tl.full((BD,), 0.0, tl.float32), mask=cm)
    for r in range(r0, r0 + nr):
        xr = xb + r * S
        dyr = dyb + r * S
        mean = tl.load(mb + r)
        rstd = tl.load(rb + r)
        s1 = tl.full((BD,), 0.0, tl.float32)
        s2 = tl.full((BD,), 0.0, tl.float32)
        for c0 in range(0, D, BD):
            cols = c0 + cols0
            cm = cols < D
            x = tl.load(xr + cols, mask=cm, other=0.0).to(tl.float32)
            dy = tl.load(dyr + cols, mask=cm, other=0.0).to(tl.float32)
            xhat = tl.where(cm, (x - mean) * rstd, 0.0)
            if ACT != 0:
                dy = _epilogue_grad(dy, _affine(xhat, wb, zbb, cols, cm, HAS_W, ACT_B), ACT)
            if HAS_W:
                wdy = dy * tl.load(wb + cols, mask=cm, other=0.0).to(tl.float32)
                tl.store(pw + cols, tl.load(pw + cols, mask=cm, other=0.0) + dy * xhat, mask=cm)
            else:
                wdy = dy
            if HAS_B:
                tl.store(pb + cols, tl.load(pb + cols, mask=cm, other=0.0) + dy, mask=cm)
            s1 += xhat * wdy
            s2 += wdy
        if NEED_DX:
            c1 = _sum(s1, 0) / D
            c2 = _sum(s2, 0) / D
            for c0 in range(0, D, BD):
                cols = c0 + cols0
                cm = cols < D
                x = tl.load(xr + cols, mask=cm, other=0.0).to(tl.float32)
                dy = tl.load(dyr + cols, mask=cm, other=0.0).to(tl.float32)
                xhat = (x - mean) * rstd
                if ACT != 0:
                    dy = _epilogue_grad(dy, _affine(xhat, wb, zbb, cols, cm, HAS_W, ACT_B), ACT)
                if HAS_W:
                    wdy = dy * tl.load(wb + cols, mask=cm, other=0.0).to(tl.float32)
                else:
                    wdy = dy
                dx = (wdy - (xhat * c1 + c2)) * rstd
                tl.store(dxb + r * S + cols, dx.to(dxb.dtype.element_ty), mask=cm)


@triton.jit
def _ln_bwd_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, b_ptr, stats_ptr, part_ptr, gtab_ptr, ctab_ptr, TOT_ROWS, TOT_PART,
                   HAS_W: tl.constexpr, HAS_B: tl.constexpr, NEED_DX: tl.constexpr, ACT: tl.constexpr,
                   ACT_B: tl.constexpr, ALIGN: tl.constexpr,
                   MIN_D: tl.constexpr, TILE: tl.constexpr, MAX_CLS: tl.constexpr):
    c = tl.program_id(0)
    crow = ctab_ptr + c * 4
    g = tl.load(crow + 0)
    r0 = tl.load(crow + 1)
    nr = tl.load(crow + 2)
    j = tl.load(crow + 3)
    row = gtab_ptr + g * NCOL_C
    D = tl.load(row + L_D).to(tl.int32)
    cls = tl.load(row + L_CLS).to(tl.int32)
    rs = tl.load(row + L_RS)
    x_off = tl.load(row + L_X)
    dy_off = tl.load(row + L_DY)
    dx_off = tl.load(row + L_DX)
    p_off = tl.load(row + L_P)
    S = tl.load(row + L_S).to(tl.int32)
    if ALIGN > 1:
        D = tl.multiple_of(D, ALIGN)
        S = tl.multiple_of(S, ALIGN)
        x_off = tl.multiple_of(x_off, ALIGN)
        dy_off = tl.multiple_of(dy_off, ALIGN)
        dx_off = tl.multiple_of(dx_off, ALIGN)
    xb = x_ptr + x_off
    dyb = dy_ptr + dy_off
    dxb = dx_ptr + dx_off
    wb = w_ptr
    if HAS_W:
        wb = w_ptr + tl.load(row + L_W)
    zbb = b_ptr
    if ACT_B:
        zbb = b_ptr + tl.load(row + L_B)
    mb = stats_ptr + rs
    rb = stats_ptr + TOT_ROWS + rs
    pw = part_ptr + p_off + j * D
    pb = part_ptr + TOT_PART + p_off + j * D
    if cls == 0:
        _ln_bwd_tile(xb, dyb, dxb, wb, zbb, mb, rb, pw, pb, D, S, r0, nr, HAS_W, HAS_B, NEED_DX, ACT, ACT_B, TILE // MIN_D, MIN_D)
    if MAX_CLS >= 1:
        if cls == 1:
            _ln_bwd_tile(xb, dyb, dxb, wb, zbb, mb, rb, pw, pb, D, S, r0, nr, HAS_W, HAS_B, NEED_DX, ACT, ACT_B,
                         TILE // (MIN_D * 2), MIN_D * 2)
    if MAX_CLS >= 2:
        if cls == 2:
            _ln_bwd_tile(xb, dyb, dxb, wb, zbb, mb, rb, pw, pb, D, S, r0, nr, HAS_W, HAS_B, NEED_DX, ACT, ACT_B,
                         TILE // (MIN_D * 4), MIN_D * 4)
    if MAX_CLS >= 3:
        if cls == 3:
            _ln_bwd_tile(xb, dyb, dxb, wb, zbb, mb, rb, pw, pb, D, S, r0, nr, HAS_W, HAS_B, NEED_DX, ACT, ACT_B,
                         TILE // (MIN_D * 8), MIN_D * 8)
    if MAX_CLS >= 4:
        if cls == 4:
            _ln_bwd_tile(xb, dyb, dxb, wb, zbb, mb, rb, pw, pb, D, S, r0, nr, HAS_W, HAS_B, NEED_DX, ACT, ACT_B,
                         TILE // (MIN_D * 16), MIN_D * 16)
    if MAX_CLS >= 5:
        if cls == 5:
            _ln_bwd_tile(xb, dyb, dxb, wb, zbb, mb, rb, pw, pb, D, S, r0, nr, HAS_W, HAS_B, NEED_DX, ACT, ACT_B,
                         TILE // (MIN_D * 32), MIN_D * 32)
    if MAX_CLS >= 6:
        if cls == 6:
            _ln_bwd_tile(xb, dyb, dxb, wb, zbb, mb, rb, pw, pb, D, S, r0, nr, HAS_W, HAS_B, NEED_DX, ACT, ACT_B, 1, TILE)
    if MAX_CLS >= 7:
        if cls == 7:
            _ln_bwd_tile(xb, dyb, dxb, wb, zbb, mb, rb, pw, pb, D, S, r0, nr, HAS_W, HAS_B, NEED_DX, ACT, ACT_B, 1, TILE * 2)
    if MAX_CLS >= 8:
        if cls == 8:
            _ln_bwd_tile(xb, dyb, dxb, wb, zbb, mb, rb, pw, pb, D, S, r0, nr, HAS_W, HAS_B, NEED_DX, ACT, ACT_B, 1, TILE * 4)
    if MAX_CLS >= 9:
        if cls == 9:
            _ln_bwd_loop(xb, dyb, dxb, wb, zbb, mb, rb, pw, pb, D, S, r0, nr, HAS_W, HAS_B, NEED_DX, ACT, ACT_B, TILE)


@triton.jit
def _ln_reduce_kernel(part_ptr, dw_ptr, db_ptr, gtab_ptr, TOT_PART,
                      HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_C: tl.constexpr):
    g = tl.program_id(0)
    cb = tl.program_id(1)
    row = gtab_ptr + g * NCOL_C
    D = tl.load(row + L_D).to(tl.int32)
    if cb * BLOCK_C < D:
        nch = tl.load(row + L_NCH).to(tl.int32)
        p_off = tl.load(row + L_P)
        cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        cmask = cols < D
        js = tl.arange(0, BLOCK_J)
        accw = tl.full((BLOCK_J, BLOCK_C), 0.0, tl.float32)
        accb = tl.full((BLOCK_J, BLOCK_C), 0.0, tl.float32)
        for j0 in range(0, nch, BLOCK_J):
            jj = j0 + js
            m = (jj < nch)[:, None] & cmask[None, :]
            offs = p_off + (jj[:, None] * D + cols[None, :])
            if HAS_W:
                accw += tl.load(part_ptr + offs, mask=m, other=0.0)
            if HAS_B:
                accb += tl.load(part_ptr + TOT_PART + offs, mask=m, other=0.0)
        if HAS_W:
            dw_off = tl.load(row + L_DW)
            tl.store(dw_ptr + dw_off + cols, _sum(accw, 0).to(dw_ptr.dtype.element_ty), mask=cmask)
        if HAS_B:
            db_off = tl.load(row + L_DB)
            tl.store(db_ptr + db_off + cols, _sum(accb, 0).to(db_ptr.dtype.element_ty), mask=cmask)


# ---------------------------------------------------------------------------------------------
# host side
# ---------------------------------------------------------------------------------------------
def width_class(d: int) -> int:
    if d <= TILE:
        k = 0
        while (MIN_D << k) < d:
            k += 1
        return k
    if d <= 2 * TILE:
        return 7
    if d <= 4 * TILE:
        return 8
    return LOOP_CLS


def _class_tile(k: int):
    """(rows per step, padded width) of class k."""
    if k <= 6:
        bd = MIN_D << k
        return TILE // bd, bd
    if k == 7:
        return 1, 2 * TILE
    if k == 8:
        return 1, 4 * TILE
    return 1, TILE


# Inside one member the kernels index in int32 (``row * D + col``, row counters that run up to
# R + BLOCK_R, partial slots ``j * D``); the members' base offsets are int64.  Past these limits a
# wrapped row index passes its mask (``rows < r_end``) and the GPU reads and writes other memory.
# Such groups never reach the kernels (``LNSignature.limit_reason``): the callers run them on the
# plain-torch path.
MAX_MEMBER_ELEMS = 2 ** 31 - 1
MAX_DIM = 2 ** 30 - 1


def limit_reason(rows: Sequence[int], widths: Sequence[int]) -> Optional[str]:
    """None if every member fits the kernels' int32 indexing, else why not (a sentence)."""
    for g, (r, d) in enumerate(zip(rows, widths)):
        r, d = int(r), int(d)
        if r * d > MAX_MEMBER_ELEMS:
            return (f"batched_layer_norm: member {g} ({r} rows x {d}) has {r * d} elements, more than the "
                    f"Triton kernels' int32 indexing allows ({MAX_MEMBER_ELEMS})")
        if max(r, d) > MAX_DIM:
            return (f"batched_layer_norm: member {g} ({r} rows x {d}) has a dimension above {MAX_DIM}, "
                    f"past the Triton kernels' int32 row counters")
    return None


LAYOUTS = ("packed", "columns")


class LNSignature:
    """Shape-only facts of one group; ``limit_reason``: None, or why it must not be launched.

    ``layout``: ``"packed"`` (every member's rows flattened and concatenated, a member's rows D
    apart) or ``"columns"`` (every member has the same R rows; x, y, dy and dx are one
    (R, sum D) matrix, member g in columns [sum D_<g, sum D_<=g), as ``torch.cat(dim=1)`` lays
    them out)."""

    def __init__(self, rows, widths, nsms, layout="packed"):
        if layout not in LAYOUTS:
            raise ValueError(f"batched_layer_norm: layout must be one of {LAYOUTS}, got {layout!r}")
        if layout == "columns" and len(set(int(r) for r in rows)) > 1:
            raise ValueError(f"batched_layer_norm: the column layout needs every member to have the same rows, "
                             f"got {list(rows)}")
        self.layout = layout
        self.G = len(rows)
        R = np.asarray(rows, dtype=np.int64)
        D = np.asarray(widths, dtype=np.int64)
        self.R, self.D = R, D
        self.limit_reason = limit_reason(rows, widths)
        if self.limit_reason is None and layout == "columns" and self.G and int(R[0]) * int(D.sum()) > MAX_MEMBER_ELEMS:
            self.limit_reason = (f"batched_layer_norm: the column layout's ({int(R[0])}, {int(D.sum())}) matrix has "
                                 f"more elements than the Triton kernels' int32 indexing allows ({MAX_MEMBER_ELEMS})")

        def excl(a):
            out = np.zeros_like(a)
            if len(a) > 1:
                out[1:] = np.cumsum(a)[:-1]
            return out

        self.off_x, self.tot_x = excl(R * D), int((R * D).sum())
        self.stride = D.copy()  # row stride of x / y / dy / dx per member
        if layout == "columns":
            self.off_x, self.stride = excl(D), np.full_like(D, int(D.sum()))
        self.off_w, self.tot_w = excl(D), int(D.sum())
        self.row_start, self.tot_rows = excl(R), int(R.sum())
        cls = np.array([width_class(int(d)) for d in D], dtype=np.int64)
        active = (R > 0) & (D > 0)
        self.max_cls = int(cls[active].max()) if active.any() else 0
        # chunking: ~CHUNKS_PER_SM chunks per SM of roughly equal element count
        br = np.array([_class_tile(int(k))[0] for k in cls], dtype=np.int64)
        bd = np.array([_class_tile(int(k))[1] for k in cls], dtype=np.int64)
        step_cost = np.where(cls == LOOP_CLS, D * 3 // 2, br * bd)
        steps = np.where(active, -(-R // br), 0)
        total = int((steps * step_cost).sum())
        target = max(1, nsms * CHUNKS_PER_SM)
        chunk_cost = max(total / target, float(TILE))
        chunks = []
        nch = np.zeros(self.G, dtype=np.int64)
        for g in range(self.G):
            if not active[g]:
                continue
            spc = max(1, int(chunk_cost // int(step_cost[g])))  # steps per chunk
            rows_per_chunk = spc * int(br[g])
            r = int(R[g])
            j = 0
            for r0 in range(0, r, rows_per_chunk):
                chunks.append((g, r0, min(rows_per_chunk, r - r0), j))
                j += 1
            nch[g] = j
        self.nch = nch
        self.n_chunks = len(chunks)
        self.chunks = np.asarray(chunks, dtype=np.int32).reshape(-1, 4)
        self.off_p, self.tot_p = excl(nch * D), int((nch * D).sum())
        tmpl = np.zeros((self.G, NCOL), dtype=np.int64)
        tmpl[:, COL["D"]] = D
        tmpl[:, COL["R"]] = R
        tmpl[:, COL["RS"]] = self.row_start
        tmpl[:, COL["CLS"]] = cls
        tmpl[:, COL["P"]] = self.off_p
        tmpl[:, COL["NCH"]] = nch
        tmpl[:, COL["S"]] = self.stride
        self.template = tmpl
        self.dims_align = {a: bool(((D % a) == 0).all()) for a in (8, 4)}
        self.max_d = int(D.max()) if self.G else 0
        self._dev = {}
        self.widths_list = [int(d) for d in D]
        self.x_sizes = [int(v) for v in R * D]

    def table(self, cols):
        t = self.template.copy()
        for name, vals in cols.items():
            t[:, COL[name]] = vals
        return t

    def _cached(self, name, device, make):
        """Device copy of a shape-only table, cached per device and stream (uploaded
        asynchronously on the current stream: only known to be ready there).  While capturing a
        CUDA graph a cached copy is kept alive for good (the graph reads it at every replay) and a
        missing one is staged fresh through the capture arena (see ``runtime/tables.py``)."""
        cap = _dt.capturing(device)
        key = (name, device, _dt.stream_key(device))
        t = self._dev.get(key)
        if t is None:
            t = _dt.upload(make(), device, cap)
            if not cap:
                self._dev[key] = t
            return t
        return _dt.keep_for_graphs(t, cap)

    def chunk_table(self, device):
        return self._cached("chunks", device, lambda: self.chunks)

    def packed_table(self, device):
        def make():
            cols = dict(X=self.off_x, Y=self.off_x, W=self.off_w, B=self.off_w, DY=self.off_x, DX=self.off_x,
                        DW=self.off_w, DB=self.off_w)
            return self.table(cols)
        return self._cached("packed", device, make)


_SIGS: dict = {}


def signature(rows, widths, device, layout="packed") -> LNSignature:
    nsms = num_sms(device)
    key = (tuple(rows), tuple(widths), nsms, layout)
    s = _SIGS.get(key)
    if s is None:
        if len(_SIGS) > 4096:
            _SIGS.clear()
        s = _SIGS[key] = LNSignature(rows, widths, nsms, layout)
    return s


_ESIZE = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}


def alignment(sig: LNSignature, dtype, ptr_or: int) -> int:
    a = 16 // _ESIZE[dtype]
    if not sig.dims_align.get(a, False):
        return 1
    return a if ptr_or % 16 == 0 else 1


def _prune_ln(configs, named_args, **kwargs):
    """Warps per program by the widest class present (the tile is TILE elements either way)."""
    mc = kwargs.get("MAX_CLS", named_args.get("MAX_CLS", 0))
    allowed = (4, 8) if mc <= 5 else ((4, 8, 16) if mc == 6 else (8, 16))
    keep = [c for c in configs if c.num_warps in allowed]
    return keep or configs[:1]


_LN_CONFIGS = [triton.Config({}, num_warps=w, num_stages=1) for w in (4, 8, 16)]
_LN_KEY = ["MAX_CLS", "TOT_ROWS"]
if not _INTERPRET:
    _ln_fwd_tuned = triton.autotune(_LN_CONFIGS, key=_LN_KEY, prune_configs_by={"early_config_prune": _prune_ln},
                                    do_bench=lambda fn, quantiles: triton.testing.do_bench(
                                        fn, warmup=2, rep=8, quantiles=quantiles))(_ln_fwd_kernel)
    _ln_bwd_tuned = triton.autotune(_LN_CONFIGS, key=_LN_KEY, prune_configs_by={"early_config_prune": _prune_ln},
                                    do_bench=lambda fn, quantiles: triton.testing.do_bench(
                                        fn, warmup=2, rep=8, quantiles=quantiles))(_ln_bwd_kernel)


# (kernel, autotuning key, flags) -> num_warps chosen by the autotuner; later launches call the
# jitted kernel directly (no per-call autotuner bookkeeping)
_CHOSEN: dict = {}
_VIA_TUNER = object()


def _run(which, tuned, raw, grid, args, kwargs, key):
    with device_guard(args[0].device):
        _run_on_device(which, tuned, raw, grid, args, kwargs, key)


def _run_on_device(which, tuned, raw, grid, args, kwargs, key):
    if _INTERPRET:
        raw[grid](*args, **kwargs, num_warps=1)
        return
    ck = (which, key)
    meta = _CHOSEN.get(ck)
    if meta is None or meta is _VIA_TUNER:
        tuned[grid](*args, **kwargs)
        if meta is None:
            try:
                _CHOSEN[ck] = dict(tuned.best_config.all_kwargs())
            except AttributeError:  # pragma: no cover - other Triton versions
                _CHOSEN[ck] = _VIA_TUNER
        return
    _launch_direct(raw, grid, args, kwargs, meta)


def _check_limits(sig):
    if sig.limit_reason is not None:  # callers route such groups to plain torch; never launch one
        raise ValueError(sig.limit_reason)


def launch_forward(sig, gtab, x, y, w, b, stats, eps, align, act="none"):
    """y = act(layer_norm(x) * w + b) for all members; mean and rstd to ``stats``."""
    _check_limits(sig)
    a = ACTIVATIONS[act]
    if sig.n_chunks == 0:
        return
    _run("fwd", None if _INTERPRET else _ln_fwd_tuned, _ln_fwd_kernel, (sig.n_chunks,),
         (x, y, w if w is not None else x, b if b is not None else x, stats, gtab, sig.chunk_table(x.device),
          float(eps), sig.tot_rows),
         dict(HAS_W=w is not None, HAS_B=b is not None, ACT=a, ALIGN=align, MIN_D=MIN_D, TILE=TILE,
              MAX_CLS=sig.max_cls),
         (sig.max_cls, sig.tot_rows, x.dtype, w is not None, b is not None, a, align))


def launch_backward(sig, gtab, x, dy, dx, w, stats, dw, db, has_b, align, b=None, act="none"):
    """dx (if not None), dw (if w is not None), db (if has_b) for all members; with an
    activation, ``dy`` is the gradient of its output, and the kernel recomputes the
    pre-activation from x, the statistics, w and the bias ``b``."""
    _check_limits(sig)
    a = ACTIVATIONS[act]
    act_b = bool(a) and b is not None
    dev = x.device
    has_w = w is not None
    if sig.n_chunks:
        part = torch.empty(2 * sig.tot_p if (has_w or has_b) else 1, dtype=torch.float32, device=dev)
        _run("bwd", None if _INTERPRET else _ln_bwd_tuned, _ln_bwd_kernel, (sig.n_chunks,),
             (x, dy, dx if dx is not None else x, w if has_w else x, b if act_b else x, stats, part, gtab,
              sig.chunk_table(dev), sig.tot_rows, sig.tot_p),
             dict(HAS_W=has_w, HAS_B=has_b, NEED_DX=dx is not None, ACT=a, ACT_B=act_b, ALIGN=align, MIN_D=MIN_D,
                  TILE=TILE, MAX_CLS=sig.max_cls),
             (sig.max_cls, sig.tot_rows, x.dtype, has_w, has_b, dx is not None, a, act_b, align))
    else:
        part = torch.zeros(1, dtype=torch.float32, device=dev)
    if (has_w or has_b) and sig.max_d > 0:
        bc = 512 if _INTERPRET else 128
        grid = (sig.G, cdiv(sig.max_d, bc))
        with device_guard(dev):
            _launch_direct(_ln_reduce_kernel, grid,
                           (part, dw if has_w else part, db if has_b else part, gtab, sig.tot_p),
                           dict(HAS_W=has_w, HAS_B=has_b, BLOCK_J=8 if _INTERPRET else 32, BLOCK_C=bc),
                           dict(num_warps=1 if _INTERPRET else 4))


def _x_shape(sig):
    """The custom ops' shape of x / y / dy / dx: 1-D when packed, (R, sum D) in columns."""
    return (int(sig.R[0]), int(sig.tot_w)) if sig.layout == "columns" else (sig.tot_x,)


def forward_packed(x, w, b, rows, widths, eps, layout="packed", activation="none"):
    sig = signature(rows, widths, x.device, layout)
    if past_int32_limits(sig):
        return ref.batched_layer_norm_layout(x, w, b, rows, widths, eps, layout, activation)
    y = torch.empty(_x_shape(sig), dtype=x.dtype, device=x.device)
    stats = torch.empty(2, sig.tot_rows, dtype=torch.float32, device=x.device)
    ptr_or = x.data_ptr() | y.data_ptr()
    align = alignment(sig, x.dtype, ptr_or)
    launch_forward(sig, sig.packed_table(x.device), x, y, w, b, stats, eps, align, activation)
    return y, stats


def backward_packed(dy, x, w, stats, rows, widths, has_b, need_dx, need_dw, need_db, layout="packed",
                    b=None, activation="none"):
    sig = signature(rows, widths, x.device, layout)
    if past_int32_limits(sig):
        return ref.batched_layer_norm_backward_layout(dy, x, w, stats, rows, widths, has_b, need_dx, need_dw,
                                                      need_db, layout, b, activation)
    dev = x.device
    dx = torch.empty(_x_shape(sig) if need_dx else (0,), dtype=x.dtype, device=dev)
    pdt = w.dtype if w is not None else x.dtype
    # dW is accumulated whenever there is a weight (it is needed for dx anyway); dropped if unused
    dw = torch.empty(sig.tot_w if w is not None else 0, dtype=pdt, device=dev)
    db = torch.empty(sig.tot_w if (need_db and has_b) else 0, dtype=pdt, device=dev)
    ptr_or = x.data_ptr() | dy.data_ptr() | dx.data_ptr()
    align = alignment(sig, x.dtype, ptr_or)
    launch_backward(sig, sig.packed_table(dev), x, dy, dx if need_dx else None,
                    w, stats, dw, db, has_b and need_db, align, b, activation)
    if not need_dw:
        dw = dw[:0]
    return dx, dw, db
