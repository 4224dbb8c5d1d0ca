"""Packed parameters (``optimus.pack_parameters``): the model behaves exactly as before.

Names, order and Parameter objects; state_dict and checkpoints (save / load into packed
and unpacked models); optimizer steps (SGD with momentum, Adam foreach / fused, AdamW)
bit for bit against an unpacked copy; zero_grad; deepcopy; the declines (shared, used
elsewhere, frozen mixed with trainable, dtypes, devices, non-contiguous, already packed);
and ``optimus.compile`` of a packed model.
"""

from __future__ import annotations

import copy
import importlib
import io
import os
import types

import pytest
import torch
import torch.nn as nn
from torch.multiprocessing.reductions import StorageWeakRef

import optimus
from optimus.compile import CUDAGRAPH_KERNELS_ENV
from optimus.tools.models.towers import Tower  # Linear -> LayerNorm -> ReLU
from optimus.packing import NOT_BY_DEFAULT_PLANNED, find_groups, pack_by_default, packed_slot


class Towers(nn.Module):
    """T identical towers on the T features of the input, then a head."""

    def __init__(self, towers: int = 5, d_in: int = 6, d_out: int = 3) -> None:
        super().__init__()
        self.towers = nn.ModuleList(Tower(d_in, d_out) for _ in range(towers))
        self.head = nn.Linear(towers * d_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        merged = torch.cat([t(f) for t, f in zip(self.towers, x.unbind(1))], 1)
        return self.head(merged).squeeze(-1)


def make(seed: int = 0, **kw) -> Towers:
    torch.manual_seed(seed)
    return Towers(**kw)


def inputs(seed: int = 1, batch: int = 4, towers: int = 5, d_in: int = 6) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, towers, d_in, generator=g)


def tower_params(model: Towers, name: str) -> list[nn.Parameter]:
    return [t.get_parameter(name) for t in model.towers]


# ------------------------------------------------------------------ packing itself
def test_packs_each_sibling_group_into_one_buffer_keeping_objects_names_and_values():
    model = make()
    before = list(model.named_parameters())
    values = {n: p.detach().clone() for n, p in before}
    report = optimus.pack_parameters(model)
    assert [g.names[0] for g in report.packed] == [f"towers.0.{n}" for n in ("linear.weight", "linear.bias", "norm.weight", "norm.bias")]
    assert all(len(g.names) == 5 for g in report.packed) and not report.declined
    after = list(model.named_parameters())
    assert [n for n, _ in after] == [n for n, _ in before]
    assert all(p is q for (_, p), (_, q) in zip(after, before))
    assert all(a is b for a, b in zip(model.parameters(), [p for _, p in before]))
    for n, p in after:
        assert torch.equal(p, values[n]) and type(p) is nn.Parameter and p.is_leaf and p.requires_grad
    for name in ("linear.weight", "linear.bias", "norm.weight", "norm.bias"):
        ps = tower_params(model, name)
        slot = packed_slot(ps)
        assert slot is not None and slot >= ps[0].numel() and (slot * 4) % 16 == 0
    assert packed_slot([model.head.weight, model.head.bias]) is None  # alone: left as it was
    assert model.head.weight.storage_offset() == 0


def test_packing_twice_reports_already_packed_and_changes_nothing():
    model = make()
    optimus.pack_parameters(model)
    storages = [StorageWeakRef(p.untyped_storage()) for p in model.parameters()]
    again = optimus.pack_parameters(model)
    assert not again.newly_packed and len(again.packed) == 4 and all(g.already_packed for g in again.packed)
    assert [StorageWeakRef(p.untyped_storage()) for p in model.parameters()] == storages
    assert "already packed" in str(again)


def test_groups_found_in_parameter_lists_and_nested_repeats():
    class Nested(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)) for _ in range(3))
            self.scales = nn.ParameterList(nn.Parameter(torch.ones(2)) for _ in range(3))

    groups = find_groups(Nested())
    assert ("blocks.0.0.weight", "blocks.1.0.weight", "blocks.2.0.weight") in groups
    assert ("blocks.0.2.bias", "blocks.1.2.bias", "blocks.2.2.bias") in groups
    assert ("scales.0", "scales.1", "scales.2") in groups
    assert len({n for g in groups for n in g}) == sum(len(g) for g in groups)


def test_groups_prefer_the_larger_sibling_set_and_identical_shapes():
    class Round(nn.Module):
        def __init__(self):
            super().__init__()
            self.linears = nn.ModuleList(nn.Linear(4, 4) for _ in range(6))

    class Rounds(nn.Module):  # two sequential rounds of six parallel linears
        def __init__(self):
            super().__init__()
            self.rounds = nn.ModuleList(Round() for _ in range(2))

    groups = find_groups(Rounds())
    assert ("rounds.0.linears.0.weight",) + tuple(f"rounds.0.linears.{i}.weight" for i in range(1, 6)) in groups
    assert all(len(g) == 6 for g in groups) and len(groups) == 4

    class Blocks(nn.Module):  # each block: two square linears; three blocks side by side
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)) for _ in range(3))

    groups = find_groups(Blocks())
    assert ("blocks.0.0.weight", "blocks.1.0.weight", "blocks.2.0.weight") in groups and len(groups) == 4

    class Mixed(nn.Module):  # the outer set has different shapes; the inner pairs are identical
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(d, d), nn.Linear(d, d)) for d in (2, 3, 4))

    groups = find_groups(Mixed())
    assert ("blocks.1.0.weight", "blocks.1.1.weight") in groups and len(groups) == 6


def test_explicit_groups_and_unknown_names():
    model = make()
    report = optimus.pack_parameters(model, groups=[[f"towers.{i}.linear.weight" for i in (3, 1, 0)]])
    assert len(report.packed) == 1 and report.packed[0].names == ("towers.3.linear.weight", "towers.1.linear.weight", "towers.0.linear.weight")
    ws = [model.towers[i].linear.weight for i in (3, 1, 0)]
    assert packed_slot(ws) is not None
    with pytest.raises(KeyError, match="no parameter named"):
        optimus.pack_parameters(model, groups=[["towers.0.nope", "towers.1.nope"]])


def test_unpack_gives_each_parameter_its_own_storage_again():
    model = make()
    ref = make()
    optimus.pack_parameters(model)
    moved = optimus.unpack_parameters(model)
    assert len(moved) == 20
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q) and p.storage_offset() == 0 and p.untyped_storage().nbytes() == p.numel() * 4, n
    assert optimus.unpack_parameters(model) == []


# ------------------------------------------------------------------ declines
def _declined(report, fragment):
    return [d for d in report.declined if fragment in d.reason]


def test_declines_shared_between_members():
    model = make()
    model.towers[2].linear.weight = model.towers[0].linear.weight  # tied
    report = optimus.pack_parameters(model)
    (d,) = _declined(report, "one shared parameter")
    assert d.names[0] == "towers.0.linear.weight"
    assert model.towers[0].linear.weight.storage_offset() == 0  # untouched
    assert len(report.packed) == 3  # the other groups still pack


def test_declines_parameter_used_elsewhere():
    model = make()
    model.extra = model.towers[1].norm.bias  # the same Parameter registered a second time
    report = optimus.pack_parameters(model)
    (d,) = _declined(report, "also used elsewhere")
    assert "towers.1.norm.bias" in d.reason and "extra" in d.reason


def test_declines_frozen_mixed_with_trainable_but_packs_all_frozen():
    model = make()
    model.towers[3].linear.weight.requires_grad_(False)
    for t in model.towers:
        t.norm.weight.requires_grad_(False)
    report = optimus.pack_parameters(model)
    (d,) = _declined(report, "frozen and trainable")
    assert "towers.3.linear.weight" in d.reason
    assert any(g.names[0] == "towers.0.norm.weight" for g in report.packed)
    assert all(not p.requires_grad for p in tower_params(model, "norm.weight"))


def test_declines_mismatched_dtype_device_and_layout_and_concatenates_different_shapes():
    model = make()
    model.towers[1].linear.double()
    model.towers[2].norm.to("meta")
    report = optimus.pack_parameters(model)
    assert len(_declined(report, "dtypes differ")) == 2  # weight and bias of towers.1.linear
    assert len(_declined(report, "devices differ")) == 2
    assert not report.packed

    odd = make()
    odd.towers[4].linear.weight = nn.Parameter(torch.randn(6, 3).t())
    report = optimus.pack_parameters(odd)
    assert _declined(report, "towers.4.linear.weight is not contiguous")

    view = make()
    base = torch.randn(100)
    view.towers[0].norm.bias = nn.Parameter(base[10:13])
    assert _declined(optimus.pack_parameters(view), "shares its storage")

    class Hetero(nn.Module):
        def __init__(self):
            super().__init__()
            self.lins = nn.ModuleList([nn.Linear(4, 3), nn.Linear(5, 3)])

    hetero = Hetero()
    values = [p.detach().clone() for p in hetero.parameters()]
    report = optimus.pack_parameters(hetero)
    layouts = {g.names[0]: g.layout for g in report.packed}
    assert not report.declined and layouts == {"lins.0.weight": "concatenated", "lins.0.bias": "stacked"}, report
    w0, w1 = hetero.lins[0].weight, hetero.lins[1].weight
    # one buffer, laid out as cat([w.reshape(-1) for w in ws]), values unchanged
    assert StorageWeakRef(w0.untyped_storage()) == StorageWeakRef(w1.untyped_storage())
    assert w1.storage_offset() == w0.storage_offset() + w0.numel()
    assert all(torch.equal(a, b) for a, b in zip(hetero.parameters(), values))
    again = optimus.pack_parameters(hetero)
    assert all(g.already_packed for g in again.packed) and not again.newly_packed
    assert "of different shapes, concatenated" in str(report)


# ------------------------------------------------------------------ state_dict, checkpoints
def test_state_dict_keys_values_and_checkpoint_round_trips():
    model, ref = make(), make()
    optimus.pack_parameters(model)
    sd, sd_ref = model.state_dict(), ref.state_dict()
    assert list(sd) == list(sd_ref)
    assert all(torch.equal(sd[k], sd_ref[k]) for k in sd)

    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert all(torch.equal(loaded[k], sd_ref[k]) and loaded[k].shape == sd_ref[k].shape for k in sd_ref)

    # into an unpacked model
    plain = make(seed=7)
    plain.load_state_dict(loaded)
    assert all(torch.equal(p, q) for p, q in zip(plain.parameters(), ref.parameters()))

    # into a packed model with other values: copied in place, the packing stays
    other = make(seed=7)
    optimus.pack_parameters(other)
    storages = [StorageWeakRef(p.untyped_storage()) for p in other.parameters()]
    ids = [id(p) for p in other.parameters()]
    other.load_state_dict(loaded)
    assert [id(p) for p in other.parameters()] == ids
    assert [StorageWeakRef(p.untyped_storage()) for p in other.parameters()] == storages
    assert packed_slot(tower_params(other, "linear.weight")) is not None
    assert all(torch.equal(p, q) for p, q in zip(other.parameters(), ref.parameters()))


def test_safetensors_save_file_round_trip():
    st = pytest.importorskip("safetensors.torch")
    import tempfile

    model, ref = make(), make(seed=3)
    optimus.pack_parameters(model)
    optimus.pack_parameters(ref)
    with tempfile.TemporaryDirectory() as d:
        st.save_file(model.state_dict(), f"{d}/m.safetensors")
        ref.load_state_dict(st.load_file(f"{d}/m.safetensors"))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))
    assert packed_slot(tower_params(ref, "linear.weight")) is not None


def test_whole_model_pickle_keeps_the_packing_and_deepcopy_gives_an_unpacked_equal_copy():
    model = make()
    optimus.pack_parameters(model)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert packed_slot(tower_params(loaded, "linear.weight")) is not None
    assert all(torch.equal(p, q) for p, q in zip(loaded.parameters(), model.parameters()))

    clone = copy.deepcopy(model)
    assert all(torch.equal(p, q) and p is not q for p, q in zip(clone.parameters(), model.parameters()))
    assert packed_slot(tower_params(clone, "linear.weight")) is None  # Parameter.__deepcopy__ clones
    assert packed_slot(tower_params(model, "linear.weight")) is not None
    assert len(optimus.pack_parameters(clone).newly_packed) == 4
    x = inputs()
    assert torch.equal(clone(x), model(x))


# ------------------------------------------------------------------ training
def _fused_adam_supported() -> bool:
    p = nn.Parameter(torch.ones(2))
    p.grad = torch.ones(2)
    try:
        torch.optim.Adam([p], fused=True).step()
    except (RuntimeError, ValueError):
        return False
    return True


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam_foreach": lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True),
    "adam_for_loop": lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=False),
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=True),
    "adam_fused": lambda ps: torch.optim.Adam(ps, lr=0.01, fused=True),
}
OPTIMIZER_CASES = [
    pytest.param(n, marks=pytest.mark.skipif(not _fused_adam_supported(), reason="fused Adam not supported by this build on CPU"))
    if n == "adam_fused" else n
    for n in OPTIMIZERS
]


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, set_to_none: bool) -> list[torch.Tensor]:
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        loss = model(inputs(seed=step)).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("name", OPTIMIZER_CASES)
def test_training_steps_equal_an_unpacked_copy_bit_for_bit(name, set_to_none):
    make_opt = OPTIMIZERS[name]
    model, ref = make(), make()
    opt_ref = make_opt(list(ref.parameters()))
    opt = make_opt(list(model.parameters()))  # built before packing: it holds the same objects
    optimus.pack_parameters(model)
    losses, losses_ref = _train(model, opt, 4, set_to_none), _train(ref, opt_ref, 4, set_to_none)
    assert all(torch.equal(a, b) for a, b in zip(losses, losses_ref))
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), n
        assert torch.equal(p.grad, q.grad), n
    assert packed_slot(tower_params(model, "linear.weight")) is not None  # steps wrote in place
    opt.zero_grad(set_to_none=set_to_none)
    for p in model.parameters():
        assert (p.grad is None) if set_to_none else torch.equal(p.grad, torch.zeros_like(p))


def test_gradients_reach_every_member_with_a_frozen_group():
    model, ref = make(), make()
    for m in (model, ref):
        for t in m.towers:
            t.norm.requires_grad_(False)
    optimus.pack_parameters(model)
    model(inputs()).sum().backward()
    ref(inputs()).sum().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad)), n


# ------------------------------------------------------------------ optimus.compile
def test_compile_with_pack_parameters_records_it_reads_weights_in_place_and_matches_eager():
    """One compile of a packed model: the report says what was packed; the batched linear
    read the weights and biases through views of their buffers (no stack); outputs and
    gradients equal eager's; the weight gradients are rows of one buffer in the
    parameters' strides (AccumulateGrad kept them, no copy)."""
    model, ref = make(), make()
    stats = _packed_op_stats()
    before = dict(stats)
    compiled = optimus.compile(model, pack_parameters=True)
    notes = compiled.optimus_report.notes
    assert any(n.startswith("pack_parameters: packed 4 group(s), 20 parameters") for n in notes), notes
    assert packed_slot(tower_params(model, "linear.weight")) is not None
    x = inputs()
    out, out_ref = compiled(x), ref(x)
    assert stats["weight_view"] == before.get("weight_view", 0) + 1 and stats["bias_view"] == before.get("bias_view", 0) + 1
    assert stats["weight_stack"] == before.get("weight_stack", 0)
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
    out.square().sum().backward()
    out_ref.square().sum().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
        assert p.grad.stride() == p.stride(), n
    grads = tower_params(model, "linear.weight")
    assert len({StorageWeakRef(p.grad.untyped_storage()) for p in grads}) == 1

    # training steps on those gradients (kept between steps: zero_grad(set_to_none=False))
    opt, opt_ref = (torch.optim.Adam(m.parameters(), lr=0.01, foreach=True) for m in (model, ref))
    for step in range(3):
        opt.step()
        opt_ref.step()
        opt.zero_grad(set_to_none=False)
        opt_ref.zero_grad(set_to_none=False)
        compiled(inputs(seed=step)).square().sum().backward()
        ref(inputs(seed=step)).square().sum().backward()
    assert packed_slot(tower_params(model, "linear.weight")) is not None
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=n)
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)


class HeteroTowers(nn.Module):
    """Towers of distinct widths over the features of one input (the zoo's hetero_towers, small)."""

    def __init__(self, d_in=(3, 5, 7, 4, 6), d_out=(4, 6, 3, 8, 5)) -> None:
        super().__init__()
        self.d_in = list(d_in)
        self.towers = nn.ModuleList(Tower(i, o) for i, o in zip(d_in, d_out))
        self.head = nn.Linear(sum(d_out), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        merged = torch.cat([t(f) for t, f in zip(self.towers, x.split(self.d_in, 1))], 1)
        return self.head(merged).squeeze(-1)


def test_compile_packs_towers_of_different_widths_and_the_grouped_ops_read_them_in_place():
    """Towers of distinct widths: their parameters are packed concatenated, the grouped
    kernels' parameter-list ops read every list in place (no copy), and outputs, gradients
    and optimizer steps equal an unpacked eager copy."""
    from optimus.kernels.runtime import params as param_ops

    torch.manual_seed(0)
    model = HeteroTowers()
    ref = copy.deepcopy(model)
    compiled = optimus.compile(model, pack_parameters=True)
    notes = compiled.optimus_report.notes
    assert any(n.startswith("pack_parameters: packed 4 group(s), 20 parameters") for n in notes), notes
    param_ops.STATS.clear()
    x = torch.randn(6, sum(model.d_in))
    out, out_ref = compiled(x), ref(x)
    assert param_ops.STATS["weight_view"] == 1 and param_ops.STATS["bias_view"] == 1, param_ops.STATS
    assert param_ops.STATS["norm_weight_view"] == 1 and param_ops.STATS["norm_bias_view"] == 1, param_ops.STATS
    assert not any(k.endswith("_cat") for k in param_ops.STATS), param_ops.STATS
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
    opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, ref))
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        xb = torch.randn(6, sum(model.d_in), generator=g)
        compiled(xb).square().sum().backward()
        ref(xb).square().sum().backward()
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
        opt.step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=n)
    w = [t.linear.weight for t in model.towers]
    assert all(b.storage_offset() == a.storage_offset() + a.numel() for a, b in zip(w, w[1:]))


def test_compile_pack_parameters_option_checks():
    with pytest.raises(TypeError, match="pack_parameters must be a bool"):
        optimus.compile(make(), pack_parameters="yes")
    compiled = optimus.compile(lambda x: x + 1, pack_parameters=True)
    assert any("not an nn.Module; nothing packed" in n for n in compiled.optimus_report.notes)


# ------------------------------------------------------------------ packing by default
class _OnCuda(nn.Module):
    """A module whose parameters say they are on CUDA (without a GPU): pack_by_default's
    one CUDA-only condition."""

    def parameters(self, recurse: bool = True):
        yield types.SimpleNamespace(device=torch.device("cuda"))


@pytest.mark.parametrize("planned, cudagraphs, expected", [
    (False, False, True), (True, False, False), (False, True, False), (True, True, False),
])
def test_pack_by_default_where_measured_to_pay(planned, cudagraphs, expected):
    """A fixed preset on CUDA without CUDA graphs packs; the planner and CUDA graphs do not,
    and each no says why (docs/packing.md)."""
    pack, why = pack_by_default(_OnCuda(), planned=planned, cudagraphs=cudagraphs)
    assert pack is expected
    if cudagraphs:
        assert "under CUDA graphs" in why
    elif planned:
        assert "passes='auto'" in why
    else:
        assert why.startswith("on by default")


def test_pack_by_default_declines_when_no_rule_reads_packed_parameters():
    pack, why = pack_by_default(_OnCuda(), planned=False, cudagraphs=False, torch_ir_rules=("split_cat",))
    assert not pack and "none of the rules that read packed parameters runs" in why
    compiled = optimus.compile(make(), passes="vertical")
    assert any("none of the rules that read packed parameters runs" in n for n in compiled.optimus_report.notes)


def test_pack_by_default_declines_the_cpu_and_non_modules():
    assert pack_by_default(make(), planned=False, cudagraphs=False) == (
        False, "not by default on cpu: packing was measured to pay on CUDA only")
    assert pack_by_default(lambda x: x, planned=False, cudagraphs=False)[0] is False


def test_compile_default_on_the_cpu_leaves_storage_alone_and_says_why():
    model = make()
    before = [p.data_ptr() for p in model.parameters()]
    compiled = optimus.compile(model, passes="all")  # a fixed preset: packing's own default
    x = inputs()
    torch.testing.assert_close(compiled(x), make()(x))
    assert [p.data_ptr() for p in model.parameters()] == before
    assert "pack_parameters: not by default on cpu: packing was measured to pay on CUDA only" in compiled.optimus_report.notes
    compiled = optimus.compile(make(), passes="all", mode="reduce-overhead")
    assert any("not by default under CUDA graphs" in n for n in compiled.optimus_report.notes)
    compiled = optimus.compile(make())  # the default passes, "auto"
    assert f"pack_parameters: {NOT_BY_DEFAULT_PLANNED}" in compiled.optimus_report.notes


def test_compile_explicit_false_packs_nothing_and_adds_no_note():
    model = make()
    compiled = optimus.compile(model, pack_parameters=False)
    assert not any(n.startswith("pack_parameters") for n in compiled.optimus_report.notes)
    assert all(p.storage_offset() == 0 and p.untyped_storage().nbytes() == p.numel() * p.element_size() for p in model.parameters())


def test_nothing_under_fsdp_is_packed(monkeypatch):
    """FSDP resizes its flat parameters' storage: a model with an FSDP module anywhere packs
    nothing, each group declined with the reason (a stand-in type: FSDP1 needs a process group)."""
    import optimus.distributed as distributed

    class StandInFSDP(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    monkeypatch.setattr(distributed, "fsdp_types", lambda: (StandInFSDP,))
    model = make()
    model.towers[0] = StandInFSDP(model.towers[0])
    model.towers[1] = StandInFSDP(model.towers[1])
    report = optimus.pack_parameters(model)
    assert not report.packed and report.declined
    assert all("FSDP manages these parameters' storage (StandInFSDP at towers.0)" in d.reason for d in report.declined)
    assert all(p.storage_offset() == 0 for p in model.parameters())


def test_a_failing_pack_is_reported_and_the_compile_goes_on(monkeypatch):
    """Whatever raises while packing, the model compiles and computes as before."""
    import optimus.packing as packing

    def boom(model):
        raise RuntimeError("injected")

    monkeypatch.setattr(packing, "pack_parameters", boom)
    model, ref = make(), make()
    compiled = optimus.compile(model, pack_parameters=True)
    x = inputs()
    torch.testing.assert_close(compiled(x), ref(x))
    assert any(n.startswith("pack_parameters failed (RuntimeError: injected)") for n in compiled.optimus_report.notes)


# ------------------------------------------------------------------ the free stack: optimus::packed_linear
def _packed_op_stats():
    from optimus.kernels.packed_linear import op as packed_ops

    return packed_ops.STATS


def _slots(g: int, shape: tuple[int, ...], slot: int, requires_grad: bool = True) -> list[nn.Parameter]:
    numel = int(torch.tensor(shape).prod())
    buf = torch.randn((g - 1) * slot + numel)
    params = []
    for i in range(g):
        p = nn.Parameter(torch.empty(0), requires_grad=requires_grad)
        p.data = buf[i * slot : i * slot + numel].view(shape)
        params.append(p)
    return params


@pytest.mark.parametrize("layout", ["packed", "padded", "separate", "reversed", "shared", "overlapping"])
def test_packed_linear_op_equals_baddbmm_on_every_layout(layout):
    from optimus.kernels.packed_linear.op import _strided_stack

    g, m, k, n = 4, 3, 5, 2
    torch.manual_seed(0)
    ws = {
        "packed": lambda: _slots(g, (n, k), n * k),
        "padded": lambda: _slots(g, (n, k), 12),
        "separate": lambda: [nn.Parameter(torch.randn(n, k)) for _ in range(g)],
        "reversed": lambda: _slots(g, (n, k), n * k)[::-1],
        "shared": lambda: [nn.Parameter(torch.randn(n, k))] * g,
        "overlapping": lambda: _slots(g, (n, k), 4),  # slot < numel: members overlap
    }[layout]()
    bs = _slots(g, (n,), 4)
    assert (_strided_stack(ws) is not None) == (layout in ("packed", "padded"))
    x = torch.randn(g, m, k, requires_grad=True)
    before = dict(_packed_op_stats())
    y = torch.ops.optimus.packed_linear(x, ws, bs)
    path = "weight_view" if layout in ("packed", "padded") else "weight_stack"
    assert _packed_op_stats()[path] == before.get(path, 0) + 1
    xr = x.detach().clone().requires_grad_()
    wr = [w.detach().clone().requires_grad_() for w in dict.fromkeys(ws)]  # one leaf per distinct parameter
    index = {id(w): i for i, w in enumerate(dict.fromkeys(ws))}
    br = [b.detach().clone().requires_grad_() for b in bs]
    ref = torch.baddbmm(torch.stack(br)[:, None], xr, torch.stack([wr[index[id(w)]] for w in ws]).mT)
    assert torch.equal(y, ref)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref.backward(dy)
    torch.testing.assert_close(x.grad, xr.grad)
    for w in dict.fromkeys(ws):
        torch.testing.assert_close(w.grad, wr[index[id(w)]].grad)  # shared: both members' gradients summed
        assert w.grad.stride() == w.stride()
    for b, r in zip(bs, br):
        torch.testing.assert_close(b.grad, r.grad)


def test_packed_linear_op_frozen_members_no_bias_and_opcheck():
    ws = _slots(3, (2, 4), 8)
    ws[1].requires_grad_(False)
    x = torch.randn(3, 5, 4)
    y = torch.ops.optimus.packed_linear(x, ws, [])
    assert torch.equal(y, torch.bmm(x, torch.stack(ws).mT))
    y.sum().backward()
    assert ws[1].grad is None and ws[0].grad is not None
    torch.testing.assert_close(ws[2].grad, torch.ones(5, 2).T @ x[2])
    # the weight gradients are rows of one buffer, in the parameters' strides
    assert ws[0].grad.stride() == (4, 1) and StorageWeakRef(ws[0].grad.untyped_storage()) == StorageWeakRef(ws[2].grad.untyped_storage())
    args = (torch.randn(3, 5, 4, requires_grad=True), [w.detach().requires_grad_() for w in ws], [torch.randn(2, requires_grad=True) for _ in ws])
    torch.library.opcheck(torch.ops.optimus.packed_linear.default, args)
    torch.library.opcheck(torch.ops.optimus.packed_linear.default, (args[0], args[1], []))
    bad = [ws[0], torch.randn(3, 4), ws[2]]
    with pytest.raises(RuntimeError):  # not a packed view: the stack refuses the odd member
        torch.ops.optimus.packed_linear(x, bad, [])
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    fakes = [mode.from_tensor(t.detach()) for t in [x] + bad]
    with mode, pytest.raises(ValueError, match="weight 1 is"):  # traced: the fake implementation names it
        torch.ops.optimus.packed_linear(fakes[0], fakes[1:], [])


class Heads(nn.Module):
    """Five linears on the five features, FX-traceable (``symbolic_trace``: parameters as get_attr)."""

    def __init__(self) -> None:
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(6, 3) for _ in range(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([lin(x[:, i]) for i, lin in enumerate(self.lins)], 1)


def test_batch_linear_emits_packed_linear_only_for_packed_weights():
    def rewritten(model):
        gm = torch.fx.symbolic_trace(model)
        optimus.optimize(gm, passes="all", example_inputs=[inputs()])
        ops = [n for n in gm.graph.nodes if n.op == "call_function"]
        return [n for n in ops if "packed_linear" in str(n.target)], [n for n in ops if n.target in (torch.stack, torch.cat)], gm

    torch.manual_seed(0)
    plain = Heads()
    found, stacks, _ = rewritten(plain)
    assert not found and any(a.op == "get_attr" for s in stacks for a in s.args[0])  # the weights are stacked
    packed = copy.deepcopy(plain)
    optimus.pack_parameters(packed)
    found, stacks, gm = rewritten(packed)
    assert len(found) == 1
    assert not any(a.op == "get_attr" for s in stacks for a in s.args[0])  # no stack of weights or biases
    x = inputs()
    torch.testing.assert_close(gm(x), plain(x))


def test_under_cuda_graphs_packed_weights_are_stacked_as_before():
    """optimus::packed_linear is not faster under CUDA graphs (docs/packing.md): with Inductor's
    triton.cudagraphs the session turns batch_linear's packed_weights option off."""
    from optimus.core.registry import resolve

    oc = importlib.import_module("optimus.compile")
    session = oc.Session(resolve("all"))
    config = session._without_capture_unsafe_rules(session.base_config, {"triton.cudagraphs": True})
    assert config.options[("torch_ir", "batch_linear")]["packed_weights"] is False
    torch.manual_seed(0)
    packed = Heads()
    optimus.pack_parameters(packed)
    gm = torch.fx.symbolic_trace(packed)
    optimus.optimize(gm, passes=config, example_inputs=[inputs()])
    assert not [n for n in gm.graph.nodes if n.op == "call_function" and "packed_linear" in str(n.target)]
    assert gm.meta["optimus_report"].graphs[0].rules["batch_linear"].matched == 1
    x = inputs()
    torch.testing.assert_close(gm(x), packed(x))


class TowersWithTiedUse(Towers):
    """A packed weight also read elsewhere in the forward (a second use outside the group)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        side = (x[:, 0] @ self.towers[0].linear.weight.T).sum(-1)
        return super().forward(x) + side


def test_compiled_packed_group_with_a_frozen_member_and_a_weight_used_elsewhere_gets_right_gradients():
    torch.manual_seed(0)
    model = TowersWithTiedUse()
    ref = copy.deepcopy(model)
    optimus.pack_parameters(model)
    for m in (model, ref):  # frozen after packing: the group lies packed with one frozen member
        m.towers[2].linear.weight.requires_grad_(False)
    stats = _packed_op_stats()
    before = stats["weight_view"]
    compiled = optimus.compile(model)
    x = inputs()
    out, out_ref = compiled(x), ref(x)
    assert stats["weight_view"] == before + 1
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
    out.square().sum().backward()
    out_ref.square().sum().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert (p.grad is None) == (q.grad is None), n
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
    assert model.towers[2].linear.weight.grad is None


def test_packed_weights_with_a_long_weight_gradient_keep_the_stacked_form():
    """Many rows per member: the weight gradient is a long reduction, which Aten-IR
    unbatches per member outside the op (unbatch_long_reduction_bmm); so no packed_linear."""
    from optimus.rules.horizontal import LONG_REDUCTION

    def rewritten(model, rows):
        gm = torch.fx.symbolic_trace(model)
        optimus.optimize(gm, passes="all", example_inputs=[torch.randn(rows, 5, 6)])
        return [n for n in gm.graph.nodes if n.op == "call_function" and "packed_linear" in str(n.target)]

    torch.manual_seed(0)
    model = Heads()
    optimus.pack_parameters(model)
    assert len(rewritten(model, 8)) == 1
    assert not rewritten(model, LONG_REDUCTION)
    model.requires_grad_(False)  # no weight gradient: nothing to unbatch
    assert len(rewritten(model, LONG_REDUCTION)) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_default_compile_on_the_gpu_packs_without_cuda_graphs_only(mode):
    model, ref = make().cuda(), make().cuda()
    compiled = optimus.compile(model, passes="all", mode=mode)  # packing by default goes with a fixed preset
    x = inputs().cuda()
    torch.testing.assert_close(compiled(x), ref(x), rtol=1e-4, atol=1e-5)
    w = [t.linear.weight for t in model.towers]
    shared = len({StorageWeakRef(p.untyped_storage()) for p in w}) == 1
    assert shared is (mode is None), compiled.optimus_report.notes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_packed_model_on_the_gpu_with_and_without_cuda_graphs(mode):
    """The view path on CUDA; under CUDA graphs, where ``batch_linear`` stacks packed weights
    (its ``cudagraph_options``), the packed model trains as eager does.

    Under CUDA graphs each step starts with ``cudagraph_mark_step_begin`` and the gradients are
    compared and dropped per step: a replay reuses the graph's memory, so a gradient kept from
    an earlier replay (as ``.grad`` accumulation would) is overwritten (CUDA graphs raise
    "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run")."""
    model, ref = make().cuda(), make().cuda()
    stats = _packed_op_stats()
    before, stacked_before = stats["weight_view"], stats["weight_stack"]
    compiled = optimus.compile(model, pack_parameters=True, mode=mode)
    for step in range(3):
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        x = inputs(seed=step).cuda()
        out, out_ref = compiled(x), ref(x)
        torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-5)
        out.square().sum().backward()
        out_ref.square().sum().backward()
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
            p.grad = q.grad = None
    # under CUDA graphs batch_linear stacks packed weights (its cudagraph_options), unless
    # OPTIMUS_CUDAGRAPH_KERNELS=1 keeps packed_linear on to run it under capture
    if mode is None or os.environ.get(CUDAGRAPH_KERNELS_ENV) == "1":
        assert stats["weight_view"] > before and stats["weight_stack"] == stacked_before
