"""GPU analogues of the Inductor-IR tests: launches per step, numerics, time, cache keys.

    python -m optimus.tools.gpu_check [--out DIR] [--budget SECONDS] [--iters N]

For a few small models it compiles, on CUDA, two configurations:

* ``fx``:  Optimus Torch-IR + Aten-IR rules, Inductor-IR off (``inductor_ir: "none"``);
* ``all``: the same plus the Inductor-IR rules (``passes="all"``);

and prints one table row per (case, mode): CUDA kernel launches per step
(``torch.profiler`` kernel events of one warmed-up step), the median step time, the
largest error of outputs and gradients against eager (TF32 off), which Inductor-IR
rules fired, and a status (``ok``, ``MISMATCH``, ``ERROR``). It then checks the FX
graph cache under the installed torch (same Inductor-IR selection: hit, no bypass;
changed option/selection: miss). Everything (reports, generated code, JSON) goes to
``--out`` (default ``$OUT``, else ``./gpu_check_out``). Cases are skipped once the time
budget (default 140 s) is spent, so the whole run stays under four minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
import traceback
from typing import Any, Callable

import torch
from torch import nn

from ..core.table import format_table

FX = {"torch_ir": "all", "aten_ir": "all", "inductor_ir": "none"}
ALL = "all"


# ------------------------------------------------------------------------------ cases
def independent(a, b, c, d):
    return a.sum(1), b.sum(1), (c * 2).relu(), (d + 1).sigmoid()


def mixed(a, b, c, d, e, f):
    """Independent small kernels of different iteration spaces: combo candidates."""
    return a.sin(), (b * 3).relu(), c.sum(-1), d.exp() + 1, e.amax(0), torch.tanh(f)


def starved(x1, x2, pos, w):
    outs = []
    for x in (x1, x2):
        s = x + pos
        h = torch.relu(s - s.mean(-1, keepdim=True))
        t = (h.view(-1, 16) @ w).view(x.shape) + pos
        outs.append(torch.sigmoid(t - t.mean(-1, keepdim=True)))
    return outs


class Towers(nn.Module):
    """8 parallel Linear -> LayerNorm -> ReLU towers (a small towers32)."""

    def __init__(self, towers: int = 8, d: int = 32) -> None:
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(d, d) for _ in range(towers))
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(towers))
        self.head = nn.Linear(towers * d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = x.unbind(1)
        return self.head(torch.cat([torch.relu(n(l(f))) for l, n, f in zip(self.lins, self.norms, feats)], 1))


@dataclasses.dataclass
class Case:
    name: str
    what: str
    build: Callable[[torch.device], tuple[Callable[..., Any], list[torch.Tensor], list[torch.Tensor]]]
    modes: tuple[str, ...]


def _fn_case(fn: Callable[..., Any], shapes: list[tuple[int, ...]]) -> Callable[[torch.device], Any]:
    def build(dev: torch.device):
        g = torch.Generator().manual_seed(0)
        return fn, [torch.randn(*s, generator=g).to(dev) for s in shapes], []

    return build


def _towers(dev: torch.device):
    torch.manual_seed(0)
    model = Towers().to(dev)
    x = torch.randn(256, 8, 32, generator=torch.Generator().manual_seed(0)).to(dev)
    return model, [x], list(model.parameters())


def _zoo(name: str) -> Callable[[torch.device], Any]:
    def build(dev: torch.device):
        from optimus.tools.models import get_model

        zoo = get_model(name, "small", dev, 0)
        return zoo.model, list(zoo.inputs), [p for p in zoo.model.parameters() if p.requires_grad]

    return build


CASES = [
    Case("independent", "2 row sums + 2 elementwise chains, independent (horizontal)", _fn_case(independent, [(512, 256)] * 4), ("infer", "train")),
    Case("mixed", "6 small independent kernels, 6 iteration spaces (combo)", _fn_case(mixed, [(1000,), (37, 11), (64, 48), (513,), (29, 31), (7, 7, 7)]), ("infer", "train")),
    Case("towers8", "8 Linear->LayerNorm->ReLU towers, cat, head", _towers, ("train",)),
    Case("starved", "layer-norm-like stages around a matmul (vertical, CPU miss)", _fn_case(starved, [(64, 9, 16), (64, 9, 16), (9, 16), (16, 16)]), ("infer",)),
    Case("zoo:towers32", "zoo towers32 (small)", _zoo("towers32"), ("train",)),
    Case("zoo:dcnv2", "zoo dcnv2 (small)", _zoo("dcnv2"), ("train",)),
]


# ----------------------------------------------------------------------- measurement
def _leaves(x: Any) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _step_fn(fn: Callable[..., Any], inputs: list[torch.Tensor], params: list[torch.Tensor], mode: str):
    args = [t.detach().clone().requires_grad_(mode == "train" and t.is_floating_point() and not params) for t in inputs]

    def step() -> Any:
        if mode == "infer":
            with torch.no_grad():
                return fn(*args)
        for p in params:
            p.grad = None
        for a in args:
            a.grad = None
        out = fn(*args)
        sum((o.float() * (i + 1)).mean() for i, o in enumerate(_leaves(out))).backward()
        return out

    def grads() -> list[torch.Tensor]:
        return [t.grad.detach().clone() for t in (params or args) if t.grad is not None]

    return step, grads


def _max_rel(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    worst = 0.0
    if len(got) != len(want):
        return float("inf")
    for g, w in zip(got, want):
        g, w = g.detach().float(), w.detach().float()
        if g.shape != w.shape:
            return float("inf")
        err = (g - w).abs().max().item() if w.numel() else 0.0
        scale = max(w.abs().max().item() if w.numel() else 0.0, 1e-6)
        worst = max(worst, err / scale)
    return worst


def _median_ms(step: Callable[[], Any], iters: int, dev: torch.device) -> float:
    if dev.type != "cuda":
        from optimus.tools import measure

        return measure.median_step_ms(step, dev, warmup=3, iters=iters)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _rules_summary(report: Any) -> tuple[dict[str, int], list[str], list[str]]:
    matched: dict[str, int] = {}
    declines: dict[str, int] = {}
    for g in report.graphs:
        if g.level != "inductor_ir":
            continue
        for name, st in g.rules.items():
            matched[name] = matched.get(name, 0) + st.matched
            for reason, n in st.declined.items():
                key = f"{name}: {reason}"
                declines[key] = declines.get(key, 0) + n
    problems = list(report.errors()) + [n for g in report.graphs for n in g.notes if "rolled back" in n]
    top = [f"{k} (x{v})" for k, v in sorted(declines.items(), key=lambda kv: -kv[1])[:4]]
    return matched, top, problems


def run_case(case: Case, mode: str, dev: torch.device, iters: int, out_dir: str) -> dict[str, Any]:
    import optimus
    from optimus.tools import measure
    from torch._inductor.utils import run_and_get_code

    row: dict[str, Any] = {"case": case.name, "what": case.what, "mode": mode, "configs": {}}
    fn, inputs, params = case.build(dev)
    step, grads = _step_fn(fn, inputs, params, mode)
    ref_out = [t.detach().clone() for t in _leaves(step())]
    ref_grads = grads() if mode == "train" else []
    for cname, passes in (("fx", FX), ("all", ALL)):
        res: dict[str, Any] = {}
        row["configs"][cname] = res
        try:
            torch._dynamo.reset()
            fn2, inputs2, params2 = case.build(dev)
            compiled = optimus.compile(fn2, passes=passes, fullgraph=True)
            step2, grads2 = _step_fn(compiled, inputs2, params2, mode)
            t0 = time.perf_counter()
            out, codes = run_and_get_code(step2)
            res["compile_s"] = round(time.perf_counter() - t0, 2)
            res["max_rel_err_out"] = _max_rel(_leaves(out), ref_out)
            res["max_rel_err_grad"] = _max_rel(grads2(), ref_grads) if mode == "train" else 0.0
            with open(os.path.join(out_dir, f"code_{case.name.replace(':', '_')}_{mode}_{cname}.py"), "w") as f:
                f.write("\n\n# ======== next graph ========\n\n".join(codes))
            step2()
            if dev.type == "cuda":
                res["kernels"] = measure.count_kernels(step2, dev)
            else:  # dry run on CPU: loop nests + extern calls in the generated code
                res["kernels"] = measure.generated_kernel_count(list(codes))
            res["generated_triton_kernels"] = sum(c.count("async_compile.triton(") for c in codes)
            res["step_ms"] = round(_median_ms(step2, iters, dev), 4)
            report = compiled.optimus_report
            res["rules"], res["top_declines"], res["problems"] = _rules_summary(report)
            with open(os.path.join(out_dir, f"report_{case.name.replace(':', '_')}_{mode}_{cname}.txt"), "w") as f:
                f.write(report.table(max_reasons=8))
            ok = res["max_rel_err_out"] <= 1e-3 and res["max_rel_err_grad"] <= 1e-3
            res["status"] = "ok" if ok and not res["problems"] else ("MISMATCH" if not ok else "OPTIMUS-ERROR")
        except Exception as e:
            res["status"] = "ERROR"
            res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            res["traceback"] = traceback.format_exc()[-4000:]
    return row


# ------------------------------------------------------------------------ cache check
def cache_check(dev: torch.device, out_dir: str) -> dict[str, Any]:
    """Same Inductor-IR selection: hit, no bypass. Changed option / selection: miss."""
    import tempfile

    import optimus
    from optimus.tools import measure
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config

    def pair(a, b):
        return torch.sin(a) * 2, torch.cos(b) + 1

    x = [torch.randn(64, 64, device=dev), torch.randn(64, 64, device=dev)]
    results: dict[str, Any] = {}
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp
        measure._clear_cache_dir_memo()
        try:
            with inductor_config.patch(fx_graph_cache=True):
                for label, passes in (
                    ("first", {"inductor_ir": "all"}),
                    ("same", {"inductor_ir": "all"}),
                    ("option changed", {"inductor_ir": {"fuse_independent_kernels": {"max_kernels": 1}}}),
                    ("selection changed", {"inductor_ir": ["combo_small_kernels"]}),
                ):
                    torch._dynamo.reset()
                    counters.clear()
                    compiled = optimus.compile(pair, passes=passes, fullgraph=True)
                    with torch.no_grad():
                        compiled(*x)
                    ind, aot = counters["inductor"], counters["aot_autograd"]
                    results[label] = {
                        "hit": ind.get("fxgraph_cache_hit", 0) + aot.get("autograd_cache_hit", 0),
                        "miss": ind.get("fxgraph_cache_miss", 0) + aot.get("autograd_cache_miss", 0),
                        "bypass": ind.get("fxgraph_cache_bypass", 0) + aot.get("autograd_cache_bypass", 0),
                        "pickle_error": ind.get("fxgraph_cache_pickle_error", 0),
                        "inductor_ir_ran": any(g.level == "inductor_ir" for g in compiled.optimus_report.graphs),
                    }
        finally:
            if old is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
            measure._clear_cache_dir_memo()
    r = results
    ok = (
        all(v["bypass"] == 0 and v["pickle_error"] == 0 for v in r.values())
        and r["first"]["miss"] >= 1 and r["first"]["inductor_ir_ran"]
        and r["same"]["hit"] >= 1 and r["same"]["miss"] == 0
        and r["option changed"]["hit"] == 0 and r["option changed"]["inductor_ir_ran"]
        and r["selection changed"]["hit"] == 0 and r["selection changed"]["inductor_ir_ran"]
    )
    return {"ok": ok, "steps": r}


# ------------------------------------------------------------------------------ main
def _fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "-"
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


SHORT = {"fuse_producer_consumer": "vertical", "fuse_independent_kernels": "horizontal", "combo_small_kernels": "combo"}


def print_table(rows: list[dict[str, Any]]) -> None:
    cells: list[Any] = []
    for row in rows:
        fx, al = row["configs"].get("fx", {}), row["configs"].get("all", {})
        kf, ka = fx.get("kernels"), al.get("kernels")
        delta = (ka - kf) if isinstance(kf, int) and isinstance(ka, int) else None
        mf, ma = fx.get("step_ms"), al.get("step_ms")
        speed = (mf / ma) if mf and ma else None
        err = max((c.get("max_rel_err_out", 0) or 0) + 0 for c in (fx, al)) if fx and al else None
        gerr = max((c.get("max_rel_err_grad", 0) or 0) for c in (fx, al)) if fx and al else None
        worst = max(err or 0, gerr or 0) if err is not None else None
        status = al.get("status", "-") if fx.get("status") == "ok" else f"fx:{fx.get('status')}/all:{al.get('status')}"
        fired = ", ".join(f"{SHORT.get(k, k)}={v}" for k, v in (al.get("rules") or {}).items() if v)
        cells.append([row["case"], row["mode"], _fmt(kf), _fmt(ka), _fmt(delta, "+d"), _fmt(mf, ".3f"), _fmt(ma, ".3f"),
                      _fmt(speed, ".2f"), _fmt(worst, ".1e"), status, fired or "-"])
        for cname in ("fx", "all"):
            c = row["configs"].get(cname, {})
            if c.get("error"):
                cells.append(f"    {cname}: {c['error']}")
            for p in (c.get("problems") or [])[:3]:
                cells.append(f"    {cname} optimus problem: {p[:160]}")
    print(format_table(["case", "mode", "kernels fx", "all", "delta", "ms fx", "ms all", "speedup", "max err", "status",
                        "rules fired (all)"], cells, [False, False] + [True] * 7 + [False, False]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optimus.tools.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out")
    parser.add_argument("--budget", type=float, default=140.0, help="seconds after which remaining cases are skipped")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--cases", default="all", help="comma list of case names, or all")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": a dry run of the script itself
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; nothing to do", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    t_start = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    if dev.type == "cuda":
        try:  # compile Triton kernels in parallel from the start
            from torch._inductor.async_compile import AsyncCompile

            AsyncCompile.warm_pool()
        except Exception:
            pass
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover
        triton_version = None
    env = {"torch": torch.__version__, "triton": triton_version,
           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (dry run)",
           "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    print(f"Optimus Inductor-IR GPU check: torch {env['torch']}, triton {env['triton']}, {env['device']}")
    print("configs: fx = Torch-IR + Aten-IR rules, inductor_ir off; all = fx + Inductor-IR rules")
    print("kernels = CUDA kernel launches per step (torch.profiler); max err = max relative error of outputs/grads vs eager (TF32 off)\n")
    from optimus.inductor_ir import inductor_api

    ok, why = inductor_api.hooks_supported()
    if not ok:
        print(f"Inductor-IR unsupported on this torch: {why}")
    cache = None
    try:
        cache = cache_check(dev, args.out)
    except Exception as e:
        cache = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    wanted = None if args.cases == "all" else set(args.cases.split(","))
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for case in CASES:
        if wanted is not None and case.name not in wanted:
            continue
        for mode in case.modes:
            if time.perf_counter() - t_start > args.budget:
                skipped.append(f"{case.name}/{mode}")
                continue
            try:
                rows.append(run_case(case, mode, dev, args.iters, args.out))
            except Exception as e:
                rows.append({"case": case.name, "mode": mode, "configs": {"fx": {"status": "ERROR", "error": f"{type(e).__name__}: {e}"}}})
            _write(args.out, env, rows, cache, skipped)
    print_table(rows)
    if skipped:
        print(f"\nskipped (time budget {args.budget:.0f}s): {', '.join(skipped)}")
    print()
    if cache is not None:
        if "steps" in cache:
            steps = "; ".join(f"{k}: hit={v['hit']} miss={v['miss']} bypass={v['bypass']}" for k, v in cache["steps"].items())
            print(f"FX graph cache with Inductor-IR passes (torch {torch.__version__}): {'OK' if cache['ok'] else 'FAILED'} ({steps})")
        else:
            print(f"FX graph cache check: FAILED ({cache.get('error')})")
    _write(args.out, env, rows, cache, skipped)
    print(f"\ndetails (JSON, Optimus reports, generated code) in {os.path.abspath(args.out)}; total {time.perf_counter() - t_start:.0f}s")
    bad = [r for r in rows for c in r["configs"].values() if c.get("status") not in ("ok", None)]
    return 1 if bad or (cache and not cache.get("ok")) else 0


def _write(out: str, env: dict[str, Any], rows: list[dict[str, Any]], cache: Any, skipped: list[str]) -> None:
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump({"env": env, "rows": rows, "cache": cache, "skipped": skipped}, f, indent=2, default=str)


if __name__ == "__main__":
    sys.exit(main())
