"""The vertical rule library beyond the first rules: each rule structurally (which ops
remain) and numerically (outputs and gradients equal eager) at Torch-IR and Aten-IR."""

import pytest
import torch

from support import LEVELS, check_level

pytestmark = pytest.mark.parametrize("level", LEVELS)


def splits_feeding_compute(run):
    """Splits in the forward graph whose chunks feed anything but the graph output (at
    Aten-IR, chunks saved for backward are outputs: views, no kernels)."""
    count = 0
    for n in run.graphs[0].graph.nodes:
        if n.op == "call_function" and "split" in str(n.target):
            if any(u.op != "output" for g in n.users for u in g.users):
                count += 1
    return count


def total(run, *ops):
    c = run.ops(0)
    return sum(c[o] for o in ops)


# ----------------------------------------------------------------- cat_adjacent_segments
@pytest.mark.parametrize(
    "make",
    [
        lambda x, y: torch.cat([y, *x.split(3, 1)[1:3], y], 1),  # partial range + extra inputs
        lambda x, y: torch.cat([x.split(3, -1)[2], x.split(3, -1)[3], x.split(3, -1)[0], x.split(3, -1)[1]], -1),  # shuffled runs
        lambda x, y: torch.cat([x[:, 0:4], x[:, 4:9], y], dim=1),  # slices
        lambda x, y: torch.cat([x[:, :5], x[:, 5:]], dim=-1),  # slices covering everything
    ],
)
def test_cat_adjacent_segments(level, make):
    run = check_level(lambda x, y: make(x, y) * 2, [torch.randn(4, 12), torch.randn(4, 2)], level)
    assert run.matched("cat_adjacent_segments") + run.matched("split_cat_to_identity") >= 1
    cat_inputs = [len(n.args[0]) for gm in run.graphs[:1] for n in gm.graph.nodes if n.op == "call_function" and "cat" in str(n.target)]
    assert all(k <= 3 for k in cat_inputs), cat_inputs


def test_cat_adjacent_segments_min_run_option(level):
    f = lambda x: torch.cat(x.split(3, 1)[1:3], 1) * 2  # noqa: E731
    run = check_level(f, [torch.randn(2, 12)], level, passes={level: {"cat_adjacent_segments": {"min_run": 3}}, "torch_ir" if level == "aten_ir" else "aten_ir": "none"})
    assert run.matched("cat_adjacent_segments") == 0


# --------------------------------------------------------------- split -> cat, other dim
@pytest.mark.parametrize("split_dim, cat_dim", [(1, 0), (-1, -2), (0, 2), (2, 1)])
def test_split_cat_other_dim_to_view(level, split_dim, cat_dim):
    run = check_level(lambda x: torch.cat(torch.split(x, 2, split_dim), cat_dim).sin(), [torch.randn(4, 6, 8)], level)
    assert total(run, "cat", "split") == 0


# ------------------------------------------------------------------ split -> stack
@pytest.mark.parametrize("split_dim, stack_dim", [(1, 1), (1, 0), (-1, 2), (0, -1)])
def test_split_stack_to_view(level, split_dim, stack_dim):
    run = check_level(lambda x: torch.stack(x.split(2, dim=split_dim), dim=stack_dim).cos(), [torch.randn(4, 6, 8)], level)
    assert total(run, "stack", "cat", "split") == 0


def test_split_unsqueeze_cat_is_a_stack(level):
    f = lambda x: torch.cat([c.view(3, 1, 2) for c in x.split(2, 1)], 1).exp()  # noqa: E731
    run = check_level(f, [torch.randn(3, 8)], level)
    assert total(run, "cat", "split") == 0


# ------------------------------------------------------------------- unbind -> stack/cat
@pytest.mark.parametrize("ud, sd", [(0, 0), (1, 1), (0, 2), (2, 0), (-1, -1)])
def test_unbind_stack_to_view(level, ud, sd):
    run = check_level(lambda x: torch.stack(torch.unbind(x, ud), sd).tanh(), [torch.randn(3, 4, 5)], level)
    assert total(run, "stack", "cat", "unbind", "select") == 0


def test_partial_unbind_stack_and_select_forms(level):
    def f(x):
        a = torch.stack([x[:, 1], x[:, 2], x[:, 3]], dim=1)  # selects
        b = torch.stack(x.unbind(0)[1:3], 0)  # partial unbind
        return a * 2, b + 1

    run = check_level(f, [torch.randn(4, 5, 2)], level)
    assert total(run, "stack", "cat") == 0


@pytest.mark.parametrize("ud, cd", [(1, 1), (1, 0), (0, 1), (2, -1)])
def test_unbind_cat_to_view(level, ud, cd):
    run = check_level(lambda x: torch.cat(x.unbind(ud), cd).relu(), [torch.randn(3, 4, 5)], level)
    assert total(run, "cat", "unbind", "select") == 0


def test_split_squeeze_to_unbind(level):
    f = lambda x: [c.squeeze(1) * (i + 1) for i, c in enumerate(x.split(1, dim=1))]  # noqa: E731
    run = check_level(f, [torch.randn(3, 4, 2)], level)
    if level == "torch_ir":
        assert run.ops(0)["squeeze"] == 0 and run.ops(0)["split"] == 0


# ------------------------------------------------------------------------ inverse pairs
@pytest.mark.parametrize(
    "sizes, widths",
    [([3, 5], [3, 5]), ([3, 9], [3, 5, 4]), ([12], [3, 5, 4]), ([8, 4], [3, 5, 4])],
)
def test_cat_split_to_inputs(level, sizes, widths):
    def f(*xs):
        return [p * 2 for p in torch.cat(xs, -1).split(sizes, -1)]

    run = check_level(f, [torch.randn(2, w) for w in widths], level)
    assert run.ops(0)["split"] == 0


def test_cat_split_keeps_the_cat_when_it_stays_and_its_inputs_would_live_longer(level):
    # The cat has another user, so it stays; handing its inputs (computed here) to the split's
    # users would keep them alive next to the cat's copy of them: declined, for memory.
    def f(a, b):
        y = torch.cat([a * 2, b * 3], 1)
        p, q = y.split([3, 5], 1)
        return y.sum(1), p.exp(), q.exp()

    run = check_level(f, [torch.randn(2, 3), torch.randn(2, 5)], level)
    assert run.matched("cat_split_to_inputs") == 0
    why = "the cat stays (it has other users), and reading its inputs instead would keep them alive next to it"
    assert any(why in r for rep in run.reports for g in rep.graphs for r in g.rules.get("cat_split_to_inputs", _NONE).declined), \
        "no decline reason"
    # graph inputs live throughout: nothing lives longer, rewritten
    def g(a, b):
        y = torch.cat([a, b], 1)
        p, q = y.split([3, 5], 1)
        return y.sum(1), p.exp(), q.exp()

    run = check_level(g, [torch.randn(2, 3), torch.randn(2, 5)], level)
    assert run.matched("cat_split_to_inputs") >= 1


class _NoStats:
    declined: dict = {}


_NONE = _NoStats()


def test_cat_split_misaligned_left_alone(level):
    f = lambda a, b: [p * 2 for p in torch.cat([a, b], 1).split([2, 6], 1)]  # noqa: E731
    run = check_level(f, [torch.randn(2, 3), torch.randn(2, 5)], level)
    assert run.matched("cat_split_to_inputs") == 0


def test_stack_unbind_to_inputs(level):
    f = lambda a, b, c: [t.sigmoid() for t in torch.stack([a, b, c], 1).unbind(1)]  # noqa: E731
    run = check_level(f, [torch.randn(2, 3) for _ in range(3)], level)
    assert total(run, "stack", "cat", "unbind", "select") == 0


def test_slices_and_selects_of_cat(level):
    def f(a, b):
        y = torch.cat([a, b], 1)
        return y[:, 4:6] * 2, y[:, 1] + 1, y[:, 3:7].exp()

    run = check_level(f, [torch.randn(2, 3), torch.randn(2, 5)], level)
    assert run.matched("slice_of_cat_to_input") >= 1 and run.matched("select_of_cat_to_input") >= 1


# ---------------------------------------------------------------------------- slices
def test_slice_and_select_chains_fold(level):
    def f(x):
        a = x[:, 2:10][:, 1:4]
        b = x.split([4, 6], 1)[1][:, 0:2]
        c = x[:, 2:10][:, 3]
        d = x[:, 0:10]
        return a * 1, b * 2, c * 3, d * 4

    run = check_level(f, [torch.randn(3, 10)], level)
    assert run.matched("fold_slice_of_range") >= 2 and run.matched("fold_select_of_range") >= 1
    assert run.ops(0)["slice"] <= 2


# ----------------------------------------------------------------------------- views
def test_view_chains_fold(level):
    def f(x):
        a = x.view(6, 4).reshape(2, 12).view(24)
        b = x.permute(1, 0, 2).permute(1, 0, 2)
        c = x.transpose(0, 2).permute(2, 1, 0)
        d = x.unsqueeze(1).squeeze(1)
        e = x.view(x.shape)
        return a * 1, b * 2, c * 3, d * 4, e * 5

    run = check_level(f, [torch.randn(2, 3, 4)], level)
    ops = run.ops(0)
    assert ops["permute"] + ops["transpose"] == 0
    assert ops["view"] + ops["reshape"] <= 1


# ------------------------------------------------------------------------ pointwise
@pytest.mark.parametrize(
    "body",
    [
        lambda cs, ps: [torch.tanh(c) for c in cs],
        lambda cs, ps: [c * p for c, p in zip(cs, ps)],  # per-chunk parameter tensors
        lambda cs, ps: [c * (0.5 + i) for i, c in enumerate(cs)],  # per-chunk scalars
        lambda cs, ps: [p - c for c, p in zip(cs, ps)],  # chunk on the right
        lambda cs, ps: [torch.add(c, 1.5, alpha=2) for c in cs],  # shared scalar, alpha kept
        lambda cs, ps: [torch.div(c, p, rounding_mode="floor") for c, p in zip(cs, ps)],
        lambda cs, ps: [torch.clamp(c, min=-0.5, max=0.5) for c in cs],
        lambda cs, ps: [torch.nn.functional.gelu(c, approximate="tanh") for c in cs],
    ],
)
def test_hoist_pointwise_through_split_rounds_collapse(level, body):
    def f(x, *ps):
        for _ in range(2):
            x = torch.cat(body(x.split(4, dim=1), ps), dim=1)
        return x

    run = check_level(f, [torch.randn(5, 12)] + [torch.rand(4) + 0.5 for _ in range(3)], level)
    assert splits_feeding_compute(run) == 0, run.graphs[0].graph
    assert run.matched("hoist_pointwise_through_split") >= 2


def test_hoist_chain_of_ops_per_chunk(level):
    """split -> per-feature (scale, shift, tanh) -> cat collapses into one region."""

    def f(x, scales):
        chunks = x.split(3, dim=-1)
        return torch.cat([torch.tanh(c * scales[i] + 0.1 * i) for i, c in enumerate(chunks)], -1)

    run = check_level(f, [torch.randn(4, 12), torch.rand(4, 3)], level)
    ops = run.ops(0)
    assert ops["split"] == 0 and ops["cat"] <= 1 and ops["tanh"] == 1, ops


@pytest.mark.parametrize(
    "body, why",
    [
        (lambda cs: [cs[0].relu(), cs[1].tanh(), cs[2].relu()], "different ops"),
        (lambda cs: [cs[0].relu(), cs[1].relu(), cs[2]], "not every chunk"),
        (lambda cs: [torch.clamp(c, max=float(i)) for i, c in enumerate(cs)], "different arguments"),
    ],
)
def test_hoist_declines(level, body, why):
    f = lambda x: torch.cat(body(x.split(2, 1)), 1)  # noqa: E731
    run = check_level(f, [torch.randn(3, 6)], level)
    assert run.matched("hoist_pointwise_through_split") == 0, why


def test_hoist_keeps_dtype_rules(level):
    """Per-chunk scalars on half tensors would round differently: declined, still correct."""
    f = lambda x: torch.cat([c * (1.1 + i) for i, c in enumerate(x.split(2, 1))], 1)  # noqa: E731
    run = check_level(f, [torch.randn(3, 6).half()], level, grad=False)
    assert run.matched("hoist_pointwise_through_split") == 0


def test_einsum_to_pointwise(level):
    f = lambda a, b: torch.einsum("abc,abcd->abd", a, b)  # noqa: E731
    run = check_level(f, [torch.randn(2, 3, 4), torch.randn(2, 3, 4, 5)], level)
    if level == "torch_ir":
        assert run.matched("einsum_to_pointwise") == 1 and run.ops(0)["einsum"] == 0


def test_sink_pointwise_into_cat_only_when_named(level):
    f = lambda a, b: torch.cat([a, b], 1).relu()  # noqa: E731
    run = check_level(f, [torch.randn(2, 3), torch.randn(2, 4)], level)
    assert run.matched("sink_pointwise_into_cat") == 0
    run = check_level(f, [torch.randn(2, 3), torch.randn(2, 4)], level, passes=["sink_pointwise_into_cat"])
    assert run.matched("sink_pointwise_into_cat") == 1
