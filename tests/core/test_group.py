"""Grouping by independence (optimus/core/group.py): candidates anywhere in the graph that do
not depend on each other form a group, whatever their depths; dependent ones never share
one; max_span bounds how far apart members lie; the guard before each fusion."""

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from optimus.core.group import DEPENDENT, Group, candidate_ancestors, depend_on_each_other, find_groups
from optimus.core.levels import make_view
from optimus.core.registry import REGISTRY
from support import check_level


def traced(fn, *inputs):
    gm = fx.symbolic_trace(fn)
    FakeTensorProp(gm).propagate(*inputs)
    return gm, make_view("torch_ir", gm)


def groups_of(gm, view, rule_name, **given):
    rule = REGISTRY.get(rule_name)
    options = {**rule.option_defaults(), **given}
    declined = []
    groups = find_groups(view, rule, options, lambda n: None, lambda n, r: declined.append((n.name, r)))
    return [[m.name for m in g.nodes] for g in groups], declined


def deep(x, k):
    for _ in range(k):
        x = torch.tanh(x)
    return x


def five_norms_at_different_depths(x0, x1, x2, x3, x4):
    xs = [deep(x, k) for x, k in zip((x0, x1, x2, x3, x4), (0, 1, 3, 2, 5))]
    return torch.cat([F.layer_norm(x, (8,)) for x in xs], 1)


def test_five_layer_norms_of_one_width_at_different_depths_form_one_group():
    xs = [torch.randn(3, 8) for _ in range(5)]
    gm, view = traced(five_norms_at_different_depths, *xs)
    groups, _ = groups_of(gm, view, "batch_layer_norm")
    assert len(groups) == 1 and len(groups[0]) == 5, groups
    run = check_level(five_norms_at_different_depths, xs, "torch_ir")  # end to end, numerics too
    assert run.matched("batch_layer_norm") == 1 and run.ops(0)["layer_norm"] == 1


def chain_and_branches(x, w1, w2, w3, w4):
    a = F.linear(x, w1)
    b = F.linear(a, w2)  # depends on a
    c = F.linear(torch.tanh(x), w3)  # independent of a and b
    d = F.linear(b + c, w4)  # depends on all of them
    return d


def test_dependent_candidates_never_share_a_group():
    ws = [torch.randn(8, 8) for _ in range(4)]
    gm, view = traced(chain_and_branches, torch.randn(2, 8), *ws)
    groups, _ = groups_of(gm, view, "batch_linear")
    names = {n.name: n for n in gm.graph.nodes}
    for g in groups:
        assert not depend_on_each_other([names[m] for m in g]), g
    # a joins c (independent, different depths); b and d depend on a and on each other
    assert sorted(map(sorted, groups)) == [["linear", "linear_2"]], groups
    run = check_level(chain_and_branches, [torch.randn(2, 8)] + ws, "torch_ir", passes=["batch_linear"])
    assert run.matched("batch_linear") == 0  # two members: not profitable, but found and tried


def test_candidate_ancestors_are_exact_on_a_small_graph():
    ws = [torch.randn(8, 8) for _ in range(4)]
    gm, view = traced(chain_and_branches, torch.randn(2, 8), *ws)
    lin = [n for n in gm.graph.nodes if n.target is F.linear]
    bit_of = {n: i for i, n in enumerate(lin)}
    anc = candidate_ancestors(gm.graph, bit_of)
    assert [anc[n] for n in lin] == [0b0000, 0b0001, 0b0000, 0b0111]


def test_max_span_bounds_how_far_apart_members_are():
    def f(x0, x1, x2, x3, x4, x5):
        return [F.layer_norm(deep(x, 20), (4,)) for x in (x0, x1, x2, x3, x4, x5)]  # 21 nodes apart

    xs = [torch.randn(2, 4) for _ in range(6)]
    gm, view = traced(f, *xs)
    wide, _ = groups_of(gm, view, "batch_layer_norm")
    assert [len(g) for g in wide] == [6]
    narrow, declined = groups_of(gm, view, "batch_layer_norm", max_span=45)
    assert [len(g) for g in narrow] == [3, 3], narrow
    pos = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    for g in narrow:
        assert pos[g[-1]] - pos[g[0]] <= 45


def test_max_group_cuts_groups():
    def f(x0, x1, x2, x3, x4, x5, x6):
        return [F.layer_norm(x, (4,)) for x in (x0, x1, x2, x3, x4, x5, x6)]

    xs = [torch.randn(2, 4) for _ in range(7)]
    gm, view = traced(f, *xs)
    groups, declined = groups_of(gm, view, "batch_layer_norm", max_group=3, min_group=2)
    assert [len(g) for g in groups] == [3, 3]
    assert len(declined) == 0  # the seventh is alone: nothing to decline


def test_the_guard_declines_members_that_came_to_depend_on_each_other():
    ws = [torch.randn(8, 8) for _ in range(4)]
    gm, view = traced(chain_and_branches, torch.randn(2, 8), *ws)
    rule = REGISTRY.get("batch_linear")
    lin = [view.classify(n) for n in gm.graph.nodes if n.target is F.linear]
    group = Group(rule, [lin[0], lin[1]], None, view, rule.option_defaults())  # b depends on a
    assert rule.decline_reason(group) == DEPENDENT
    ok = Group(rule, [lin[0], lin[2]], None, view, rule.option_defaults())
    assert rule.decline_reason(ok) != DEPENDENT


def test_dhen_layer_norms_feeding_one_cat_from_different_depths_merge():
    """The zoo's dhen: per layer, five LayerNorms of one width reach the layer's cat from
    different depths; depth buckets only ever paired them (and declined). Now one group per layer."""
    from optimus.tools.models import get_model

    zoo = get_model("dhen", "small")
    names = [n for n, _ in zoo.model.named_parameters()]
    k = len(zoo.inputs)

    def f(*a):
        return torch.func.functional_call(zoo.model, dict(zip(names, a[k:])), tuple(a[:k]))

    run = check_level(f, list(zoo.inputs) + [p.detach() for p in zoo.model.parameters()], "torch_ir")
    assert run.matched("batch_layer_norm") == 2
    assert run.ops(0)["layer_norm"] == 4  # 12 before: 2 layers x 5 merged, 2 others stay
