"""The driver's safety checks, at both levels: outputs that are views of a replaced node,
in-place writes the rule's pattern does not capture, memory layout (strides), and the
view normalization of splits of empty dims. Each fixes a bug the fuzzer found (see
tests/fuzz/test_fuzz_known_bugs.py); these tests pin the mechanism down directly."""

import pytest
import torch

from optimus.core.safety import layout_difference, viewable
from optimus.core.view import GraphView
from optimus.torch_ir.view import TorchIRView
from support import LEVELS, check_level


def reasons(run):
    return [r for rep in run.reports for g in rep.graphs for s in g.rules.values() for r in s.declined]


# ------------------------------------------------------------------ zero-size split dims
def test_split_sizes_of_an_empty_dim():
    assert GraphView._split_sizes(2, (3, 0), 1) == [0]  # torch returns one empty chunk
    assert GraphView._split_sizes(0, (3, 0), 1) == [0]
    assert GraphView._split_sizes(2, (3, 5), 1) == [2, 2, 1]
    assert GraphView._split_sizes(0, (3, 5), 1) == 0  # invalid: left as written
    assert len(torch.zeros(3, 0).split(2, 1)) == 1


def test_chunk_of_an_empty_dim_has_every_chunk():
    found = []

    def backend(gm, ex):
        view = TorchIRView(gm)
        found.extend(c for c in map(view.classify, gm.graph.nodes) if c is not None and c.op == "split")
        return gm.forward

    torch.compile(lambda x: [t + 1 for t in torch.chunk(x, 3, 1)], backend=backend, fullgraph=True)(torch.zeros(3, 0))
    assert [c.args["sizes"] for c in found] == [[0, 0, 0]]
    assert len(torch.chunk(torch.zeros(3, 0), 3, 1)) == 3


@pytest.mark.parametrize("level", LEVELS)
def test_rules_on_splits_of_an_empty_dim(level):
    def f(x):
        a, b = x.split([0, 2], 1)
        return torch.cat([a.split(2, 1)[0], b], 1) * 2, a.split(3, 0)[0] + 1

    torch._dynamo.reset()
    try:  # torch 2.11's fake split of a zero-size dim raises inside Dynamo itself
        torch.compile(f, backend="eager", fullgraph=True)(torch.randn(3, 2))
    except Exception as e:
        pytest.skip(f"torch {torch.__version__} cannot trace this program: {type(e).__name__}")
    check_level(f, [torch.randn(3, 2)], level, grad=False)


# --------------------------------------------------------- outputs that are views of a replaced node
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(
    "make",
    [
        lambda x: torch.stack([x.unbind(0)[1]], 0).squeeze(-1),  # squeeze of the stack
        lambda x: torch.cat([x, x], 1).split([2, 2], 1)[0].contiguous(),  # contiguous of a chunk
        lambda x: torch.stack(x.unbind(0), 0).view(-1),  # view of the stack
    ],
)
def test_output_viewing_a_replaced_node_does_not_alias_the_input(level, make):
    run = check_level(make, [torch.randn(2, 2)], level)
    if level == "torch_ir":  # at Aten-IR the decomposed graph may decline earlier, for other reasons
        assert any("would alias a graph input" in r for r in reasons(run)), reasons(run)


@pytest.mark.parametrize("level", LEVELS)
def test_output_viewing_a_replaced_node_of_a_fresh_value_still_rewrites(level):
    """The replacement is fresh (not an input): the output may become a view of it."""
    run = check_level(lambda x: torch.stack((x * 2).unbind(0), 0).view(-1), [torch.randn(3, 4)], level)
    assert run.matched("unbind_stack_to_view") + run.matched("unbind_cat_to_view") >= 1


@pytest.mark.parametrize("level", LEVELS)
def test_written_input_seen_through_an_output_view(level):
    """At Aten-IR AOTAutograd writes x back after the graph; the returned stack must not
    be a view of x by then."""

    def f(x):
        s = torch.stack([x.select(0, 0), x.select(0, 1)], 0)
        x[0].neg_()
        return s

    check_level(f, [torch.randn(2, 2)], level, grad=False)


def test_two_outputs_in_chunks_of_one_new_buffer_decline():
    """Hoisting makes per-chunk results chunks of one buffer: returned both, they would share storage."""

    def f(x):
        a, b = x.split([1, 1], 1)
        return a * 2, b * 2

    run = check_level(f, [torch.randn(2, 2)], "torch_ir")
    assert run.matched("hoist_pointwise_through_split") == 0
    assert any("would alias each other" in r for r in reasons(run)), reasons(run)


# -------------------------------------------------------------- writes the pattern does not capture
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("pieces", [lambda x: x.split(1, dim=1), lambda x: x.unbind(1)])
def test_stack_of_pieces_of_a_tensor_written_later(level, pieces):
    def f(x):
        a, b = pieces(x)
        s = torch.stack([a, b], 1)
        x.add_(1)
        return s * 1

    run = check_level(f, [torch.randn(2, 2)], level, grad=False)
    if level == "torch_ir":
        assert any("reads" in r and "mutated in place" in r for r in reasons(run)), reasons(run)


@pytest.mark.parametrize("level", LEVELS)
def test_hoisted_result_written_later(level):
    def f(x):
        a, b = x.split([1, 1], 1)
        u, w = a * 2, b * 2
        w.mul_(3)
        return u + 0, w + 0

    run = check_level(f, [torch.randn(2, 2)], level, grad=False)
    if level == "torch_ir":
        assert run.matched("hoist_pointwise_through_split") == 0
        assert any("would be replaced" in r for r in reasons(run)), reasons(run)


# ------------------------------------------------------------------------------- strides
def columns(t):
    """The first two columns of t, stacked back: t[:, :2] (a view of t, with t's strides)."""
    return torch.stack([t[:, 0], t[:, 1]], 1)


def test_layout_difference():
    x = torch.randn(4, 6)
    assert layout_difference(x, x.clone()) is None
    assert layout_difference(x.t().contiguous(), x.t()) == "strides"
    assert layout_difference(x[:, :3].contiguous(), x[:, :3]) == "strides"
    assert layout_difference(x[:2], x[2:]) == "offset"
    assert layout_difference(torch.randn(1, 6), torch.randn(6, 1).t()) is None  # size-1 dims do not count
    assert layout_difference(torch.randn(0, 3), torch.randn(3, 0).t()) is None  # no elements
    assert layout_difference((x, x.t()), (x, x.t().contiguous())) == "strides"


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(
    "make",
    [
        lambda x: columns(x.transpose(0, 1)).reshape(-1) * 2,  # a transpose
        lambda x: (columns(x.transpose(0, 1)) * 2).reshape(-1) + 1,  # through an elementwise op
        lambda x: torch.cat(x.transpose(0, 1).split([1, 1], 1), 1).reshape(-1) * 2,  # split/cat of a transpose
        lambda x: torch.cat(x.split([2, 2, 1], -1)[:2], -1).reshape(-1) * 2,  # adjacent chunks: a slice
    ],
)
def test_view_of_a_replacement_with_other_strides(level, make):
    """Torch-IR keeps reshape (which copies when it must); Aten-IR has only aten.view."""
    check_level(make, [torch.randn(2, 5)], level)


@pytest.mark.parametrize("level", LEVELS)
def test_view_of_a_replacement_with_other_strides_declines(level):
    run = check_level(lambda x: columns(x.transpose(0, 1)).view(-1) * 2, [torch.randn(2, 3)], level)
    assert any("does not accept the memory layout" in r for r in reasons(run)), reasons(run)


def test_metadata_strides_follow_a_layout_change():
    """After a rewrite that changes a layout, every node's metadata has its real strides."""

    def f(x):
        return torch.stack(x.split(2, dim=1), dim=0).cos() * 2

    x = torch.randn(4, 6, 8)
    run = check_level(f, [x], "torch_ir")
    assert run.matched("split_stack_to_view") == 1
    gm = run.graphs[0]
    real = {}

    class Record(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            real[n] = out
            return out

    Record(gm).run(x)
    for n, v in real.items():
        meta = n.meta.get("example_value")
        if isinstance(v, torch.Tensor) and isinstance(meta, torch.Tensor):
            assert layout_difference(meta, v) is None, (n.name, meta.stride(), v.stride())


def test_viewable_agrees_with_torch_view():
    """``viewable`` (which the driver uses because fake tensors accept any view) gives
    torch's answer on permuted, sliced and size-1-padded layouts."""
    rng = torch.Generator().manual_seed(0)
    cases = 0
    for sizes in [(2, 3, 4), (1, 2, 2), (4, 1, 3), (2, 2, 1, 3)]:
        base = torch.randn(*[s + 1 for s in sizes], generator=rng)
        for perm in [(0, 1, 2, 3)[: len(sizes)], tuple(reversed(range(len(sizes))))]:
            for sliced in (False, True):
                t = base[tuple(slice(0, s) for s in sizes)] if sliced else torch.randn(*sizes, generator=rng)
                t = t.permute(*perm)
                n = t.numel()
                for shape in ([n], [-1], [1, n], [n, 1], list(t.shape), [t.shape[0], -1], [-1, t.shape[-1]]):
                    try:
                        t.view(shape)
                        expected = True
                    except RuntimeError:
                        expected = False
                    assert viewable(t, shape) == expected, (tuple(t.shape), t.stride(), shape)
                    cases += 1
    assert cases > 100
    assert viewable(torch.empty(0, 3).t(), [3, 0])
