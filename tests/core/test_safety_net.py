"""The safety net (optimus/safety_net.py): no failure of ours breaks a compile, the user's
own passes are chained, outputs alias only where eager's did, every torch.compile option
works, and Dynamo's restart signals pass through."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import optimus
from optimus import safety_net
from optimus.core.snapshot import restore, snapshot
from optimus.tools import measure


class Tower(torch.nn.Module):
    """Split/cat junk plus a layer norm: every level has work (Inductor-IR fuses on CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(12, 12)
        self.norm = torch.nn.LayerNorm(12)

    def forward(self, x):
        a, b, c = self.lin(x).split(4, dim=-1)
        y = torch.cat([a, b, c], dim=-1)
        return self.norm(y).relu() * 2


def _train_step(model, x):
    out = model(x)
    out.sum().backward()
    return out


def _twin():
    torch.manual_seed(0)
    model, ref = Tower(), Tower()
    ref.load_state_dict(model.state_dict())
    return model, ref


# --------------------------------------------------------------- per-graph ladder
def test_fault_only_in_the_backward_inductor_ir_hook_falls_back_for_that_graph(monkeypatch):
    """A fault inside the Inductor-IR hook that shows only in the (lazily compiled)
    backward graph: that graph compiles again without the Inductor-IR passes, the
    forward keeps them, the step runs and the gradients are right."""
    from optimus.inductor_ir import passes

    real = passes.InductorIRPass.__call__
    hits = []

    def faulty(self, nodes):
        if (safety_net.GRAPH_KIND.get() or "").startswith("backward"):
            hits.append(self.hook)
            raise RuntimeError("injected backward-only fault")
        return real(self, nodes)

    monkeypatch.setattr(passes.InductorIRPass, "__call__", faulty)
    model, ref = _twin()
    x = torch.randn(6, 12)
    compiled = optimus.compile(model)
    with measure.fresh_inductor_cache():
        out = _train_step(compiled, x)
    want = _train_step(ref, x)
    torch.testing.assert_close(out, want)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert hits, "the fault was never injected"
    report = compiled.optimus_report
    notes = [n for n in report.notes if n.startswith("backward 0: compiling with every Optimus level failed")]
    assert len(notes) == 1 and "injected backward-only fault" in notes[0] and "without the Inductor-IR passes" in notes[0]
    forward = [g for g in report.graphs if g.level == "inductor_ir" and g.graph == "forward 0"]
    assert forward and not forward[0].discarded  # the forward kept its Inductor-IR passes
    backward = [g for g in report.graphs if g.graph == "backward 0" and not g.discarded]
    assert {g.level for g in backward} == {"aten_ir"}  # the retry ran Aten-IR, not Inductor-IR
    assert any(g.discarded and g.graph == "backward 0" for g in report.graphs)


def test_fault_in_every_attempt_with_optimus_reaches_plain_inductor(monkeypatch):
    """A rewrite Inductor cannot compile, at Torch-IR (before AOTAutograd): the graph is
    restored and compiled without any Optimus pass."""
    import importlib

    oc = importlib.import_module("optimus.compile")

    real = oc.Session.run_level

    def broken(self, level, graph):
        real(self, level, graph)
        if level == "torch_ir":  # a node AOTAutograd cannot trace
            out = next(n for n in graph.nodes if n.op == "output")
            with graph.inserting_before(out):
                graph.call_function(_explode, (out.args[0][0],))

    monkeypatch.setattr(oc.Session, "run_level", broken)
    model, ref = _twin()
    x = torch.randn(6, 12)
    compiled = optimus.compile(model)
    with measure.fresh_inductor_cache():
        torch.testing.assert_close(_train_step(compiled, x), _train_step(ref, x))
    notes = compiled.optimus_report.notes
    assert any("compiled again without any Optimus pass" in n and "torch_ir rewrite cannot be compiled" in n for n in notes), notes


def _explode(t):
    raise RuntimeError("this torch_ir rewrite cannot be compiled")


# --------------------------------------------------------------- chained user passes
class _CountingPass(torch._inductor.custom_graph_pass.CustomGraphPass):
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, graph):
        self.calls += 1

    def uuid(self):
        return "test-counting-pass"


def test_users_post_grad_pass_runs_under_optimus_compile():
    from torch._inductor import config as inductor_config

    counting = _CountingPass()
    model, _ = _twin()
    x = torch.randn(4, 12)
    with inductor_config.patch(post_grad_custom_pre_pass=counting), measure.fresh_inductor_cache():
        torch._dynamo.reset()
        torch.compile(model)(x)
        plain = counting.calls
        torch._dynamo.reset()
        compiled = optimus.compile(model)
        compiled(x)
    assert plain == 1
    assert counting.calls == 2, "the user's pass must run once more under optimus.compile"
    assert compiled.optimus_report.graphs  # and Optimus's own passes ran too
    assert any("post_grad_custom_pre_pass" in n and "_CountingPass" in n for n in compiled.optimus_report.notes)


def test_users_pass_given_in_options_is_chained_too():
    counting = _CountingPass()
    model, _ = _twin()
    with measure.fresh_inductor_cache():
        torch._dynamo.reset()
        compiled = optimus.compile(model, options={"pre_grad_custom_pass": counting})
        compiled(torch.randn(4, 12))
    assert counting.calls == 1
    assert any(g.level == "torch_ir" for g in compiled.optimus_report.graphs)


def test_a_users_pass_that_raises_is_their_error_not_swallowed():
    from torch._inductor import config as inductor_config

    def bad_user_pass(graph):
        raise ValueError("user pass bug")

    model, _ = _twin()
    with inductor_config.patch(post_grad_custom_pre_pass=bad_user_pass), measure.fresh_inductor_cache():
        torch._dynamo.reset()
        with pytest.raises(Exception) as info:
            optimus.compile(model)(torch.randn(4, 12))
    assert safety_net.user_error(info.value) == "post_grad_custom_pre_pass = test_a_users_pass_that_raises_is_their_error_not_swallowed.<locals>.bad_user_pass"
    assert "user pass bug" in str(info.value) or "user pass bug" in repr(info.value.__cause__)


def test_chained_hook_uuid_combines_both_and_is_none_without_the_users():
    ours = _CountingPass()
    keyed = safety_net.HookPass("post_grad_custom_pre_pass", [_CountingPass()], ours)
    assert "test-counting-pass" in keyed.uuid() and keyed.uuid().count("test-counting-pass") == 2
    unkeyed = safety_net.HookPass("post_grad_custom_pre_pass", [lambda g: None], ours)
    assert unkeyed.uuid() is None  # Inductor then bypasses its cache, as for that pass alone
    import pickle

    assert pickle.loads(pickle.dumps(unkeyed)).uuid()  # 2.11 pickles it into a key: never "None"


# --------------------------------------------------------------- aliasing
def test_cat_of_split_returns_a_fresh_tensor_like_eager():
    x = torch.randn(4, 8)
    for f in (lambda t: torch.cat(torch.split(t, 2, 1), 1), lambda t: torch.cat(torch.split(t, [2, 2, 2, 2], 1), 1)):
        torch._dynamo.reset()
        compiled = optimus.compile(f)
        for _ in range(2):  # the first call decides, every call keeps it
            with torch._inductor.config.patch(fx_graph_cache=False):  # the passes run for each f
                y = compiled(x)
            assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
            torch.testing.assert_close(y, x)
        y.add_(1)
        assert not torch.equal(x, y)
        # Inductor would fold the returned cat into its input: split_cat_to_clone keeps it a
        # copy in the graph, so the output guard has nothing to copy on each call
        assert compiled.optimus_report.rule_totals()["split_cat_to_clone"].matched == 1
        assert not any("alias where eager's do not" in n for n in compiled.optimus_report.notes)


def test_eagers_own_aliasing_is_kept():
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    compiled = optimus.compile(lambda t: (t.view(-1), t.t() * 2))
    v, w = compiled(x)
    assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # eager: a view of x
    assert w.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert not any("alias" in n for n in compiled.optimus_report.notes)


# --------------------------------------------------------------- first call
def test_first_call_failure_recompiles_without_optimus():
    notes: list[str] = []

    def broken(*args):
        raise RuntimeError("generated code failed")

    guard = safety_net.OutputGuard(broken, lambda: (lambda *a: (a[0] + 1,)), None, notes.append, may_rerun=True)
    assert guard(torch.ones(2))[0].tolist() == [2.0, 2.0]
    assert guard(torch.zeros(1))[0].tolist() == [1.0]
    assert len(notes) == 1 and "generated code failed" in notes[0] and "without any Optimus pass" in notes[0]
    no_rerun = safety_net.OutputGuard(broken, lambda: (lambda *a: a), None, notes.append, may_rerun=False)
    with pytest.raises(RuntimeError, match="generated code failed"):
        no_rerun(torch.ones(2))
    assert "writes its inputs in place" in notes[-1]


def test_mutated_inputs_are_detected_from_the_traced_graph():
    seen = {}

    def backend(gm, inputs):
        seen["mutates"] = safety_net.mutates_inputs(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(lambda t: t.add_(1) * 2, backend=backend)(torch.ones(3))
    assert seen["mutates"] is True
    torch._dynamo.reset()
    torch.compile(lambda t: (t * 2).relu_(), backend=backend)(torch.ones(3))
    assert seen["mutates"] is False  # an in-place op on an intermediate does not count


# --------------------------------------------------------------- torch.compile options
@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_modes_work_with_optimus_compile(mode):
    model, ref = _twin()
    x = torch.randn(4, 12)
    torch._dynamo.reset()
    # max-autotune implies the planner's tune=True under "auto" (tests/planner covers it);
    # here the point is that the mode reaches a working compile, so the rules run as given
    compiled = optimus.compile(model, mode=mode, passes="all" if "autotune" in mode else "auto")
    torch.testing.assert_close(compiled(x), ref(x))
    assert any(g.level == "torch_ir" and g.matched for g in compiled.optimus_report.graphs)


def test_mode_reaches_inductor_config():
    seen = {}
    from torch._inductor import config as inductor_config
    from optimus import torch_api

    real = torch_api.compile_fx_inner

    def spy(gm, example_inputs, **kwargs):
        seen["cudagraphs"] = inductor_config.triton.cudagraphs
        seen["max_autotune"] = inductor_config.max_autotune
        return real(gm, example_inputs, **kwargs)

    torch_api.compile_fx_inner = spy
    try:
        torch._dynamo.reset()
        with measure.fresh_inductor_cache():
            optimus.compile(Tower(), mode="reduce-overhead")(torch.randn(2, 12))
        assert seen == {"cudagraphs": True, "max_autotune": False}
        torch._dynamo.reset()
        with measure.fresh_inductor_cache():
            # a fixed preset: under "auto" max_autotune also tunes the plan (tests/planner/test_auto.py)
            optimus.compile(Tower(), passes="all", options={"max_autotune": True, "max_autotune_gemm_backends": "ATEN"})(torch.randn(2, 12))
        assert seen["max_autotune"] is True and seen["cudagraphs"] is False
    finally:
        torch_api.compile_fx_inner = real


def test_registered_backend_takes_mode_and_options():
    model, ref = _twin()
    x = torch.randn(4, 12)
    for kwargs in ({"mode": "reduce-overhead"}, {"options": {"max_autotune": False}}, {"options": {"optimus_passes": "vertical"}}):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="optimus", **kwargs)
        torch.testing.assert_close(compiled(x), ref(x))
    report = optimus.last_report()
    assert report.passes == "vertical" and report.graphs


def test_bad_options_raise_pytorchs_own_errors():
    with pytest.raises(RuntimeError, match="Unexpected optimization option"):
        optimus.compile(Tower(), options={"no_such_option": 1})
    with pytest.raises(RuntimeError, match="Either mode or options"):
        optimus.compile(Tower(), mode="reduce-overhead", options={"max_autotune": True})


def test_dynamic_and_fullgraph_pass_through():
    model, ref = _twin()
    torch._dynamo.reset()
    compiled = optimus.compile(model, dynamic=True, fullgraph=True)
    for n in (3, 5):
        x = torch.randn(n, 12)
        torch.testing.assert_close(compiled(x), ref(x))


# --------------------------------------------------------------- Dynamo's control flow
def test_dynamo_restart_signals_are_not_failures():
    """Under dynamic=True a float scalar makes Dynamo restart its analysis
    (TensorifyScalarRestartAnalysis): not a failure, no fallback, no note saying so."""

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x, scale: float):
            a, b = self.lin(x).split(4, 1)
            return torch.cat([a, b], 1) * scale

    torch._dynamo.reset()
    model = Scaled()
    compiled = optimus.compile(model, dynamic=True)
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x, 0.5), model(x, 0.5))
    report = compiled.optimus_report
    assert not any("failed" in n for n in report.notes), report.notes
    live = [g for g in report.graphs if not g.discarded]
    assert {"torch_ir", "aten_ir", "inductor_ir"} <= {g.level for g in live}


def test_passthrough_classes_exist_on_this_torch():
    names = {c.__name__ for c in optimus.torch_api.passthrough_exceptions()}
    assert {"RestartAnalysis", "SkipFrame"} <= names


# --------------------------------------------------------------- rollback keeps inputs
def test_restore_keeps_placeholders_and_their_attributes():
    gm = torch.fx.symbolic_trace(lambda x, y: (x + y).relu())
    x = next(iter(gm.graph.nodes))
    x._dynamo_source = "L['x']"
    record = snapshot(gm.graph)
    relu = next(n for n in gm.graph.nodes if n.op in ("call_method", "call_function") and "relu" in str(n.target))
    with gm.graph.inserting_after(relu):
        extra = gm.graph.call_function(torch.tanh, (relu,))
    relu.replace_all_uses_with(extra, delete_user_cb=lambda u: u is not extra)
    restore(gm.graph, record)
    gm.recompile()
    assert next(iter(gm.graph.nodes)) is x and x._dynamo_source == "L['x']"
    assert not any(n.target is torch.tanh for n in gm.graph.nodes)
    torch.testing.assert_close(gm(torch.ones(2), -torch.ones(2) * 2), torch.zeros(2))


# --------------------------------------------------------------- numeric_check that cannot run
def test_numeric_check_that_cannot_run_warns():
    class M(torch.nn.Module):
        def forward(self, x):
            a, b = x.split([2, 2], 1)
            return torch.cat([a, b], 1) + 1

    gm = torch.fx.symbolic_trace(M())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimus.optimize(gm, passes={"torch_ir": "all", "options": {"numeric_check": True}})
    assert any(issubclass(w.category, RuntimeWarning) and "NOT verified" in str(w.message) for w in caught)
    # with example inputs it runs, and says so quietly
    gm = torch.fx.symbolic_trace(M())
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        optimus.optimize(gm, passes={"torch_ir": "all", "options": {"numeric_check": True}}, example_inputs=[torch.randn(3, 4)])
    assert any("numeric check passed" in n for g in optimus.last_report().graphs for n in g.notes)


def test_dropout_model_trains_under_dynamic_true():
    """Regression: dynamic=True training with dropout must not break the compile."""

    class Drop(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x):
            return F.dropout(self.a(x), 0.1) + F.dropout(self.b(x), 0.1)

    torch._dynamo.reset()
    model = Drop().train()
    compiled = optimus.compile(model, dynamic=True)
    compiled(torch.randn(4, 8)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_copies_of_aliasing_outputs_keep_eagers_autograd():
    """An output copied because it shares storage keeps eager's requires_grad, and a
    gradient flows through the copy where eager's did, on every call."""
    notes: list[str] = []
    w = torch.randn(3, requires_grad=True)

    def program(x):
        y = x * w
        return (y, y)  # two outputs, one buffer

    eager = safety_net.EagerOutputs(frozenset(), (True, False))  # the second came from no_grad
    guard = safety_net.OutputGuard(program, None, eager, notes.append, may_rerun=True)
    for _ in range(2):
        y, z = guard(torch.ones(3))
        assert (y.requires_grad, z.requires_grad) == (True, False)
        assert y.untyped_storage().data_ptr() != z.untyped_storage().data_ptr()
        w.grad = None
        y.sum().backward()
        assert w.grad is not None
    both = safety_net.OutputGuard(program, None, safety_net.EagerOutputs(frozenset(), (True, True)), notes.append, may_rerun=True)
    for _ in range(2):
        y, z = both(torch.ones(3))
        w.grad = None
        z.sum().backward()  # the copy is recorded by autograd
        torch.testing.assert_close(w.grad, torch.ones(3))


def test_a_first_call_with_other_autograd_than_eager_recompiles_without_optimus():
    notes: list[str] = []
    discarded: list[str] = []
    w = torch.randn(3, requires_grad=True)
    wrong = safety_net.OutputGuard(lambda x: ((x * w).detach(),), lambda: (lambda x: (x * w,)), safety_net.EagerOutputs(frozenset(), (True,)), notes.append, True, discarded.append)
    for _ in range(2):
        (y,) = wrong(torch.ones(3))
        assert y.requires_grad
    assert len(discarded) == 1 and "autograd differs from eager's" in discarded[0] and "output 0 needs a gradient" in discarded[0]


def test_a_fallback_after_the_first_call_marks_the_rewrites_thrown_away(monkeypatch):
    """The compiled program with Optimus fails on its first call: it is compiled again
    without Optimus, and the report's counts, table and notes say so."""
    from optimus import torch_api

    real = torch_api.compile_fx

    def failing_with_optimus(gm, example_inputs, inner_compile, options):
        compiled = real(gm, example_inputs, inner_compile, options)
        if inner_compile is None:  # the plain recompile
            return compiled

        def first_call_fails(*args):
            raise RuntimeError("Expected result >= 0")

        return first_call_fails

    monkeypatch.setattr(torch_api, "compile_fx", failing_with_optimus)
    torch._dynamo.reset()
    f = lambda t: torch.cat(torch.split(torch.relu(t), 2, 1), 1).tanh()  # noqa: E731
    with torch._inductor.config.patch(fx_graph_cache=False):
        compiled = optimus.compile(f, passes="all")
        x = torch.randn(4, 8)
        torch.testing.assert_close(compiled(x), f(x))
    report = compiled.optimus_report
    assert report.graphs and all(g.discarded for g in report.graphs)
    assert "Expected result >= 0" in report.graphs[0].discarded
    assert sum(s.matched for s in report.rule_totals().values()) == 0  # counts describe what runs
    note = next(n for n in report.notes if "Rewrites thrown away" in n)
    assert "split_cat_to_identity (" in note and "compiled again without any Optimus pass" in note
    assert "DISCARDED" in report.table()
