"""kernels/runtime/launch.py: direct launches of compiled Triton kernels, and the lean op registration
of kernels/runtime/registration.py (the hot path of every grouped op call).

On the CPU the launcher is driven by a stand-in for a jitted function (the JIT cannot compile
here), and its parameter introspection is checked against the real jitted kernels of this
Triton; the GPU test launches a real kernel both ways.
"""

import types

import numpy as np
import pytest
import torch

from kernels_testutil import HAS_CUDA, HAS_TRITON, K

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")


def _launch_mod():
    import importlib

    return importlib.import_module(K.__name__ + ".runtime.launch")


class _Param:
    def __init__(self, name, default=None, has_default=False):
        self.name, self.default, self.has_default = name, default, has_default


class _Compiled:
    def __init__(self, names, calls):
        self.src = types.SimpleNamespace(signature={n: "x" for n in names})
        self.calls = calls

    def __getitem__(self, grid):
        return lambda *args: self.calls.append(("direct", grid, args))


class _Jit:
    """A stand-in for a ``@triton.jit`` function of parameters (x_ptr, n, BLOCK, FLAG=False);
    ``compiled_names``: the parameters of the compiled kernels it returns (another Triton's may
    differ)."""

    def __init__(self, compiled_names=("x_ptr", "n", "BLOCK", "FLAG")):
        self.arg_names = ["x_ptr", "n", "BLOCK", "FLAG"]
        self.params = [_Param("x_ptr"), _Param("n"), _Param("BLOCK"), _Param("FLAG", False, True)]
        self.calls, self.compiled_names = [], list(compiled_names)

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.calls.append(("jit", grid, args, kwargs))
            return _Compiled(self.compiled_names, self.calls)
        return run


@pytest.fixture
def direct():
    L = _launch_mod()
    old = L._DIRECT
    L._DIRECT = True
    L._CACHE.clear()
    yield L
    L._DIRECT = old
    L._CACHE.clear()


def test_first_launch_through_the_jit_then_direct_with_the_constexprs_in_order(direct):
    fn, x = _Jit(), torch.zeros(64)
    for _ in range(3):
        direct.launch(fn, (4,), (x, 64), dict(BLOCK=32), dict(num_warps=4))
    kinds = [c[0] for c in fn.calls]
    assert kinds == ["jit", "direct", "direct"]
    assert fn.calls[0][3] == dict(BLOCK=32, num_warps=4)
    # the direct launch: a 3-D grid, the runtime arguments, then BLOCK and FLAG's default
    _, grid, args = fn.calls[1]
    assert grid == (4, 1, 1) and args[0] is x and args[1:] == (64, 32, False)


@pytest.mark.parametrize("change", ["alignment", "int_is_one", "int_multiple_of_16", "int_width", "dtype",
                                    "constexpr", "option"])
def test_a_new_specialization_goes_through_the_jit_again(direct, change):
    fn = _Jit()
    x = torch.zeros(64)
    base = dict(args=(x, 64), cx=dict(BLOCK=32), opt=dict(num_warps=4))
    other = {
        "alignment": dict(args=(x[1:], 64)),      # 4 bytes past a 16-byte boundary
        "int_is_one": dict(args=(x, 1)),
        "int_multiple_of_16": dict(args=(x, 65)),
        "int_width": dict(args=(x, 2 ** 35)),
        "dtype": dict(args=(torch.zeros(64, dtype=torch.float16), 64)),
        "constexpr": dict(cx=dict(BLOCK=64)),
        "option": dict(opt=dict(num_warps=8)),
    }[change]
    for spec in (base, {**base, **other}, {**base, **other}):
        direct.launch(fn, (1,), spec["args"], spec["cx"], spec["opt"])
    assert [c[0] for c in fn.calls] == ["jit", "jit", "direct"]


def test_same_facts_share_a_compiled_kernel(direct):
    fn = _Jit()
    a, b = torch.zeros(64), torch.zeros(128)  # both 16-byte aligned, sizes 64 and 128 both multiples of 16
    direct.launch(fn, (1,), (a, 64), dict(BLOCK=32), {})
    direct.launch(fn, (1,), (b, 128), dict(BLOCK=32), {})
    direct.launch(fn, (1,), (b, np.int64(256)), dict(BLOCK=32), {})  # a NumPy int: the same facts
    assert [c[0] for c in fn.calls] == ["jit", "direct", "direct"]
    assert fn.calls[1][2][0] is b and fn.calls[1][2][1] == 128


def test_a_compiled_kernel_of_another_shape_is_never_called_directly(direct):
    fn = _Jit(compiled_names=("x_ptr", "BLOCK"))  # its parameters differ from the jitted function's
    for _ in range(3):
        direct.launch(fn, (1,), (torch.zeros(4), 4), dict(BLOCK=32), {})
    assert [c[0] for c in fn.calls] == ["jit"] * 3


def test_off_switch(direct):
    direct.set_direct(False)
    fn = _Jit()
    for _ in range(2):
        direct.launch(fn, (1,), (torch.zeros(4), 4), dict(BLOCK=32), {})
    assert [c[0] for c in fn.calls] == ["jit", "jit"]


def _reduce_like(part_ptr, dw_ptr, db_ptr, gtab_ptr, TOT_PART, HAS_W: "tl.constexpr", HAS_B: "tl.constexpr",
                 BLOCK_J: "tl.constexpr", BLOCK_C: "tl.constexpr" = 128):
    pass


def test_tail_from_a_real_jitted_function_of_this_triton():
    """The introspection ``_tail`` relies on (``arg_names``, ``params``, ``has_default``) holds
    for a jitted function of the installed Triton (built directly: ``triton.jit`` gives an
    interpreter function under ``TRITON_INTERPRET=1``, and importing our kernel modules here
    would fix them to one mode for the whole session)."""
    from triton.runtime.jit import JITFunction

    L = _launch_mod()
    fn = JITFunction(_reduce_like)
    compiled = _Compiled(list(fn.arg_names), [])
    named = dict(HAS_W=True, HAS_B=False, BLOCK_J=32, num_warps=4)
    assert L._tail(fn, compiled, 5, named) == (True, False, 32, 128)  # BLOCK_C from its default
    assert L._tail(fn, compiled, 5, dict(HAS_W=True)) is L._UNSUPPORTED


# ------------------------------------------------------------------------------------------------
# the lean registration (kernels/runtime/registration.py)
# ------------------------------------------------------------------------------------------------
def _gl_args(requires_grad):
    ks, ns, ms = [4, 8], [3, 5], [6, 6]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 12, generator=g, dtype=torch.float64, requires_grad=requires_grad)
    w = torch.randn(sum(k * n for k, n in zip(ks, ns)), generator=g, dtype=torch.float64, requires_grad=requires_grad)
    b = torch.randn(sum(ns), generator=g, dtype=torch.float64, requires_grad=requires_grad)
    return x, w, b, ms, ks, ns


def _loop(x, w, b, ks, ns):
    ys, o, ob, oc = [], 0, 0, 0
    for k, n in zip(ks, ns):
        ys.append(torch.relu(torch.nn.functional.linear(x[:, oc:oc + k], w[o:o + n * k].view(n, k), b[ob:ob + n])))
        o, ob, oc = o + n * k, ob + n, oc + k
    return torch.cat(ys, 1)


def test_op_without_gradients():
    x, w, b, ms, ks, ns = _gl_args(True)
    with torch.no_grad():
        y, _ = torch.ops.optimus.grouped_linear(x, w, b, ms, ks, ns, "relu", "columns")
    torch.testing.assert_close(y, _loop(x, w, b, ks, ns).detach())
    assert y.grad_fn is None and not y.requires_grad


def test_op_defaults_filled_and_gradients_through_the_generated_function():
    x, w, b, ms, ks, ns = _gl_args(True)
    y, pre = torch.ops.optimus.grouped_linear(x, w, b, ms, ks, ns, "relu", layout="columns")
    assert type(y.grad_fn).__name__ == "GroupedLinearBackward"
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, w, b), g)
    x2, w2, b2 = (t.detach().requires_grad_() for t in (x, w, b))
    want = torch.autograd.grad(_loop(x2, w2, b2, ks, ns), (x2, w2, b2), g)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)
    # the packed layout with its default left out (the dispatcher drops trailing defaults)
    xp = torch.cat([x[:, :4].reshape(-1), x[:, 4:].reshape(-1)]).detach()
    yp, _ = torch.ops.optimus.grouped_linear(xp, w.detach(), b.detach(), ms, ks, ns, "relu")
    torch.testing.assert_close(yp, torch.cat([_loop(x, w, b, ks, ns)[:, :3].reshape(-1),
                                              _loop(x, w, b, ks, ns)[:, 3:].reshape(-1)]).detach())


def test_list_op_gradients_per_parameter():
    import importlib

    importlib.import_module(K.__name__ + ".linear.op")
    x, w, b, ms, ks, ns = _gl_args(False)
    ws = [w[:12].view(3, 4).clone().requires_grad_(), w[12:].view(5, 8).clone().requires_grad_()]
    bs = [b[:3].clone().requires_grad_(), b[3:].clone()]  # the second bias frozen
    x = x.requires_grad_()
    y, _ = torch.ops.optimus.grouped_linear_params(x, ws, bs, ms, ks, ns, "relu", "columns")
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, *ws, bs[0]), g, retain_graph=True)
    again = torch.autograd.grad(y, (x, *ws, bs[0]), g)  # a kept graph: the formula sees the same flags
    for a, e in zip(again, got):
        torch.testing.assert_close(a, e, rtol=0, atol=0)
    x2 = x.detach().requires_grad_()
    ws2 = [t.detach().requires_grad_() for t in ws]
    b0 = bs[0].detach().requires_grad_()
    want_y = _loop(x2, torch.cat([t.reshape(-1) for t in ws2]), torch.cat([b0, bs[1]]), ks, ns)
    want = torch.autograd.grad(want_y, (x2, *ws2, b0), g)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)


def test_meta_and_fake_tensors_reach_the_fake_implementation():
    from torch._subclasses import FakeTensorMode

    x, w, b, ms, ks, ns = _gl_args(True)
    y, _ = torch.ops.optimus.grouped_linear(x.detach().to("meta"), w.detach().to("meta"), None, ms, ks, ns,
                                            "relu", "columns")
    assert y.device.type == "meta" and tuple(y.shape) == (6, 8)
    with FakeTensorMode():
        fx = torch.empty(6, 12, dtype=torch.float64, requires_grad=True)
        fw = torch.empty(w.shape, dtype=torch.float64, requires_grad=True)
        fy, _ = torch.ops.optimus.grouped_linear(fx, fw, None, ms, ks, ns, "relu", "columns")
        assert tuple(fy.shape) == (6, 8) and fy.requires_grad
        with torch.no_grad():  # no gradients: the fake mode's key must still be dispatched to
            fz, _ = torch.ops.optimus.grouped_linear(fx, fw, None, ms, ks, ns, "relu", "columns")
    from torch._subclasses.fake_tensor import FakeTensor

    assert isinstance(fz, FakeTensor) and tuple(fz.shape) == (6, 8)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_direct_launch_gpu():
    import triton
    import triton.language as tl

    L = _launch_mod()
    if not L._DIRECT:
        pytest.skip("direct launches are off here")

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr, TWICE: tl.constexpr = False):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(x_ptr + offs, v + (2.0 if TWICE else 1.0), mask=offs < n)

    before = dict(L.STATS)
    base = torch.zeros(1025, device="cuda")
    for x in (base, base[1:], base):  # aligned, then a misaligned view, then aligned again
        for _ in range(3):
            L.launch(add_one, (triton.cdiv(x.numel(), 256),), (x, x.numel()), dict(BLOCK=256), dict(num_warps=4))
    torch.cuda.synchronize()
    assert base[0].item() == 6.0 and torch.all(base[1:] == 9.0)
    assert L.STATS["direct"] - before.get("direct", 0) >= 6
    assert L.STATS["jit"] - before.get("jit", 0) == 2  # aligned once, misaligned once
