"""Grouped linear: G heterogeneous ``y_g = act(x_g @ W_g^T + b_g)`` in one launch, with backward.

Math
----
For every member g of the group (``x_g``: M_g x K_g, ``W_g``: N_g x K_g, ``b_g``: N_g)::

    z_g  = x_g @ W_g^T + b_g                     (fp32 accumulation)
    y_g  = act(z_g)                              act in {none, relu, gelu, silu, sigmoid, tanh}

Backward, with ``dz_g = dy_g * act'(.)`` (act' from y_g for relu/sigmoid/tanh, from the saved
pre-activation z_g for gelu/silu)::

    dx_g = dz_g @ W_g            (M_g x K_g, reduction over N_g)   -> kernel ``_gl_dx_kernel``
    dW_g = dz_g^T @ x_g          (N_g x K_g, reduction over M_g)   -> kernel ``_gl_dw_kernel``
    db_g = sum_rows(dz_g)        (N_g, fused into the dW kernel: the programs of the first K-tile
                                  column sum the dz tile they already hold)

Memory plan
-----------
* Operands are never copied per member: every kernel receives one *base* tensor per operand plus a
  table of int64 element offsets (``tab``, ``G x 16``, one row per member, columns ``C_*`` below).
  In the traceable custom op the bases are packed 1-D buffers and the offsets their prefix sums
  (cached per shape signature, so no host->device copy per call).  The eager fast path uses the
  members' own storage: offsets are pointer differences to the first member (one small H2D copy of
  the table per call instead of packing copies).
* Persistent grid over all tiles of all groups: ``min(total_tiles, PROGS_PER_SM * #SMs)``
  programs; program p takes tiles p, p + P, p + 2P, ... walking the table once (tiles of member g
  are the ``cdiv(M, BM) * cdiv(N, BN)`` tiles after those of members before it).  The host sorts
  the table rows by reduction length, longest first, so the expensive tiles start first and the
  tail is made of cheap ones (LPT-style balance across SMs).
* Each output tile is computed by one program in registers (fp32 accumulator) over a software-
  pipelined loop of (BM x BK) and (BK x BN) operand tiles; the epilogue adds the bias, stores z
  (only for gelu/silu, needed by backward), applies the activation and stores y in the input dtype.
* dW splits the reduction over rows into ``SPLIT`` row chunks when M_g is large compared to the
  N_g x K_g output (recommendation layers: M up to 4096, N,K <= 512) so the small dW problems still
  fill the GPU; partial sums go with fp32 atomics into a zeroed fp32 workspace that holds dW and db
  of all members (cast to the parameter dtype afterwards).  The activation derivative is fused into
  the operand loads of both backward GEMMs (dz is never written to memory).
* ``ALIGN``: when every row stride and offset is a multiple of 16 bytes the host says so and the
  kernels tell the compiler (``tl.multiple_of``) so operand loads become 16-byte vector loads.
* ``DOT_F32``: the products run as exact fp32 FMAs (``input_precision="ieee"``, operands upcast
  to fp32 first).  Set for fp32 operands unless torch allows TF32 (``allow_tf32`` / ``fp32_precision``
  / ``set_float32_matmul_precision``, read at each call), so the kernels follow the precision
  torch's own fp32 matmuls use (Triton's default for fp32 ``tl.dot`` is TF32, about 1e-3 relative
  error); for 16-bit operands in Triton's CPU interpreter, where ``tl.dot`` on them is unreliable.
  It is a constexpr and part of the autotuning key (``_KEYS``, ``_CHOSEN``).

Compiled (GPU) numerics vs the interpreter
------------------------------------------
* 16-bit operands: tensor-core products, fp32 accumulation (``acc`` is fp32); dz is rounded to the
  input dtype before the backward GEMMs, as autograd's own 16-bit backward does.
* dW / db with ``SPLIT`` below M_g: the row chunks meet in fp32 ``atomic_add`` in arrival order,
  so dW and db are not bitwise reproducible run to run (differences at fp32 rounding level, far
  below the 16-bit output rounding); forward and dX are deterministic.
* Transcendentals: on NVIDIA GPUs Triton lowers fp32 ``tl.exp`` to ``ex2.approx`` and ``/`` to
  ``div.full`` (a few ulps, as Inductor's generated kernels); ``tl.math.erf`` (gelu) is libdevice.
  The interpreter computes with NumPy.  The tanh epilogue avoids ``2 / (1 + exp(-2z)) - 1``, which
  cancels near 0 on both.
* Offsets: int32 inside a member, int64 member bases; see ``MAX_MEMBER_ELEMS`` for the limits.

Launch count: forward 1; backward 2 GEMM kernels + a memset of the fp32 workspace (+ one cast for
16-bit dtypes).
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from ..runtime import tables as _dt
from ..runtime.backend import device_guard, interpret_mode, next_pow2, num_sms, torch_allows_tf32
from ..runtime.checks import past_int32_limits
from ..runtime.activation import ACTIVATIONS, NEEDS_PREACT
from ..runtime.activation_jit import act_bwd as _act_bwd, act_fwd as _act_fwd
from ..runtime.launch import launch as _launch_direct
from . import reference as ref

# ---------------------------------------------------------------------------------------------
# metadata table layout: int64 [G, NCOL], one row per member
# ---------------------------------------------------------------------------------------------
NCOL = 16
C_M = tl.constexpr(0)
C_N = tl.constexpr(1)
C_K = tl.constexpr(2)
C_X = tl.constexpr(3)    # x offset (elements)
C_W = tl.constexpr(4)    # W offset
C_B = tl.constexpr(5)    # bias offset
C_Y = tl.constexpr(6)    # y offset
C_Z = tl.constexpr(7)    # saved pre-activation / aux offset (forward: z, backward: aux)
C_DY = tl.constexpr(8)   # dy offset
C_DX = tl.constexpr(9)   # dx offset
C_DW = tl.constexpr(10)  # dW offset (into the fp32 workspace)
C_DB = tl.constexpr(11)  # db offset (into the fp32 workspace)
C_XS = tl.constexpr(12)  # row stride of x and dx (K when packed, sum K in the column layout)
C_YS = tl.constexpr(13)  # row stride of y, z, dy and aux (N when packed, sum N in the column layout)
NCOL_C = tl.constexpr(NCOL)
# python-side column indices
COL = dict(M=0, N=1, K=2, X=3, W=4, B=5, Y=6, Z=7, DY=8, DX=9, DW=10, DB=11, XS=12, YS=13)

_INTERPRET = interpret_mode()


# Only Triton builtins and our own jitted helpers are called inside the kernels (no tl.sum /
# tl.zeros / tl.cdiv, which are @jit functions of triton.language): that keeps the kernels usable
# by Triton's CPU interpreter even when triton itself was imported before TRITON_INTERPRET was set.
# The reduction uses triton's own sum combiner, which the interpreter maps to numpy.sum.
@triton.jit
def _sum(x, AXIS: tl.constexpr):
    return tl.reduce(x, AXIS, tl.standard._sum_combine)


# ---------------------------------------------------------------------------------------------
# forward: y = act(x @ W^T + b)          tiles over (M, N), reduction over K
# ---------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["G", "KEY_M", "KEY_N", "KEY_K"])
def _gl_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, z_ptr, tab_ptr,
    G, KEY_M, KEY_N, KEY_K,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, STORE_Z: tl.constexpr,
    ALIGN: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PROGS_PER_SM: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    tile = pid
    start = 0
    for gi in range(0, G):
        row = tab_ptr + gi * NCOL_C
        M = tl.load(row + C_M).to(tl.int32)
        N = tl.load(row + C_N).to(tl.int32)
        tiles_n = (N + BLOCK_N - 1) // BLOCK_N
        end = start + ((M + BLOCK_M - 1) // BLOCK_M) * tiles_n
        while tile < end:
            K = tl.load(row + C_K).to(tl.int32)
            Nn = N
            x_off = tl.load(row + C_X)
            w_off = tl.load(row + C_W)
            y_off = tl.load(row + C_Y)
            XS = tl.load(row + C_XS).to(tl.int32)
            YS = tl.load(row + C_YS).to(tl.int32)
            if ALIGN > 1:
                K = tl.multiple_of(K, ALIGN)
                Nn = tl.multiple_of(Nn, ALIGN)
                XS = tl.multiple_of(XS, ALIGN)
                YS = tl.multiple_of(YS, ALIGN)
                x_off = tl.multiple_of(x_off, ALIGN)
                w_off = tl.multiple_of(w_off, ALIGN)
                y_off = tl.multiple_of(y_off, ALIGN)
            local = tile - start
            tm = local // tiles_n
            tn = local - tm * tiles_n
            offs_m = tm * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = tn * BLOCK_N + tl.arange(0, BLOCK_N)
            offs_k = tl.arange(0, BLOCK_K)
            mask_m = offs_m < M
            mask_n = offs_n < Nn
            a_ptrs = x_ptr + x_off + (offs_m[:, None] * XS + offs_k[None, :])
            b_ptrs = w_ptr + w_off + (offs_n[None, :] * K + offs_k[:, None])
            acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
            for kk in range(0, (K + BLOCK_K - 1) // BLOCK_K):
                k_left = K - kk * BLOCK_K
                a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
                b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
                if DOT_F32:
                    acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
                else:
                    acc = tl.dot(a, b, acc)
                a_ptrs += BLOCK_K
                b_ptrs += BLOCK_K
            if HAS_BIAS:
                b_off = tl.load(row + C_B)
                bias = tl.load(b_ptr + b_off + offs_n, mask=mask_n, other=0.0)
                acc += bias.to(tl.float32)[None, :]
            out_idx = offs_m[:, None] * YS + offs_n[None, :]
            out_mask = mask_m[:, None] & mask_n[None, :]
            if STORE_Z:
                z_off = tl.load(row + C_Z)
                if ALIGN > 1:
                    z_off = tl.multiple_of(z_off, ALIGN)
                tl.store(z_ptr + z_off + out_idx, acc.to(z_ptr.dtype.element_ty), mask=out_mask)
            out = _act_fwd(acc, ACT)
            tl.store(y_ptr + y_off + out_idx, out.to(y_ptr.dtype.element_ty), mask=out_mask)
            tile += nprog
        start = end


# ---------------------------------------------------------------------------------------------
# backward dX = dz @ W                   tiles over (M, K), reduction over N
# ---------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["G", "KEY_M", "KEY_N", "KEY_K"])
def _gl_dx_kernel(
    dy_ptr, aux_ptr, w_ptr, dx_ptr, tab_ptr,
    G, KEY_M, KEY_N, KEY_K,
    ACT: tl.constexpr, ALIGN: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PROGS_PER_SM: tl.constexpr,
):
    # output tile: BLOCK_M rows of dx x BLOCK_N columns (the K dimension of the layer);
    # reduction over the layer's N dimension in steps of BLOCK_K.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    tile = pid
    start = 0
    for gi in range(0, G):
        row = tab_ptr + gi * NCOL_C
        M = tl.load(row + C_M).to(tl.int32)
        K = tl.load(row + C_K).to(tl.int32)
        tiles_c = (K + BLOCK_N - 1) // BLOCK_N
        end = start + ((M + BLOCK_M - 1) // BLOCK_M) * tiles_c
        while tile < end:
            N = tl.load(row + C_N).to(tl.int32)
            Kk = K
            dy_off = tl.load(row + C_DY)
            aux_off = tl.load(row + C_Z)
            w_off = tl.load(row + C_W)
            dx_off = tl.load(row + C_DX)
            XS = tl.load(row + C_XS).to(tl.int32)
            YS = tl.load(row + C_YS).to(tl.int32)
            if ALIGN > 1:
                N = tl.multiple_of(N, ALIGN)
                Kk = tl.multiple_of(Kk, ALIGN)
                XS = tl.multiple_of(XS, ALIGN)
                YS = tl.multiple_of(YS, ALIGN)
                dy_off = tl.multiple_of(dy_off, ALIGN)
                aux_off = tl.multiple_of(aux_off, ALIGN)
                w_off = tl.multiple_of(w_off, ALIGN)
                dx_off = tl.multiple_of(dx_off, ALIGN)
            local = tile - start
            tm = local // tiles_c
            tc = local - tm * tiles_c
            offs_m = tm * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_c = tc * BLOCK_N + tl.arange(0, BLOCK_N)
            offs_r = tl.arange(0, BLOCK_K)
            mask_m = offs_m < M
            mask_c = offs_c < Kk
            g_idx = offs_m[:, None] * YS + offs_r[None, :]
            g_ptrs = dy_ptr + dy_off + g_idx
            aux_ptrs = aux_ptr + aux_off + g_idx
            w_ptrs = w_ptr + w_off + (offs_r[:, None] * Kk + offs_c[None, :])
            acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
            for rr in range(0, (N + BLOCK_K - 1) // BLOCK_K):
                r_left = N - rr * BLOCK_K
                a_mask = mask_m[:, None] & (offs_r[None, :] < r_left)
                a = tl.load(g_ptrs, mask=a_mask, other=0.0)
                if ACT != 0:
                    aux = tl.load(aux_ptrs, mask=a_mask, other=0.0)
                    a = _act_bwd(a.to(tl.float32), aux.to(tl.float32), ACT).to(w_ptr.dtype.element_ty)
                b = tl.load(w_ptrs, mask=(offs_r[:, None] < r_left) & mask_c[None, :], other=0.0)
                if DOT_F32:
                    acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
                else:
                    acc = tl.dot(a, b, acc)
                g_ptrs += BLOCK_K
                aux_ptrs += BLOCK_K
                w_ptrs += BLOCK_K * Kk
            out_idx = offs_m[:, None] * XS + offs_c[None, :]
            tl.store(dx_ptr + dx_off + out_idx, acc.to(dx_ptr.dtype.element_ty),
                     mask=mask_m[:, None] & mask_c[None, :])
            tile += nprog
        start = end


# ---------------------------------------------------------------------------------------------
# backward dW = dz^T @ x (+ db = colsum dz)   tiles over (N, K, row-split), reduction over M
# ---------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["G", "KEY_M", "KEY_N", "KEY_K"])
def _gl_dw_kernel(
    dy_ptr, aux_ptr, x_ptr, ws_ptr, tab_ptr,
    G, KEY_M, KEY_N, KEY_K,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, ALIGN: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
    PROGS_PER_SM: tl.constexpr,
):
    # output tile: BLOCK_M rows of dW (layer's N dim) x BLOCK_N columns (layer's K dim);
    # reduction over the layer's rows (M) in steps of BLOCK_K, at most SPLIT rows per tile.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    tile = pid
    start = 0
    for gi in range(0, G):
        row = tab_ptr + gi * NCOL_C
        M = tl.load(row + C_M).to(tl.int32)
        N = tl.load(row + C_N).to(tl.int32)
        K = tl.load(row + C_K).to(tl.int32)
        tiles_r = (N + BLOCK_M - 1) // BLOCK_M
        tiles_c = tl.maximum((K + BLOCK_N - 1) // BLOCK_N, 1)  # >= 1 so that db is produced when K == 0
        per_split = tiles_r * tiles_c
        end = start + per_split * ((M + SPLIT - 1) // SPLIT)
        while tile < end:
            Nn = N
            Kk = K
            dy_off = tl.load(row + C_DY)
            aux_off = tl.load(row + C_Z)
            x_off = tl.load(row + C_X)
            dw_off = tl.load(row + C_DW)
            XS = tl.load(row + C_XS).to(tl.int32)
            YS = tl.load(row + C_YS).to(tl.int32)
            if ALIGN > 1:
                Nn = tl.multiple_of(Nn, ALIGN)
                Kk = tl.multiple_of(Kk, ALIGN)
                XS = tl.multiple_of(XS, ALIGN)
                YS = tl.multiple_of(YS, ALIGN)
                dy_off = tl.multiple_of(dy_off, ALIGN)
                aux_off = tl.multiple_of(aux_off, ALIGN)
                x_off = tl.multiple_of(x_off, ALIGN)
            local = tile - start
            s = local // per_split
            rem = local - s * per_split
            ti = rem // tiles_c
            tj = rem - ti * tiles_c
            r0 = s * SPLIT
            n_rows = tl.minimum(M - r0, SPLIT)
            offs_n = ti * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_k = tj * BLOCK_N + tl.arange(0, BLOCK_N)
            offs_r = tl.arange(0, BLOCK_K)
            mask_n = offs_n < Nn
            mask_k = offs_k < Kk
            g_idx = (r0 + offs_r)[:, None] * YS + offs_n[None, :]
            g_ptrs = dy_ptr + dy_off + g_idx
            aux_ptrs = aux_ptr + aux_off + g_idx
            x_ptrs = x_ptr + x_off + ((r0 + offs_r)[:, None] * XS + offs_k[None, :])
            acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
            db_acc = tl.full((BLOCK_M,), 0.0, tl.float32)
            do_db = tj == 0
            for rr in range(0, (n_rows + BLOCK_K - 1) // BLOCK_K):
                r_left = n_rows - rr * BLOCK_K
                rmask = offs_r < r_left
                g_mask = rmask[:, None] & mask_n[None, :]
                g = tl.load(g_ptrs, mask=g_mask, other=0.0)
                if ACT != 0:
                    aux = tl.load(aux_ptrs, mask=g_mask, other=0.0)
                    gf = _act_bwd(g.to(tl.float32), aux.to(tl.float32), ACT)
                    g = gf.to(x_ptr.dtype.element_ty)
                    if HAS_BIAS:
                        if do_db:
                            db_acc += _sum(gf, 0)
                else:
                    if HAS_BIAS:
                        if do_db:
                            db_acc += _sum(g.to(tl.float32), 0)
                xt = tl.load(x_ptrs, mask=rmask[:, None] & mask_k[None, :], other=0.0)
                if DOT_F32:
                    acc = tl.dot(tl.trans(g.to(tl.float32)), xt.to(tl.float32), acc, input_precision="ieee")
                else:
                    acc = tl.dot(tl.trans(g), xt, acc)
                g_ptrs += BLOCK_K * YS
                aux_ptrs += BLOCK_K * YS
                x_ptrs += BLOCK_K * XS
            out_idx = offs_n[:, None] * Kk + offs_k[None, :]
            tl.atomic_add(ws_ptr + dw_off + out_idx, acc, mask=mask_n[:, None] & mask_k[None, :],
                          sem="relaxed")
            if HAS_BIAS:
                if do_db:
                    db_off = tl.load(row + C_DB)
                    tl.atomic_add(ws_ptr + db_off + offs_n, db_acc, mask=mask_n, sem="relaxed")
            tile += nprog
        start = end


# ---------------------------------------------------------------------------------------------
# configurations and autotuning
# ---------------------------------------------------------------------------------------------
def _cfg(bm, bn, bk, warps, stages, pps, **extra):
    kw = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PROGS_PER_SM=pps, **extra)
    return triton.Config(kw, num_warps=warps, num_stages=stages)


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, programs per SM); BLOCK_K 64 for 16-bit, 32 for fp32
_GEMM_TILES = [
    (128, 128, 8, 3, 2),
    (128, 64, 4, 4, 2),
    (64, 128, 4, 4, 2),
    (64, 64, 4, 4, 4),
    (128, 256, 8, 3, 1),
]
_FWD_CONFIGS = [_cfg(bm, bn, bk, w, s, p) for (bm, bn, w, s, p) in _GEMM_TILES for bk in (64, 32)]
_DW_TILES = [(128, 128, 8, 3, 2), (64, 128, 4, 4, 2), (64, 64, 4, 4, 4)]
_DW_CONFIGS = [
    _cfg(bm, bn, bk, w, s, p, SPLIT=split)
    for (bm, bn, w, s, p) in _DW_TILES for bk in (64, 32) for split in (512, 1024, 4096, 1 << 30)
]


def _is_fp32(named_args, name):
    t = named_args.get(name)
    return t is not None and t.dtype == torch.float32


def _prune_gemm(configs, named_args, **kwargs):
    """Keep the configs that fit the dtype and the largest member of the group."""
    fp32 = _is_fp32(named_args, "x_ptr") or _is_fp32(named_args, "dy_ptr")
    key_n = named_args.get("KEY_N", 1 << 30)
    key_k = named_args.get("KEY_K", 1 << 30)
    is_dx = "dx_ptr" in named_args
    out_cols = key_k if is_dx else key_n
    keep = []
    for c in configs:
        kw = c.kwargs
        if kw["BLOCK_K"] != (32 if fp32 else 64):
            continue
        if kw["BLOCK_N"] > max(64, out_cols):
            continue
        if fp32 and kw["BLOCK_N"] > 128:
            continue
        keep.append(c)
    return keep or [configs[0]]


def _prune_dw(configs, named_args, **kwargs):
    fp32 = _is_fp32(named_args, "x_ptr")
    key_m = named_args.get("KEY_M", 1 << 30)
    key_n = named_args.get("KEY_N", 1 << 30)
    key_k = named_args.get("KEY_K", 1 << 30)
    keep = []
    seen_nosplit = set()
    for c in configs:
        kw = c.kwargs
        if kw["BLOCK_K"] != (32 if fp32 else 64):
            continue
        if kw["BLOCK_M"] > max(64, key_n) or kw["BLOCK_N"] > max(64, key_k):
            continue
        tile = (kw["BLOCK_M"], kw["BLOCK_N"])
        if kw["SPLIT"] >= key_m:  # no split for any member: keep one such config per tile shape
            if tile in seen_nosplit:
                continue
            seen_nosplit.add(tile)
        keep.append(c)
    return keep or [configs[0]]


def _bench(fn, quantiles):
    # each candidate: ~2 ms warm-up + ~8 ms of timed calls (hundreds of calls for these kernels);
    # the tuning of one key costs a few tenths of a second once, then ``_CHOSEN`` bypasses it
    return triton.testing.do_bench(fn, warmup=2, rep=8, quantiles=quantiles)


_AUTOTUNE = os.environ.get("OPTIMUS_KERNELS_AUTOTUNE", "1") != "0"
# DOT_F32 (TF32 allowed or not, ``_dot_f32``) is part of the key: it changes the kernel's products,
# so a configuration tuned under one setting is not the choice for the other
_KEYS = ["G", "KEY_M", "KEY_N", "KEY_K", "DOT_F32"]

if not _INTERPRET:
    _fwd_tuned = triton.autotune(_FWD_CONFIGS, key=_KEYS, prune_configs_by={"early_config_prune": _prune_gemm},
                                 do_bench=_bench)(_gl_fwd_kernel)
    _dx_tuned = triton.autotune(_FWD_CONFIGS, key=_KEYS, prune_configs_by={"early_config_prune": _prune_gemm},
                                do_bench=_bench)(_gl_dx_kernel)
    _dw_tuned = triton.autotune(_DW_CONFIGS, key=_KEYS, prune_configs_by={"early_config_prune": _prune_dw},
                                reset_to_zero=["ws_ptr"], do_bench=_bench)(_gl_dw_kernel)

# interpreter: one small config that still exercises masking, persistence and the row split
_INTERP_META = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, PROGS_PER_SM=1)
_INTERP_SPLIT = 32
# non-autotuned defaults (OPTIMUS_KERNELS_AUTOTUNE=0, or set_autotune(False)); one of the candidates
_DEFAULT_META = {
    False: dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, PROGS_PER_SM=2, num_warps=4, num_stages=4),
    True: dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=32, PROGS_PER_SM=2, num_warps=4, num_stages=4),  # fp32
}
_DEFAULT_DW_META = {
    False: dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, PROGS_PER_SM=4, num_warps=4, num_stages=4, SPLIT=1024),
    True: dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, PROGS_PER_SM=4, num_warps=4, num_stages=4, SPLIT=1024),
}


def set_autotune(flag: bool) -> None:
    """Turn autotuning on (default) or off (fixed default tiles; faster first call)."""
    global _AUTOTUNE
    _AUTOTUNE = bool(flag)


# ---------------------------------------------------------------------------------------------
# host side: per-shape-signature metadata
# ---------------------------------------------------------------------------------------------
# The kernels index inside one member in int32 (``row * K + col``, ``row * N + col``, the row and
# tile counters, ``M + SPLIT - 1`` with SPLIT up to 2**30); only the members' base offsets (the
# table) are int64.  Past these limits an int32 product wraps on the GPU and a load reads other
# memory, silently (masked lanes included: a wrapped row index passes ``row < M``).  Such groups
# never reach the kernels: ``GLSignature.limit_reason`` says why, and the callers (the packed ops
# below, the eager path) run them on the plain-torch path instead.
MAX_MEMBER_ELEMS = 2 ** 31 - 1   # elements of one member's x, W, or y
MAX_DIM = 2 ** 30 - 1            # M, N, K of one member


def limit_reason(ms: Sequence[int], ks: Sequence[int], ns: Sequence[int]) -> Optional[str]:
    """None if every member fits the kernels' int32 indexing, else why not (a sentence)."""
    for g, (m, k, n) in enumerate(zip(ms, ks, ns)):
        m, k, n = int(m), int(k), int(n)
        for name, elems in (("x", m * k), ("W", n * k), ("y", m * n)):
            if elems > MAX_MEMBER_ELEMS:
                return (f"grouped_linear: member {g} (M={m}, K={k}, N={n}) has {elems} elements in {name}, "
                        f"more than the Triton kernels' int32 indexing allows ({MAX_MEMBER_ELEMS})")
        if max(m, k, n) > MAX_DIM:
            return (f"grouped_linear: member {g} has a dimension above {MAX_DIM} "
                    f"(M={m}, K={k}, N={n}), past the Triton kernels' int32 row / tile counters")
    return None


def _columns_limit_reason(ms: Sequence[int], ks: Sequence[int], ns: Sequence[int]) -> Optional[str]:
    """In the column layout a member's rows are ``sum K`` (x) and ``sum N`` (y) apart, so the
    whole (M, sum K) and (M, sum N) operands must fit the int32 indexing."""
    m = int(ms[0]) if len(ms) else 0
    for name, width in (("x", sum(int(k) for k in ks)), ("y", sum(int(n) for n in ns))):
        if m * width > MAX_MEMBER_ELEMS or width > MAX_DIM:
            return (f"grouped_linear: the column layout's {name} is ({m}, {width}), more than the Triton "
                    f"kernels' int32 indexing allows ({MAX_MEMBER_ELEMS} elements)")
    return None


LAYOUTS = ("packed", "columns")


class GLSignature:
    """Everything about a group that depends only on the shapes and the layout (cached per
    shape tuple and layout).

    ``layout``: ``"packed"``, every member's x, y (and dx, dy) flattened and concatenated, a
    member's rows K (x) and N (y) apart; or ``"columns"``, every member has the same M rows and
    x is one (M, sum K) matrix, member g reading columns [sum K_<g, sum K_<=g), y one
    (M, sum N) matrix in the same way (what ``torch.cat(ys, dim=1)`` would be). W, b and the
    dW / db workspace are packed in both.

    ``limit_reason``: None, or why the group must not be launched (see ``MAX_MEMBER_ELEMS``)."""

    def __init__(self, ms, ks, ns, layout="packed"):
        if layout not in LAYOUTS:
            raise ValueError(f"grouped_linear: layout must be one of {LAYOUTS}, got {layout!r}")
        if layout == "columns" and len(set(int(m) for m in ms)) > 1:
            raise ValueError(f"grouped_linear: the column layout needs every member to have the same rows, got {list(ms)}")
        self.layout = layout
        self.G = len(ms)
        self.ms = np.asarray(ms, dtype=np.int64)
        self.ks = np.asarray(ks, dtype=np.int64)
        self.ns = np.asarray(ns, dtype=np.int64)
        ms_, ks_, ns_ = self.ms, self.ks, self.ns
        self.limit_reason = limit_reason(ms, ks, ns) or (
            _columns_limit_reason(ms, ks, ns) if layout == "columns" else None)

        def excl(a):
            out = np.zeros_like(a)
            if len(a) > 1:
                out[1:] = np.cumsum(a)[:-1]
            return out

        self.off_x, self.tot_x = excl(ms_ * ks_), int((ms_ * ks_).sum())
        self.off_w, self.tot_w = excl(ns_ * ks_), int((ns_ * ks_).sum())
        self.off_b, self.tot_b = excl(ns_), int(ns_.sum())
        self.off_y, self.tot_y = excl(ms_ * ns_), int((ms_ * ns_).sum())
        # row strides of x / y per member (packed: each member's own K / N)
        self.xs, self.ys = ks_.copy(), ns_.copy()
        if layout == "columns":
            self.off_x, self.off_y = excl(ks_), excl(ns_)
            self.xs = np.full_like(ks_, int(ks_.sum()))
            self.ys = np.full_like(ns_, int(ns_.sum()))
        # processing orders: longest reduction first
        self.orders = (
            np.argsort(-ks_, kind="stable"),   # forward: reduction over K
            np.argsort(-ns_, kind="stable"),   # dX: reduction over N
            np.argsort(-ms_, kind="stable"),   # dW: reduction over M
        )
        tmpl = np.zeros((self.G, NCOL), dtype=np.int64)
        tmpl[:, COL["M"]] = ms_
        tmpl[:, COL["N"]] = ns_
        tmpl[:, COL["K"]] = ks_
        tmpl[:, COL["XS"]] = self.xs
        tmpl[:, COL["YS"]] = self.ys
        self.template = tmpl
        self.key = (
            self.G,
            max(16, next_pow2(int(ms_.max()) if self.G else 1)),
            max(16, next_pow2(int(ns_.max()) if self.G else 1)),
            max(16, next_pow2(int(ks_.max()) if self.G else 1)),
        )
        self.dims_align = {}
        for a in (8, 4):  # the strides are sums of the dims: aligned when the dims are
            self.dims_align[a] = bool(((ks_ % a) == 0).all() and ((ns_ % a) == 0).all())
        self._tiles = {}
        self._packed = {}
        # python lists for splitting packed buffers into members
        self.ns_list = [int(v) for v in ns_]
        self.x_sizes = [int(v) for v in ms_ * ks_]
        self.w_sizes = [int(v) for v in ns_ * ks_]
        self.y_sizes = [int(v) for v in ms_ * ns_]
        # eager tables: dims plus the packed dW / db workspace offsets, one per kernel order; the
        # offsets of the tensors that live elsewhere are filled in per call (see eager.py)
        static = [dict(), dict(), dict(DW=self.off_w, DB=self.tot_w + self.off_b)]
        self.eager_base = np.stack([self.table(i, static[i]) for i in range(3)])

    # ---- tile counts (must match the kernels' tile enumeration) ----
    def tiles(self, kind, bm, bn, split=0):
        key = (kind, bm, bn, split)
        t = self._tiles.get(key)
        if t is None:
            ms, ks, ns = self.ms, self.ks, self.ns
            # (a * b // c parses as (a * b) // c: every factor is a separate ceil-division)
            if kind == 0:
                t = int((((ms + bm - 1) // bm) * ((ns + bn - 1) // bn)).sum())
            elif kind == 1:
                t = int((((ms + bm - 1) // bm) * ((ks + bn - 1) // bn)).sum())
            else:
                tc = np.maximum((ks + bn - 1) // bn, 1)
                t = int((((ns + bm - 1) // bm) * tc * ((ms + split - 1) // split)).sum())
            self._tiles[key] = t
        return t

    # ---- tables ----
    def table(self, which, cols):
        """int64 numpy table [G, NCOL] in processing order ``which`` (0 fwd, 1 dX, 2 dW).

        ``cols`` maps a column name of ``COL`` to a length-G array of offsets in member order."""
        order = self.orders[which]
        t = self.template[order].copy()
        for name, vals in cols.items():
            t[:, COL[name]] = vals[order]
        return t

    def packed_tables(self, device):
        """Device tables for the packed convention (offsets = prefix sums), cached per device and
        stream.

        Uploaded asynchronously on the current stream, so a cached copy is only known to be ready
        on that stream (a launch on another stream could read it before the copy lands): the
        stream is part of the key, as for the eager tables.  During CUDA-graph capture a cached
        copy is kept alive for good (the graph reads it at every replay, after any eviction of
        this signature) and a missing one is staged fresh through the capture arena, see
        ``runtime/tables.py``."""
        cap = _dt.capturing(device)
        key = (device, _dt.stream_key(device))
        t = self._packed.get(key)
        if t is None:
            cols = dict(X=self.off_x, W=self.off_w, B=self.off_b, Y=self.off_y, Z=self.off_y,
                        DY=self.off_y, DX=self.off_x, DW=self.off_w, DB=self.tot_w + self.off_b)
            arr = np.stack([self.table(i, cols) for i in range(3)])
            t = _dt.upload(arr, device, cap)
            if not cap:
                self._packed[key] = t
            return t
        return _dt.keep_for_graphs(t, cap)


_SIGS: dict = {}


def signature(ms, ks, ns, layout="packed") -> GLSignature:
    key = (tuple(ms), tuple(ks), tuple(ns), layout)
    s = _SIGS.get(key)
    if s is None:
        if len(_SIGS) > 4096:
            _SIGS.clear()
        s = _SIGS[key] = GLSignature(ms, ks, ns, layout)
    return s


def alignment(sig: GLSignature, dtype: torch.dtype, ptrs) -> int:
    """Elements per 16 bytes if every row stride, offset and base pointer is 16-byte aligned, else 1."""
    a = 16 // _ESIZE[dtype]
    if a not in sig.dims_align or not sig.dims_align[a]:
        return 1
    acc = 0
    for p in ptrs:
        acc |= int(p)
    return a if acc % 16 == 0 else 1


_ESIZE = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}


def align_from_or(sig: GLSignature, dtype, ptr_or: int) -> int:
    """Like :func:`alignment`, given the OR of all the pointers involved (eager path)."""
    a = 16 // _ESIZE[dtype]
    if not sig.dims_align.get(a, False):
        return 1
    return a if ptr_or % 16 == 0 else 1


# ---------------------------------------------------------------------------------------------
# launchers (tensors already validated; tables are device int64 [G, NCOL] in the right order)
# ---------------------------------------------------------------------------------------------
def _progs(device, pps):
    return num_sms(device) * pps


# (kernel, tuning key, dtype, constexpr flags) -> launch meta (tile constexprs, warps, stages).
# After the autotuner has chosen a configuration for a key, launches go straight to the jitted
# kernel with that configuration: no per-call autotuner bookkeeping (argument dicts, key tuple),
# no grid lambda.  Filled on the first launch of each combination.
_CHOSEN: dict = {}
_KIND = {"fwd": 0, "dx": 1, "dw": 2}


_VIA_TUNER = object()  # sentinel: this Triton's autotuner does not expose its choice; keep calling it


def _chosen_meta(tuned):
    try:
        return dict(tuned.best_config.all_kwargs())
    except AttributeError:  # pragma: no cover - other Triton versions
        return _VIA_TUNER


def _grid(sig, kind, meta, dev):
    t = sig.tiles(_KIND[kind], meta["BLOCK_M"], meta["BLOCK_N"], meta.get("SPLIT", 0))
    return (max(1, min(t, _progs(dev, meta["PROGS_PER_SM"]))),)


def _dot_f32(dtype):
    """DOT_F32 for operands of ``dtype``.

    fp32 operands: exact fp32 products unless torch allows TF32 for its own fp32 matmuls
    (``torch.backends.cuda.matmul.allow_tf32``, ``fp32_precision``, or
    ``torch.set_float32_matmul_precision("high")``), read at each call as torch's matmuls read
    it (through ``torch_allows_tf32``, which also understands the newer ``fp32_precision`` API:
    reading ``allow_tf32`` raises once that API set TF32); never TF32 otherwise. The flag is a
    constexpr of the kernels and part of their autotuning key and of ``_CHOSEN``'s, so a choice
    made with TF32 on is never reused with it off, or the other way round.
    16-bit operands: tensor-core products with fp32 accumulation; upcast to fp32 first in
    Triton's CPU interpreter, where ``tl.dot`` on 16-bit operands is unreliable."""
    if dtype == torch.float32:
        return not torch_allows_tf32()
    return _INTERPRET


def _launch(kind, sig, args, kwargs, flags):
    """Launch kernel ``kind`` ("fwd", "dx", "dw") over the tiles of ``sig``.

    ``flags``: hashable tuple of the constexpr values in ``kwargs`` (part of the config cache key)."""
    if sig.limit_reason is not None:  # callers route such groups to plain torch; never launch one
        raise ValueError(sig.limit_reason)
    with device_guard(args[0].device):
        _launch_on_device(kind, sig, args, kwargs, flags)


def _launch_on_device(kind, sig, args, kwargs, flags):
    raw = globals()[f"_gl_{kind}_kernel"]
    dev = args[0].device
    if _INTERPRET:
        meta = dict(_INTERP_META)
        if kind == "dw":
            meta["SPLIT"] = _INTERP_SPLIT
        raw[_grid(sig, kind, meta, dev)](*args, **kwargs, **meta)
        return
    fp32 = args[0].dtype == torch.float32
    if not _AUTOTUNE:
        meta = (_DEFAULT_DW_META if kind == "dw" else _DEFAULT_META)[fp32]
    else:
        ck = (kind, sig.key, args[0].dtype, flags)
        meta = _CHOSEN.get(ck)
        if meta is None or meta is _VIA_TUNER:
            tuned = globals()[f"_{kind}_tuned"]
            tuned[lambda m: _grid(sig, kind, m, dev)](*args, **kwargs)  # tunes once per key, launches
            if meta is None:
                _CHOSEN[ck] = _chosen_meta(tuned)
            return
    _launch_direct(raw, _grid(sig, kind, meta, dev), args, kwargs, meta)


def launch_forward(sig, tab, x, w, b, y, z, act, align):
    """y (and z when given) <- act(x @ W^T + b) for all members.  ``tab``: forward-order table."""
    if sig.tiles(0, 16, 16) == 0:
        return
    a, f32 = ACTIVATIONS[act], _dot_f32(x.dtype)
    _launch("fwd", sig,
            (x, w, b if b is not None else x, y, z if z is not None else y, tab, sig.G, *sig.key[1:]),
            dict(HAS_BIAS=b is not None, ACT=a, STORE_Z=z is not None, ALIGN=align, DOT_F32=f32),
            (b is not None, a, z is not None, align, f32))


def launch_dx(sig, tab, dy, aux, w, dx, act, align):
    if sig.tiles(1, 16, 16) == 0:
        return
    a, f32 = ACTIVATIONS[act], _dot_f32(dy.dtype)
    _launch("dx", sig, (dy, aux if aux is not None else dy, w, dx, tab, sig.G, *sig.key[1:]),
            dict(ACT=a, ALIGN=align, DOT_F32=f32), (a, align, f32))


def launch_dw(sig, tab, dy, aux, x, ws, has_bias, act, align):
    """ws (fp32, zeroed) += [dW | db] for all members."""
    if sig.tiles(2, 16, 16, 1 << 30) == 0:
        return
    a, f32 = ACTIVATIONS[act], _dot_f32(dy.dtype)
    _launch("dw", sig, (dy, aux if aux is not None else dy, x, ws, tab, sig.G, *sig.key[1:]),
            dict(HAS_BIAS=has_bias, ACT=a, ALIGN=align, DOT_F32=f32), (has_bias, a, align, f32))


# ---------------------------------------------------------------------------------------------
# packed convention (used by the custom ops)
# ---------------------------------------------------------------------------------------------
def _operand_shape(sig, which):
    """The custom ops' shape of x / y: 1-D when packed, (M, sum K) / (M, sum N) in columns."""
    if sig.layout == "columns":
        return (int(sig.ms[0]), int(sig.xs[0]) if which == "x" else int(sig.ys[0]))
    return (sig.tot_x if which == "x" else sig.tot_y,)


def forward_packed(x, w, b, ms, ks, ns, act, layout="packed"):
    sig = signature(ms, ks, ns, layout)
    if past_int32_limits(sig):
        return ref.grouped_linear_layout(x, w, b, ms, ks, ns, act, layout)
    tabs = sig.packed_tables(x.device)
    y = torch.empty(_operand_shape(sig, "y"), dtype=x.dtype, device=x.device)
    z = torch.empty(_operand_shape(sig, "y") if act in NEEDS_PREACT else (0,), dtype=x.dtype, device=x.device)
    ptrs = [x.data_ptr(), w.data_ptr(), y.data_ptr()] + ([b.data_ptr()] if b is not None else [])
    align = alignment(sig, x.dtype, ptrs + ([z.data_ptr()] if z.numel() else []))
    launch_forward(sig, tabs[0], x, w, b, y, z if act in NEEDS_PREACT else None, act, align)
    return y, z


def backward_packed(dy, x, w, aux, ms, ks, ns, act, has_bias, need_dx, need_dw, need_db, layout="packed"):
    sig = signature(ms, ks, ns, layout)
    if past_int32_limits(sig):
        return ref.grouped_linear_backward_layout(dy, x, w, aux, ms, ks, ns, act, has_bias, need_dx, need_dw,
                                                  need_db, layout)
    dev = x.device
    tabs = sig.packed_tables(dev)
    ptrs = [dy.data_ptr(), x.data_ptr(), w.data_ptr()] + ([aux.data_ptr()] if aux is not None else [])
    dx = torch.empty(_operand_shape(sig, "x") if need_dx else (0,), dtype=x.dtype, device=dev)
    align = alignment(sig, x.dtype, ptrs + ([dx.data_ptr()] if need_dx else []))
    if need_dx:
        launch_dx(sig, tabs[1], dy, aux, w, dx, act, align)
    dw = torch.empty(0, dtype=w.dtype, device=dev)
    db = torch.empty(0, dtype=w.dtype, device=dev)
    if need_dw or need_db:
        ws = torch.zeros(sig.tot_w + sig.tot_b, dtype=torch.float32, device=dev)
        launch_dw(sig, tabs[2], dy, aux, x, ws, has_bias and need_db, act, align)
        # separate tensors (custom-op outputs must not alias each other)
        if need_dw:
            dw = ws[: sig.tot_w] if w.dtype == torch.float32 else ws[: sig.tot_w].to(w.dtype)
        if need_db:
            db = ws[sig.tot_w:].to(w.dtype, copy=True)
    return dx, dw, db
