"""Every spelling of an op reads as the same canonical call, at both levels."""


import torch
import torch.nn.functional as F

from optimus.aten_ir.view import AtenIRView
from optimus.torch_ir.view import TorchIRView


def torch_ir_calls(fn, *inputs):
    out = []

    def backend(gm, ex):
        view = TorchIRView(gm)
        out.extend((n, view.classify(n)) for n in gm.graph.nodes)
        return gm.forward

    torch.compile(fn, backend=backend, fullgraph=True)(*inputs)
    return [(n, c) for n, c in out if c is not None]


def test_split_spellings_agree():
    x = torch.randn(4, 12)
    forms = [
        lambda x: x.split(4, -1),
        lambda x: x.split(split_size=4, dim=1),
        lambda x: torch.split(x, [4, 4, 4], dim=-1),
        lambda x: torch.split(x, split_size_or_sections=4, dim=1),
        lambda x: torch.chunk(x, 3, -1),
        lambda x: x.split_with_sizes([4, 4, 4], 1),
    ]
    for form in forms:
        calls = [c for _, c in torch_ir_calls(lambda x: [t * 1 for t in form(x)], x) if c.op == "split"]
        assert len(calls) == 1
        assert calls[0].args["sizes"] == [4, 4, 4] and calls[0].args["dim"] == 1


def test_cat_stack_pointwise_and_linear_spellings():
    x, y, w = torch.randn(2, 3), torch.randn(2, 3), torch.randn(5, 3)

    def f(x, y, w):
        a = torch.concat([x, y], axis=-1)
        b = torch.concatenate((x, y), 0)
        c = torch.stack([x, y], dim=-1)
        d = F.relu(x) + torch.relu(y) + x.relu()
        e = F.linear(x, w) + torch._C._nn.linear(y, w)
        g = torch.add(x, y, alpha=2) - x.sub(y) * torch.mul(x, 3) / y
        return a, b, c, d, e, g

    calls = torch_ir_calls(f, x, y, w)
    by_op = {}
    for _, c in calls:
        by_op.setdefault(c.op, []).append(c)
    assert [c.args["dim"] for c in by_op["cat"]] == [1, 0]
    assert by_op["stack"][0].args["dim"] == 2
    assert len(by_op["relu"]) == 3 and len(by_op["linear"]) == 2
    assert any(c.args["alpha"] == 2 for c in by_op["add"])
    assert len(by_op["div"]) == 1 and by_op["div"][0].args["rounding_mode"] is None


def test_tensor_indexing_reads_as_slice_or_select():
    calls = torch_ir_calls(lambda x: (x[:, 2:5] * 1, x[1] * 1, x[:, -3:] * 1, x[..., 0] * 1), torch.randn(4, 8))
    slices = [c for _, c in calls if c.op == "slice"]
    selects = [c for _, c in calls if c.op == "select"]
    assert [(c.args["dim"], c.args["start"], c.args["end"]) for c in slices] == [(1, 2, 5), (1, 5, 8)]
    assert [(c.args["dim"], c.args["index"]) for c in selects] == [(0, 1)]


def test_inplace_variants_are_not_canonical_ops():
    def f(x):
        y = x * 1
        F.relu(y, inplace=True)
        return y

    ops = [c.op for _, c in torch_ir_calls(f, torch.randn(3))]
    assert "relu" not in ops


def test_aten_overloads():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        a = torch.ops.aten.split.Tensor(x, 2, -1)
        b = torch.ops.aten.split_with_sizes.default(x, [1, 3], dim=1)
        c = torch.ops.aten.slice.Tensor(x, -1, 1, 9223372036854775807)
        return torch.cat([a[0], b[1]], -1), c, torch.ops.aten.select.int(x, 1, -1)

    gm = make_fx(f)(torch.randn(3, 4))
    view = AtenIRView(gm)
    calls = [view.classify(n) for n in gm.graph.nodes]
    calls = [c for c in calls if c is not None]
    splits = [c for c in calls if c.op == "split"]
    assert [(c.args["sizes"], c.args["dim"]) for c in splits] == [([2, 2], 1), ([1, 3], 1)]
    sl = next(c for c in calls if c.op == "slice")
    assert (sl.args["dim"], sl.args["start"], sl.args["end"]) == (1, 1, 4)
    sel = next(c for c in calls if c.op == "select")
    assert (sel.args["dim"], sel.args["index"]) == (1, 3)
    assert sum(c.op == "getitem" for c in calls) >= 2


def test_emit_round_trips_through_classify():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: x * 2)(torch.randn(3, 8))
    view = AtenIRView(gm)
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with gm.graph.inserting_after(x):
        node = view.emit("split", {"input": x, "sizes": [3, 5], "dim": 1})
    call = view.classify(node)
    assert call.op == "split" and call.args["sizes"] == [3, 5]
    assert [tuple(v.shape) for v in node.meta["val"]] == [(3, 3), (3, 5)]
    assert node.target is torch.ops.aten.split_with_sizes.default


def test_cast_spellings_at_torch_ir():
    """x.to(dtype) / .float() / .half() / .bfloat16() / .double() / .type(dtype) are one
    ``cast`` when they change the dtype; a conversion to the dtype a tensor has returns it
    itself (an alias), and .to(device) / .to(tensor) are no dtype conversion: neither is a cast."""
    x, h = torch.randn(2, 3), torch.randn(2, 3).half()

    def f(x, h):
        return (x.to(torch.bfloat16), x.to(dtype=torch.float16), x.half(), x.bfloat16(), x.double(),
                x.type(torch.float64), h.float(), h.to(torch.float32, non_blocking=False),
                x.float(), x.to(torch.float32), x.to("cpu"), x.to(h), x.to(torch.float16, copy=True))

    casts = [c for _, c in torch_ir_calls(f, x, h) if c.op == "cast"]
    assert [c.args["dtype"] for c in casts] == [torch.bfloat16, torch.float16, torch.float16, torch.bfloat16, torch.float64,
                                                torch.float64, torch.float32, torch.float32]
    assert all(c.args["input"].name in ("l_x_", "l_h_") for c in casts)


def test_cast_spellings_at_aten_ir():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        return (torch.ops.prims.convert_element_type.default(x, torch.bfloat16),
                torch.ops.aten._to_copy.default(x, dtype=torch.float16),
                torch.ops.aten._to_copy.default(x, dtype=torch.float16, device=torch.device("cpu")),  # the device it is on
                torch.ops.aten._to_copy.default(x, dtype=torch.float32),  # the same dtype: a copy, not a cast
                torch.ops.aten._to_copy.default(x, dtype=torch.float16, non_blocking=True))  # not only a dtype change

    gm = make_fx(f)(torch.randn(3, 4))
    view = AtenIRView(gm)
    casts = [c for c in (view.classify(n) for n in gm.graph.nodes) if c is not None and c.op == "cast"]
    assert [c.args["dtype"] for c in casts] == [torch.bfloat16, torch.float16, torch.float16]


def test_cast_emits_each_levels_spelling():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: x * 2)(torch.randn(3, 8))
    view = AtenIRView(gm)
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with gm.graph.inserting_after(x):
        node = view.emit("cast", {"input": x, "dtype": torch.bfloat16})
    assert node.target is torch.ops.prims.convert_element_type.default
    assert node.meta["val"].dtype == torch.bfloat16 and view.classify(node).op == "cast"

    seen = []

    def backend(gm, ex):
        tv = TorchIRView(gm)
        inp = next(n for n in gm.graph.nodes if n.op == "placeholder")
        with gm.graph.inserting_after(inp):
            made = tv.emit("cast", {"input": inp, "dtype": torch.float16})
        seen.append((made.op, made.target, made.meta["example_value"].dtype, tv.classify(made).op))
        return gm.forward

    torch.compile(lambda x: x + 1, backend=backend, fullgraph=True)(torch.randn(2))
    assert seen == [("call_method", "to", torch.float16, "cast")]


def test_dtype_inclusion_for_folding_casts():
    from optimus.core.dtypes import compute_dtype, holds

    f32, f16, bf16, f64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
    assert holds(f32, bf16) and holds(f32, f16) and holds(f64, f32) and holds(f32, torch.bool)
    assert not holds(bf16, f16) and not holds(f16, bf16) and not holds(f16, f32) and not holds(bf16, f32)
    assert holds(f32, torch.int16) and not holds(f32, torch.int32) and holds(bf16, torch.uint8) and not holds(f16, torch.int16)
    assert holds(torch.int64, torch.int32) and not holds(torch.uint8, torch.int8) and not holds(torch.int32, f16)
    assert compute_dtype(bf16, f32) == f32 and compute_dtype(bf16) == f32 and compute_dtype(f16, bf16) == f32
    assert compute_dtype(f64, f32) == f64 and compute_dtype(f32) == f32
