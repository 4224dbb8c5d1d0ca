"""The fuzzer's oracle: what it compares over two calls (outputs, requires_grad, gradients of
inputs and parameters, state written in place, memory shared by outputs), and that a call
that fails inside a region cannot leave its modes to the next case. Fast: no compile except
where a test says so."""

from __future__ import annotations

import pytest
import torch

from optimus.tools.fuzz import Case, InputSpec, check_source, reference
from optimus.tools.fuzz.oracle import (
    CallError,
    _alias_signature,
    _caller_modes,
    _compare_calls,
    _Program,
    _Run,
    _thread_state,
    tolerance,
)
from optimus.tools.fuzz.shrink import signature
from optimus.tools.fuzz.oracle import LevelResult

INPUTS = (InputSpec("x0", (2, 3), seed=1), InputSpec("w0", (3, 3), seed=2, role="param"), InputSpec("b0", (3,), seed=3, role="buffer"))


def _run(**changes) -> _Run:
    base = dict(
        spec="spec",
        outputs=[torch.ones(2)],
        requires_grad=[True],
        grads=[torch.ones(2, 3), torch.ones(3, 3), None],
        inputs_after=[torch.zeros(2, 3), torch.zeros(3, 3), torch.zeros(3)],
        aliases=(((), ()),),
    )
    base.update(changes)
    return _Run(**base)


def test_a_parameter_without_gradient_must_stay_without_one():
    ref = [_run(grads=[torch.ones(2, 3), None, None])] * 2
    got = [_run(grads=[torch.ones(2, 3), torch.zeros(3, 3), None])] * 2
    msg = _compare_calls(ref, got, INPUTS)
    assert msg == "grad of parameter w0 (input 1): unexpected (eager leaves it None)"
    assert signature(LevelResult("torch_ir", "mismatch", msg)) == "mismatch:grad of parameter"
    # an input: no gradient and an all-zero one are the same (as before)
    ref = [_run(grads=[None, torch.ones(3, 3), None])] * 2
    got = [_run(grads=[torch.zeros(2, 3), torch.ones(3, 3), None])] * 2
    assert _compare_calls(ref, got, INPUTS) is None


def test_a_difference_on_the_second_call_names_the_call():
    ref = [_run(), _run(inputs_after=[torch.zeros(2, 3), torch.zeros(3, 3), torch.ones(3)])]
    got = [_run(), _run()]
    msg = _compare_calls(ref, got, INPUTS)
    assert msg.startswith("call 2: input 2 (b0, buffer) after the call (written in place): max abs diff 1"), msg
    assert signature(LevelResult("aten_ir", "mismatch", msg)) == "mismatch:input (call 2)"


def test_requires_grad_and_dtype_of_every_output():
    assert "requires_grad [False], expected [True]" in _compare_calls([_run()], [_run(requires_grad=[False])], INPUTS)
    assert "dtype torch.bfloat16, expected torch.float32" in _compare_calls([_run()], [_run(outputs=[torch.ones(2, dtype=torch.bfloat16)])], INPUTS)


def test_outputs_share_memory_only_where_elements_overlap():
    """Disjoint chunks of one buffer share a storage but no element: not aliasing (the
    driver accepts it for horizontal batching); the same tensor twice, or a view of an
    input, is."""
    x = torch.randn(2, 3)
    a, b = torch.randn(2, 3).unbind(0)
    assert _alias_signature([x], [a, b]) == (((), ()), ((), ()))
    c, d = torch.randn(3, 2).unbind(1)  # interleaved: one storage, disjoint elements
    assert _alias_signature([x], [c, d]) == (((), ()), ((), ()))
    assert _alias_signature([x], [a, a]) == (((), (1,)), ((), (0,)))
    assert _alias_signature([x], [x[1], x.t()[:, 0]]) == (((0,), ()), ((0,), ()))  # x[1] and column 0 do not overlap
    assert _alias_signature([x], [x[0], x.t()[0]]) == (((0,), (1,)), ((0,), (0,)))  # both hold x[0, 0]


def test_tolerance_follows_what_the_program_computes():
    def case(body: str) -> Case:
        return Case(INPUTS[:1], raw_source=f"def f(x0):\n    {body}\n")

    assert tolerance(case("return (x0.t(),)"), "torch_ir") == (1e-4, 1e-5)
    assert tolerance(case("return (x0 @ x0.t(),)"), "aten_ir") == (1e-3, 1e-4)
    assert tolerance(case("return (x0.t(),)"), "compile") == (1e-3, 1e-4)
    assert tolerance(case("return (x0.to(torch.bfloat16),)"), "torch_ir") == (3e-2, 3e-2)


def test_the_program_runs_as_a_module_whose_state_persists():
    """Parameters and buffers are the module's; the second call sees what the first wrote;
    data inputs are fresh on every call; a frozen parameter never gets a gradient."""
    src = """
def f(x0, w0, w1, b0):
    b0.add_(1)
    return (x0 @ w0 + b0, x0 @ w1)
"""
    inputs = (InputSpec("x0", (2, 3), seed=1), InputSpec("w0", (3, 3), seed=2, role="param"), InputSpec("w1", (3, 3), seed=3, role="frozen"), InputSpec("b0", (3,), seed=4, role="buffer"))
    case = Case(inputs, raw_source=src)
    ran, runs, why = reference(case)
    assert why is None and len(runs) == 2
    first, second = runs
    torch.testing.assert_close(second.inputs_after[3], first.inputs_after[3] + 1)  # the buffer's update carried over
    assert not torch.equal(first.inputs_after[0], second.inputs_after[0])  # fresh data
    assert first.grads[1] is not None and first.grads[2] is None and first.grads[3] is None
    program = _Program(case.function(), inputs, True)
    assert [n for n, _ in program.named_parameters()] == ["w0", "w1"] and [n for n, _ in program.named_buffers()] == ["b0"]
    assert program.w0.requires_grad and not program.w1.requires_grad


def test_a_call_that_raises_inside_regions_leaves_no_mode_behind():
    """A graph's region markers have no ``finally``: entered and not left when it raises."""
    from torch.amp import autocast_mode
    from torch.autograd import grad_mode

    before = _thread_state()

    def leaky():
        grad_mode._enter_inference_mode(True)
        autocast_mode._enter_autocast("cpu", torch.bfloat16, True, None)
        torch._C._set_grad_enabled(False)
        torch._C._dispatch_tls_set_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher, True)
        raise RuntimeError("inside the regions")

    with pytest.raises(CallError, match="RuntimeError: inside the regions"):
        with _caller_modes():
            leaky()
    assert _thread_state() == before
    torch.randn(2)  # the dispatcher works


def test_check_source_rejects_an_unknown_level():
    with pytest.raises(ValueError, match="level must be"):
        check_source("def f(x0):\n    return (x0,)\n", INPUTS[:1], level="inductor_ir")


def test_a_level_skip_says_what_torch_did():
    """The campaign counts torch's own failures by what they were."""
    from optimus.tools.fuzz.campaign import skip_reason

    build = LevelResult("aten_ir", "skip", "torch: building the aten_ir graph raised RuntimeError: Cannot set version_counter for inference tensor")
    assert skip_reason(build) == "building the graph raised RuntimeError: Cannot set version_counter for inference tensor"
    grad = LevelResult("aten_ir", "skip", "torch: ...", torch_failure=("mismatch", "grad of input 0: unexpected (eager leaves it None)", False))
    assert skip_reason(grad) == "mismatch (no Optimus rewrite): mismatch:grad unexpected (eager leaves it None)"
    later = LevelResult("aten_ir", "skip", "torch: ...", torch_failure=("mismatch", "call 2: output 1: max abs diff 0.1 at (0,)", True))
    assert skip_reason(later) == "mismatch (also without Optimus): mismatch:output (call 2) max abs diff"


def test_a_difference_beyond_the_tolerance_is_judged_against_fp64():
    """Beyond the tolerance, a compiled value passes if its error against the fp64
    reference is within the benchmark harness's multiple of eager's own error; a value far
    from both still fails, and without an fp64 value the tolerance alone decides."""
    fp64 = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    eager = torch.tensor([1.0, 2.0, 3.003])  # off by 1e-3 relative in its last element
    rounded = torch.tensor([1.0, 2.0, 2.998])  # off by as much, the other way: eager's rounding
    wrong = torch.tensor([1.0, 2.0, 3.3])
    run = lambda t, **kw: _run(outputs=[t], grads=None, **kw)  # noqa: E731
    ref64 = [run(fp64, inputs_after=[x.double() for x in _run().inputs_after])]
    assert _compare_calls([run(eager)], [run(rounded)], INPUTS) is not None  # beyond (1e-4, 1e-5)
    assert _compare_calls([run(eager)], [run(rounded)], INPUTS, ref64=ref64) is None
    msg = _compare_calls([run(eager)], [run(wrong)], INPUTS, ref64=ref64)
    assert msg is not None and msg.startswith("output 0: max abs diff"), msg


def test_the_fp64_reference_runs_the_program_in_float64():
    from optimus.tools.fuzz.oracle import fp64_reference

    case = Case(INPUTS, raw_source="def f(x0, w0, b0):\n    b0.add_(1)\n    return (x0 @ w0 + b0,)\n")
    case, ref, why = reference(case)
    assert why is None
    ref64 = fp64_reference(case)
    assert ref64 is not None and len(ref64) == len(ref)
    for a, r in zip(ref, ref64):
        assert r.outputs[0].dtype == torch.float64 and r.grads[0].dtype == torch.float64
        torch.testing.assert_close(r.outputs[0].float(), a.outputs[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r.grads[1].float(), a.grads[1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r.inputs_after[2].float(), a.inputs_after[2])
    # a program that fixes a dtype float64 inputs no longer match has no fp64 reference
    fixed = Case(INPUTS[:1], grad=False, raw_source="def f(x0):\n    return (x0 @ torch.ones(3, 3),)\n")
    assert fp64_reference(fixed) is None


def test_a_sum_reordered_beyond_the_tolerance_passes_the_fp64_rule():
    """A campaign's case (seed 2000, case 214): six layer norms over 2 elements with
    ``eps=1e-6`` (ill-conditioned gradients). A rewrite that only reorders the sum of two
    gradients lands beyond the tolerance; against the fp64 reference it is as accurate as
    eager, and the level says it was judged so. Compiles."""
    from optimus.tools.fuzz.oracle import check_case

    body = "".join(f"    v{2 * k} = F.layer_norm(x0, [2], weight=w{2 * k}, bias=w{2 * k + 1}, eps=1e-6)\n    v{2 * k + 1} = v{2 * k}.tanh()\n" for k in range(6))
    src = (
        f"def f(x0, x1, {', '.join(f'w{i}' for i in range(12))}):\n{body}"
        "    v12 = torch.concat([v1, v3, v5, v7, v9, v11], dim=2)\n    v13 = v5.add(v1)\n    v14 = torch.abs(v12)\n"
        "    v15 = v13.unsqueeze(-3)\n    v16 = v10.split([1, 1, 1, 1], -2)\n    v17, = torch.split(v16[-1], [1], 1)\n"
        "    return (v16[3], v14, v15, v16[3], v17)\n"
    )
    seeds = (1092628530, 1076224214, 774558133, 1387163471, 2123595582, 1198511323, 360654883, 976980191, 847606956, 1355927757, 1993903529, 774782802)
    params = tuple(InputSpec(f"w{i}", (2,), seed=s, role="frozen" if i == 10 else "param") for i, s in enumerate(seeds))
    case = Case((InputSpec("x0", (3, 4, 2), seed=1035365619), InputSpec("x1", (3, 4, 2), seed=1056479055), *params), raw_source=src)
    result = check_case(case, passes="vertical")
    assert result.skip is None and not result.failures, [r.message for r in result.failures]
    assert any(r.fp64_judged for r in result.levels.values())
