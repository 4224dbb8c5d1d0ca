"""The rules under autocast (CPU bf16, as CI runs): they see through the casts autocast puts
between the ops they look for, and every cast keeps its meaning.

At Torch-IR autocast is implicit (the graph runs under the caller's ``torch.autocast``: a linear
of fp32 operands computes in bf16); at Aten-IR its casts are explicit
``prims.convert_element_type`` nodes. Each program is checked at both levels, forward and
backward, against eager under the same autocast as PyTorch's benchmark harness judges a bf16 run
(fp64 reference, the bf16 multiplier), every result and gradient in eager's dtype; and the rules
that rewrite it in fp32 rewrite it under autocast too (structure). Then the bad inputs:
mixed-dtype members, autocast switched off inside a region, fp16 values that overflow in fp16,
a model already in half precision.
"""

import pytest
import torch
import torch.nn.functional as F

from support import LEVELS, check_level

BF16 = torch.bfloat16
D = 16


def _towers(chunks, p, width=D):
    """Linear -> LayerNorm -> ReLU per chunk, the parameters four per tower in ``p``."""
    outs = []
    for i, c in enumerate(chunks):
        w, b, lw, lb = p[4 * i: 4 * i + 4]
        outs.append(torch.relu(F.layer_norm(F.linear(c, w, b), (w.shape[0],), lw, lb)))
    return outs


def towers_over_split(x, *p):
    """The issue's example: towers over a split, a split/cat of their concatenation."""
    n = len(p) // 4
    y = torch.cat(_towers(torch.split(x, D, 1), p), 1)
    a, b = torch.split(y, [D * (n // 2), D * (n - n // 2)], 1)
    return torch.cat([b, a], 1)


def towers_over_unbind(x, *p):
    return torch.stack(_towers(x.unbind(1), p), 1)


def linears_of_one_input(x, *ws):
    return [F.linear(x, w) for w in ws]


def hetero_towers(x, *p):
    """Towers of different widths: the grouped kernels' rules."""
    return torch.cat(_towers(torch.split(x, HETERO_IN, 1), p), 1)


HETERO_IN, HETERO_OUT = [8, 16, 24, 32, 8, 12, 4], [12, 8, 20, 16, 4, 24, 8]


def _tower_params(g, shapes, dtype=torch.float32):
    ps = []
    for k, n in shapes:
        ps += [torch.randn(n, k, generator=g) / 4, torch.randn(n, generator=g), torch.randn(n, generator=g) * 0.1 + 1, torch.randn(n, generator=g) * 0.1]
    return [p.to(dtype) for p in ps]


def _inputs(name, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(len(name))
    if name == "towers_over_split":
        return [torch.randn(8, 4 * D, generator=g).mul(scale).to(dtype)] + _tower_params(g, [(D, D)] * 4, dtype)
    if name == "towers_over_unbind":
        return [torch.randn(8, 4, D, generator=g).mul(scale).to(dtype)] + _tower_params(g, [(D, D)] * 4, dtype)
    if name == "linears_of_one_input":
        return [torch.randn(8, D, generator=g)] + [torch.randn(D, D, generator=g) / 4 for _ in range(4)]
    if name == "hetero_towers":
        return [torch.randn(8, sum(HETERO_IN), generator=g)] + _tower_params(g, list(zip(HETERO_IN, HETERO_OUT)))
    raise KeyError(name)


# What rewrites each program in fp32 (measured), at each level: under autocast the same rules
# must rewrite it. At Aten-IR autocast adds hoist_pointwise_through_split: the chunks' casts move
# above their split (one cast of the whole input), which the batched matmul then reads in place.
EXPECTED = {
    ("towers_over_split", "torch_ir"): {"batch_linear", "batch_layer_norm", "batch_pointwise", "unbind_cat_to_view", "cat_split_to_inputs", "split_stack_to_view"},
    ("towers_over_split", "aten_ir"): {"batch_mm", "batch_pointwise", "unbind_stack_to_view", "slice_of_cat_to_input", "fold_slice_of_range", "hoist_pointwise_through_split"},
    ("towers_over_unbind", "torch_ir"): {"batch_linear", "batch_layer_norm", "batch_pointwise", "unbind_stack_to_view"},
    ("towers_over_unbind", "aten_ir"): {"batch_mm", "batch_pointwise", "unbind_stack_to_view", "fold_permute_chain"},
    ("linears_of_one_input", "torch_ir"): {"batch_linear_lhs"},
    ("linears_of_one_input", "aten_ir"): {"batch_mm"},
    # the towers' ReLUs are the norm's epilogue (nothing left to hoist through the split)
    ("hetero_towers", "torch_ir"): {"grouped_linear", "batched_layer_norm", "split_cat_to_identity"},
}
PROGRAMS = {f.__name__: f for f in (towers_over_split, towers_over_unbind, linears_of_one_input, hetero_towers)}


@pytest.mark.parametrize("name,level", sorted(EXPECTED))
def test_rules_see_through_autocast(name, level):
    run = check_level(PROGRAMS[name], _inputs(name), level, autocast=BF16)
    missing = {r for r in EXPECTED[name, level] if run.matched(r) == 0}
    assert not missing, f"{name} at {level} under autocast: {sorted(missing)} did not rewrite"


def test_towers_torch_ir_batched_layer_norm_runs_in_fp32_and_rounds_once():
    """bf16 inputs with fp32 weights: one fp32 LayerNorm and affine, one cast back to bf16,
    where the fp32 rewrite has no cast at all."""
    run = check_level(towers_over_unbind, _inputs("towers_over_unbind"), "torch_ir", autocast=BF16)
    ops = run.ops(0)
    assert ops["layer_norm"] == 1 and ops["baddbmm"] == 1 and ops["relu"] == 1, ops
    assert ops["cast"] == 2, ops  # to fp32 before the LayerNorm, back to bf16 after the affine
    fp32 = check_level(towers_over_unbind, _inputs("towers_over_unbind"), "torch_ir")
    assert fp32.ops(0)["cast"] == 0


def test_aten_ir_batches_the_towers_matmuls_on_one_cast_of_the_input():
    run = check_level(towers_over_split, _inputs("towers_over_split"), "aten_ir", autocast=BF16)
    fwd = run.ops(0)
    assert fwd["addmm"] == 0 and fwd["baddbmm"] == 1, fwd
    x = next(n for n in run.graphs[0].graph.nodes if n.op == "placeholder")
    assert [str(u.target) for u in x.users] == ["prims.convert_element_type.default"]  # one cast, not one per chunk


def test_grouped_linear_under_autocast_runs_on_bf16_casts_of_its_operands():
    run = check_level(hetero_towers, _inputs("hetero_towers"), "torch_ir", autocast=BF16)
    gm = run.graphs[0]
    op = next(n for n in gm.graph.nodes if "grouped_linear" in str(n.target))
    assert op.meta["example_value"][0].dtype == BF16  # the kernel computes in bf16, as the linears


def test_grouped_mm_inference_under_autocast():
    run = check_level(hetero_towers, _inputs("hetero_towers"), "aten_ir", autocast=BF16, grad=False)
    assert run.matched("grouped_mm") == 1


def norms_of_mixed_dtypes(x, *p):
    """DHEN's ensemble under autocast: LayerNorms of bf16 linear outputs beside one of an fp32
    residual (x * bf16 promotes to fp32)."""
    ws, lws, lbs = p[:4], p[4:9], p[9:14]
    outs = [F.linear(x, w) for w in ws[:3]] + [x * F.linear(x, ws[3]) + x]
    outs += [x.relu()]
    return [F.layer_norm(o, (D,), lw, lb) for o, lw, lb in zip(outs, lws, lbs)]


def test_layer_norms_of_bf16_and_fp32_inputs_batch_together():
    g = torch.Generator().manual_seed(7)
    ins = [torch.randn(8, D, generator=g)] + [torch.randn(D, D, generator=g) / 4 for _ in range(4)]
    ins += [torch.randn(D, generator=g) * 0.1 + 1 for _ in range(5)] + [torch.randn(D, generator=g) * 0.1 for _ in range(5)]
    run = check_level(norms_of_mixed_dtypes, ins, "torch_ir", autocast=BF16)
    assert [o.dtype for o in run.outputs] == [BF16] * 3 + [torch.float32] * 2
    assert run.matched("batch_layer_norm") == 1 and run.ops(0)["layer_norm"] == 1


# ------------------------------------------------------------------ casts the user wrote
def chunks_cast_and_scaled(x):
    return torch.cat([c.to(BF16) * 2 for c in x.split(4, 1)], 1)


@pytest.mark.parametrize("level", LEVELS)
def test_per_chunk_casts_become_one_cast_of_the_input(level):
    """x.split -> .to(bf16) per chunk -> cat: the casts (elementwise) move above the split, and the
    split/cat round trip goes."""
    run = check_level(chunks_cast_and_scaled, [torch.randn(4, 16)], level)
    ops = run.ops(0)
    assert ops["cast"] == 1 and ops["split"] == 0 and ops["cat"] == 0, ops
    assert run.matched("hoist_pointwise_through_split") >= 1


def cast_chains(x, h):
    # fp32 -> bf16 -> fp32 rounds: kept. fp16 -> fp32 -> fp16 is exact: x itself.
    # fp16 -> fp32 -> bf16 rounds once, in the second cast: one cast.
    return x.bfloat16().float() * 2, h.float().half() + 1, h.float().bfloat16() * 3


@pytest.mark.parametrize("level", LEVELS)
def test_cast_chains_fold_only_where_exact(level):
    g = torch.Generator().manual_seed(4)
    x, h = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g).half()
    run = check_level(cast_chains, [x, h], level)
    assert run.ops(0)["cast"] == 3, run.ops(0)
    assert run.matched("fold_cast_chain") >= 2  # at Aten-IR also the gradients' casts back


def casts_of_adjacent_slices(x):
    return torch.cat([x[:, 0:4].to(BF16), x[:, 4:8].to(BF16), x[:, 8:16].to(BF16)], 1) + 1


@pytest.mark.parametrize("level", LEVELS)
def test_cast_moves_after_a_concatenation_of_adjacent_ranges(level):
    run = check_level(casts_of_adjacent_slices, [torch.randn(4, 16)], level)
    ops = run.ops(0)
    assert ops["cast"] == 1 and ops["cat"] == 0, ops
    assert run.matched("cast_after_concatenation") == 1


def casts_of_separate_tensors(a, b):
    return torch.cat([a.to(BF16), b.to(BF16)], 1)


def test_casts_of_separate_tensors_stay_before_their_concatenation():
    run = check_level(casts_of_separate_tensors, [torch.randn(4, 4), torch.randn(4, 4)], "aten_ir")
    assert run.matched("cast_after_concatenation") == 0 and run.ops(0)["cast"] == 2


# ------------------------------------------------------------------------- bad input
def mixed_dtype_linears(x16, x32, *ws):
    """Three bf16 linears and three fp32 ones over splits: a group never mixes them."""
    outs = [F.linear(c, w) for c, w in zip(x16.split(D, 1), ws[:3])]
    outs += [F.linear(c, w) for c, w in zip(x32.split(D, 1), ws[3:])]
    return outs


@pytest.mark.parametrize("level", LEVELS)
def test_mixed_dtype_members_never_share_a_call(level):
    g = torch.Generator().manual_seed(5)
    ins = [torch.randn(4, 3 * D, generator=g).to(BF16), torch.randn(4, 3 * D, generator=g)]
    ins += [(torch.randn(D, D, generator=g) / 4).to(BF16) for _ in range(3)] + [torch.randn(D, D, generator=g) / 4 for _ in range(3)]
    run = check_level(mixed_dtype_linears, ins, level)  # dtypes compared with eager's (assert_close)
    rule = "batch_linear" if level == "torch_ir" else "batch_mm"
    assert run.matched(rule) >= 2  # one group per dtype


def half_disabled_inside(x, *p):
    """Four towers under the caller's autocast, four with autocast switched off inside."""
    chunks = torch.split(x, D, 1)
    outs = _towers(chunks[:4], p[:16])
    with torch.autocast("cpu", enabled=False):
        outs += _towers(chunks[4:], p[16:])
    return outs


@pytest.mark.parametrize("level", LEVELS)
def test_autocast_disabled_inside_a_region(level):
    g = torch.Generator().manual_seed(6)
    ins = [torch.randn(8, 8 * D, generator=g)] + _tower_params(g, [(D, D)] * 8)
    run = check_level(half_disabled_inside, ins, level, autocast=BF16)
    assert [o.dtype for o in run.outputs] == [BF16] * 4 + [torch.float32] * 4
    if level == "torch_ir":  # two groups: the bf16 towers and the fp32 ones, never one
        assert run.matched("batch_linear") == 2 and run.matched("batch_layer_norm") == 2


@pytest.mark.parametrize("level", LEVELS)
def test_fp16_values_that_overflow_in_fp16_arithmetic(level):
    """A half-precision model (no autocast) with inputs of magnitude ~1e3: their variance
    (~1e6) overflows fp16 (max 65504); eager's layer_norm computes it in fp32, and so does the
    batched one (fp32 LayerNorm and affine, one rounding to fp16)."""
    ins = _inputs("towers_over_unbind", torch.float16, scale=1000.0)
    run = check_level(towers_over_unbind, ins, level)
    assert all(torch.isfinite(t).all() for t in [run.outputs] + [g for g in run.grads if g is not None])
    if level == "torch_ir":
        assert run.matched("batch_layer_norm") == 1 and run.ops(0)["cast"] == 4  # x, weights, biases up; the result down


@pytest.mark.parametrize("level", LEVELS)
def test_a_model_already_in_bf16_without_autocast(level):
    run = check_level(towers_over_split, _inputs("towers_over_split", BF16), level)
    assert run.outputs.dtype == BF16 and all(g.dtype == BF16 for g in run.grads)
    rule = "batch_linear" if level == "torch_ir" else "batch_mm"
    assert run.matched(rule) >= 1


def mlp(x, w1, w2):
    return F.linear(torch.relu(F.linear(x, w1)), w2)


def test_a_cast_weight_transposed_twice_is_the_cast_weight():
    """Under autocast the forward graph transposes each bf16 cast of a weight for its matmul
    and transposes it back to save it for the backward: the two permutations cancel although
    the inner one has another user (its matmul), so the saved tensor is the cast itself."""
    g = torch.Generator().manual_seed(3)
    inputs = [torch.randn(8, D, generator=g), torch.randn(D, D, generator=g) / 4, torch.randn(D, D, generator=g) / 4]
    run = check_level(mlp, inputs, "aten_ir", autocast=BF16)
    assert run.matched("fold_permute_chain") >= 1
    assert run.ops(0)["permute"] < check_level(mlp, inputs, "aten_ir", passes="none", autocast=BF16).ops(0)["permute"]
