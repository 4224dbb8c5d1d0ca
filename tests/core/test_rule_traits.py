"""Rule traits: what the compile, the packing and the planner know of a rule is declared on
the rule and read through the registry, so a rule of a user's gets the same policy as a
built-in one with the same trait, and renaming a rule keeps its policy."""

from __future__ import annotations

import importlib

import pytest
import torch

from optimus import Op, Var
from optimus.core.group import group_rule
from optimus.core.registry import REGISTRY, resolve
from optimus.core.rule import rule
from optimus.inductor_ir.rule import fusion_rule
from optimus.packing import pack_by_default, packed_readers
from optimus.planner.plan import Context, Planner

oc = importlib.import_module("optimus.compile")  # the module; ``optimus.compile`` is the function


def test_the_builtin_traits():
    traits = {}
    for r in REGISTRY.rules():
        found = [t for t in ("reads_packed_parameters", "saves_only_launches", "memory_bounded") if getattr(r, t)]
        found += [] if r.cudagraph_safe else ["not cudagraph_safe"]
        found += [f"cudagraph_options {r.cudagraph_options}"] if r.cudagraph_options else []
        if found and r.replace.__module__.startswith("optimus.rules."):
            traits[r.name] = found
    assert traits == {
        "group_embedding_lookups": ["not cudagraph_safe"],
        "batch_linear": ["reads_packed_parameters", "cudagraph_options {'torch_ir': {'packed_weights': False}}"],
        "grouped_linear": ["reads_packed_parameters"],
        "batched_layer_norm": ["reads_packed_parameters"],
        "fuse_independent_kernels": ["memory_bounded"],
        "combo_small_kernels": ["saves_only_launches", "memory_bounded"],
    }


def test_cudagraph_options_are_checked_where_the_rule_is_defined():
    with pytest.raises(ValueError, match="cudagraph_options for 'inductor_ir', where it does not run"):
        rule(Op("relu", Var("x")), options={"on": True}, cudagraph_options={"inductor_ir": {"on": False}}, register=False)(lambda m, b: m.x)
    with pytest.raises(ValueError, match="has no option 'off'"):
        rule(Op("relu", Var("x")), options={"on": True}, cudagraph_options={"torch_ir": {"off": False}}, register=False)(lambda m, b: m.x)
    with pytest.raises(TypeError, match="must be bool"):
        rule(Op("relu", Var("x")), options={"on": True}, cudagraph_options={"torch_ir": {"on": 3}}, register=False)(lambda m, b: m.x)


@pytest.fixture
def user_rules():
    made = []

    def add(r):
        made.append(r.name)
        return r

    yield add
    for name in made:
        REGISTRY.remove(name)


def test_a_users_rule_gets_the_policy_of_its_traits(user_rules, monkeypatch):
    """Not safe under capture: left out under CUDA graphs; options under CUDA graphs taken
    there; reads packed parameters: packing by default sees it."""
    monkeypatch.delenv(oc.CUDAGRAPH_KERNELS_ENV, raising=False)
    unsafe = user_rules(rule(Op("relu", Op("relu", Var("x"))), name="test_trait_unsafe", cudagraph_safe=False)(lambda m, b: b.relu(m.x)))
    reader = user_rules(group_rule("tanh", key=lambda c, v: 1, name="test_trait_reader", options={"flag": True},
                                   reads_packed_parameters=True, cudagraph_options={"torch_ir": {"flag": False}})(lambda g, b: {}))
    session = oc.Session(resolve("all"))
    config = session._without_capture_unsafe_rules(session.base_config, {"triton.cudagraphs": True})
    names = {n for lv in config.rules.values() for n in lv}
    assert unsafe.name not in names and reader.name in names
    assert any("CUDA graphs:" in n and unsafe.name in n for n in session.report.notes)
    assert config.options[("torch_ir", reader.name)] == {"flag": False}
    assert ("aten_ir", reader.name) not in config.options  # per level, as declared
    assert reader.name in packed_readers()
    pack, why = pack_by_default(torch.nn.Linear(2, 2), planned=False, cudagraphs=False, torch_ir_rules=[reader.name])
    assert "none of the rules that read packed parameters" not in why


def test_the_planner_reads_the_launch_and_memory_traits(user_rules):
    combo = user_rules(fusion_rule(Op("pointwise"), name="test_trait_launches", pairing="combo", saves_only_launches=True,
                                   options={"memory_increase": None})(lambda m, b: b.combo(m.group, m.candidate)))
    assert combo.memory_bounded
    planner = Planner(Context("cuda", cudagraphs=True))
    rules, notes = planner.configure(resolve("all").rules)
    assert combo.name not in rules["inductor_ir"] and "combo_small_kernels" not in rules["inductor_ir"]
    assert any(combo.name in n and "only saves launches" in n for n in notes)
    options = planner.rule_options({})
    assert options[("inductor_ir", combo.name)] == {"memory_increase": planner.memory_increase}
    assert options[("inductor_ir", "fuse_independent_kernels")] == {"memory_increase": planner.memory_increase}
    assert ("inductor_ir", "fuse_producer_consumer") not in options  # no memory_increase option: unbounded
