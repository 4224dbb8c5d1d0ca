"""The grouped kernels in 16-bit precision and under TF32, in Triton's CPU interpreter.

Each family's Triton kernels against its plain-torch reference (``reference.py``), which computes
16-bit inputs in fp32 and rounds once: forward and backward agree within the 16-bit rounding of
that one result, outputs come in the inputs' dtype and weight gradients in the parameters' dtype
(what autograd gives a 16-bit parameter). And the TF32 switch: torch's own flag decides the
grouped-linear kernels' ``DOT_F32`` constexpr at every call, and with it their tuning key.
"""

import pytest
import torch

from optimus import torch_api as compat

from kernels_testutil import K, interpret, interpreter_only, interpreter_works, kmod, make_gl, make_ln, needs_triton  # noqa: F401

pytestmark = [interpreter_only, needs_triton, interpreter_works, pytest.mark.usefixtures("interpret")]

HALF = [torch.bfloat16, torch.float16]


def _ulps(dtype):
    """Tolerances of a few 16-bit roundings (both sides round the same fp32 value once; the
    kernels sum in another order)."""
    eps = torch.finfo(dtype).eps
    return {"rtol": 4 * eps, "atol": 4 * eps}


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("act", ["none", "gelu", "relu"])
def test_grouped_linear_16bit_matches_the_fp32_accumulating_reference(dtype, act):
    kern, ref = kmod("linear.kernel"), kmod("linear.reference")
    dims = [(20, 24, 16), (7, 40, 8), (33, 8, 24)]
    xs, ws, bs = make_gl(dims, dtype, seed=11)
    ms, ks, ns = [d[0] for d in dims], [d[1] for d in dims], [d[2] for d in dims]
    x, w, b = (K.pack([t.detach() for t in ts]) for ts in (xs, ws, bs))
    y, z = kern.forward_packed(x, w, b, ms, ks, ns, act)
    ry, rz = ref.grouped_linear_layout(x, w, b, ms, ks, ns, act, "packed")
    assert y.dtype == dtype
    torch.testing.assert_close(y, ry, **_ulps(dtype))
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(12)).to(dtype)
    aux, raux = ref.saved_activation(act, y, z), ref.saved_activation(act, ry, rz)
    got = kern.backward_packed(dy, x, w, aux, ms, ks, ns, act, True, True, True, True)
    want = ref.grouped_linear_backward_layout(dy, x, w, raux, ms, ks, ns, act, True, True, True, True, "packed")
    for name, g, r in zip(("dx", "dw", "db"), got, want):
        assert g.dtype == dtype, f"{name} in {g.dtype}, not the operands' {dtype}"
        torch.testing.assert_close(g.float(), r.float(), **_ulps(dtype), msg=name)


@pytest.mark.parametrize("dtype", HALF)
def test_batched_layer_norm_16bit_matches_the_fp32_accumulating_reference(dtype):
    kern, ref = kmod("layer_norm.kernel"), kmod("layer_norm.reference")
    dims = [(9, 24), (16, 8), (5, 40)]
    xs, ws, bs = make_ln(dims, dtype, seed=13)
    rows, widths = [d[0] for d in dims], [d[1] for d in dims]
    x, w, b = (K.pack([t.detach() for t in ts]) for ts in (xs, ws, bs))
    y, stats = kern.forward_packed(x, w, b, rows, widths, 1e-5)
    ry, rstats = ref.batched_layer_norm_layout(x, w, b, rows, widths, 1e-5, "packed")
    assert y.dtype == dtype and stats.dtype == torch.float32  # statistics kept in fp32
    torch.testing.assert_close(y, ry, **_ulps(dtype))
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(14)).to(dtype)
    got = kern.backward_packed(dy, x, w, stats, rows, widths, True, True, True, True)
    want = ref.batched_layer_norm_backward_layout(dy, x, w, rstats, rows, widths, True, True, True, True, "packed")
    for name, g, r in zip(("dx", "dw", "db"), got, want):
        assert g.dtype == dtype, f"{name} in {g.dtype}, not the parameters' {dtype}"
        torch.testing.assert_close(g.float(), r.float(), rtol=8 * torch.finfo(dtype).eps, atol=8 * torch.finfo(dtype).eps, msg=name)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("deterministic", [True, False])
def test_grouped_embedding_bag_16bit_accumulates_in_fp32(dtype, deterministic):
    g = torch.Generator().manual_seed(15)
    tables = [torch.randn(20, 8, generator=g).to(dtype).requires_grad_(), torch.randn(30, 16, generator=g).to(dtype).requires_grad_()]
    idx = [torch.randint(0, 20, (12,), generator=g), torch.randint(0, 30, (9,), generator=g)]
    offs = [torch.tensor([0, 3, 7, 10]), torch.tensor([0, 2, 5, 8])]
    out = K.grouped_embedding_bag(tables, idx, offs, mode="sum", deterministic=deterministic)
    f32 = [t.detach().float().requires_grad_() for t in tables]
    ref = torch.cat([torch.nn.functional.embedding_bag(i, t, o, mode="sum") for t, i, o in zip(f32, idx, offs)], 1)
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref.to(dtype), **_ulps(dtype))  # fp32 sums, one rounding
    dy = torch.randn(out.shape, generator=g).to(dtype)
    grads = torch.autograd.grad(out, tables, dy)
    rgrads = torch.autograd.grad(ref, f32, dy.float())
    for grad, rgrad, t in zip(grads, rgrads, tables):
        assert grad.dtype == t.dtype
        torch.testing.assert_close(grad, rgrad.to(dtype), **_ulps(dtype))


def _spy_dot_f32(monkeypatch):
    kern = kmod("linear.kernel")
    seen = []
    real = kern._launch_on_device

    def spy(kind, sig, args, kwargs, flags):
        seen.append((kind, kwargs["DOT_F32"], flags))
        return real(kind, sig, args, kwargs, flags)

    monkeypatch.setattr(kern, "_launch_on_device", spy)
    return seen


@pytest.mark.parametrize("allow", [False, True])
def test_tf32_switch_reaches_the_grouped_linear_kernels(allow, monkeypatch):
    """fp32 operands: ``DOT_F32`` (exact fp32 products) exactly when torch does not allow TF32,
    for the forward and both backward kernels, and the flag is in the launch's cache key."""
    seen = _spy_dot_f32(monkeypatch)
    xs, ws, bs = make_gl([(12, 16, 8), (5, 24, 16)], torch.float32, seed=16)
    with compat.tf32(allow):
        ys = K.grouped_linear(xs, ws, bs, "relu")
        torch.autograd.grad(ys, xs + ws, [torch.ones_like(y) for y in ys])
    assert {k for k, _, _ in seen} == {"fwd", "dx", "dw"}
    assert all(f32 is (not allow) for _, f32, _ in seen), seen
    assert all((not allow) in flags for _, _, flags in seen)


def test_float32_matmul_precision_high_allows_tf32(monkeypatch):
    seen = _spy_dot_f32(monkeypatch)
    xs, ws, bs = make_gl([(12, 16, 8), (5, 24, 16)], torch.float32, seed=17)
    from support import float32_matmul_precision

    with float32_matmul_precision("high"):
        K.grouped_linear(xs, ws, bs)
    with float32_matmul_precision("highest"):
        K.grouped_linear(xs, ws, bs)
    assert [f32 for _, f32, _ in seen] == [False, True]


def test_16bit_operands_ignore_the_tf32_switch(monkeypatch):
    """TF32 concerns fp32 matmuls only: 16-bit operands take the same path with it on or off
    (in the interpreter, upcast to fp32 before ``tl.dot``)."""
    seen = _spy_dot_f32(monkeypatch)
    xs, ws, bs = make_gl([(12, 16, 8), (5, 24, 16)], torch.bfloat16, seed=18)
    for allow in (False, True):
        with compat.tf32(allow):
            K.grouped_linear(xs, ws, bs)
    assert len({f32 for _, f32, _ in seen}) == 1


def test_dot_f32_is_part_of_the_autotuning_key():
    kern = kmod("linear.kernel")
    assert "DOT_F32" in kern._KEYS
