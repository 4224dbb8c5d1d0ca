"""``optimus demo``: plain Inductor vs Inductor + Optimus on a built-in split/cat-heavy model.

The embedded model is written the way feature-interaction code often is: the input holds
F feature embeddings side by side; every round splits it into per-feature chunks, does
per-feature elementwise work, concatenates, regroups with other section sizes, and goes
through a stack/unbind round trip. Eager PyTorch launches one kernel per little op;
Inductor fuses some of it; Optimus removes the round trips first.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
import torch.nn as nn

from . import measure
from ..core.table import format_table
from ..compile import DEFAULT_PASSES, CustomGraphPass


class SplitCatDemo(nn.Module):
    """Rounds of split -> per-feature elementwise -> cat, regrouping and stack/unbind."""

    def __init__(self, features: int = 16, width: int = 32, rounds: int = 4) -> None:
        super().__init__()
        self.features, self.width, self.rounds = features, width, rounds
        g = torch.Generator().manual_seed(0)
        self.scales = nn.ParameterList(
            [nn.Parameter(1 + 0.1 * torch.randn(width, generator=g)) for _ in range(features * rounds)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f, w = self.features, self.width
        half = f * w // 2
        for r in range(self.rounds):
            chunks = x.split(w, dim=1)  # per-feature chunks
            chunks = [torch.tanh(c * self.scales[r * f + i] + 0.01 * i) for i, c in enumerate(chunks)]
            x = torch.cat(chunks, dim=1)
            pairs = torch.split(x, 2 * w, dim=-1)  # regroup features in pairs ...
            x = torch.cat(pairs, dim=-1)  # ... and back
            left, right = x.split([half, half], dim=1)  # a split of a split's chunk
            l1, l2 = left.split([w, half - w], dim=1)
            x = torch.cat([l1, l2, right], dim=1)
            feats = torch.unbind(x.view(-1, f, w), dim=1)  # stack/unbind round trip
            x = torch.stack(feats, dim=1).view(-1, f * w)
        return x


@dataclasses.dataclass
class DemoConfig:
    batch: int = 512
    features: int = 16
    width: int = 32
    rounds: int = 4
    iters: int = 30
    size: str = "realistic"  # for zoo models (--model NAME)

    @classmethod
    def small(cls) -> "DemoConfig":
        return cls(batch=64, features=8, width=16, rounds=2, iters=5, size="small")


class _NodeCounter(CustomGraphPass):  # type: ignore[misc]
    """Counts the nodes of the graphs a hook sees (a no-op pass, for the table)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.count = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.count += len(graph.nodes)

    def uuid(self) -> str:
        return f"optimus-demo-node-counter-{self.tag}"


CONFIGS = ("inductor", "upstream", "optimus-vertical", "optimus")


def _build(model_name: str | None, cfg: DemoConfig, device: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], str]:
    if model_name in (None, "demo"):
        torch.manual_seed(0)
        model = SplitCatDemo(cfg.features, cfg.width, cfg.rounds)
        x = torch.randn(cfg.batch, cfg.features * cfg.width)
        desc = f"SplitCatDemo(features={cfg.features}, width={cfg.width}, rounds={cfg.rounds}), batch {cfg.batch}"
        return model.to(device).eval(), (x.to(device),), desc
    from .models import get_model

    zoo = get_model(model_name, size=cfg.size, device=device, seed=0)
    return zoo.model.eval(), tuple(zoo.inputs), f"zoo model {model_name!r} ({cfg.size}), batch {zoo.batch_size}"


def run_demo(
    device: str | None = None,
    cfg: DemoConfig | None = None,
    passes: Any = DEFAULT_PASSES,
    configs: tuple[str, ...] = ("inductor", "optimus"),
    model_name: str | None = None,
    warm: bool = True,
) -> dict[str, Any]:
    """Compile a model (the demo model by default) with each configuration and measure
    inference: graph nodes per level after each configuration's passes, kernels per
    step, median step time, cold compile time, outputs against eager.

    Configurations: ``inductor`` (plain), ``upstream`` (Inductor with upstream PyTorch's
    own Optimus options all on), ``optimus-vertical`` and ``optimus`` (``passes``).

    Compile times are comparable: each configuration compiles with an empty Inductor
    cache, and with ``warm`` (the default) the process first compiles a tiny unrelated
    function with every configuration, so the one-time start-up (imports, the C++ or
    Triton toolchain's first use, Optimus's own first use) is paid before any is timed
    rather than charged to whichever runs first. ``result["compile_timing"]`` says which.
    """
    from torch._inductor import config as inductor_config

    from .bench.configs import upstream_fusion_options

    cfg = cfg or DemoConfig()
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown demo configuration(s) {unknown}; choose from {list(CONFIGS)}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model, inputs, desc = _build(model_name, cfg, device)
    with torch.no_grad():
        expected = model(*inputs)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": desc,
        "configs": {},
    }
    if warm:
        t0 = time.perf_counter()
        _warm_up(configs, device, passes)
        result["warm_up_s"] = round(time.perf_counter() - t0, 2)
        result["compile_timing"] = (f"each configuration compiled with an empty Inductor cache, after a warm-up compile of a "
                                    f"tiny unrelated function with every configuration ({result['warm_up_s']:.1f} s) "
                                    f"paid the process's one-time start-up")
    else:
        result["compile_timing"] = ("each configuration compiled with an empty Inductor cache, no warm-up: the first "
                                    f"({configs[0]}) also paid the process's one-time start-up")
    for name in configs:
        torch._dynamo.reset()
        torch_ir, aten_ir = _NodeCounter("torch_ir"), _NodeCounter("aten_ir")
        # Counted where every configuration's passes are done: Torch-IR after the pre-grad
        # passes (upstream's run inside them), Aten-IR after all post-grad passes.
        patches: dict[str, Any] = {"post_grad_custom_post_pass": aten_ir}
        if name in ("inductor", "upstream"):
            patches["pre_grad_custom_pass"] = torch_ir
        if name == "upstream":
            opts = upstream_fusion_options()
            patches.update(pre_grad_fusion_options=opts["pre_grad"], post_grad_fusion_options=opts["post_grad"])
        with measure.fresh_inductor_cache(), torch.no_grad(), inductor_config.patch(patches):
            compiled = _compile_config(name, model, passes)
            t0 = time.perf_counter()
            if device == "cpu":
                out, kernels = measure.compiled_kernel_count(lambda: compiled(*inputs), device)
            else:
                out = compiled(*inputs)
                measure.synchronize(device)
            compile_s = time.perf_counter() - t0
            if device != "cpu":
                kernels = measure.count_kernels(lambda: compiled(*inputs), device)
            median = measure.median_step_ms(lambda: compiled(*inputs), device, warmup=3, iters=cfg.iters)
        entry: dict[str, Any] = {
            "kernels": int(kernels),
            "median_ms": round(float(median), 4),
            "outputs_match": bool(torch.allclose(out, expected, rtol=1e-4, atol=1e-5)),
            "compile_s": round(compile_s, 2),
        }
        if name.startswith("optimus"):
            report = compiled.optimus_report
            before, after = _count_nodes(report, "torch_ir")
            entry["nodes"] = {"torch_ir": {"before": before, "after": after}, "aten_ir": {"after": aten_ir.count}}
            entry["rewrites"] = sum(g.matched for g in report.graphs)
            entry["errors"] = report.errors()
        else:
            entry["nodes"] = {"torch_ir": {"after": torch_ir.count}, "aten_ir": {"after": aten_ir.count}}
        result["configs"][name] = entry
    if "inductor" in result["configs"] and "optimus" in result["configs"]:
        base, ours = result["configs"]["inductor"]["median_ms"], result["configs"]["optimus"]["median_ms"]
        result["speedup"] = round(base / ours, 3) if ours else None
    return result


def _compile_config(name: str, model: Any, passes: Any) -> Any:
    import optimus

    if name in ("inductor", "upstream"):
        return torch.compile(model)
    return optimus.compile(model, passes="vertical" if name == "optimus-vertical" else passes)


def _warm_up(configs: tuple[str, ...], device: str, passes: Any) -> None:
    """Compile and run a tiny function unrelated to the model with each configuration,
    each in a fresh Inductor cache, so that what a process pays once is paid here."""
    def tiny(x: torch.Tensor) -> torch.Tensor:
        a, b = x.split(4, dim=1)
        return torch.cat([torch.tanh(a), b * 2], dim=1).sum(dim=1)

    x = torch.randn(8, 8, device=device)
    for name in configs:
        torch._dynamo.reset()
        with measure.fresh_inductor_cache(), torch.no_grad():
            _compile_config(name, tiny, passes)(x)
    torch._dynamo.reset()


def _count_nodes(report: Any, level: str) -> tuple[int, int]:
    before = sum(g.nodes_before for g in report.graphs if g.level == level)
    after = sum(g.nodes_after for g in report.graphs if g.level == level)
    return before, after


def format_demo(result: dict[str, Any]) -> str:
    names = list(result["configs"])
    cols = {"inductor": "inductor", "upstream": "+ upstream", "optimus-vertical": "+ optimus vertical", "optimus": "+ optimus"}
    rows_of = [
        ("Torch-IR graph nodes", lambda c: c["nodes"]["torch_ir"]["after"]),
        ("Aten-IR graph nodes", lambda c: c["nodes"]["aten_ir"]["after"]),
        ("kernels per step", lambda c: c["kernels"]),
        ("median step (ms)", lambda c: f"{c['median_ms']:.3f}"),
        ("outputs match eager", lambda c: str(c["outputs_match"])),
        ("cold compile (s)", lambda c: f"{c['compile_s']:.1f}"),
    ]
    rows = [[label] + [fn(result["configs"][n]) for n in names] for label, fn in rows_of]
    lines = [
        f"Optimus demo on {result['device']} (torch {result['torch']})",
        f"model: {result['model']}",
        "",
        format_table([""] + [cols.get(n, n) for n in names], rows, [False] + [True] * len(names)),
    ]
    opt = result["configs"].get("optimus")
    if opt is not None:
        lines += ["", f"speedup over inductor: {result.get('speedup')}x   rewrites: {opt.get('rewrites')}   rule errors: {len(opt.get('errors', []))}"]
    lines.append("(nodes are counted after each configuration's passes: Torch-IR after the pre-grad passes, Aten-IR after all post-grad passes)")
    if result.get("compile_timing"):
        lines.append(f"(cold compile: {result['compile_timing']})")
    return "\n".join(lines)
