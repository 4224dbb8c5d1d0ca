"""The batched layer norm's activation epilogue: ``y = act(layer_norm(x) * w + b)`` in one op,
its gradient taken at the pre-activation the backward recomputes. Checked against ``act(F.layer_norm(...))`` in
float64, forward and backward, on the plain-torch path and through the Triton kernels in the
interpreter, in both layouts, through the packed and the parameter-list ops."""

import pytest
import torch
import torch.nn.functional as F

from kernels_testutil import GPU_TOL, HAS_CUDA, K, TOL, interpret, interpreter_only, interpreter_works, needs_triton, rel_err  # noqa: F401

ACTS = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}
# every width class of the interpreter's configuration, the single-row tiles and the looped rows
RAGGED = [(7, 3), (0, 16), (33, 40), (5, 300), (2, 600), (1, 1100), (4, 0)]
SAME_ROWS = [(9, 5), (9, 40), (9, 300)]


def _operands(dims, dtype, layout, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(r, d, generator=g) * 2 + 0.3 for r, d in dims]
    ws = [torch.randn(d, generator=g) * 0.5 + 1 for r, d in dims]
    bs = [torch.randn(d, generator=g) * 0.5 for r, d in dims]
    x = torch.cat([t.reshape(-1) for t in xs]) if layout == "packed" else torch.cat(xs, 1)
    return [t.to(dtype).to(device).requires_grad_() for t in (x, torch.cat(ws), torch.cat(bs))]


def _members(x, dims, layout):
    if layout == "packed":
        return [c.view(r, d) for c, (r, d) in zip(torch.split(x, [r * d for r, d in dims]), dims)]
    return list(torch.split(x, [d for _, d in dims], 1))


def _eager(x, w, b, dims, layout, act):
    """act(F.layer_norm) member by member, in x's layout."""
    widths = [d for _, d in dims]
    ys = [ACTS[act](F.layer_norm(xm, (d,), wm, bm, 1e-5))
          for xm, wm, bm, d in zip(_members(x, dims, layout), w.split(widths), b.split(widths), widths)]
    return torch.cat([y.reshape(-1) for y in ys]) if layout == "packed" else torch.cat(ys, 1)


def _run(x, w, b, dims, layout, act, params):
    rows, widths = [r for r, _ in dims], [d for _, d in dims]
    if params:  # the parameter-list op: the affines as the members' own tensors
        return torch.ops.optimus.batched_layer_norm_params(x, list(w.split(widths)), list(b.split(widths)), rows,
                                                           widths, 1e-5, layout, act)[0]
    return torch.ops.optimus.batched_layer_norm(x, w, b, rows, widths, 1e-5, layout, act)[0]


def _check(dims, dtype, layout, act, params, tol, seed=0, device="cpu"):
    x, w, b = _operands(dims, dtype, layout, seed, device)
    y = _run(x, w, b, dims, layout, act, params)
    assert y.dtype == dtype and y.shape == x.shape
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed + 1)).to(dtype).to(device)
    grads = torch.autograd.grad(y, (x, w, b), gy)
    ref = [t.detach().double().requires_grad_() for t in (x, w, b)]
    y64 = _eager(*ref, dims, layout, act)
    ref_grads = torch.autograd.grad(y64, ref, gy.double())
    errs = dict(y=rel_err(y, y64), dx=rel_err(grads[0], ref_grads[0]), dw=rel_err(grads[1], ref_grads[1]),
                db=rel_err(grads[2], ref_grads[2]))
    assert all(v <= tol for v in errs.values()), errs


@pytest.mark.parametrize("params", [False, True], ids=["packed_op", "params_op"])
@pytest.mark.parametrize("layout,dims", [("packed", RAGGED), ("columns", SAME_ROWS)])
@pytest.mark.parametrize("act", sorted(ACTS))
def test_plain_torch_path(act, layout, dims, params):
    K.set_backend("torch")
    try:
        _check(dims, torch.float32, layout, act, params, TOL[torch.float32])
    finally:
        K.set_backend("auto")


@interpreter_only
@needs_triton
@interpreter_works
@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout,dims", [("packed", RAGGED), ("columns", SAME_ROWS)])
@pytest.mark.parametrize("act", sorted(ACTS))
def test_triton_kernels_in_the_interpreter(act, layout, dims, dtype):
    _check(dims, dtype, layout, act, params=(layout == "columns"), tol=TOL[dtype] * (10 if dtype == torch.float32 else 1))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout,dims", [("packed", RAGGED + [(3, 9000), (2, 20000)]),
                                         ("columns", [(64, 24), (64, 200), (64, 1000), (64, 5000)])])
@pytest.mark.parametrize("act", sorted(ACTS))
def test_triton_kernels_on_the_gpu(act, layout, dims, dtype):
    _check(dims, dtype, layout, act, params=(layout == "columns"), tol=GPU_TOL[dtype], device="cuda")


def test_relu_gradient_is_zero_where_the_output_is():
    """Where the epilogue clamps, nothing flows back: a member whose every output is clamped
    gets no gradient at all (its bias pushes every value below zero)."""
    dims = [(4, 8), (4, 6)]
    x, w, b = _operands(dims, torch.float32, "packed", seed=3)
    with torch.no_grad():
        b[8:] = -100.0
    y = _run(x, w, b, dims, "packed", "relu", params=False)
    assert torch.count_nonzero(y[32:]) == 0
    dx, dw, db = torch.autograd.grad(y, (x, w, b), torch.ones_like(y))
    assert torch.count_nonzero(dx[32:]) == 0 and torch.count_nonzero(dw[8:]) == 0 and torch.count_nonzero(db[8:]) == 0
    assert torch.count_nonzero(db[:8]) > 0


@pytest.mark.parametrize("act", sorted(ACTS))
def test_opcheck(act):
    dims = [(3, 4), (3, 6)]
    for layout in ("packed", "columns"):
        x, w, b = _operands(dims, torch.float32, layout, seed=5)
        torch.library.opcheck(torch.ops.optimus.batched_layer_norm.default,
                              (x, w, b, [3, 3], [4, 6], 1e-5, layout, act))
        torch.library.opcheck(torch.ops.optimus.batched_layer_norm_params.default,
                              (x, list(w.detach().split([4, 6])), [], [3, 3], [4, 6], 1e-5, layout, act))


def test_an_unknown_activation_is_refused():
    x, w, b = _operands([(3, 4)], torch.float32, "packed", seed=6)
    with pytest.raises(ValueError, match="activation must be None or one of"):
        torch.ops.optimus.batched_layer_norm(x, w, b, [3], [4], 1e-5, "packed", "swish")


@pytest.mark.parametrize("params", [False, True], ids=["packed_op", "params_op"])
def test_the_epilogue_saves_nothing_more_than_the_norm(params):
    """The backward recomputes the pre-activation: what autograd keeps for the op is x, the
    statistics and the parameters, never a copy of y."""
    dims = [(5, 8), (5, 6)]
    x, w, b = _operands(dims, torch.float32, "packed", seed=7)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = _run(x, w, b, dims, "packed", "relu", params)
    sizes = sorted(t.numel() for t in saved)
    assert max(sizes) == x.numel() and sizes.count(y.numel()) == 1, sizes
