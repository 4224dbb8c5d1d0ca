"""passes="auto": the planner gates and sizes horizontal groups, picks Inductor-IR rules,
and with tune=True measures candidate plans once per graph (optimus/planner/plan.py)."""

import dataclasses
import importlib
import json
import logging

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

import optimus
from optimus.core.registry import REGISTRY, resolve
from optimus.planner import costmodel, tune
from optimus.planner.plan import Context, Planner

oc = importlib.import_module("optimus.compile")
H200ISH = costmodel.DEFAULTS["cuda"]


class Towers(torch.nn.Module):
    """``n`` independent linears on separate inputs; ``consume``: each output summed at
    once (so only one is live at a time), else all returned."""

    def __init__(self, n: int, m: int, k: int, consume: bool) -> None:
        super().__init__()
        self.w = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(k, k) / k**0.5) for _ in range(n)])
        self.b = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(k)) for _ in range(n)])
        self.consume = consume

    def run(self, xs):
        outs = [F.linear(x, w, b) for x, w, b in zip(xs, self.w, self.b)]
        if self.consume:
            total = outs[0].sum()
            for o in outs[1:]:
                total = total + o.sum()
            return total
        return tuple(outs)


def towers(n: int, m: int, k: int, consume: bool) -> torch.nn.Module:
    """A ``Towers`` whose forward takes ``n`` named inputs (symbolic_trace cannot unpack *args)."""
    names = ", ".join(f"x{i}" for i in range(n))
    scope: dict = {}
    exec(f"def forward(self, {names}):\n    return self.run([{names}])\n", scope)
    cls = type(f"Towers{n}", (Towers,), {"forward": scope["forward"]})
    return cls(n, m, k, consume)


def _optimize(model, inputs, planner):
    gm = fx.symbolic_trace(model)
    config = dataclasses.replace(resolve("auto"), planner=planner)
    optimus.optimize(gm, passes=config, level="torch_ir", example_inputs=list(inputs))
    return gm, gm.meta["optimus_report"]


def _ops(gm):
    return [n.target.__name__ if callable(n.target) else str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


@pytest.fixture
def sliver_budget(monkeypatch):
    """Torch-IR graphs budgeted like the later levels' (2% or 256 KiB), not with the step's
    8 MiB: the cutting and declining below are shown on graphs of a few hundred KiB."""
    from optimus.planner import memory, plan

    monkeypatch.setattr(plan, "STEP_SLACK", memory.MEMORY_SLACK)


@pytest.mark.parametrize("cudagraphs", [False, True])
def test_small_group_is_taken_and_large_copy_heavy_group_declined(cudagraphs):
    roomy = dict(profile=H200ISH, memory_increase=100.0)  # memory is not what this test judges
    small = towers(8, 64, 32, consume=False)
    xs = [torch.randn(64, 32) for _ in range(8)]
    gm, report = _optimize(small, xs, Planner(Context("cuda", cudagraphs=cudagraphs), **roomy))
    decisions = [d for g in report.graphs for d in g.decisions]
    assert decisions and decisions[0]["accepted"], decisions
    assert decisions[0]["after_us"] < decisions[0]["before_us"]
    assert "linear" not in _ops(gm)  # batched
    for got, want in zip(gm(*xs), small(*xs)):
        torch.testing.assert_close(got, want)

    # five 2048 x 1024 @ 1024 x 1024 linears: compute-bound, the device already full;
    # stacking 40 MiB of inputs and 20 MiB of weights costs more than the launches saved
    # (the rule's own launch count, 5 kernels -> 4, would take it)
    big = towers(5, 2048, 1024, consume=False)
    xs = [torch.randn(2048, 1024) for _ in range(5)]
    gm, report = _optimize(big, xs, Planner(Context("cuda", cudagraphs=cudagraphs), **roomy))
    decisions = [d for g in report.graphs for d in g.decisions if d["rule"] == "batch_linear"]
    assert decisions and not any(d["accepted"] for d in decisions), decisions
    assert decisions[0]["after_us"] > decisions[0]["before_us"]
    assert _ops(gm).count("linear") == 5
    reasons = [r for g in report.graphs for r in g.rules["batch_linear"].declined]
    assert any(r.startswith("cost model: not faster (est. +") for r in reasons), reasons


def test_a_group_that_raises_peak_memory_is_cut_into_chunks():
    model = towers(12, 256, 256, consume=True)
    xs = [torch.randn(256, 256) for _ in range(12)]
    want = model(*xs)
    gm, report = _optimize(model, xs, Planner(Context("cuda"), profile=H200ISH, memory_increase=1.0))
    notes = [n for g in report.graphs for n in g.notes]
    assert any("batch_linear: group of 12" in n and "cut into groups of" in n for n in notes), notes
    ops = _ops(gm)
    assert ops.count("baddbmm") >= 2 and ops.count("linear") <= 2, ops  # smaller batches (a leftover pair may stay)
    torch.testing.assert_close(gm(*xs), want)
    # without a planner ("all") the same graph is one group of 12
    gm_all = fx.symbolic_trace(model)
    optimus.optimize(gm_all, passes="all", level="torch_ir", example_inputs=xs)
    assert _ops(gm_all).count("baddbmm") == 1


def test_cuda_graphs_turn_off_launch_only_fusions_and_change_the_cache_key():
    config = resolve("auto")
    rules = dict(config.rules)
    assert "combo_small_kernels" in rules["inductor_ir"]
    graphs = Planner(Context("cuda", cudagraphs=True), profile=H200ISH)
    kept, notes = graphs.configure(rules)
    assert "combo_small_kernels" not in kept["inductor_ir"] and kept["inductor_ir"]
    assert any("combo_small_kernels off" in n for n in notes)
    launched = Planner(Context("cuda"), profile=H200ISH)
    assert launched.configure(rules)[0] == rules
    a = dataclasses.replace(config, planner=graphs).fingerprint()
    b = dataclasses.replace(config, planner=launched).fingerprint()
    assert a != b != config.fingerprint()


def test_the_context_reads_cuda_graphs_training_and_autotune_from_the_compile():
    w = torch.randn(2, requires_grad=True)
    x = torch.randn(2)
    assert Context.of_compile([w, x], {}) == Context("cpu", cudagraphs=False, training=True, tune=False)
    with torch.no_grad():
        assert not Context.of_compile([w, x], {}).training
    assert Context.of_compile([x], {"triton.cudagraphs": True}).cudagraphs
    assert Context.of_compile([x], {"max_autotune": True}).tune  # mode="max-autotune" implies tune=True
    assert Context.of_compile([x], {}, mode_tunes=True).tune


def test_auto_is_the_default_and_the_report_shows_the_planner():
    assert oc.DEFAULT_PASSES == "auto"
    model = towers(8, 16, 16, consume=False)  # 8 linears: the rule's own launch count takes them, the planner judges
    xs = [torch.randn(16, 16) for _ in range(8)]
    compiled = optimus.compile(model)
    got = compiled(*xs)
    for g, w in zip(got, model(*xs)):
        torch.testing.assert_close(g, w)
    report = compiled.optimus_report
    assert report.passes == "auto"
    assert any(n.startswith("planner: cpu") for n in report.notes), report.notes
    assert any(g.decisions for g in report.graphs)
    assert "planner:" in report.table()


def test_the_registered_backend_and_the_command_line_default_to_auto():
    torch._dynamo.reset()
    model, xs = towers(2, 8, 8, consume=True), [torch.randn(4, 8) for _ in range(2)]
    torch.testing.assert_close(torch.compile(model, backend="optimus")(*xs), model(*xs))
    assert optimus.last_report().passes == "auto"
    from optimus.tools.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["demo"]).passes == "auto"
    assert parser.parse_args(["explain"]).passes == "auto"
    assert parser.parse_args(["demo", "--passes", "all"]).passes == "all"  # the fixed presets by name


def _tiny():
    return towers(3, 8, 8, consume=True), [torch.randn(8, 8) for _ in range(3)]


def test_tune_measures_once_then_the_decision_cache_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTIMUS_CACHE_DIR", str(tmp_path))
    model, xs = _tiny()
    first = optimus.compile(model, passes="auto", tune=True)
    with torch.no_grad():  # inference graphs: one compile per candidate keeps the test short
        torch.testing.assert_close(first(*xs), model(*xs))
    notes = " | ".join(first.optimus_report.notes)
    assert "measured" in notes and "->" in notes, notes
    saved = json.loads((tmp_path / "decisions.json").read_text())
    (entry,) = saved.values()
    assert entry["plan"] in tune.TUNE_CANDIDATES and set(entry["measured_ms"]) == set(tune.TUNE_CANDIDATES)

    torch._dynamo.reset()
    second = optimus.compile(model, passes="auto", tune=True)
    with torch.no_grad():
        torch.testing.assert_close(second(*xs), model(*xs))
    notes = " | ".join(second.optimus_report.notes)
    assert "from the decision cache" in notes and "nothing re-measured" in notes, notes


def test_a_corrupt_decision_cache_is_ignored_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("OPTIMUS_CACHE_DIR", str(tmp_path))
    (tmp_path / "decisions.json").write_text("{not json")
    model, xs = _tiny()
    # torch._logging turns propagation off on "optimus" once a test set logs: listen on it directly
    logging.getLogger("optimus").addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="optimus"):
            compiled = optimus.compile(model, passes="auto", tune=True)
            with torch.no_grad():
                torch.testing.assert_close(compiled(*xs), model(*xs))
    finally:
        logging.getLogger("optimus").removeHandler(caplog.handler)
    assert any("ignoring the planner's decision cache" in r.getMessage() for r in caplog.records)
    assert any("measured" in n for n in compiled.optimus_report.notes)
    assert isinstance(json.loads((tmp_path / "decisions.json").read_text()), dict)  # rewritten whole


def test_tune_declines_a_graph_that_writes_its_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTIMUS_CACHE_DIR", str(tmp_path))

    def f(x, y):
        x.add_(1)
        return F.relu(x) + F.relu(y)

    x, y = torch.randn(4), torch.randn(4)
    compiled = optimus.compile(f, passes="auto", tune=True)
    got = compiled(x.clone(), y)
    torch.testing.assert_close(got, f(x.clone(), y))
    assert any("not tuned" in n and "in place" in n for n in compiled.optimus_report.notes), compiled.optimus_report.notes


def _opaque_grouped_op(*xs):  # stands for a rule's custom op: outside the vocabulary
    return torch.cat(xs)


def test_an_opaque_replacement_is_charged_the_members_arithmetic():
    from optimus.core.levels import make_view
    from optimus.planner import estimate

    big = towers(5, 2048, 1024, consume=False)
    xs = [torch.randn(2048, 1024) for _ in range(5)]
    gm = fx.symbolic_trace(big)
    oc._propagate_fake_meta(gm, xs)
    view = make_view("torch_ir", gm)
    members = [n for n in gm.graph.nodes if n.target is F.linear]
    w = estimate.work(view, members)
    assert w.flops == 5 * 2 * 2048 * 1024 * 1024 and w.tiles == 5 * 16 * 8
    # a linear is in the vocabulary: priced with its own FLOPs, whatever the group's
    assert estimate.node_cost(view, members[0], H200ISH, True, opaque=w).us == estimate.node_cost(view, members[0], H200ISH, True).us
    out = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(out):
        grouped = gm.graph.call_function(_opaque_grouped_op, tuple(members))
    grouped.meta["val"] = torch.empty(5 * 2048, 1024)
    assert view.classify(grouped) is None
    priced = estimate.node_cost(view, grouped, H200ISH, True, opaque=w)
    bytes_only = estimate.node_cost(view, grouped, H200ISH, True)
    floor = w.flops / (H200ISH.matmul_tflops["fp32"]["large"] * 1e6)
    assert priced.us >= floor > bytes_only.us


def test_training_keeps_activations_for_the_backward_and_a_group_holds_all_gradients_at_once():
    from optimus.planner.memory import Liveness

    def f(*args):  # 12 inputs, then 12 weights (graph inputs, like Dynamo's lifted parameters)
        total = 0
        for x, w in zip(args[:12], args[12:]):
            total = total + F.linear(x, w).sum()  # each output dead right after its sum
        return total

    names = ", ".join(f"a{i}" for i in range(24))
    scope = {"f": f}
    exec(f"def g({names}):\n    return f({names})\n", scope)
    gm = fx.symbolic_trace(scope["g"])
    oc._propagate_fake_meta(gm, [torch.randn(256, 256) for _ in range(24)])
    for n in gm.graph.nodes:  # as Dynamo's pre-grad graph of a training step records them
        v = n.meta.get("val")
        if n.op == "call_function" and isinstance(v, torch.Tensor):
            n.meta["val"] = v.detach().requires_grad_(True)
    members = [n for n in gm.graph.nodes if n.target is F.linear]
    one = 256 * 256 * 4
    inference, training = Liveness(gm.graph), Liveness(gm.graph, saved_for_backward=True)
    assert training.peak >= inference.peak + 11 * one  # every linear's output is saved, not freed after its sum
    assert inference.with_group(members) - inference.peak >= 10 * one  # batching keeps all 12 outputs at once
    # saved anyway in the forward; the group's backward holds 12 output gradients where the
    # loop held one (the inputs need no gradient here)
    assert abs(training.with_group(members) - training.peak - 11 * one) <= 64  # (a scalar sum is not live there)


@pytest.mark.usefixtures("sliver_budget")
def test_a_group_over_consecutive_parts_of_one_tensor_is_declined_not_cut():
    class Parts(torch.nn.Module):
        def __init__(self, n: int, k: int) -> None:
            super().__init__()
            self.w = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(k, k)) for _ in range(n)])

        def forward(self, x):
            return torch.cat([torch.relu(F.linear(x[:, i], w)) for i, w in enumerate(self.w)], 1)

    model = Parts(8, 64)
    x = torch.randn(256, 8, 64)
    gm, report = _optimize(model, [x], Planner(Context("cuda"), profile=H200ISH))
    reasons = [r for g in report.graphs for r in g.rules["batch_linear"].declined]
    assert any("not cut: its members read consecutive parts of one tensor" in r for r in reasons), reasons
    assert _ops(gm).count("linear") == 8
    torch.testing.assert_close(gm(x), model(x))


def test_a_stack_of_consecutive_parts_is_priced_as_the_view_it_becomes():
    from optimus.core.levels import make_view
    from optimus.planner import estimate

    def f(x):
        a, b, c = x.unbind(0)
        return torch.stack([a, b, c]) + torch.stack([c, a, b])

    gm = fx.symbolic_trace(f)
    oc._propagate_fake_meta(gm, [torch.randn(3, 64, 64)])
    view = make_view("torch_ir", gm)
    stacks = [n for n in gm.graph.nodes if n.target is torch.stack]
    in_order, shuffled = (estimate.node_cost(view, s, H200ISH, True) for s in stacks)
    assert in_order.kernels == 0 and shuffled.kernels == 1


def test_cuda_graphs_leave_out_the_rules_that_emit_our_custom_ops():
    session = oc.Session(resolve("all"))
    kept = session._without_capture_unsafe_rules(session.base_config, {"triton.cudagraphs": True})
    names = {r for rules in kept.rules.values() for r in rules}
    unsafe = {r.name for r in REGISTRY.rules() if not r.cudagraph_safe}
    assert unsafe == {"group_embedding_lookups"} and not names & unsafe
    assert {"batch_linear", "grouped_linear", "batched_layer_norm"} <= names  # the other rules stay
    assert any("CUDA graphs:" in n and "group_embedding_lookups" in n for n in session.report.notes)
    assert session._without_capture_unsafe_rules(session.base_config, {}) is session.base_config


def test_tune_needs_the_planner():
    with pytest.raises(ValueError, match="tune=True measures the planner's candidate plans"):
        optimus.compile(torch.nn.Linear(2, 2), passes="all", tune=True)


def test_the_planner_never_takes_a_group_the_rule_declines():
    """The rules' own checks run under "auto" too: 4 linears on separate inputs, weights
    and biases stack into 4 kernels where 4 ran (the launch count declines), so the
    planner is never asked, however cheap its estimate."""
    model = towers(4, 16, 16, consume=False)
    xs = [torch.randn(16, 16) for _ in range(4)]
    gm, report = _optimize(model, xs, Planner(Context("cuda"), profile=H200ISH, memory_increase=100.0))
    assert _ops(gm).count("linear") == 4
    assert not [d for g in report.graphs for d in g.decisions if d["rule"] == "batch_linear"]
    reasons = [r for g in report.graphs for r in g.rules["batch_linear"].declined]
    assert any("4 kernels would become 4" in r for r in reasons), reasons


def test_cudagraph_kernels_env_keeps_the_kernel_rules(monkeypatch):
    # OPTIMUS_CUDAGRAPH_KERNELS=1: the experiment that measures the capture-clean tables.
    monkeypatch.setenv(oc.CUDAGRAPH_KERNELS_ENV, "1")
    session = oc.Session(resolve("all"))
    kept = session._without_capture_unsafe_rules(session.base_config, {"triton.cudagraphs": True})
    assert kept.rules == session.base_config.rules
    assert any(oc.CUDAGRAPH_KERNELS_ENV in n and "experimental" in n for n in session.report.notes)


class SharedInputHeads(torch.nn.Module):
    """``n`` linears reading one input (``batch_linear_lhs``: one linear on concatenated
    weights), each head's output reduced at once."""

    def __init__(self, n: int, k: int) -> None:
        super().__init__()
        self.w = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(k, k) / k**0.5) for _ in range(n)])

    def forward(self, x):
        total = x.sum()
        for w in self.w:
            total = total + F.linear(x, w).sum()
        return total


@pytest.mark.usefixtures("sliver_budget")
def test_the_weights_a_rule_concatenates_count_toward_memory():
    # 8 heads of 512 x 512 weights (1 MiB each) on an [8, 512] input: concatenating the
    # weights is an 8 MiB copy each step, where the activations are 16 KiB. The rule says
    # what it copies (``copies``), so the estimate sees the weights, not only the input.
    model = SharedInputHeads(8, 512).eval()
    x = torch.randn(8, 512)
    with torch.no_grad():
        want = model(x)
        gm, report = _optimize(model, [x], Planner(Context("cuda"), profile=H200ISH))
        got = gm(x)
    reasons = [r for g in report.graphs for r in g.rules["batch_linear_lhs"].declined]
    assert any(r.startswith("memory: all 8 at once would raise the graph's estimated peak by 8.") for r in reasons), reasons
    assert _ops(gm).count("linear") == 8
    torch.testing.assert_close(got, want)
    # with room for the copy, the same group is taken whole
    with torch.no_grad():
        gm, report = _optimize(model, [x], Planner(Context("cuda"), profile=H200ISH, memory_increase=100.0))
    assert _ops(gm).count("linear") == 1 and _ops(gm).count("cat") == 1, _ops(gm)


def test_a_small_step_may_add_the_steps_allowance_at_torch_ir(monkeypatch):
    """The memory target: Inductor's peak + 2%, at least 8 MiB. A Torch-IR graph is the step:
    a group adding 2 MiB (8 concatenated 256 KiB weights) to a step of about 100 KiB is taken
    whole; budgeted like a later level's graph (2% or 256 KiB), it is not."""
    from optimus.planner import memory, plan

    model = SharedInputHeads(8, 256).eval()
    x = torch.randn(8, 256)
    with torch.no_grad():
        want = model(x)
        gm, report = _optimize(model, [x], Planner(Context("cuda"), profile=H200ISH))
        torch.testing.assert_close(gm(x), want)
    assert _ops(gm).count("linear") == 1, _ops(gm)
    assert plan.STEP_SLACK + 3 * memory.MEMORY_SLACK == 8 * 2**20
    monkeypatch.setattr(plan, "STEP_SLACK", memory.MEMORY_SLACK)
    with torch.no_grad():
        gm, report = _optimize(model, [x], Planner(Context("cuda"), profile=H200ISH))
    reasons = [r for g in report.graphs for r in g.rules["batch_linear_lhs"].declined]
    assert _ops(gm).count("linear") > 1 and any("allowed: 2% or 256 KiB" in r for r in reasons), (_ops(gm), reasons)


@pytest.mark.parametrize("width,step_allowance", [(128, True), (512, False)])
def test_a_training_group_whose_gradients_exceed_the_steps_allowance_gets_the_sliver(width, step_allowance):
    """Six linears of a (1024, 512) input in a training step: outputs of 0.5 MiB each (3 MiB of
    gradients held at once by the group's backward) are judged against the step's allowance;
    outputs of 2 MiB each (12 MiB) exceed it and are judged against 2% or 256 KiB."""
    import types

    from optimus.core.levels import make_view
    from optimus.planner import memory, plan

    def f(x, *ws):
        return sum(torch.relu(F.linear(x, w)).sum() for w in ws)

    scope = {"f": f}
    exec("def g(x, w0, w1, w2, w3, w4, w5):\n    return f(x, w0, w1, w2, w3, w4, w5)\n", scope)
    gm = fx.symbolic_trace(scope["g"])
    oc._propagate_fake_meta(gm, [torch.randn(1024, 512)] + [torch.randn(width, 512) for _ in range(6)])
    for n in gm.graph.nodes:  # as Dynamo's pre-grad graph of a training step records them
        v = n.meta.get("val")
        if n.op == "call_function" and isinstance(v, torch.Tensor):
            n.meta["val"] = v.detach().requires_grad_(True)
    view = make_view("torch_ir", gm)
    members = [n for n in gm.graph.nodes if n.target is F.linear]
    planner = Planner(Context("cuda", training=True), profile=H200ISH)
    planner.round_started(view, types.SimpleNamespace(notes=[]))
    assert planner._liveness(view).gradient_bytes(members) == 6 * 1024 * width * 4
    budget = planner._budget_for(view, members)
    assert budget.slack_bytes == (plan.STEP_SLACK if step_allowance else memory.MEMORY_SLACK)
    # a rule that says what its backward holds (GroupRule.backward_held) takes no freed-buffer
    # credit, so its group keeps the step's allowance whatever its gradients
    assert planner._budget_for(view, members, held=lambda n: 0).slack_bytes == plan.STEP_SLACK
    assert planner._budget_for(view, members, held=lambda n: None).slack_bytes == budget.slack_bytes


class GatesAndExperts(torch.nn.Module):
    """One input read by ``n`` narrow gates (``k -> 1``) and ``n`` wide expert projections
    (``k -> r``), each projection consumed at once (DCNv2's mixture of cross experts)."""

    def __init__(self, n: int, k: int, r: int) -> None:
        super().__init__()
        self.experts = torch.nn.ModuleList(torch.nn.Linear(k, r, bias=False) for _ in range(n))
        self.gates = torch.nn.ModuleList(torch.nn.Linear(k, 1, bias=False) for _ in range(n))

    def forward(self, x):
        total = x.sum()
        for e in self.experts:
            total = total + torch.tanh(e(x)).sum()
        return total + torch.cat([g(x) for g in self.gates], 1).softmax(1).sum()


@pytest.mark.usefixtures("sliver_budget")
def test_linears_sharing_an_input_concatenate_weights_and_cut_narrow_members_together():
    # stacking one input 8 times for a bmm is 8 copies of it: batch_linear leaves those
    # groups to batch_linear_lhs; all 16 heads at once would hold 8 expert outputs of
    # 512 KiB together, so the group is cut, smallest results first: the 8 gates in one
    model = GatesAndExperts(8, 256, 128).eval()
    x = torch.randn(1024, 256)
    with torch.no_grad():
        want = model(x)
        gm, report = _optimize(model, [x], Planner(Context("cuda"), profile=H200ISH))
        got = gm(x)
    notes = [n for g in report.graphs for n in g.notes]
    assert any("batch_linear_lhs: group of 16" in n and "smallest" in n for n in notes), notes
    assert "bmm" not in _ops(gm) and "stack" not in _ops(gm), _ops(gm)
    widths = [n.meta["val"].shape[-1] for n in gm.graph.nodes if n.op == "call_function" and n.target is F.linear]
    assert any(w % 128 == 8 for w in widths), widths  # all 8 gates in one linear (with a few experts)
    assert len(widths) < 16, widths
    torch.testing.assert_close(got, want)
    # with room for everything: batch_linear refuses the stacked copies, the lhs rule takes all 16
    with torch.no_grad():
        gm, report = _optimize(model, [x], Planner(Context("cuda"), profile=H200ISH, memory_increase=100.0))
        got = gm(x)
    assert _ops(gm).count("linear") == 1 and "bmm" not in _ops(gm), _ops(gm)
    torch.testing.assert_close(got, want)
    # batch_linear alone declines them, saying why
    gm = fx.symbolic_trace(model)
    optimus.optimize(gm, passes={"torch_ir": ["batch_linear"]}, level="torch_ir", example_inputs=[x])
    declined = [r for g in gm.meta["optimus_report"].graphs for r in g.rules["batch_linear"].declined]
    assert any(r.startswith("the members read one input: batch_linear_lhs") for r in declined), declined
    assert not {"bmm", "baddbmm", "stack"} & set(_ops(gm)), _ops(gm)


class SavedTowers(torch.nn.Module):
    """``n`` Linear -> LayerNorm towers on separate inputs: each linear's result is saved
    for its norm's backward (a forward output of AOTAutograd's training graph)."""

    def __init__(self, n: int, k: int) -> None:
        super().__init__()
        self.lin = torch.nn.ModuleList(torch.nn.Linear(k, k) for _ in range(n))
        self.ln = torch.nn.ModuleList(torch.nn.LayerNorm(k) for _ in range(n))

    def forward(self, xs):
        return torch.cat([ln(lin(x)) for x, lin, ln in zip(xs, self.lin, self.ln)], 1)


def _aten_forward_only(planner, graphs):
    """A backend: AOTAutograd with Inductor's decompositions and partitioner; the forward
    graph gets the Aten-IR rules under ``planner``, the backward none; both run eagerly."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    def fw(gm, example_inputs):
        optimus.optimize(gm, passes=dataclasses.replace(resolve("auto"), planner=planner), level="aten_ir", example_inputs=list(example_inputs))
        graphs.append(gm.meta["optimus_report"])
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=fw, bw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                        decompositions=select_decomp_table(), partition_fn=min_cut_rematerialization_partition)


@pytest.mark.parametrize("memory_increase,chunked", [(0.02, True), (100.0, False)])
def test_a_training_forward_group_whose_results_are_saved_is_cut(memory_increase, chunked):
    # 12 towers, each linear's (256, 64) result (64 KiB) saved for the norm's backward.
    # Batched whole, the backward could free none of the 12 before the last: +704 KiB where
    # the budget allows 256 KiB, so the group is cut; with room it is taken whole.
    torch.manual_seed(0)
    n, rows, k = 12, 256, 64
    model = SavedTowers(n, k)
    ref = SavedTowers(n, k)
    ref.load_state_dict(model.state_dict())
    xs = [torch.randn(rows, k) for _ in range(n)]
    graphs = []
    torch._dynamo.reset()
    planner = Planner(Context("cuda", training=True), profile=H200ISH, memory_increase=memory_increase)
    y = torch.compile(model, backend=_aten_forward_only(planner, graphs), fullgraph=True)(xs)
    want = ref(xs)
    torch.testing.assert_close(y, want)
    g = torch.randn_like(y)
    (y * g).sum().backward()
    (want * g).sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
    notes = [note for r in graphs for gr in r.graphs for note in gr.notes]
    taken = [d["members"] for r in graphs for gr in r.graphs for d in gr.decisions if d["accepted"] and d["rule"] == "batch_mm"]
    if chunked:
        assert any(f"batch_mm: group of {n}" in note and "cut into groups of" in note for note in notes), notes
        assert all(m < n for m in taken), taken
    else:
        assert taken == [n], taken


def test_the_planner_orders_and_cuts_a_group_for_the_driver(monkeypatch):
    """``order``: members reading one input go smallest result first (stable); ``chunk``: a
    cut of results of different sizes is the fitting prefix and the rest, of one size
    balanced chunks; when not even two fit, every member is declined."""
    from optimus.core.group import Cut
    from optimus.core.levels import make_view

    widths = [8, 2, 8, 4, 2]

    class Heads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = torch.nn.ModuleList(torch.nn.Linear(4, w) for w in widths)

        def forward(self, x):
            return [h(x) for h in self.heads]

    gm = fx.symbolic_trace(Heads())
    oc._propagate_fake_meta(gm, [torch.randn(3, 4)])
    view = make_view("torch_ir", gm)
    members = [n for n in gm.graph.nodes if n.op == "call_module"]
    planner = Planner(Context("cpu"), profile=H200ISH)
    assert planner.order(view, members) == [1, 4, 3, 0, 2]
    ordered = [members[i] for i in planner.order(view, members)]
    monkeypatch.setattr(Planner, "_fitting", lambda self, *a: (2, "why"))
    assert planner.chunk(view, ordered, 2) == Cut(((0, 1), (2, 3, 4)), f"group of 5 at {ordered[-1].name} cut after its 2 smallest (why)")
    monkeypatch.setattr(Planner, "_fitting", lambda self, *a: (4, "why"))
    assert planner.chunk(view, ordered, 2).parts == ((0, 1, 2, 3),)  # the rest (one) is no group
    same = members[:1] * 8
    monkeypatch.setattr(Planner, "_fitting", lambda self, *a: (5, "why"))
    assert planner.chunk(view, same, 2).parts == ((0, 1, 2, 3), (4, 5, 6, 7))  # 8 at most 5: 4 + 4
    monkeypatch.setattr(Planner, "_fitting", lambda self, *a: (0, "why"))
    assert planner.chunk(view, same, 2) == Cut(declined="why; no smaller group fits")
    monkeypatch.setattr(Planner, "_fitting", lambda self, *a: None)
    assert planner.chunk(view, same, 2) is None
