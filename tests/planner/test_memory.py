"""Peak memory as Inductor would run a graph, and what a horizontal fusion does to it
(optimus/planner/memory.py)."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from optimus.planner.memory import POINTWISE_CAT_INPUTS, Liveness, MemoryBudget, dfs_order, op_kind


def _sequences(xs, ws):
    # each sequence: a wide projection that dies at once (its sum is tiny)
    return [torch.relu(x @ w).sum(1) for x, w in zip(xs, ws)]


def _graph(n=4, rows=64, k=16, wide=256):
    xs = [torch.randn(rows, k) for _ in range(n)]
    ws = [torch.randn(k, wide) for _ in range(n)]
    return make_fx(_sequences)(xs, ws), rows * wide * 4


def _mms(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == torch.ops.aten.mm.default]


def _inputs_bytes(live):
    return sum(live.size[k] for k in live.resident)


def test_inputs_live_throughout_and_elementwise_temporaries_take_no_memory():
    gm, wide_bytes = _graph()
    live = Liveness(gm.graph)
    inputs = _inputs_bytes(live)
    assert inputs > 0 and live.curve.min() >= inputs
    # one wide matmul output at a time; its relu runs inside the sum's kernel (never stored)
    assert wide_bytes <= live.peak - inputs < 1.5 * wide_bytes
    assert wide_bytes in [b for _, b in live.live_at_peak()]


def test_batching_the_projections_raises_the_peak_and_the_budget_refuses():
    gm, wide_bytes = _graph()
    live = Liveness(gm.graph)
    mms = _mms(gm)
    assert len(mms) == 4
    budget = MemoryBudget(live.peak, allowed_increase=0.02)
    whole = live.with_group(mms)
    # all four wide outputs at once instead of one at a time
    assert budget.increase(whole) >= 2.5 * wide_bytes
    assert not budget.fits(whole)
    # two at a time rises about half as much; a loose budget takes all four
    assert live.peak < live.with_group(mms[:2]) < whole
    assert MemoryBudget(live.peak, allowed_increase=10.0).fits(whole)


def test_the_bound_answers_without_simulating_when_even_the_most_fits():
    gm, wide_bytes = _graph()
    live = Liveness(gm.graph)
    mms = _mms(gm)
    simulated = live.with_group(mms)
    generous = live.peak + 100 * wide_bytes
    bound = live.with_group(mms, allowed=generous)
    assert simulated <= bound <= generous  # an upper bound, returned as it is
    assert live.with_group(mms, allowed=live.peak) == simulated  # too tight: simulated


def test_a_group_whose_outputs_live_long_anyway_costs_nothing():
    def keep(xs, ws):
        return [x @ w for x, w in zip(xs, ws)]  # every output is a graph output

    xs = [torch.randn(8, 4) for _ in range(3)]
    ws = [torch.randn(4, 8) for _ in range(3)]
    gm = make_fx(keep)(xs, ws)
    live = Liveness(gm.graph)
    assert MemoryBudget(live.peak, allowed_increase=0.0).increase(live.with_group(_mms(gm))) == 0.0


def _towers(xs, ws):
    # each tower's result is written into its slice of the cat: only one matmul output lives
    return torch.cat([torch.relu(x @ w) for x, w in zip(xs, ws)], 1)


def test_consumers_move_after_the_fused_op_so_the_whole_buffer_lives_through_them():
    n, rows, k, wide = 6, 64, 16, 128
    xs = [torch.randn(rows, k) for _ in range(n)]
    ws = [torch.randn(k, wide) for _ in range(n)]
    gm = make_fx(_towers)(xs, ws)
    live = Liveness(gm.graph)
    one = rows * wide * 4
    cat = n * one
    assert live.peak - _inputs_bytes(live) < cat + 1.5 * one  # the cat and one matmul output
    # batched: the members' relus (which ran right after each matmul) now run after the
    # batched matmul, so all n outputs live with the cat
    assert live.with_group(_mms(gm)) - live.peak >= (n - 1.5) * one


def _matmuls_first(xs, ws):
    # the order a post-grad graph can list things in: every matmul, then every tail
    hs = [x @ w for x, w in zip(xs, ws)]
    return torch.cat([torch.relu(h) for h in hs], 1)


def test_graph_order_that_holds_every_tower_at_once_is_rescheduled_depth_first():
    n, rows, k, wide = 6, 64, 16, 128
    xs = [torch.randn(rows, k) for _ in range(n)]
    ws = [torch.randn(k, wide) for _ in range(n)]
    gm = make_fx(_matmuls_first)(xs, ws)
    nodes = list(gm.graph.nodes)
    order = dfs_order(nodes, {x: x.all_input_nodes for x in nodes})
    assert sorted(map(str, order)) == sorted(map(str, nodes)) and order[-1].op == "output"
    mms = _mms(gm)
    first_relu = next(u for u in mms[0].users)
    assert order.index(first_relu) < order.index(mms[1])  # tower 0 runs to its end before tower 1 starts
    live = Liveness(gm.graph)
    one = rows * wide * 4
    assert live.order_kind == "dfs"  # the rescheduled order had the lower peak
    assert live.peak - _inputs_bytes(live) < n * one + 1.5 * one  # as if tower by tower


def test_the_output_node_counts_what_its_inputs_hold_not_its_own_stale_value():
    # a rewrite leaves the output node's ``val`` as it was (the old values): read through
    # its inputs, the outputs count once, as the values the graph now returns
    gm, _ = _graph()
    peak = Liveness(gm.graph).peak
    out = next(n for n in gm.graph.nodes if n.op == "output")
    out.meta["val"] = [torch.empty(1024, 1024) for _ in range(4)]  # 16 MiB nobody produces
    assert Liveness(gm.graph).peak == peak


def _pooled_late(xs, ws):
    # every sequence's wide result is pooled twice, and the graph lists the poolings after
    # the last sequence (as a model does that first runs every sequence, then summarizes)
    outs = [torch.relu(x @ w) + 1 for x, w in zip(xs, ws)]
    a = torch.cat([o.mean(1, keepdim=True) @ torch.ones(1, 2) for o in outs], 1)
    b = torch.cat([o.amax(1, keepdim=True) @ torch.ones(1, 2) for o in outs], 1)
    return a, b


def test_poolings_listed_late_run_with_the_sequence_they_read_as_inductor_fuses_them():
    n, rows, k, wide = 6, 64, 16, 256
    xs = [torch.randn(rows, k) for _ in range(n)]
    ws = [torch.randn(k, wide) for _ in range(n)]
    gm = make_fx(_pooled_late)(xs, ws)
    live = Liveness(gm.graph)
    one = rows * wide * 4
    # graph order and depth-first both hold all n wide results until the poolings run
    assert live.order_kind == "freeing_first"
    assert live.peak - _inputs_bytes(live) < 1.5 * one


def _small_cat(x, y, w):
    return (torch.cat([x * 2, y * 2], 1) + 1) @ w


def test_a_cat_of_few_inputs_read_by_elementwise_ops_is_computed_inside_them():
    rows, k = 256, 64
    x, y, w = torch.randn(rows, k), torch.randn(rows, k), torch.randn(2 * k, 8)
    live = Liveness(make_fx(_small_cat)(x, y, w).graph)
    # Inductor's pointwise cat: the add reads x and y, only the add's result is stored
    cat_bytes = rows * 2 * k * 4
    assert live.peak - _inputs_bytes(live) < 1.5 * cat_bytes

    def wide_cat(*parts):
        return (torch.cat([p * 2 for p in parts[:-1]], 1) + 1) @ parts[-1]

    parts = [torch.randn(rows, k) for _ in range(POINTWISE_CAT_INPUTS + 1)]
    live = Liveness(make_fx(wide_cat)(*parts, torch.randn(len(parts) * k, 8)).graph)
    # more inputs than Inductor fuses: the cat is a buffer, and the add's result another
    assert live.peak - _inputs_bytes(live) >= 2 * rows * len(parts) * k * 4


def _pooled_then_projected(xs, ws, vs):
    # each sequence's result is pooled 8:1 and projected at once
    rows = xs[0].shape[0]
    outs = []
    for x, w, v in zip(xs, ws, vs):
        o = torch.relu(x @ w) + 1
        outs.append(o.view(rows, -1, 8).mean(-1) @ v)
    return torch.cat(outs, 1)


def test_a_stack_of_computed_inputs_lives_from_its_first_input_on():
    n, rows, k, wide, m = 6, 64, 16, 256, 4
    xs = [torch.randn(rows, k) for _ in range(n)]
    ws = [torch.randn(k, wide) for _ in range(n)]
    vs = [torch.randn(wide // 8, m) for _ in range(n)]
    gm = make_fx(_pooled_then_projected)(xs, ws, vs)
    live = Liveness(gm.graph)
    projections = [x for x in _mms(gm) if x.args[1].name.startswith("vs")]
    pools = [p.args[0] for p in projections]
    pooled = rows * (wide // 8) * 4
    # batched, the projections read one stack of the pooled results; Inductor writes each
    # pooling into its slice, so the stack is live from the first sequence's pooling on,
    # through every later sequence's wide result
    raised = live.with_group(projections, [(p, pooled) for p in pools]) - live.peak
    assert raised >= (n - 2) * pooled


def test_torch_ir_reductions_are_recognized_by_name():
    class Pool(torch.nn.Module):
        def forward(self, x):
            return x.mean(1) + torch.sum(x, 1)

    gm = torch.fx.symbolic_trace(Pool())
    kinds = {n.name: op_kind(None, n) for n in gm.graph.nodes}
    assert kinds["mean"] == "mean" and kinds["sum_1"] == "sum"


def _reused_later(x, w1, w2, v):
    a = torch.tanh(x @ w1)  # a buffer of some size, dead after the next matmul...
    b = a @ v
    big = torch.relu(x @ w2)  # ...while this wide one lives...
    c = torch.tanh(big.sum(1, keepdim=True) * x @ w1)  # ...until a buffer of a's size is allocated again
    return b, c


def test_a_dead_buffer_is_held_until_inductor_reuses_it_for_one_of_its_size():
    rows, k, wide = 64, 32, 512
    x, w1, w2, v = torch.randn(rows, k), torch.randn(k, k), torch.randn(k, wide), torch.randn(k, 4)
    live = Liveness(make_fx(_reused_later)(x, w1, w2, v).graph)
    spans = {owner.name: (s, e) for owner, s, e in live._spans.values()}
    # the first (rows, k) matmul output dies at its reader, but stays allocated until the
    # second one of its size takes its memory over, so it is live with the wide buffer
    first, second = spans["mm"], spans["mm_3"]
    assert first[1] == second[0] - 1
    assert live.peak - _inputs_bytes(live) >= rows * wide * 4 + rows * k * 4


def _towers_with_views(xs, ws):
    # each member's output is read through a view (t) and by a cat of two members, so the
    # patched readers must rename storages held by views and count a cat's inputs again
    hs = [x @ w for x, w in zip(xs, ws)]
    return torch.cat([torch.relu(h.t()).sum(0) for h in hs]) + torch.cat(hs[:2], 1).sum()


def _wide_cat(xs, ws):
    # a cat of more inputs than Inductor computes inside its elementwise readers, until the
    # group makes them one
    return torch.relu(torch.cat([x @ w for x, w in zip(xs, ws)], 1))


def test_a_groups_patched_readers_are_the_ones_found_anew(monkeypatch):
    """A group's graph is judged with ``_readers`` patched around the group instead of
    found again over the whole graph; on every judged group here the two agree (creators,
    readers, transient storages), with and without a stacked copy."""
    checks: list[bool] = []
    monkeypatch.setattr(Liveness, "readers_checks", checks)
    n, rows, k, wide = POINTWISE_CAT_INPUTS + 2, 32, 8, 16
    xs = [torch.randn(rows, k) for _ in range(n)]
    ws = [torch.randn(k, wide) for _ in range(n)]
    for fn in (_towers_with_views, _towers, _matmuls_first, _sequences, _wide_cat):
        gm = make_fx(fn)(xs, ws)
        live = Liveness(gm.graph)
        mms = _mms(gm)
        stacked = [(x, rows * k * 4) for x in (m.args[0] for m in mms)]
        for members in (mms, mms[:2], mms[1:]):
            live.with_group(members)
            live.with_group(members, stacked=stacked[: len(members)])
    assert len(checks) == 5 * 3 * 2 and all(checks), checks


def test_saved_results_batched_into_one_buffer_are_freed_by_the_backward_only_at_the_end():
    # AOTAutograd's training forward returns what the backward reads; the backward frees each
    # saved storage after its last reader. Batched, the n saved results are views of one
    # buffer, freed after the last of them: n - 1 members' parts stay live longer.
    def keep(xs, ws):
        outs = [x @ w for x, w in zip(xs, ws)]
        return (sum(o.sum() for o in outs),) + tuple(outs)  # the loss, and every result saved

    n, rows, k, wide = 5, 32, 8, 64
    xs = [torch.randn(rows, k) for _ in range(n)]
    ws = [torch.randn(k, wide) for _ in range(n)]
    gm = make_fx(keep)(xs, ws)
    one = rows * wide * 4
    mms = _mms(gm)
    inference, forward = Liveness(gm.graph), Liveness(gm.graph, outputs_saved=True)
    assert forward.peak == inference.peak  # the graph alone: the same curve
    assert inference.with_group(mms) == inference.peak  # returned anyway: batching costs nothing here
    assert forward.shared_saved_bytes(mms) == (n - 1) * one
    assert forward.with_group(mms) - forward.peak >= (n - 1) * one - 64
    assert forward.with_group(mms[:2]) - forward.peak <= one + 64  # a pair: one part longer
    assert forward.with_group(mms, allowed=forward.peak + 100 * n * one) >= forward.with_group(mms)  # the bound covers it


def test_only_saved_results_count_as_shared():
    def one_saved(xs, ws):
        outs = [x @ w for x, w in zip(xs, ws)]
        return sum(o.sum() for o in outs), outs[0]  # the others die in their sums

    xs = [torch.randn(16, 8) for _ in range(4)]
    ws = [torch.randn(8, 16) for _ in range(4)]
    gm = make_fx(one_saved)(xs, ws)
    assert Liveness(gm.graph, outputs_saved=True).shared_saved_bytes(_mms(gm)) == 0


def _as_training(gm):
    for n in gm.graph.nodes:  # as Dynamo's pre-grad graph of a training step records them
        v = n.meta.get("val")
        if n.op == "call_function" and isinstance(v, torch.Tensor) and v.is_floating_point():
            n.meta["val"] = v.detach().requires_grad_(True)
    return gm


def test_in_training_a_groups_stacked_operands_are_saved_for_the_backward():
    # the fused op's backward reads what it stacked (a batched matmul's dW, a grouped
    # kernel's saved x): the copy lives to the end of a Torch-IR training graph, as the
    # activations the loop saved do; in inference it dies with the op
    xs = [torch.randn(64, 16) for _ in range(4)]
    ws = [torch.randn(16, 256) for _ in range(4)]
    gm = _as_training(make_fx(_sequences)(xs, ws))
    mms = _mms(gm)
    inputs = [m.args[0] for m in mms]
    stacked = [(x, 64 * 16 * 4) for x in inputs]
    copy = sum(b for _, b in stacked)
    training = Liveness(gm.graph, saved_for_backward=True)
    rise = training.with_group(mms, stacked) - training.with_group(mms)
    assert abs(rise - copy) <= 64, (rise, copy)  # live at the end, where the saved activations peak
    inference = Liveness(gm.graph)
    assert inference.with_group(mms, stacked) - inference.with_group(mms) < copy


def test_in_training_the_copy_of_a_saved_activation_is_not_saved_twice():
    # splitcat: the members read chunks of one round tensor, itself saved for the backward;
    # the stack of the chunks replaces them for the backward (the partitioner saves one of
    # the two), so in training too the copy dies with the fused op
    def rounds(x, v, ws):
        chunks = (x @ v).split(16, 1)  # the round: materialized, needs a gradient
        return [torch.relu(c @ w).sum(1) for c, w in zip(chunks, ws)]

    n, rows = 4, 64
    gm = _as_training(make_fx(rounds)(torch.randn(rows, 16), torch.randn(16, 16 * n), [torch.randn(16, 256) for _ in range(n)]))
    mms = _mms(gm)[1:]
    stacked = [(m.args[0], rows * 16 * 4) for m in mms]
    copy = sum(b for _, b in stacked)
    training = Liveness(gm.graph, saved_for_backward=True)
    assert all(training._held_to_end(m.args[0], training.keys, training.grad, training._found[2]) for m in mms)
    rise = training.with_group(mms, stacked) - training.with_group(mms)
    assert abs(rise - copy) <= 64, (rise, copy)  # the chunks' stacked gradient (the group's backward), not the copy too
    # a chunk of a graph input is not saved by the loop: its copy is (the test above)
    gm = _as_training(make_fx(lambda x, ws: [torch.relu(c @ w).sum(1) for c, w in zip(x.split(16, 1), ws)])(torch.randn(rows, 16 * n), [torch.randn(16, 256) for _ in range(n)]))
    mms = _mms(gm)
    training = Liveness(gm.graph, saved_for_backward=True)
    rise = training.with_group(mms, [(m.args[0], rows * 16 * 4) for m in mms]) - training.with_group(mms)
    assert abs(rise - copy) <= 64, (rise, copy)  # the copy, saved (the input needs no gradient)


def _chain_and_branches():
    def chain(xs, ws, v):  # every later op depends on every member (splitcat's rounds)
        t = torch.cat([x @ w for x, w in zip(xs, ws)], 1)
        for _ in range(3):
            t = torch.relu(t @ v)
        return t.sum()

    def branches(xs, ws, vs):  # each later op depends on one member only (interformer's sequences)
        return sum(torch.relu(torch.relu(x @ w) @ v).sum() for x, w, v in zip(xs, ws, vs))

    n, rows, k, wide = 4, 64, 16, 64
    xs = [torch.randn(rows, k) for _ in range(n)]
    ws = [torch.randn(k, wide) for _ in range(n)]
    a = _as_training(make_fx(chain)(xs, ws, torch.randn(n * wide, n * wide)))
    b = _as_training(make_fx(branches)(xs, ws, [torch.randn(wide, 4 * wide) for _ in range(n)]))
    return a, b, n


def test_in_training_a_groups_gradients_are_charged_when_its_backward_runs():
    # the group's gradients are complete only after the backward of the ops that depend on
    # every member, which freed what those saved: charged over what is left, not over all
    chain, branches, n = _chain_and_branches()
    live = Liveness(chain.graph, saved_for_backward=True)
    first = _mms(chain)[:n]
    assert len(live._depending_on_all(first)) > 0
    timed, opaque = live.with_group(first), live.with_group(first, opaque_backward=True)
    assert timed < opaque, (timed, opaque)
    assert timed >= live.peak  # never below the graph's own peak
    # independent branches: a member's gradient may be complete while the others' ops still
    # hold what they saved, so nothing is counted freed
    live = Liveness(branches.graph, saved_for_backward=True)
    first = [m for m in _mms(branches) if m.args[0].op == "placeholder"]
    common = live._depending_on_all(first)
    assert len(first) == n and sum(live.size[k] for x in common for k in live.keys[x]) <= 16  # the loss's sums only
    assert live.with_group(first, opaque_backward=True) - live.with_group(first) <= 16


def test_our_custom_op_rules_are_charged_over_everything_saved():
    from optimus.rules import embedding, grouped_kernels, horizontal

    assert grouped_kernels.grouped_linear.custom_op and grouped_kernels.batched_layer_norm.custom_op
    assert grouped_kernels.grouped_mm.custom_op and embedding.group_embedding_lookups.custom_op
    assert not horizontal.batch_linear.custom_op and not horizontal.batch_mm.custom_op


def test_what_a_rule_says_its_backward_holds_replaces_the_default_charge():
    # GroupRule.backward_held: the bytes the op's backward holds beyond the members' (its
    # buffers; no output gradient when it reads a cat's slice in place) are charged in place
    # of the default (every output gradient at once, less one member's)
    xs = [torch.randn(64, 16) for _ in range(4)]
    ws = [torch.randn(16, 256) for _ in range(4)]
    gm = _as_training(make_fx(_sequences)(xs, ws))
    mms = _mms(gm)
    training = Liveness(gm.graph, saved_for_backward=True)
    one = 64 * 256 * 4
    default, nothing = training.with_group(mms, opaque_backward=True), training.with_group(mms, opaque_backward=True, held=0)
    assert default - nothing >= 3 * one - 64  # the default: four output gradients at once, less one
    extra, big = 5 * 2**20, 2**30  # held at the end of the forward, over what is still saved there
    assert training.with_group(mms, opaque_backward=True, held=extra) >= nothing
    assert training.with_group(mms, opaque_backward=True, held=big) - training.with_group(mms, opaque_backward=True, held=big - extra) == extra
    inference = Liveness(gm.graph)
    assert inference.with_group(mms, held=extra) == inference.with_group(mms)  # no backward: nothing held
