"""group_embedding_lookups under torch.compile(dynamic=True): bag lengths L are symbols.

DLRM's index tensors are [B, L]; under ``dynamic=True`` both B and L are symbolic. The rule
passes a symbolic L to the grouped op's ``SymInt[] bag_sizes`` as a graph value
(``aten.sym_size.int(indices, 1)`` at Torch-IR, the iota step at Aten-IR) and adds no guard.
Each test compiles the same model with and without the rule (same backend otherwise), runs
it at two batch sizes and two bag lengths, and checks: one grouped op took every table, the
outputs and table gradients equal the unoptimized compile's, both compiled as often (once),
and the rewrite added no guard (the optimized compile's guards are among the unoptimized
one's; with the dims also ``mark_dynamic``, a specialization would raise).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.fx as fx
import torch.nn as nn

import optimus

RULE = "group_embedding_lookups"
F64 = torch.float64
GROUPED = torch.ops.optimus.grouped_embedding_bag.default


class DlrmLookups(nn.Module):
    """DLRM's sparse arch with two bag lengths: features 0-2 slice one [B, 3, L] id tensor
    (DLRM's layout), feature 3 has its own [B, L2] ids; tables of different sizes and dims,
    sum and mean; the pooled outputs are concatenated and feed a dense layer."""

    def __init__(self) -> None:
        super().__init__()
        specs = [(13, 4, "sum"), (7, 3, "mean"), (11, 5, "sum"), (9, 2, "mean")]
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, d, mode=m) for n, d, m in specs)
        self.top = nn.Linear(sum(d for _, d, _ in specs), 3)
        torch.manual_seed(0)
        for p in self.parameters():
            nn.init.normal_(p)
        self.to(F64)

    def forward(self, shared: torch.Tensor, own: torch.Tensor | None = None) -> torch.Tensor:
        if own is None:  # one id tensor: feature 3 reads all of a row's ids, a bag of 3 * L
            own = shared.flatten(1)
        pooled = [t(shared[:, i]) for i, t in enumerate(self.tables[:3])] + [self.tables[3](own)]
        return self.top(torch.cat(pooled, 1)).relu()


def dlrm_inputs(batch: int, bag: int, bag2: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(batch * 100 + bag * 10 + bag2)
    return torch.randint(0, 7, (batch, 3, bag), generator=g), torch.randint(0, 9, (batch, bag2), generator=g)


# (B, L, L2) of the two calls: no size equal to another in the first (duck sizing would make
# them one symbol), every size changed in the second
SIZES = [(5, 4, 6), (8, 2, 3)]


class Compiled:
    """``model`` under ``torch.compile(dynamic=True, fullgraph=True)``, rewritten at ``level``
    (``rules``: the rules that run, [] for the unoptimized compile); keeps every frame's
    rewritten graphs, reports and shape environment."""

    def __init__(self, model: nn.Module, level: str, rules: list[str]) -> None:
        self.backend_calls = 0  # Dynamo's Tensorify restart (EmbeddingBag's norm_type) calls twice
        self.recompiles = 0  # backend calls after the first sizes' compile
        self.graphs: list[fx.GraphModule] = []
        self.reports: list[Any] = []
        self.envs: list[Any] = []
        self.fn = torch.compile(model, backend=self._backend(level, rules), dynamic=True, fullgraph=True)

    def _rewrite(self, gm: fx.GraphModule, level: str, rules: list[str]) -> fx.GraphModule:
        if rules:
            optimus.optimize(gm, passes=rules, level=level)
            self.reports.append(optimus.last_report())
        self.graphs.append(gm)
        return gm

    def _backend(self, level: str, rules: list[str]) -> Callable[..., Any]:
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        def boxed(gm: fx.GraphModule, example_inputs: Any) -> Any:
            return make_boxed_func(gm.forward)

        def aten(gm: fx.GraphModule, example_inputs: Any) -> Any:
            return make_boxed_func(self._rewrite(gm, "aten_ir", rules).forward)

        if level == "torch_ir":
            after = aot_autograd(fw_compiler=boxed, bw_compiler=boxed)
        else:
            from torch._inductor.decomposition import select_decomp_table

            after = aot_autograd(fw_compiler=aten, bw_compiler=aten, decompositions=select_decomp_table())

        def backend(gm: fx.GraphModule, example_inputs: Any) -> Any:
            self.backend_calls += 1
            fake = next(v for v in (n.meta.get("example_value") for n in gm.graph.nodes) if isinstance(v, torch.Tensor))
            self.envs.append(fake.fake_mode.shape_env)
            if level == "torch_ir":
                gm = self._rewrite(gm, "torch_ir", rules)
            return after(gm, example_inputs)

        return backend

    def guards(self) -> set[str]:
        return {str(g.expr) for env in self.envs for g in env.guards}

    def matched(self) -> list[int]:
        """The rule's matches in each rewritten graph."""
        return [sum(g.rules[RULE].matched for g in r.graphs if RULE in g.rules) for r in self.reports]

    def declines(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.reports:
            for g in r.graphs:
                for reason, n in (g.rules[RULE].declined.items() if RULE in g.rules else ()):
                    out[reason] = out.get(reason, 0) + n
        return out


def step(model: Any, params: list[nn.Parameter], inputs: tuple[torch.Tensor, ...], training: bool) -> list[torch.Tensor]:
    if not training:
        with torch.no_grad():
            return [model(*inputs)]
    out = model(*inputs)
    g = torch.Generator().manual_seed(1)
    loss = (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum()
    return [out.detach(), *torch.autograd.grad(loss, params)]


def grouped_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is GROUPED]


def run_both(level: str, training: bool, mark_dynamic: bool = False) -> tuple[Compiled, Compiled]:
    """The model compiled with and without the rule at ``level``, both run at ``SIZES``;
    asserts equal results at every size (outputs, and in training every parameter's
    gradient) and returns both compiles."""
    compiles = []
    results = []
    for rules in ([RULE], []):
        torch._dynamo.reset()
        model = DlrmLookups().train(training)
        if not training:
            model.requires_grad_(False)
        c = Compiled(model, level, rules)
        got = []
        for sizes in SIZES:
            inputs = dlrm_inputs(*sizes)
            if mark_dynamic:
                # one id tensor (two marked batch dims would be two symbols, whose equality
                # Dynamo guards only in the form ceil(B*L / L) == ceil(B'*L' / L'))
                inputs = inputs[:1]
                if sizes is SIZES[0]:
                    torch._dynamo.mark_dynamic(inputs[0], [0, 2])
            calls = c.backend_calls
            got.append(step(c.fn, list(model.parameters()), inputs, training))
            if sizes is not SIZES[0]:
                c.recompiles += c.backend_calls - calls
        compiles.append(c)
        results.append(got)
    for optimized, plain in zip(*results):
        assert len(optimized) == len(plain)
        for a, b in zip(optimized, plain):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    return compiles[0], compiles[1]


def assert_grouped_without_a_guard(optimized: Compiled, plain: Compiled) -> None:
    """One op took the four tables (in every graph the rule saw), with the bag lengths as
    symbols; one compile served both sizes, as without the rule; no guard beyond those of
    the unoptimized compile (which has more: the guards its meta functions put on the
    lookups' ``ceil(B*L / L)`` bag counts, where the grouped op's output has ``B`` rows)."""
    assert optimized.matched() and all(m == 1 for m in optimized.matched()), (optimized.matched(), optimized.declines())
    nodes = grouped_nodes(optimized.graphs[-1])
    assert [len(n.args[0]) for n in nodes] == [4], [n.format_node() for n in nodes]
    # the bag lengths reach the op as symbols: two distinct sizes, L for the three slices
    bag_sizes = [a.meta.get("val", a.meta.get("example_value")) if isinstance(a, fx.Node) else a for a in nodes[0].args[6]]
    assert all(isinstance(s, torch.SymInt) for s in bag_sizes), bag_sizes
    assert len({str(s) for s in bag_sizes}) == 2, bag_sizes
    assert optimized.recompiles == plain.recompiles == 0  # other B and L: no recompile, with or without the rule
    assert optimized.backend_calls == plain.backend_calls
    assert optimized.guards() <= plain.guards(), optimized.guards() - plain.guards()
    assert not [e for r in optimized.reports for e in r.errors()]


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_torch_ir_groups_bags_of_symbolic_length(training):
    """Torch-IR: the op's autograd gives the grouped backward; gradients of every table and
    of the dense layer equal the unoptimized compile's at two B and two L."""
    optimized, plain = run_both("torch_ir", training)
    assert_grouped_without_a_guard(optimized, plain)
    ops = [n.target for n in optimized.graphs[-1].graph.nodes if n.op == "call_function"]
    assert not any("embedding_bag" in str(t) and t is not GROUPED for t in ops)


def test_aten_ir_inference_groups_iota_offsets_of_symbolic_step():
    """Aten-IR spells ``F.embedding_bag`` of [B, L] ids as flattened ids and
    ``iota(B, step=L)`` offsets; with L symbolic the step is a graph value the op reads."""
    optimized, plain = run_both("aten_ir", training=False)
    assert_grouped_without_a_guard(optimized, plain)


def test_marked_dynamic_batch_and_bag_lengths_stay_dynamic():
    """The batch and bag dims of DLRM's one [B, 3, L] id tensor also ``mark_dynamic``
    (feature 3 pools a row's 3 * L ids): a guard that fixed B or L would raise
    ConstraintViolationError; none does, and the second sizes run the same graph."""
    optimized, plain = run_both("torch_ir", training=True, mark_dynamic=True)
    assert_grouped_without_a_guard(optimized, plain)


@pytest.mark.slow  # two Inductor CPU compiles (forward and backward C++ kernels): ~1 min on the shared machine
def test_optimus_compile_dynamic_true_through_inductor():
    """End to end: ``optimus.compile(dynamic=True)`` against ``torch.compile(dynamic=True)``
    (Inductor both), training: the grouped op runs as Inductor's extern kernel with the bag
    lengths read from the inputs' sizes at run time; outputs and gradients equal at two B and
    two L, neither compiles again, the report has the one grouped lookup."""
    from torch._inductor import config as inductor_config

    results = []
    recompiles = []
    report = None
    with inductor_config.patch(fx_graph_cache=False):
        for optimized in (True, False):
            torch._dynamo.reset()
            model = DlrmLookups()
            if optimized:
                compiled = optimus.compile(model, dynamic=True, fullgraph=True)
            else:
                compiled = torch.compile(model, dynamic=True, fullgraph=True)
            got = []
            for sizes in SIZES:
                got.append(step(compiled, list(model.parameters()), dlrm_inputs(*sizes), training=True))
                if sizes is SIZES[0]:
                    frames = torch._dynamo.utils.counters["frames"]["ok"]
            recompiles.append(torch._dynamo.utils.counters["frames"]["ok"] - frames)
            results.append(got)
            if optimized:
                report = compiled.optimus_report
    for a_step, b_step in zip(*results):
        for a, b in zip(a_step, b_step):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert recompiles == [0, 0]
    graphs = [g for g in report.graphs if not g.discarded and RULE in g.rules]
    assert sum(g.rules[RULE].matched for g in graphs) == 1, [dict(g.rules[RULE].declined) for g in graphs]
    assert not report.errors()
