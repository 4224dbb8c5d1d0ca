"""Dynamic shapes (docs/dynamic-shapes.md): four crashes as regression tests, and the guard-free
facts rules reason with.

Each crash test names what used to happen; all run at Torch-IR or Aten-IR through
Dynamo/AOTAutograd without Inductor unless the crash was in the compile itself.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import optimus
from optimus.core.group import group_rule
from optimus.core.registry import REGISTRY
from support import assert_close_tree, run_level


def _frames() -> int:
    return torch._dynamo.utils.counters["frames"]["ok"]


def _rewrite_at(level: str, reports: list):
    def backend(gm, example_inputs):
        optimus.optimize(gm, level=level)
        reports.append(optimus.last_report())
        return gm.forward

    return backend


# ------------------------------------------------------------- (a) dropout, dynamic=True
class DropoutHeads(nn.Module):
    """Four Linears on one input (batch_linear_lhs fuses them), each followed by dropout
    whose ``p`` is a module float: under ``dynamic=True`` Dynamo makes it a graph value
    (``item()`` of a tensorified scalar), so the dropout's ``p`` is an ``fx.Node``."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.p = 0.1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(F.dropout(h(x), self.p, self.training) for h in self.heads)


def test_dropout_with_symbolic_p_does_not_roll_back_the_level():
    """Was: ``_pointwise_key`` compared ``p > 0`` with ``p`` a Node; the TypeError escaped
    and the whole Torch-IR level was rolled back (losing batch_linear_lhs)."""
    model = DropoutHeads().train()
    run = run_level(model, [torch.randn(4, 8)], "torch_ir", dynamic=True)
    gm = run.graphs[0]
    ps = [n.args[1] if len(n.args) > 1 else n.kwargs.get("p") for n in gm.graph.nodes if n.target is F.dropout]
    assert ps and all(isinstance(p, torch.fx.Node) for p in ps), "the test needs p as a graph value"
    assert not run.errors(), run.errors()
    notes = [n for r in run.reports for g in r.graphs for n in g.notes]
    assert not any("rolled back" in n for n in notes), notes
    assert run.matched("batch_linear_lhs") == 1
    assert run.matched("batch_pointwise") == 0  # random dropouts are never batched


@pytest.fixture
def temp_group_rule():
    added = []

    def make(anchors, key, fn, **kw):
        r = group_rule(anchors, key=key, **kw)(fn)
        added.append(r.name)
        return r

    yield make
    for name in added:
        REGISTRY.remove(name)


def test_a_group_key_that_raises_is_that_rule_error_only(temp_group_rule):
    """A key raising (TypeError, as the dropout key did) is reported as the rule's error
    on that node; the level keeps every other rewrite."""

    def bad_key(call, view):
        return call.args["input"] > 0  # a Node compared with an int

    temp_group_rule("relu", bad_key, lambda g, b: {}, name="test_raising_key")

    def f(x):
        a, b = x.split(4, 1)
        return torch.cat([a, b], 1).relu()

    run = run_level(f, [torch.randn(3, 8)], "torch_ir")
    errors = run.errors()
    assert errors and all("key: TypeError" in e for e in errors)
    assert run.matched("split_cat_to_identity") == 1
    assert not any("rolled back" in n for r in run.reports for g in r.graphs for n in g.notes)


@pytest.mark.slow  # one Inductor compile: ~15-40 s on 2 shared cores
def test_level_rollback_keeps_dynamo_sources_and_the_compile_works(monkeypatch):
    """Was: a level rollback rebuilt the graph and lost ``_dynamo_source`` on
    placeholders; AOTAutograd then failed. A driver that rewrites and then crashes must
    leave a graph AOTAutograd and Inductor still compile (dynamic=True)."""
    from optimus.core import driver

    real_run = driver.FxDriver.run

    def run_then_crash(self):
        real_run(self)
        if self.view.level == "torch_ir":
            raise RuntimeError("driver bug after rewriting")

    monkeypatch.setattr(driver.FxDriver, "run", run_then_crash)
    model = DropoutHeads().eval()  # no randomness: outputs compare with eager
    compiled = optimus.compile(model, dynamic=True)
    x = torch.randn(5, 8)
    with torch.no_grad():  # one graph: AOTAutograd reads the sources in inference too
        out = compiled(x)
        torch.testing.assert_close(out, model(x))
    report = compiled.optimus_report
    torch_graphs = [g for g in report.graphs if g.level == "torch_ir"]
    assert torch_graphs and all(any("rolled back" in n for n in g.notes) for g in torch_graphs)
    assert not any("failed" in n for n in report.notes), report.notes
    assert any(g.level == "aten_ir" for g in report.graphs)  # AOTAutograd ran on the restored graph


# ------------------------------------------------------ (b) mark_dynamic is never specialized
class WideHeads(nn.Module):
    """Four Linears on one input, each viewed as (batch, 2, 8): batch_linear_lhs makes them
    one Linear and chunks of it, whose views the driver must prove possible with a
    symbolic batch (it used to ``int()`` the sizes, specializing the batch to 16)."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([h(x).view(x.shape[0], 2, 8) for h in self.heads], 1).relu()


@pytest.mark.parametrize("level", ["torch_ir", "aten_ir"])
def test_mark_dynamic_batch_is_not_specialized(level):
    """Was: ConstraintViolationError ("you marked ... dynamic but your code specialized it
    to be a constant (16)") from a Torch-IR rule on DHEN. Now: the rewrite happens, with
    no guard, and batch 11 runs without compiling again."""
    torch._dynamo.reset()
    model = WideHeads().eval()
    reports: list = []
    if level == "torch_ir":
        backend = _rewrite_at("torch_ir", reports)
    else:
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        def fw(gm, example_inputs):
            optimus.optimize(gm, level="aten_ir")
            reports.append(optimus.last_report())
            return make_boxed_func(gm.forward)

        backend = aot_autograd(fw_compiler=fw)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(16, 16)
    torch._dynamo.mark_dynamic(x, 0)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        frames = _frames()
        y = torch.randn(11, 16)
        torch.testing.assert_close(compiled(y), model(y))
    assert _frames() == frames, "compiled again for another batch size"
    rewrites = sum(g.matched for r in reports for g in r.graphs)
    assert rewrites >= 1
    assert not [e for r in reports for e in r.errors()]
    if level == "torch_ir":
        assert sum(g.rules["batch_linear_lhs"].matched for r in reports for g in r.graphs) == 1


def test_refusing_new_guards_raises_before_recording():
    """What the driver wraps each level in: a ``bool()`` of an undecidable symbolic
    comparison raises ``GuardRefused`` and records no guard, so the marked batch stays
    dynamic (no ConstraintViolationError)."""
    from optimus.core.symbolic import GuardRefused, refusing_new_guards

    torch._dynamo.reset()
    seen: list = []

    def backend(gm, example_inputs):
        sym = next(n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.SymInt))
        env = sym.node.shape_env
        with refusing_new_guards(env):
            before = len(env.guards)
            with pytest.raises(GuardRefused):
                bool(sym == 16)
            seen.append(len(env.guards) - before)
        return gm.forward

    f = torch.compile(lambda x: x * 2, backend=backend)
    x = torch.randn(16, 3)
    torch._dynamo.mark_dynamic(x, 0)
    f(x)
    f(torch.randn(9, 3))  # no ConstraintViolationError, no recompile needed
    assert seen == [0]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_hf_llama_mark_dynamic_batch():
    """Was: ConstraintViolationError on a 2-layer HF Llama with ``mark_dynamic(ids, 0)``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg).eval()
    reports: list = []
    compiled = torch.compile(model, backend=_rewrite_at("torch_ir", reports))
    ids = torch.randint(0, 100, (2, 8))
    torch._dynamo.mark_dynamic(ids, 0)
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids).logits, model(ids).logits)
        frames = _frames()
        ids3 = torch.randint(0, 100, (3, 8))
        torch.testing.assert_close(compiled(ids3).logits, model(ids3).logits)
    assert _frames() == frames
    assert not [e for r in reports for e in r.errors()]


# ------------------------------------------------- (c) Dynamo's restart is not a failure
def test_tensorify_restart_passes_through_and_inductor_ir_runs():
    """Was: under dynamic=True Dynamo's TensorifyScalarRestartAnalysis (here: dropout's
    float ``p``, which cannot stay a graph value) was caught as a failure and the
    Inductor-IR passes dropped. Now the first attempt's graph is marked discarded (the
    restart), the final compile has all three levels, and no note says it failed."""
    torch._dynamo.reset()
    model = DropoutHeads().train()
    compiled = optimus.compile(model, dynamic=True)
    x = torch.randn(4, 8, requires_grad=True)
    out = compiled(x)
    out.sum().backward()
    assert out.shape == (4, 8) and torch.isfinite(out).all() and x.grad is not None
    report = compiled.optimus_report
    restarted = [g for g in report.graphs if g.discarded and "TensorifyScalarRestartAnalysis" in g.discarded]
    assert restarted, "the test needs Dynamo to restart"
    assert not any("failed" in n for n in report.notes), report.notes
    live = [g for g in report.graphs if not g.discarded]
    assert {"torch_ir", "aten_ir", "inductor_ir"} <= {g.level for g in live}
    assert sum(g.rules["batch_linear_lhs"].matched for g in live if "batch_linear_lhs" in g.rules) == 1
    assert not report.errors()


# ---------------------------------------------- (d) make_fx graphs without example_inputs
@pytest.mark.parametrize("tracing_mode", ["real", "fake", "symbolic"])
def test_make_fx_graph_batches_without_example_inputs(tracing_mode):
    """Was: "Mixing fake modes NYI" in batch_mm / batch_pointwise on a default (real)
    ``make_fx`` graph, whose nodes each carry a fake tensor of a mode of their own."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(A, B):
        a, b = A.unbind(0), B.unbind(0)
        return [torch.mm(a[i], b[i]).relu() for i in range(3)]

    args = [torch.randn(3, 4, 8), torch.randn(3, 8, 4)]
    gm = make_fx(f, tracing_mode=tracing_mode)(*args)
    optimus.optimize(gm, level="aten_ir")
    report = optimus.last_report()
    assert not report.errors(), report.errors()
    stats = report.graphs[0].rules
    assert stats["batch_mm"].matched == 1
    assert stats["batch_pointwise"].matched == 1
    assert_close_tree(gm(*args), f(*args))
    if tracing_mode == "symbolic":
        other = [torch.randn(3, 5, 8), torch.randn(3, 8, 6)]
        assert_close_tree(gm(*other), f(*other))


# ------------------------------------------------------------------ symbolic facts
def test_symbolic_facts_are_guard_free():
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    from optimus.core import symbolic as S

    env = ShapeEnv()
    s0 = env.create_symintnode(env.create_symbol(8, ConstantSource("s0"), dynamic_dim=DimDynamic.DYNAMIC), hint=8)
    s1 = env.create_symintnode(env.create_symbol(8, ConstantSource("s1"), dynamic_dim=DimDynamic.DYNAMIC), hint=8)
    assert S.known_eq(s0 * 4, 4 * s0) and not S.known_eq(s0, s1)  # equal hints are no proof
    assert S.known_divisible(s0 * 4, 4) and not S.known_divisible(s0, 4)
    assert S.known_nonneg(s0) and not S.known_nonneg(s0 - 4)
    assert S.known_lt(s0, s0 + 1) and not S.known_lt(s0, 5)
    assert S.concrete_int(s0) is None and S.concrete_int(7) == 7
    assert S.sym_key(s0 * 2) == S.sym_key(2 * s0) != S.sym_key(s1 * 2)
    assert S.size_hint(s0 * 3) == 24 and S.size_bound(s0) == 8
    assert not env.guards  # none of the above added a guard
