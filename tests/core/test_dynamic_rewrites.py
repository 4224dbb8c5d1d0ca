"""Dynamic shapes keep the static rewrites (docs/dynamic-shapes.md): facts that used to be
unprovable, and zoo models whose rewrite counts under symbolic sizes were below static.

Each model test rewrites one level (Torch-IR through Dynamo, or Aten-IR through
AOTAutograd, no Inductor) under ``dynamic=True``, checks outputs and gradients against
the unoptimized model at two batch sizes with no recompile at the second, and counts the
rule's matches against the static compile of the same level.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import optimus
from optimus.core import symbolic as S
from support import assert_close_tree, run_level


# ------------------------------------------------------------------ symbolic facts
def _env_and_sizes(*hints: int):
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv()
    sizes = [
        env.create_symintnode(env.create_symbol(h, ConstantSource(f"s{i}"), dynamic_dim=DimDynamic.DYNAMIC), hint=h)
        for i, h in enumerate(hints)
    ]
    return env, sizes


def test_ceil_division_of_an_exact_multiple_is_provable_without_a_guard():
    """``ceil(s0*s1 / s1) == s0`` (how embedding_bag's meta sizes its bags of 2-D
    indices): true for every ``s1 >= 1``; the shape environment alone cannot decide it."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    env, (s0, s1) = _env_and_sizes(32, 4)
    bags = (s0 * s1 + s1 - 1) // s1
    assert not statically_known_true(bags == s0)  # what torch decides by itself
    assert S.known_eq(bags, s0) and S.known_eq(s0, bags)
    assert S.known_sizes_eq((bags, 16), (s0, 16))
    assert S.known_eq((s0 * s1) // s1, s0)
    # not exact, so not folded: floor((s0*s1 + s1) / s1) is s0 + 1, and floor(s0 / 2) is no multiple
    assert not S.known_eq((s0 * s1 + s1) // s1, s0)
    assert S.known_eq((s0 * s1 + s1) // s1, s0 + 1)
    assert not S.known_eq((s0 + 1) // 2, s0 // 2)
    # a remainder not provably below the divisor: floor((s0*s1 + s0) / s1) is not s0
    assert not S.known_eq((s0 * s1 + s0) // s1, s0)
    assert not env.guards  # none of the above added a guard


def test_a_fact_dynamo_guarded_before_is_known_inside_the_refusing_level():
    """Dynamo guards ``Eq(ceil(s0*s1 / s1), s0)`` while it traces a cat of the pooled
    bags with a batch-sized tensor; the shape environment memoizes the "unknown" it saw
    before the guard (its version does not change when a guard is recorded). Re-emitting
    that cat inside ``refusing_new_guards`` used to be refused as a new guard."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    env, (s0, s1) = _env_and_sizes(32, 4)
    bags = (s0 * s1 + s1 - 1) // s1
    with FakeTensorMode(shape_env=env):
        pooled, dense = torch.empty(bags, 16), torch.empty(s0, 8)
        torch.cat([dense, pooled], 1)  # Dynamo's trace: records the guard
        recorded = len(env.guards)
        assert recorded >= 1
        # the environment also keeps its last 256 evaluations; Dynamo makes many more
        # between its cat and a rewrite's, so this one is gone by then
        type(env)._inner_evaluate_expr.cache_clear()
        with S.refusing_new_guards(env):
            out = torch.cat([dense, torch.empty(s0, 4), pooled], 1)  # a rewrite's cat
    assert S.known_sizes_eq(out.shape, (s0, 28))
    assert len(env.guards) == recorded


# ------------------------------------------------------------- zoo parity harness
def _level_backend(level: str, reports: list) -> Callable[..., Any]:
    def rewrite(gm: torch.fx.GraphModule, lv: str) -> torch.fx.GraphModule:
        optimus.optimize(gm, level=lv)
        reports.append(optimus.last_report())
        return gm

    if level == "torch_ir":
        return lambda gm, example_inputs: rewrite(gm, "torch_ir").forward
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    def compiler(gm, example_inputs):
        return make_boxed_func(rewrite(gm, "aten_ir").forward)

    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler, decompositions=select_decomp_table(), partition_fn=min_cut_rematerialization_partition)


def _step(model: torch.nn.Module, inputs: list[torch.Tensor], training: bool) -> tuple[Any, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    if not training:
        with torch.no_grad():
            return model(*inputs), []
    out = model(*inputs)
    g = torch.Generator().manual_seed(1)
    (out * torch.randn(out.shape, generator=g)).sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _same_at_two_batches(compiled: Any, first: list, second: list, expected: list, training: bool, atol: float) -> None:
    """``compiled`` gives ``expected`` at both batches, without compiling again for the second."""
    got = [_step(compiled, first, training)]
    frames = torch._dynamo.utils.counters["frames"]["ok"]
    got.append(_step(compiled, second, training))
    assert torch._dynamo.utils.counters["frames"]["ok"] == frames, "compiled again for another batch size"
    for g, e in zip(got, expected):
        assert_close_tree(g, e, rtol=1e-4, atol=atol)


def dynamic_parity(name: str, level: str, training: bool) -> list:
    """Zoo model ``name`` (small) rewritten at ``level`` under ``dynamic=True``: outputs
    and parameter gradients equal the unoptimized model's at the zoo batch and at batch
    + 3, with no recompile at the second; returns the reports."""
    from optimus.tools.models import get_model
    from optimus.tools.dynamic_report import second_batch

    torch._dynamo.reset()
    zoo = get_model(name, "small")
    model = zoo.model.train(training)
    first, second = list(zoo.inputs), list(second_batch(zoo.inputs, zoo.batch_size))
    expected = [_step(model, first, training), _step(model, second, training)]
    reports: list = []
    compiled = torch.compile(model, backend=_level_backend(level, reports), dynamic=True, fullgraph=True)
    _same_at_two_batches(compiled, first, second, expected, training, atol=1e-5)
    assert not [e for r in reports for e in r.errors()]
    return reports


def matched(reports: list, rule: str) -> int:
    return sum(g.rules[rule].matched for r in reports for g in r.graphs if rule in g.rules)


def static_matched(name: str, level: str, training: bool, rule: str) -> int:
    from optimus.tools.models import get_model

    zoo = get_model(name, "small")
    run = run_level(zoo.model.train(training), list(zoo.inputs), level, dynamic=False, grad=training)
    return run.matched(rule)


# ------------------------------------------------------------------------- models
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_dlrm_keyed_tensor_round_trip_is_removed_under_dynamic(training):
    """DLRM's cat(pooled) -> split -> cat([dense, *pieces]) round trip: the pieces'
    rows are ``ceil(batch*bag / bag)``, the dense batch ``batch``; provably equal, so
    cat_split_to_inputs rewrites as it does with static sizes (it used to decline)."""
    reports = dynamic_parity("dlrm", "torch_ir", training)
    assert matched(reports, "cat_split_to_inputs") == static_matched("dlrm", "torch_ir", training, "cat_split_to_inputs") == 1


# ------------------------------------------------------- Inductor-IR cost caps
def test_independent_kernels_fuse_under_dynamic_shapes():
    """``fuse_independent_kernels`` caps a kernel's iteration points; for symbolic sizes
    the view asked ``sizevars.size_hint``, which torch 2.13 no longer has, so every
    kernel of a dynamic graph declined the cap ("more than max_work iteration points").
    Two independent elementwise chains over ``(s0, 8)`` now share one loop nest, with
    the outputs and gradients of eager at two batch sizes and no recompile."""
    from torch._inductor import config as inductor_config

    from optimus.core.report import Report

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.sin() * 2 + 1, y.cos() - 3

    torch._dynamo.reset()
    with inductor_config.patch(fx_graph_cache=False):
        compiled = optimus.compile(f, dynamic=True, passes={"torch_ir": "none", "aten_ir": "none", "inductor_ir": ["fuse_independent_kernels"]})
        frames = None
        for batch in (6, 9):
            args = [torch.randn(batch, 8, requires_grad=True) for _ in range(2)]
            ref = [a.detach().clone().requires_grad_() for a in args]
            out, expected = compiled(*args), f(*ref)
            sum(o.sum() for o in out).backward()
            sum(o.sum() for o in expected).backward()
            assert_close_tree(out, expected)
            assert_close_tree([a.grad for a in args], [r.grad for r in ref])
            if frames is None:
                frames = torch._dynamo.utils.counters["frames"]["ok"]
        assert torch._dynamo.utils.counters["frames"]["ok"] == frames, "compiled again for another batch size"
    report: Report = compiled.optimus_report
    fused = sum(g.rules["fuse_independent_kernels"].matched for g in report.graphs if g.level == "inductor_ir" and not g.discarded)
    caps = [r for g in report.graphs if g.level == "inductor_ir" and "fuse_independent_kernels" in g.rules for r in g.rules["fuse_independent_kernels"].declined if "max_work" in r]
    assert fused >= 2  # forward and backward: one loop nest each
    assert not caps


# ------------------------------------------------- fake-tensor cache guards
def test_cat_of_leading_columns_is_a_view_under_dynamic_shapes():
    """cat([x[:, 0], x[:, 1], x[:, 2]]) of an ``(s0, s1)`` x is x[:, 0:3] flattened
    (unbind_cat_to_view). Emitting that slice asked ``Ne(s1, 3)``: not the slice's own
    meta, but the fake-tensor cache validating its new entry, refused as a guard. With
    the cache off while a rewrite computes metadata, it rewrites (as InterFormer's
    sparse-id columns do) with eager's outputs and gradients at two sizes, no recompile."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:, 0], x[:, 1], x[:, 2]], 0) * 2

    torch._dynamo.reset()
    reports: list = []
    compiled = torch.compile(f, backend=_level_backend("torch_ir", reports), dynamic=True, fullgraph=True)
    frames = None
    for shape in ((4, 5), (7, 6)):
        x = torch.randn(*shape, requires_grad=True)
        ref = x.detach().clone().requires_grad_()
        out, expected = compiled(x), f(ref)
        out.pow(2).sum().backward()
        expected.pow(2).sum().backward()
        assert_close_tree((out, x.grad), (expected, ref.grad))
        frames = torch._dynamo.utils.counters["frames"]["ok"] if frames is None else frames
    assert torch._dynamo.utils.counters["frames"]["ok"] == frames, "compiled again for another size"
    assert matched(reports, "unbind_cat_to_view") == 1
    assert not [e for r in reports for e in r.errors()]


def test_interformer_sparse_columns_rewrite_under_dynamic():
    """InterFormer at Torch-IR: every rewrite of the static compile, under dynamic=True."""
    reports = dynamic_parity("interformer", "torch_ir", training=False)
    assert matched(reports, "unbind_cat_to_view") == static_matched("interformer", "torch_ir", False, "unbind_cat_to_view") >= 1


# --------------------------------------- specialization after the levels (DHEN)
@pytest.mark.slow
def test_dhen_training_with_mark_dynamic_batch_is_not_specialized():
    """Was: ConstraintViolationError. batch_layer_norm stacked DHEN's LayerNorms; the
    stacked op's saved rstd got another layout from Inductor and AOTAutograd's re-stride
    of the backward placeholder (example-batch ints) guarded the batch to 16, after
    Optimus's levels. Now the rule declines in training under symbolic sizes; the compile
    keeps the batch dynamic, matches eager at two batches and does not recompile."""
    from optimus.tools.models import get_model
    from optimus.tools.dynamic_report import second_batch

    torch._dynamo.reset()
    zoo = get_model("dhen", "small")
    model = zoo.model.train()
    first, second = [t.clone() for t in zoo.inputs], list(second_batch(zoo.inputs, zoo.batch_size))
    expected = [_step(model, first, True), _step(model, second, True)]
    for t in first:
        torch._dynamo.mark_dynamic(t, 0)
    compiled = optimus.compile(model)
    _same_at_two_batches(compiled, first, second, expected, True, atol=1e-4)
    report = compiled.optimus_report
    assert not report.errors()
    live = [g for g in report.graphs if not g.discarded]
    declines = [r for g in live if "batch_layer_norm" in g.rules for r in g.rules["batch_layer_norm"].declined]
    assert any("training with symbolic sizes and inputs of mixed layouts" in r for r in declines), declines
    assert sum(g.matched for g in live) > 50  # the other rewrites stay


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "one_transposed"])
def test_batch_layer_norm_under_a_symbolic_batch(training, transposed):
    """Contiguous LayerNorm inputs still become one stacked LayerNorm under a symbolic
    batch, in inference and training (splitcat's and towers32's were measured without
    a guard); in training, a group whose inputs have mixed layouts (DHEN: one transposed)
    declines. Outputs and input gradients match eager at two batches, no recompile."""
    from torch import nn

    class Norms(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norms = nn.ModuleList(nn.LayerNorm(16) for _ in range(4))

        def forward(self, stacked: torch.Tensor) -> torch.Tensor:
            xs = list(stacked.unbind(0))  # parts of one tensor: stacking is free
            if transposed:
                xs[2] = xs[2].transpose(1, 2).contiguous().transpose(1, 2)  # same values, strides (48, 1, 3)
            return sum(n(x) for n, x in zip(self.norms, xs))

    model = Norms().train(training)
    torch._dynamo.reset()
    reports: list = []
    compiled = torch.compile(model, backend=_level_backend("torch_ir", reports), fullgraph=True)
    frames = None
    for batch in (5, 8):
        x = torch.randn(4, batch, 3, 16)
        ref = x.clone().requires_grad_(training)
        x.requires_grad_(training)
        if frames is None:
            torch._dynamo.mark_dynamic(x, 1)
        with torch.set_grad_enabled(training):
            out, expected = compiled(x), model(ref)
        assert_close_tree(out, expected)
        if training:
            out.pow(2).sum().backward()
            expected.pow(2).sum().backward()
            assert_close_tree(x.grad, ref.grad)
        frames = torch._dynamo.utils.counters["frames"]["ok"] if frames is None else frames
    assert torch._dynamo.utils.counters["frames"]["ok"] == frames
    declines = [r for rep in reports for g in rep.graphs if "batch_layer_norm" in g.rules for r in g.rules["batch_layer_norm"].declined]
    if not transposed:
        assert matched(reports, "batch_layer_norm") == 1
    elif training:
        assert matched(reports, "batch_layer_norm") == 0
        assert any("mixed layouts" in r for r in declines), declines
    else:  # the copy of the transposed member makes the stack unprofitable, but not this reason
        assert not any("mixed layouts" in r for r in declines), declines
    assert not [e for r in reports for e in r.errors()]
