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
from .compile import CustomGraphPass


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

    @classmethod
    def small(cls) -> "DemoConfig":
        return cls(batch=64, features=8, width=16, rounds=2, iters=5)


class _NodeCounter(CustomGraphPass):  # type: ignore[misc]
    """Counts the Aten-IR nodes plain Inductor receives (a no-op pass, for the table)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.count += len(graph.nodes)

    def uuid(self) -> str:
        return "optimus-demo-node-counter"


def _count_nodes(report: Any, level: str) -> tuple[int, int]:
    before = sum(g.nodes_before for g in report.graphs if g.level == level)
    after = sum(g.nodes_after for g in report.graphs if g.level == level)
    return before, after


def run_demo(device: str | None = None, cfg: DemoConfig | None = None, passes: Any = "all") -> dict[str, Any]:
    """Compile the demo model with plain Inductor and with Optimus; measure both."""
    import optimus

    cfg = cfg or DemoConfig()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = SplitCatDemo(cfg.features, cfg.width, cfg.rounds).to(device).eval()
    x = torch.randn(cfg.batch, cfg.features * cfg.width, device=device)
    with torch.no_grad():
        expected = model(x)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": f"SplitCatDemo(features={cfg.features}, width={cfg.width}, rounds={cfg.rounds}), batch {cfg.batch}",
        "configs": {},
    }
    from torch._inductor import config as inductor_config

    for name in ("inductor", "optimus"):
        torch._dynamo.reset()
        counter = _NodeCounter()
        hook = {"post_grad_custom_pre_pass": counter} if name == "inductor" else {}
        with measure.fresh_inductor_cache(), torch.no_grad(), inductor_config.patch(hook):
            if name == "inductor":
                compiled = torch.compile(model)
            else:
                compiled = optimus.compile(model, passes=passes)
            t0 = time.perf_counter()
            if device == "cpu":
                out, kernels = measure.compiled_kernel_count(lambda: compiled(x), device)
            else:
                out = compiled(x)
                measure.synchronize(device)
            compile_s = time.perf_counter() - t0
            if device != "cpu":
                kernels = measure.count_kernels(lambda: compiled(x), device)
            median = measure.median_step_ms(lambda: compiled(x), device, warmup=3, iters=cfg.iters)
        entry: dict[str, Any] = {
            "kernels": int(kernels),
            "median_ms": round(float(median), 4),
            "outputs_match": bool(torch.allclose(out, expected, rtol=1e-4, atol=1e-5)),
            "compile_s": round(compile_s, 2),
        }
        if name == "inductor":
            entry["nodes"] = {"aten_ir": {"before": counter.count, "after": counter.count}}
        else:
            report = compiled.optimus_report
            entry["nodes"] = {lv: dict(zip(("before", "after"), _count_nodes(report, lv))) for lv in ("torch_ir", "aten_ir")}
            entry["rewrites"] = sum(g.matched for g in report.graphs)
            entry["errors"] = report.errors()
        result["configs"][name] = entry
    base = result["configs"]["inductor"]["median_ms"]
    result["speedup"] = round(base / result["configs"]["optimus"]["median_ms"], 3) if result["configs"]["optimus"]["median_ms"] else None
    return result


def format_demo(result: dict[str, Any]) -> str:
    ind, opt = result["configs"]["inductor"], result["configs"]["optimus"]
    nodes = opt.get("nodes", {})
    lines = [
        f"Optimus demo on {result['device']} (torch {result['torch']})",
        f"model: {result['model']}",
        "",
        f"{'':<26}{'inductor':>14}{'inductor + optimus':>22}",
        f"{'Torch-IR graph nodes':<26}{nodes.get('torch_ir', {}).get('before', '-'):>14}{nodes.get('torch_ir', {}).get('after', '-'):>22}",
        f"{'Aten-IR graph nodes':<26}{ind.get('nodes', {}).get('aten_ir', {}).get('after', '-'):>14}{nodes.get('aten_ir', {}).get('after', '-'):>22}",
        f"{'kernels per step':<26}{ind['kernels']:>14}{opt['kernels']:>22}",
        f"{'median step (ms)':<26}{ind['median_ms']:>14.3f}{opt['median_ms']:>22.3f}",
        f"{'outputs match eager':<26}{str(ind['outputs_match']):>14}{str(opt['outputs_match']):>22}",
        f"{'cold compile (s)':<26}{ind['compile_s']:>14.1f}{opt['compile_s']:>22.1f}",
        "",
        f"speedup: {result['speedup']}x   rewrites: {opt.get('rewrites')}   rule errors: {len(opt.get('errors', []))}",
    ]
    return "\n".join(lines)
