"""torch.compile integration: results, reports, the registered backend, cache keys."""

import pytest
import torch

import optimus
from optimus.tools import measure
from optimus.compile import LevelPass, Session
from optimus.core.registry import REGISTRY, resolve


class Chunky(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(12, 12)

    def forward(self, x):
        a, b, c = self.lin(x).split(4, dim=-1)
        y = torch.cat([a, b, c], dim=-1)
        p, q = y.split([6, 6], 1)
        q1, q2 = q.split([2, 4], 1)
        return torch.cat([p, q1, q2], 1).relu()


def test_compile_training_matches_eager_and_reports_both_graphs():
    torch.manual_seed(0)
    model, ref = Chunky(), Chunky()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(8, 12)
    compiled = optimus.compile(model)
    with measure.fresh_inductor_cache():  # so the passes run (and report) rather than hit a cache
        out = compiled(x)
        out.sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(out, ref(x))
    torch.testing.assert_close(model.lin.weight.grad, ref.lin.weight.grad)
    report = compiled.optimus_report
    levels = {(g.level, g.graph.split()[0]) for g in report.graphs}
    assert ("torch_ir", "graph") in levels
    assert ("aten_ir", "forward") in levels and ("aten_ir", "backward") in levels
    torch_ir = next(g for g in report.graphs if g.level == "torch_ir")
    assert torch_ir.nodes_after < torch_ir.nodes_before
    assert not report.errors()


def test_registered_backend_name():
    model = Chunky()
    x = torch.randn(2, 12)
    compiled = torch.compile(model, backend="optimus")
    torch.testing.assert_close(compiled(x), model(x))
    assert optimus.last_report().graphs


def test_passes_none_installs_nothing():
    assert Session(resolve("none")).inductor_patches() == {}
    patches = Session(resolve({"torch_ir": "vertical", "aten_ir": "vertical"})).inductor_patches()
    assert set(patches) == {"pre_grad_custom_pass", "post_grad_custom_pre_pass"}
    assert all(isinstance(p, LevelPass) for p in patches.values())


def test_uuid_changes_with_rule_set_options_and_code():
    all_ = LevelPass(Session(resolve("all")), "aten_ir").uuid()
    assert all_ == LevelPass(Session(resolve("all")), "aten_ir").uuid()
    assert all_ != LevelPass(Session(resolve(["merge_splits"])), "aten_ir").uuid()
    assert all_ != LevelPass(Session(resolve({"aten_ir": "all", "torch_ir": "all", "options": {"max_rewrites": 5}})), "aten_ir").uuid()
    # a torch_ir-only change still changes the post-grad key (it covers every level)
    assert LevelPass(Session(resolve({"torch_ir": "all", "aten_ir": "all"})), "aten_ir").uuid() != LevelPass(
        Session(resolve({"torch_ir": ["merge_splits"], "aten_ir": "all"})), "aten_ir"
    ).uuid()

    @optimus.rule(optimus.Op("tanh", optimus.Var("x")), name="test_uuid_rule")
    def noop(m, b):
        m.decline("never")

    try:
        assert LevelPass(Session(resolve("all")), "aten_ir").uuid() != all_
    finally:
        REGISTRY.remove("test_uuid_rule")


def _compile_once(passes, x):
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    model = Chunky()
    compiled = optimus.compile(model, passes=passes)
    with torch.no_grad():
        compiled(x)
    hits = counters["inductor"].get("fxgraph_cache_hit", 0) + counters["aot_autograd"].get("autograd_cache_hit", 0)
    return compiled.optimus_report, hits


def test_fx_graph_cache_is_used_and_never_stale(tmp_path, monkeypatch):
    """Same passes: a cache hit (not bypassed). Other passes: a miss, and the passes run."""
    from torch._inductor import config as inductor_config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    measure._clear_cache_dir_memo()
    x = torch.randn(4, 12)
    try:
        with inductor_config.patch(fx_graph_cache=True):
            first, hits = _compile_once("all", x)
            assert hits == 0 and first.graphs
            again, hits = _compile_once("all", x)
            assert hits >= 1, "identical passes must hit the cache"
            assert not [g for g in again.graphs if g.level == "aten_ir"]
            other, hits = _compile_once(["split_cat_to_identity"], x)
            assert hits == 0, "different passes must not reuse the artifact"
            assert [g for g in other.graphs if g.level == "aten_ir"]
    finally:
        measure._clear_cache_dir_memo()


def test_explain_prints_and_returns_report(capsys):
    report = optimus.explain(Chunky(), torch.randn(2, 12))
    printed = capsys.readouterr().out
    assert "split_cat_to_identity" in printed and "torch_ir" in printed
    assert report.rule_totals()["split_cat_to_identity"].matched >= 1


def test_compile_rejects_backend_kwarg_and_bad_passes():
    with pytest.raises(TypeError, match="backend"):
        optimus.compile(Chunky(), backend="inductor")
    with pytest.raises(ValueError, match="Did you mean"):
        optimus.compile(Chunky(), passes="vertica")


def test_level_pass_pickles_as_its_uuid():
    """torch 2.11 pickles ``pre_grad_custom_pass`` into the FX graph cache key: the pickled
    form must be deterministic and change exactly when the passes do."""
    import copy
    import pickle

    a = LevelPass(Session(resolve("all")), "torch_ir")
    same = LevelPass(Session(resolve("all")), "torch_ir")
    other = LevelPass(Session(resolve(["merge_splits"])), "torch_ir")
    assert pickle.dumps(a) == pickle.dumps(same) != pickle.dumps(other)
    assert copy.deepcopy(a) is a
    restored = pickle.loads(pickle.dumps(a))
    assert restored.uuid() == a.uuid()
    gm = torch.fx.symbolic_trace(Chunky())
    before = [n.target for n in gm.graph.nodes]
    assert restored(gm.graph) is None and [n.target for n in gm.graph.nodes] == before  # rewrites nothing
