"""Helpers shared by the optimus.kernels tests (imported by the test modules of this folder and
its family subfolders; tests/kernels/conftest.py puts this folder on the path)."""

import math
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]

HAS_CUDA = torch.cuda.is_available()


def load_kernels():
    """``optimus.kernels`` when the package imports, else the top-level ``kernels`` folder."""
    try:
        import optimus.kernels as K  # noqa: F401

        if hasattr(K, "grouped_linear"):
            return K
    except Exception:
        pass
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import kernels as K

    return K


K = load_kernels()


def kmod(name: str):
    """The module ``name`` of the kernels package (``"linear.eager"``, ``"runtime.plans"``, ...),
    under whichever name the package was imported."""
    import importlib

    return importlib.import_module(K.__name__ + "." + name)


# the modules the tests reach into (none of them imports Triton)
plans = kmod("runtime.plans")          # eager_cache_info, clear_eager_caches, set_table_cache, PLANS, TABLES
tables = kmod("runtime.tables")        # device tables: upload, capturing, stats
gl_eager = kmod("linear.eager")        # the grouped linear's eager path: validate, _GLPlan, set_gl_route
ln_eager = kmod("layer_norm.eager")    # the batched layer norm's eager path: validate, _LNPlan
vendor = kmod("linear.vendor")         # the grouped linear's vendor routes


def gl_kernel():
    """The grouped-linear Triton module (imports Triton)."""
    return kmod("linear.kernel")


def ln_kernel():
    """The batched-layer-norm Triton module (imports Triton)."""
    return kmod("layer_norm.kernel")

# The interpreter tests run Triton on CPU tensors; they are for machines without CUDA (CI).  On a
# CUDA machine the kernels are compiled instead and the GPU tests run.
interpreter_only = pytest.mark.skipif(HAS_CUDA, reason="interpreter tests run on CPU-only machines")
try:
    import triton  # noqa: F401

    HAS_TRITON = True
except Exception:  # pragma: no cover
    HAS_TRITON = False
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")


def _interpreter_problem():
    """``None`` if Triton's CPU interpreter can run our kernels here, else why not.

    Triton 3.6's interpreter turns a loaded scalar into an index with ``int()`` on a
    one-element array, which NumPy >= 2.4 rejects ("only 0-dimensional arrays can be
    converted to Python scalars"); our kernels loop over bounds loaded from device tables,
    so every interpreter test would fail with that. A tiny kernel doing the same tells.
    """
    if HAS_CUDA or not HAS_TRITON:
        return None
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def _probe(x_ptr, n_ptr):
            acc = 0.0
            for i in range(0, tl.load(n_ptr)):  # a loop bound loaded at run time
                acc += tl.load(x_ptr + i)
            tl.store(x_ptr, acc)

        x = torch.ones(3)
        _probe[(1,)](x, torch.tensor([3], dtype=torch.int32))
        return None if x[0].item() == 3.0 else f"interpreter probe computed {x[0].item()}, expected 3"
    except Exception as e:
        import numpy

        return (f"Triton's CPU interpreter cannot run loops over loaded bounds here (triton "
                f"{getattr(triton, '__version__', '?')}, numpy {numpy.__version__}): {type(e).__name__}: {str(e)[:160]}")
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


INTERPRETER_PROBLEM = _interpreter_problem()
interpreter_works = pytest.mark.skipif(INTERPRETER_PROBLEM is not None, reason=str(INTERPRETER_PROBLEM))


@pytest.fixture
def interpret(monkeypatch):
    """Route CPU tensors through the Triton kernels in the interpreter for one test."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    K.set_backend("auto")
    yield
    K.set_backend("auto")


ACT = {None: lambda z: z, "none": lambda z: z, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
       "sigmoid": torch.sigmoid, "tanh": torch.tanh}
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2, torch.float64: 1e-12}
GPU_TOL = {torch.float32: 5e-3, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def rel_err(a, r):
    a, r = a.detach().double().cpu(), r.detach().double().cpu()
    assert torch.isfinite(a).all(), "non-finite values"
    d = r.norm().item()
    return (a - r).norm().item() / (d if d > 0 else 1.0)


def flat(ts):
    ts = [t.reshape(-1) for t in ts if t is not None]
    return torch.cat(ts) if ts else torch.zeros(0)


def make_gl(dims, dtype, device="cpu", bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(m, k, generator=g).to(dtype).to(device).requires_grad_() for m, k, n in dims]
    ws = [(torch.randn(n, k, generator=g) / math.sqrt(max(k, 1))).to(dtype).to(device).requires_grad_()
          for m, k, n in dims]
    bs = [torch.randn(n, generator=g).to(dtype).to(device).requires_grad_() for m, k, n in dims] if bias else None
    return xs, ws, bs


def gl_reference(xs, ws, bs, act, gys, ys_ours=None):
    """float64 outputs and grads (x, w, present b) of [act(F.linear(x, w, b))].

    For relu the backward mask comes from ``ys_ours`` when given: relu' jumps at 0, and under TF32
    (fp32 inputs on the GPU) pre-activations within rounding of 0 may flip sign in the forward,
    which then (correctly) changes the gradient; the backward is checked against that mask."""
    x64 = [x.detach().double().requires_grad_() for x in xs]
    w64 = [w.detach().double().requires_grad_() for w in ws]
    b64 = [b.detach().double().requires_grad_() if b is not None else None for b in bs] if bs is not None \
        else [None] * len(xs)
    if act == "relu" and ys_ours is not None:
        ys = [F.linear(x, w, b) * (y.detach() > 0).double() for x, w, b, y in zip(x64, w64, b64, ys_ours)]
    else:
        ys = [ACT[act](F.linear(x, w, b)) for x, w, b in zip(x64, w64, b64)]
    params = x64 + w64 + [b for b in b64 if b is not None]
    grads = torch.autograd.grad(ys, params, [g.double() for g in gys], allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params)]
    return ys, grads


def check_gl(xs, ws, bs, act, tol):
    ys = K.grouped_linear(xs, ws, bs, act)
    assert len(ys) == len(xs)
    for y, x, w in zip(ys, xs, ws):
        assert y.shape == tuple(x.shape[:-1]) + (w.shape[0],)
        assert y.dtype == x.dtype and y.device == x.device
    gys = [torch.randn_like(y) for y in ys]
    params = list(xs) + list(ws) + ([b for b in bs if b is not None] if bs is not None else [])
    grads = torch.autograd.grad(ys, params, gys, allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params)]
    ry, rg = gl_reference(xs, ws, bs, act, gys, ys)
    G = len(xs)
    errs = dict(y=rel_err(flat(ys), flat(ry)), dx=rel_err(flat(grads[:G]), flat(rg[:G])),
                dw=rel_err(flat(grads[G:2 * G]), flat(rg[G:2 * G])), db=rel_err(flat(grads[2 * G:]), flat(rg[2 * G:])))
    for k, v in errs.items():
        assert v <= tol, f"{k}: relative error {v:.3e} > {tol:.1e} ({errs})"
    return errs


def make_ln(dims, dtype, device="cpu", affine=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [(torch.randn(r, d, generator=g) * 2 + 0.5).to(dtype).to(device).requires_grad_() for r, d in dims]
    ws = [(torch.randn(d, generator=g) * 0.5 + 1).to(dtype).to(device).requires_grad_() for r, d in dims] \
        if affine else None
    bs = [torch.randn(d, generator=g).to(dtype).to(device).requires_grad_() for r, d in dims] if affine else None
    return xs, ws, bs


def check_ln(xs, ws, bs, tol, eps=1e-5):
    ys = K.batched_layer_norm(xs, ws, bs, eps)
    for y, x in zip(ys, xs):
        assert y.shape == x.shape and y.dtype == x.dtype
    gys = [torch.randn_like(y) for y in ys]
    params = list(xs) + [p for seq in (ws, bs) if seq is not None for p in seq if p is not None]
    grads = torch.autograd.grad(ys, params, gys, allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params)]
    x64 = [x.detach().double().requires_grad_() for x in xs]
    w64 = [w.detach().double().requires_grad_() if w is not None else None for w in ws] if ws is not None \
        else [None] * len(xs)
    b64 = [b.detach().double().requires_grad_() if b is not None else None for b in bs] if bs is not None \
        else [None] * len(xs)
    ry = [F.layer_norm(x, (x.shape[-1],), w, b, eps) for x, w, b in zip(x64, w64, b64)]
    p64 = x64 + [p for seq in (w64, b64) for p in seq if p is not None]
    rg = torch.autograd.grad(ry, p64, [g.double() for g in gys], allow_unused=True)
    rg = [g if g is not None else torch.zeros_like(p) for g, p in zip(rg, p64)]
    G = len(xs)
    errs = dict(y=rel_err(flat(ys), flat(ry)), dx=rel_err(flat(grads[:G]), flat(rg[:G])),
                dwb=rel_err(flat(grads[G:]), flat(rg[G:])))
    for k, v in errs.items():
        assert v <= tol, f"{k}: relative error {v:.3e} > {tol:.1e} ({errs})"
    return errs
