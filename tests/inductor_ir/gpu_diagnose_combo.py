"""Issue 11 on the GPU: combo kernels against split mix-order reductions.

    python tests/inductor_ir/gpu_diagnose_combo.py [--cases mini,wukong,hstu] [--size realistic]
                                                   [--budget 110] [--out DIR]

Each case is compiled (FX graph and AOT autograd caches off) and run for one step
(``mini``: row and column sums of one 8192x768 tensor plus a small independent
reduction, inference; ``wukong``/``hstu``: a zoo model's training step, TF32 off) with
``passes="all"`` in two modes:

* ``guarded``: Optimus as it is;
* ``unguarded``: the issue-11 guards switched off (no codegen facts, no member checks,
  no final legality check), i.e. the driver before the fix.

After each scheduler's post-fusion hook the script records the split mix-order
reductions (partial buffers their codegen drops, second stages it takes over), the
combo kernels made (members, kinds, whether a member holds a taken-over stage) and the
legality check's problems, and replaces ``V.graph.removed_buffers`` by a set that
records who adds each name (caller and the node being generated). A compile that
fails with ``AssertionError: bufN`` (``CRASH``, or ``recompiled`` where
``optimus.compile`` compiled the graph again without the Inductor-IR passes) is attributed: who dropped ``bufN``, which combo member reads
it. Prints one row per (case, mode) and a verdict; writes ``diagnose_combo.json`` to
``--out`` (default ``$OUT``). Modes are skipped once ``--budget`` seconds are spent.
``--device cpu`` dry-runs the script without a GPU (``fake_gpu_on_cpu``: Triton codegen,
no-op kernels).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import torch  # noqa: E402

import optimus  # noqa: E402
from optimus.inductor_ir import inductor_api, legality, passes  # noqa: E402

GRAPHS: list[dict[str, Any]] = []  # one record per scheduled graph of the current run
REAL_COLLECT = legality.CodegenFacts.collect  # the real facts, also while unguarded


# ------------------------------------------------------------------ instrumentation
def _caller() -> str:
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename.endswith("_ordered_set.py") or f.f_code.co_filename == __file__):
        f = f.f_back
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_code.co_name}" if f is not None else "?"


def _recorder_class(base: type) -> type:
    class Recording(base):  # type: ignore[misc, valid-type]
        """``V.graph.removed_buffers`` that remembers who added each name."""

        record: dict[str, Any] | None = None

        def _note(self, names: Any) -> None:
            if self.record is None:
                return
            sched = getattr(inductor_api.V.graph, "scheduler", None)
            node = getattr(sched, "current_node", None)
            where = {"by": _caller(), "while_generating": node.get_name() if node is not None else None}
            for n in list(names):
                self.record["removed_by"].setdefault(str(n), where)

        def add(self, name: Any) -> None:
            self._note([name])
            super().add(name)

        def update(self, *others: Any) -> None:
            for o in others:
                self._note(o)
            super().update(*others)

        def __ior__(self, other: Any) -> Any:
            self._note(other)
            return super().__ior__(other)

    return Recording


def _describe(node: Any, facts: legality.CodegenFacts) -> dict[str, Any]:
    ops = [leaf.get_name() for leaf in legality.leaves(node)]
    reads = sorted({name for leaf in legality.leaves(node) for name, weak in legality.reads(leaf) if not weak})
    return {
        "name": node.get_name(),
        "kind": "reduction" if inductor_api.call_safely(node.is_reduction, False) else "pointwise",
        "taken_over_ops": [op for op in ops if op in facts.replaced],
        "reads_dropped": [b for b in reads if b in facts.dropped],
        "reads": reads,
    }


def _hook(session: Any, hook: str, nodes: list[Any]) -> list[Any]:
    out = _original_hook(session, hook, nodes)
    if hook != "post_fusion":
        return out
    try:
        scheduler = inductor_api.current_scheduler()
        facts = REAL_COLLECT(list(nodes))
        record: dict[str, Any] = {
            "graph": inductor_api.graph_kind(),
            "mix_order": [],
            "combos": [],
            "problems": {},
            "removed_by": {},
        }
        for n in nodes:
            if inductor_api._is_kind(n, "FusedMixOrderReductions"):
                buffers, ops = inductor_api.codegen_replacements(n)
                record["mix_order"].append({"name": n.get_name(), "drops": sorted(buffers), "takes_over": sorted(ops)})
        before = {id(n) for n in nodes}
        for n in out:
            if legality.is_combo(n) and id(n) not in before:
                record["combos"].append([_describe(m, facts) for m in legality.units(n)])
        record["problems"] = dict(collections.Counter(p.kind for p in legality.plan_problems(scheduler, list(out), facts)))
        graph = inductor_api.V.graph
        recording = _recorder_class(type(graph.removed_buffers))(graph.removed_buffers)
        recording.record = record
        graph.removed_buffers = recording
        GRAPHS.append(record)
    except Exception as e:  # the diagnosis must not change the compile
        GRAPHS.append({"graph": "?", "diagnostic_error": f"{type(e).__name__}: {e}"})
    return out


_original_hook = passes.run_hook


@contextlib.contextmanager
def unguarded() -> Iterator[None]:
    """The driver as before the issue-11 fix (only the trial codegen, without codegen facts)."""
    saved = [
        (legality, "generates_no_kernel", legality.generates_no_kernel),
        (legality, "combo_member_problem", legality.combo_member_problem),
        (legality, "new_problems", legality.new_problems),
        (legality.CodegenFacts, "collect", legality.CodegenFacts.__dict__["collect"]),
    ]
    legality.generates_no_kernel = lambda node, facts: False
    legality.combo_member_problem = lambda node, facts: None
    legality.new_problems = lambda *args, **kwargs: []
    legality.CodegenFacts.collect = classmethod(lambda cls, nodes: cls())
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


# -------------------------------------------------------------------------- cases
def _mini(device: str) -> tuple[Any, list[torch.Tensor], bool]:
    def row_and_column_sums(x, y, z):
        t = x * y
        return t.sum(-1), t.sum(0), z.sin().sum(1)

    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(8192, 768, generator=g), torch.randn(8192, 768, generator=g), torch.randn(10, 100, generator=g)]
    return row_and_column_sums, [t.to(device) for t in inputs], False


def run_case(case: str, size: str, device: str) -> dict[str, Any]:
    from torch._inductor import config as inductor_config

    torch._dynamo.reset()
    GRAPHS.clear()
    row: dict[str, Any] = {"status": "ok", "error": None}
    fc = torch._functorch.config
    fc_patch = {"enable_autograd_cache": False} if hasattr(fc, "enable_autograd_cache") else {}
    with inductor_config.patch(fx_graph_cache=False), fc.patch(fc_patch):
        if case == "mini":
            fn, inputs, _ = _mini(device)
            compiled = optimus.compile(fn, passes="all", fullgraph=True)
            step = lambda: compiled(*inputs)  # noqa: E731
        else:
            from optimus.tools.models import get_model

            zoo = get_model(case, size, device, 0)
            compiled = optimus.compile(zoo.model, passes="all", fullgraph=True)
            step = lambda: zoo.loss(compiled(*zoo.inputs)).backward()  # noqa: E731
        try:
            with torch.no_grad() if case == "mini" else contextlib.nullcontext():
                step()
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # e.g. the backward graph, compiled lazily at backward()
            row["status"] = "CRASH"
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    report = compiled.optimus_report
    failed = [n for n in report.notes if "compilation failed with the Inductor-IR passes" in n]
    if failed and row["status"] == "ok":
        row["status"] = "recompiled"
        row["error"] = failed[0]
    declines: collections.Counter[str] = collections.Counter()
    matched = 0
    for g in report.graphs:
        if g.level == "inductor_ir" and "combo_small_kernels" in g.rules:
            declines.update(g.rules["combo_small_kernels"].declined)
            matched += g.rules["combo_small_kernels"].matched
    row["combos"] = matched
    row["declines"] = dict(declines)
    row["refused"] = [n for g in report.graphs for n in g.notes if "plan refused" in n]
    row["graphs"] = [dict(g) for g in GRAPHS]
    row["verdict"] = _verdict(row)
    return row


def _verdict(row: dict[str, Any]) -> str:
    m = re.search(r"AssertionError: (\w+)", row["error"] or "")
    if m is None:
        taken = sum(1 for g in row["graphs"] for c in g.get("combos", []) for mem in c if mem["taken_over_ops"])
        if taken:
            return f"compiled, but {taken} combo member(s) hold a taken-over stage (not generated yet?)"
        return f"compiled; {row['combos']} combo kernel(s), none holds a mix-order second stage"
    buf = m.group(1)
    for g in row["graphs"]:
        who = g.get("removed_by", {}).get(buf)
        if who is None:
            continue
        dropper = next((mo["name"] for mo in g["mix_order"] if buf in mo["drops"]), None)
        readers = [mem["name"] for c in g["combos"] for mem in c if buf in mem["reads"]]
        return (
            f"{buf} dropped by {who['by']} while generating {who['while_generating']}"
            f"{' (split mix-order reduction ' + dropper + ')' if dropper else ''}; read by combo member(s) {readers or '?'}"
        )
    return f"AssertionError on {buf}; no graph recorded who removed it"


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="mini,wukong,hstu")
    parser.add_argument("--size", default="realistic")
    parser.add_argument("--budget", type=float, default=110.0)
    parser.add_argument("--out", default=os.environ.get("OUT") or "diagnose_combo_out")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run (fake_gpu_on_cpu)")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    context: Any = contextlib.nullcontext()
    if args.device == "cpu":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from inductor_ir_support import fake_gpu_on_cpu

        context = fake_gpu_on_cpu()
    cases = [c for c in args.cases.split(",") if c]
    order = [(c, "guarded") for c in cases] + [(c, "unguarded") for c in cases]
    order.sort(key=lambda cm: (cm[0] != "mini", cm[1] == "unguarded"))  # mini first, both modes
    passes.run_hook = _hook
    t0 = time.perf_counter()
    rows = []
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (fake GPU)"}
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        pass
    with context:
        for case, mode in order:
            if time.perf_counter() - t0 > args.budget:
                rows.append({"case": case, "mode": mode, "status": "skipped (budget)"})
                continue
            t1 = time.perf_counter()
            try:
                with unguarded() if mode == "unguarded" else contextlib.nullcontext():
                    row = run_case(case, args.size, args.device)
            except Exception as e:
                row = {"status": "ERROR", "error": f"{type(e).__name__}: {str(e)[:300]}", "trace": traceback.format_exc()[-2000:]}
            row.update(case=case, mode=mode, seconds=round(time.perf_counter() - t1, 1))
            rows.append(row)
            print(f"[{row['seconds']:6.1f}s] {case:7s} {mode:9s} {row['status']}", flush=True)
    passes.run_hook = _original_hook
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "diagnose_combo.json"), "w") as f:
        json.dump({"env": env, "size": args.size, "rows": rows}, f, indent=1, default=str)
    print(f"\n{env}")
    print(f"{'case':8s} {'mode':10s} {'status':11s} {'combos':>6s} {'2nd-stage declines':>18s}  verdict")
    for r in rows:
        no_kernel = (r.get("declines") or {}).get(legality.NO_KERNEL, 0)
        print(f"{r['case']:8s} {r['mode']:10s} {r['status'][:11]:11s} {r.get('combos', '-')!s:>6s} {no_kernel!s:>18s}  {r.get('verdict') or r.get('error') or ''}")
    ok = all(r["status"] == "ok" for r in rows if r["mode"] == "guarded")
    print("\nVERDICT:", "guarded runs compile with their Inductor-IR passes" if ok else "a guarded run failed: see the JSON")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
