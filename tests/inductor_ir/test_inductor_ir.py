"""Inductor-IR: scheduler-node view, fusion rules, legality, report, robustness, cache keys.

CPU only (the GPU analogues are ``python -m optimus.tools.gpu_check``). Compilations
are memoized in ``inductor_ir_support`` so the whole file compiles each scenario once.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import optimus
from optimus.compile import Session
from optimus.core.registry import REGISTRY, resolve
from optimus.inductor_ir import inductor_api, scheduler_patches
from optimus.inductor_ir.passes import InductorIRPass
from optimus.inductor_ir.rule import FusionRule, fusion_rule
from optimus.inductor_ir.view import SchedulerView

from inductor_ir_support import assert_close_tree, eager, run_compiled, scenario, pair, pair_inputs

RULES = ("fuse_producer_consumer", "fuse_independent_kernels", "combo_small_kernels")
ONLY_IR = {"inductor_ir": "all"}

needs_hooks = pytest.mark.skipif(not inductor_api.hooks_supported()[0], reason="torch without scheduler hooks")


# ------------------------------------------------------------------ registry / presets
def test_rules_registered_like_the_others(capsys):
    resolve("none")  # loads the built-in rules
    for name in RULES:
        rule = REGISTRY.get(name)
        assert isinstance(rule, FusionRule) and rule.levels == ("inductor_ir",)
        assert rule.doc and "->" in rule.doc
    assert REGISTRY.get("fuse_producer_consumer").kind == "vertical"
    assert REGISTRY.get("fuse_independent_kernels").kind == "horizontal"
    assert set(resolve("all").rules["inductor_ir"]) == set(RULES)
    assert resolve("vertical").rules["inductor_ir"] == ("fuse_producer_consumer",)
    assert set(resolve("horizontal").rules["inductor_ir"]) == {"fuse_independent_kernels", "combo_small_kernels"}
    assert resolve(["fuse_independent_kernels"]).rules == {"torch_ir": (), "aten_ir": (), "inductor_ir": ("fuse_independent_kernels",)}
    with pytest.raises(ValueError, match="has no option"):
        resolve({"inductor_ir": {"fuse_independent_kernels": {"bogus": 1}}})
    from optimus.tools.cli import main

    assert main(["rules", "--level", "inductor_ir"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in RULES)


def test_fingerprint_and_uuid_cover_inductor_ir_selection_and_options():
    base = Session(resolve("all"))
    same = Session(resolve("all"))
    opt = Session(resolve({"torch_ir": "all", "aten_ir": "all", "inductor_ir": {"fuse_independent_kernels": {"max_kernels": 2}}}))
    off = Session(resolve({"torch_ir": "all", "aten_ir": "all", "inductor_ir": "none"}))
    assert base.fingerprint() == same.fingerprint()
    assert len({base.fingerprint(), opt.fingerprint(), off.fingerprint()}) == 3
    if not inductor_api.hooks_supported()[0]:
        assert scheduler_patches(base) == {}
        return
    patches = base.inductor_patches()
    pre, post = patches["_pre_fusion_custom_pass"], patches["_post_fusion_custom_pass"]
    for p in (pre, post):
        assert isinstance(p, InductorIRPass)
        if inductor_api.CustomSchedulerPass is not None:  # 2.13: no cache bypass
            assert isinstance(p, inductor_api.CustomSchedulerPass)
        assert isinstance(p, inductor_api.CustomGraphPass)  # 2.11: no cache bypass
        assert copy.deepcopy(p) is p
    assert pre.uuid() != post.uuid()
    assert post.uuid() == same.inductor_patches()["_post_fusion_custom_pass"].uuid()
    assert post.uuid() != opt.inductor_patches()["_post_fusion_custom_pass"].uuid()
    # the pickled form (torch 2.11 pickles the post-fusion hook into the FX cache key)
    # is exactly the uuid: deterministic, and different when the selection differs
    assert pickle.dumps(post) == pickle.dumps(same.inductor_patches()["_post_fusion_custom_pass"])
    assert pickle.dumps(post) != pickle.dumps(opt.inductor_patches()["_post_fusion_custom_pass"])
    restored = pickle.loads(pickle.dumps(post))
    assert restored.uuid() == post.uuid() and restored([1, 2]) == [1, 2]
    assert off.inductor_patches().keys() == {"pre_grad_custom_pass", "post_grad_custom_pre_pass"}


# ------------------------------------------------------------------ horizontal fusion
@needs_hooks
def test_horizontal_fusion_forward_and_backward_structure():
    base = scenario("independent", "none")
    opt = scenario("independent", ONLY_IR)
    fwd_b, bwd_b = base.nests
    fwd_o, bwd_o = opt.nests
    # forward: 2 row sums + 2 elementwise chains -> one loop nest per iteration space
    assert (fwd_b, fwd_o) == (4, 2)
    # backward: relu' and sigmoid' (same shape, independent) -> one loop nest
    assert bwd_o < bwd_b and bwd_o == 1
    assert opt.kernels < base.kernels
    assert opt.matched("fuse_independent_kernels") == 3
    graphs = {g.graph.split()[0]: g for g in opt.graphs()}
    assert set(graphs) == {"forward", "backward"}
    for g in graphs.values():
        assert g.nodes_before - g.nodes_after == sum(s.removed - s.added for s in g.rules.values())
        assert any("fuse_independent_kernels:" in n for n in g.notes)


@needs_hooks
def test_horizontal_fusion_outputs_and_gradients_match_eager():
    ref_out, ref_grads = eager("independent")
    opt = scenario("independent", ONLY_IR)
    assert_close_tree(opt.outputs, ref_out)
    assert_close_tree(opt.grads, ref_grads)
    assert not opt.report.errors()


# -------------------------------------------------------------------- vertical fusion
@needs_hooks
def test_vertical_rule_recovers_starved_outer_loop_fusions():
    base = scenario("starved", "none")
    opt = scenario("starved", {"inductor_ir": ["fuse_producer_consumer"]})
    # 2 matmuls + 6 loop nests; Inductor leaves the three reduction -> elementwise pairs
    # (outer-loop fusions) apart, the rule fuses them: 3 loop nests
    assert base.nests == [6] and opt.nests == [3]
    assert opt.matched("fuse_producer_consumer") == 3
    assert opt.graphs()[0].rules.keys() == {"fuse_producer_consumer"}  # selected by name only
    ref_out, _ = eager("starved")
    assert_close_tree(opt.outputs, ref_out)
    assert not opt.report.errors()


# ------------------------------------------------------------------- rules by name
@needs_hooks
def test_each_rule_selected_by_name():
    horiz = scenario("pair", {"inductor_ir": ["fuse_independent_kernels"]})
    combo = scenario("pair", {"inductor_ir": ["combo_small_kernels"]})
    base = scenario("pair", "none")
    assert base.nests == [2] and horiz.nests == [1]
    assert {name for g in horiz.graphs() for name in g.rules} == {"fuse_independent_kernels"}
    # combo kernels are GPU-only: on CPU the rule declines with a reason, nothing changes
    assert combo.nests == [2] and combo.matched("combo_small_kernels") == 0
    assert any("GPU" in reason for reason in combo.declines("combo_small_kernels"))
    ref_out, _ = eager("pair")
    assert_close_tree(horiz.outputs, ref_out)
    assert_close_tree(combo.outputs, ref_out)


@needs_hooks
def test_caps_are_decline_reasons():
    capped = scenario("independent", {"inductor_ir": {"fuse_independent_kernels": {"max_distance": 0}}})
    assert capped.matched("fuse_independent_kernels") == 0
    reasons = capped.declines("fuse_independent_kernels")
    assert any(r.startswith("too far apart") for r in reasons), reasons
    assert capped.nests == scenario("independent", "none").nests


# --------------------------------------------------------------------- robustness
class _Mystery:
    """Turns the first reduction kernel into an unknown node type before the pass."""


@needs_hooks
def test_unknown_node_type_is_left_untouched_and_reported(monkeypatch):
    seen: dict[str, object] = {}
    original = InductorIRPass.__call__

    def call(self, nodes):
        if self.hook == "post_fusion":
            sched = inductor_api.current_scheduler()
            view = SchedulerView(sched, nodes)
            seen["kinds"] = sorted(view.classify(n).op for n in nodes)
            target = next(n for n in nodes if view.classify(n).op == "reduction")
            target.__class__ = type("MysteryNode", (type(target),), {})
            seen["name"] = target.get_name()
        return original(self, nodes)

    monkeypatch.setattr(InductorIRPass, "__call__", call)
    run = run_compiled(*_independent_fwd(), passes=ONLY_IR, grad=False)
    assert seen["kinds"] == ["pointwise", "pointwise", "reduction", "reduction"]
    declines = run.declines("fuse_independent_kernels")
    assert declines.get("unknown node type MysteryNode") == 1
    assert any("unknown type" in n for g in run.graphs() for n in g.notes)
    # the other reduction has no known partner left; the two pointwise chains still fuse
    assert run.nests == [3]
    ref_out, _ = eager("independent")
    assert_close_tree(run.outputs, ref_out)


def _independent_fwd():
    from inductor_ir_support import independent, independent_inputs

    return independent, independent_inputs()


@needs_hooks
def test_a_failing_rule_is_reported_and_compilation_continues():
    def boom(m):
        """never reached"""
        raise RuntimeError("rule bug")

    rule = fusion_rule(optimus.Op("pointwise"), where=[boom], name="test_failing_fusion_rule")(lambda m, b: b.fuse(m.target, m.candidate))
    try:
        run = run_compiled(pair, pair_inputs(), {"inductor_ir": ["test_failing_fusion_rule"]}, grad=False)
    finally:
        REGISTRY.remove(rule.name)
    errors = run.report.errors()
    assert errors and "rule bug" in errors[0]
    assert run.nests == [2]
    assert_close_tree(run.outputs, eager("pair")[0])


@needs_hooks
def test_pass_failure_rolls_back_to_inductors_node_list(monkeypatch):
    def broken_sort(scheduler, nodes):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(inductor_api, "topo_sort", broken_sort)
    run = run_compiled(pair, pair_inputs(), {"inductor_ir": ["fuse_independent_kernels"]}, grad=False)
    assert run.nests == [2]  # Inductor's own result
    assert any("rolled back" in n for g in run.graphs() for n in g.notes)
    assert any("injected failure" in e for e in run.report.errors())
    assert_close_tree(run.outputs, eager("pair")[0])


@needs_hooks
def test_compile_failure_after_the_hook_recompiles_without_inductor_ir(monkeypatch):
    """Whatever goes wrong once the scheduler has our node list (e.g. a combo kernel that
    fails to generate or compile) surfaces from Inductor, not from our hook: the graph is
    compiled again without the Inductor-IR passes, and the report says so."""
    from optimus.inductor_ir import passes

    def failing_hook(session, hook, nodes):
        raise RuntimeError("injected codegen failure")

    monkeypatch.setattr(passes, "run_hook", failing_hook)
    run = run_compiled(pair, pair_inputs(), {"inductor_ir": ["fuse_independent_kernels"]}, grad=False)
    assert run.nests == [2]  # Inductor's own result
    assert any("compiled again without" in n and "injected codegen failure" in n for n in run.report.notes)
    assert_close_tree(run.outputs, eager("pair")[0])


# ----------------------------------------------------------------------- cache keys
@needs_hooks
def test_fx_graph_cache_hits_same_selection_and_misses_changed_ones(tmp_path, monkeypatch):
    """Same Inductor-IR selection: hit (the scheduler passes cause no bypass). Changed
    option or selection: miss, and the passes run again (never a stale artifact)."""
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config

    from optimus.tools import measure

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    measure._clear_cache_dir_memo()
    x = pair_inputs()

    def compile_once(passes):
        torch._dynamo.reset()
        counters.clear()
        compiled = optimus.compile(pair, passes=passes, fullgraph=True)
        with torch.no_grad():
            out = compiled(*x)
        ind, aot = counters["inductor"], counters["aot_autograd"]
        hit = ind.get("fxgraph_cache_hit", 0) + aot.get("autograd_cache_hit", 0)
        miss = ind.get("fxgraph_cache_miss", 0) + aot.get("autograd_cache_miss", 0)
        bypass = ind.get("fxgraph_cache_bypass", 0) + aot.get("autograd_cache_bypass", 0) + ind.get("fxgraph_cache_pickle_error", 0)
        return compiled.optimus_report, hit, miss, bypass, out

    try:
        with inductor_config.patch(fx_graph_cache=True):
            report, hit, miss, bypass, _ = compile_once(ONLY_IR)
            assert hit == 0 and miss >= 1 and bypass == 0
            assert report.rule_totals()["fuse_independent_kernels"].matched == 1
            report, hit, miss, bypass, out = compile_once(ONLY_IR)
            assert hit >= 1 and miss == 0 and bypass == 0, "the same selection must hit, not bypass"
            assert not [g for g in report.graphs if g.level == "inductor_ir"]
            assert_close_tree(out, eager("pair")[0])
            changed = {"inductor_ir": {"fuse_independent_kernels": {"max_kernels": 1}}}
            report, hit, miss, bypass, _ = compile_once(changed)
            assert hit == 0 and miss >= 1 and bypass == 0, "a changed option must not reuse the artifact"
            assert report.rule_totals()["fuse_independent_kernels"].matched == 0
            report, hit, miss, bypass, _ = compile_once({"inductor_ir": ["combo_small_kernels"]})
            assert hit == 0 and miss >= 1 and bypass == 0, "a changed selection must not reuse the artifact"
    finally:
        measure._clear_cache_dir_memo()


# ------------------------------------------------------------------ view internals
class _Dep:
    def __init__(self, name):
        self.name = name


class _Node:
    """A stand-in scheduler node: one operation writing one buffer."""

    def __init__(self, name, *deps):
        self.name = name
        self.unmet_dependencies = [_Dep(f"buf_{d}") for d in deps]

    def get_name(self):
        return self.name

    def get_operation_names(self):
        return {self.name}

    def get_buffer_names(self):
        return {f"buf_{self.name}"}


def test_reachability_stays_exact_under_contraction():
    from optimus.inductor_ir.view import Reachability

    #  a -> x -> b      c -> d      (a, c independent; b depends on a through x)
    a, x, b, c, d = _Node("a"), _Node("x", "a"), _Node("b", "x", "a"), _Node("c"), _Node("d", "c")
    r = Reachability(object(), [a, x, b, c, d])
    assert r.reaches(a, b) and r.reaches(x, b) and not r.reaches(b, a)
    assert not r.reaches(a, c) and not r.reaches(c, a)
    assert r.path_avoiding(a, b) is x  # fusing a into b directly would be a cycle
    # fuse a and c (independent): d now transitively depends on a's ancestors and vice versa
    ac = _Node("ac")
    ac.unmet_dependencies = []
    r.contract([a, c], ac)
    assert r.reaches(ac, d) and r.reaches(ac, b)
    assert r.producers(d) == [ac] and set(map(id, r.producers(b))) == {id(x), id(ac)}
    # fuse x and d: now b is reachable from the new node, and c's former consumer chain too
    xd = _Node("xd")
    r.contract([x, d], xd)
    assert r.reaches(ac, xd) and r.reaches(xd, b)
    assert r.path_avoiding(ac, b) is xd


def test_unsupported_torch_installs_nothing_and_says_why(monkeypatch):
    monkeypatch.setattr(inductor_api, "hooks_supported", lambda: (False, "no scheduler hooks in this build"))
    session = Session(resolve("all"))
    assert scheduler_patches(session) == {}
    assert any("unsupported on this torch" in n for n in session.report.notes)
    patches = session.inductor_patches()
    assert "_post_fusion_custom_pass" not in patches and "post_grad_custom_pre_pass" in patches


# ---------------------------------------------------------------- memory (passes="auto")
@needs_hooks
def test_merges_within_the_global_peak_are_still_bounded_by_their_local_rise(monkeypatch):
    """towers32 on the H200: Inductor's estimate puts the peak elsewhere, so merges that
    double the real peak leave the estimated one unchanged; each merge's local rise counts
    against the graph's allowance."""
    from optimus.planner import schedule_memory as sm

    # (bounds no other test uses: scenario runs are memoized by their passes)
    monkeypatch.setattr(sm, "local_rise", lambda *a: 2 * sm.MEMORY_SLACK)
    refused = scenario("pair", {"inductor_ir": {"fuse_independent_kernels": {"memory_increase": 0.021}}})
    assert refused.matched("fuse_independent_kernels") == 0
    reasons = [r for g in refused.graphs() for r in g.rules["fuse_independent_kernels"].declined]
    assert reasons and all(r.startswith("memory: the merged kernel would hold 0.50 MiB more at once where it runs") for r in reasons), reasons
    assert_close_tree(refused.outputs, eager("pair")[0])
    monkeypatch.setattr(sm, "local_rise", lambda *a: sm.MEMORY_SLACK // 2)
    kept = scenario("pair", {"inductor_ir": {"fuse_independent_kernels": {"memory_increase": 0.022}}})
    assert kept.matched("fuse_independent_kernels") == 1, [r for g in kept.graphs() for r in g.rules["fuse_independent_kernels"].declined]


@needs_hooks
def test_merges_are_priced_by_inductors_peak_memory_estimate(monkeypatch):
    from optimus.planner import schedule_memory as sm

    seen = []
    orig = sm.ScheduleMemory.why_not

    def why_not(self, members, increase):
        why = orig(self, members, increase)
        seen.append((self.base, why))
        return why

    monkeypatch.setattr(sm.ScheduleMemory, "why_not", why_not)
    # the default bound (passes="auto" sets 2%): these merges keep the peak, all happen
    kept = scenario("pair", {"inductor_ir": {"fuse_independent_kernels": {"memory_increase": 0.02}}})
    assert kept.matched("fuse_independent_kernels") == 1
    assert seen and all(base is not None and base >= 0 and why is None for base, why in seen), seen
    notes = [n for g in kept.graphs() for n in g.notes if "-> one kernel" in n]  # the estimate behind the merge
    assert notes and all("; estimated peak " in n and " MiB allowed, rise " in n for n in notes), notes
    # a budget a byte below the schedule's own peak: every merge declines, with the estimate in its reason
    monkeypatch.setattr(sm, "MEMORY_SLACK", -1)
    refused = scenario("pair", {"inductor_ir": {"fuse_independent_kernels": {"memory_increase": 0.0}}})
    assert refused.matched("fuse_independent_kernels") == 0
    reasons = [r for g in refused.graphs() for r in g.rules["fuse_independent_kernels"].declined]
    assert reasons and all(r.startswith("memory: the merged kernel would raise the schedule's estimated peak to ") for r in reasons), reasons
    assert refused.nests == [2]
    assert_close_tree(refused.outputs, eager("pair")[0])


def test_auto_bounds_the_kernel_merging_rules_by_memory():
    from optimus.planner.plan import Context, Planner

    options = Planner(Context("cuda")).rule_options({("inductor_ir", "combo_small_kernels"): {"memory_increase": 0.5}})
    assert options[("inductor_ir", "fuse_independent_kernels")] == {"memory_increase": 0.02}
    assert options[("inductor_ir", "combo_small_kernels")] == {"memory_increase": 0.5}  # what was set stays
    assert resolve("all").options_for("inductor_ir", REGISTRY.get("fuse_independent_kernels"))["memory_increase"] is None  # fixed presets: unbounded
