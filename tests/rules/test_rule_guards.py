"""Conditions rules check themselves, at both levels: type promotion in the cat/stack
eliminating rules, symbolic reshape targets (fold_reshape_chain, sizes 0 next to a
symbolic size). Each was a rule error or a wrong dtype the fuzzer found."""

import pytest
import torch

from optimus.rules._facts import emittable_shape, resolvable
from support import LEVELS, check_level

pytestmark = pytest.mark.parametrize("level", LEVELS)


def reasons(run):
    return [r for rep in run.reports for g in rep.graphs for s in g.rules.values() for r in s.declined]


F32, F64 = torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64)


# ------------------------------------------------------------------- type promotion
@pytest.mark.parametrize(
    "rule, make",
    [
        ("cat_split_to_inputs", lambda a, b: [t * 2 for t in torch.cat([a, a, b], 1).split([3, 3, 3], 1)]),
        ("slice_of_cat_to_input", lambda a, b: torch.cat([a, b], 1)[:, 0:2] * 2),
        ("select_of_cat_to_input", lambda a, b: torch.cat([a, b], 0)[1] * 2),
        ("stack_unbind_to_inputs", lambda a, b: [t * 2 for t in torch.stack([a, b], 0).unbind(0)]),
        ("select_of_stack_to_input", lambda a, b: torch.stack([a, b], 1)[:, 0] * 2),
    ],
)
def test_cat_and_stack_inverses_decline_on_type_promotion(level, rule, make):
    """cat/stack promote float32 with float64 to float64; the float32 input is not the chunk."""
    run = check_level(make, [F32, F64], level)
    assert run.matched(rule) == 0
    assert not run.errors()


@pytest.mark.parametrize(
    "rule, make",
    [
        ("cat_split_to_inputs", lambda a, b: [t * 2 for t in torch.cat([a, a, b], 1).split([3, 3, 3], 1)]),
        ("slice_of_cat_to_input", lambda a, b: torch.cat([a, b], 1)[:, 0:2] * 2),
        ("stack_unbind_to_inputs", lambda a, b: [t * 2 for t in torch.stack([a, b], 0).unbind(0)]),
    ],
)
def test_cat_and_stack_inverses_still_apply_on_one_dtype(level, rule, make):
    run = check_level(make, [F32, F32 + 1], level, grad=False)  # an unused input has no gradient, not zeros
    assert run.matched(rule) >= 1


# -------------------------------------------------------------- symbolic reshape targets
def test_fold_reshape_chain_with_dynamic_shapes_declines_cleanly(level):
    """The outer view's shape is (1, 2, (s0*s1)//2): no rule error, whatever the outcome."""

    def f(x):
        return x.reshape([12]).view((1, 2, 6)) * 2

    check_level(f, [torch.randn(1, 2, 6)], level, dynamic=True, grad=False)


def test_fold_reshape_chain_with_a_symbolic_batch_still_folds(level):
    def f(x):
        return x.reshape(-1).view(-1, 3, 2) * 2

    run = check_level(f, [torch.randn(5, 6)], level, dynamic="batch")
    check_level(f, [torch.randn(7, 6)], level, dynamic="batch")
    if level == "torch_ir":
        assert run.matched("fold_reshape_chain") == 1


def test_reshape_targets_with_a_size_0_and_a_symbolic_size(level):
    assert emittable_shape([3, 0, 4]) == [3, 0, 4]
    assert emittable_shape([3, 0, object()]) is None  # a symbolic size would be -1: ambiguous beside 0
    assert not resolvable([1, 3, 0, -1]) and resolvable([1, 3, 2, -1]) and resolvable([0, 3])

    def f(x):
        (a,) = torch.split(x, 3, -3)
        return torch.cat([a], 1) * 2, a + 1

    check_level(f, [torch.randn(3, 0, 2)], level, dynamic=True, grad=False)
