"""H200 diagnosis 3 (2026-12-02): which stage computes splitcat's cut pointwise groups wrongly?

Run 13's wrong result came from ``batch_pointwise`` groups cut into chunks whose stacked inputs
``unbind_stack_to_view`` turned into slices of one batched matmul's output. Main's planner no
longer cuts such groups, so this script builds the same construct on purpose: the fixed rules
with ``batch_pointwise`` capped at ``max_group`` members (chunks of consecutive members) and no
Inductor-IR rules. Then, against an fp64 eager reference:

1. the whole compile (Optimus + Inductor);
2. the Dynamo graph after Optimus's Torch-IR rules, run eagerly (are our rewrites right?);
3. that same graph compiled by plain Inductor, no Optimus hook (is Inductor's code right?);
4. (3) with Inductor settings changed one at a time, to narrow the stage;
5. (3) with every intermediate value returned as an output, to find the first wrong value.

Writes $OUT/diag-cut.json, the captured graph's code, and Inductor's output code of each
variant (TORCH_LOGS-free: read from the compiled module's file). Prints a table last.
CPU dry run: DIAG_DEVICE=cpu DIAG_SIZE=small. DIAG_PLAN=auto-guard-off: step 1 is main's "auto"
with the planner's guard against cutting such groups turned off.
"""
import copy, json, os, shutil, sys, time
import torch
import optimus
import importlib
ocompile = importlib.import_module("optimus.compile")
from optimus.models import get_model

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
OUT = os.environ.get("OUT", ".")
DEV = os.environ.get("DIAG_DEVICE", "cuda")
MAX_GROUP = int(os.environ.get("DIAG_MAX_GROUP", "6"))
T0, LIMIT = time.time(), float(os.environ.get("DIAG_SECONDS", "400"))
z = get_model("splitcat", os.environ.get("DIAG_SIZE", "realistic"), device=DEV)
ref_model = copy.deepcopy(z.model).double()
with torch.no_grad():
    ref = ref_model(*[x.double() if x.is_floating_point() else x for x in z.inputs]).float()

captured = {}
orig_call, orig_compile = ocompile.LevelPass.__call__, ocompile.Session.compile


def call(self, graph):
    orig_call(self, graph)
    if self.level == "torch_ir" and "gm" not in captured:
        captured["gm"] = copy.deepcopy(graph.owning_module)


def session_compile(self, gm, example_inputs, inductor_options=None):
    captured.setdefault("inputs", list(example_inputs))
    return orig_compile(self, gm, example_inputs, inductor_options)


ocompile.LevelPass.__call__, ocompile.Session.compile = call, session_compile
rows = []


def err_of(out):
    return (out.float() - ref).abs().max().item()


def record(label, err, extra=None):
    ok = err < 1e-3
    rows.append(dict(label=label, max_abs_err=err, ok=ok, s=round(time.time() - T0), **(extra or {})))
    print(f"{label:52s} err {err:.3e} {'ok' if ok else 'WRONG'}  t={time.time() - T0:.0f}s", flush=True)
    return ok


def keep_code(compiled, name):
    """Copy the output code Inductor wrote for the last compile (newest file under its cache)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:
        return
    best = None
    for root, _, files in os.walk(cache_dir()):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(root, f)
                if best is None or os.path.getmtime(p) > os.path.getmtime(best):
                    best = p
    if best is not None:
        shutil.copy(best, os.path.join(OUT, f"output-code-{name}.py"))


P = {lv: {"all": True, "batch_pointwise": {"max_group": MAX_GROUP}} for lv in ("torch_ir", "aten_ir")}
P["inductor_ir"] = None
if os.environ.get("DIAG_PLAN") == "auto-guard-off":  # main's planner, its guard against such cuts off
    from optimus.planner import plan as _plan
    _plan.Planner._reads_parts_of_one_tensor = staticmethod(lambda view, members: False)
    P = "auto"
torch._dynamo.reset()
fn = optimus.compile(z.model, passes=P, fullgraph=True)
with torch.no_grad():
    out = fn(*z.inputs)
rep = optimus.last_report()
counts = {f"{g.level}:{n}": s.matched for g in rep.graphs for n, s in g.rules.items() if s.matched}
record(f"1. Optimus ({P if isinstance(P, str) else f'max_group={MAX_GROUP}'}) + Inductor", err_of(out), {"rules": counts})
keep_code(fn, "1-optimus")
gm, inputs = captured["gm"], captured["inputs"]
open(os.path.join(OUT, "captured-graph.py"), "w").write(gm.code)
json.dump([list(t.shape) if isinstance(t, torch.Tensor) else repr(t) for t in inputs], open(os.path.join(OUT, "captured-inputs.json"), "w"))

with torch.no_grad():
    eager = gm(*inputs)
record("2. captured Torch-IR graph, eager", err_of(eager[0]))

from torch._inductor import config as iconf
from torch._inductor.compile_fx import compile_fx


def plain(label, patches=None, graph=None, name=None):
    torch._dynamo.reset()
    g = copy.deepcopy(graph if graph is not None else gm)
    with iconf.patch(patches or {}), torch.no_grad():
        f = compile_fx(g, inputs)
        res = f(*inputs)
    if name:
        keep_code(f, name)
    return res


r = plain("3", name="3-plain")
ok3 = record("3. captured graph, plain Inductor", err_of(r[0]))
if ok3 and not rows[0]["ok"]:  # Inductor computes our Torch-IR graph right: the Aten-IR rules?
    torch._dynamo.reset()
    fn = optimus.compile(z.model, passes={**P, "aten_ir": None}, fullgraph=True)
    with torch.no_grad():
        record("3b. Optimus Torch-IR rules only + Inductor", err_of(fn(*z.inputs)))
variants = [] if ok3 else [
    ("pattern_matcher off", {"pattern_matcher": False}),
    ("split_cat_fx_passes off", {"split_cat_fx_passes": False}),
    ("max_fusion_size=1", {"max_fusion_size": 1}),
    ("max_pointwise_cat_inputs=0", {"max_pointwise_cat_inputs": 0}),
    ("realize_opcount_threshold=0", {"realize_opcount_threshold": 0}),
    ("triton.max_tiles=1", {"triton.max_tiles": 1}),
    ("force_disable_caches", {"force_disable_caches": True}),
]
for label, patch in variants:
    if time.time() - T0 > LIMIT:
        break
    try:
        record(f"4. plain Inductor, {label}", err_of(plain(label, patch)[0]))
    except Exception as e:  # a setting this torch lacks
        rows.append(dict(label=label, error=repr(e)[:200]))
        print(label, "failed:", repr(e)[:200])

# 5. every intermediate tensor an output: first wrong value (changes fusion; may hide the bug)
if not ok3 and time.time() - T0 < LIMIT:
    g2 = copy.deepcopy(gm)
    nodes = [n for n in g2.graph.nodes if n.op == "call_function" and isinstance(n.meta.get("example_value", n.meta.get("val")), torch.Tensor)]
    if not nodes:  # no meta: every call_function
        nodes = [n for n in g2.graph.nodes if n.op == "call_function"]
    out_node = next(n for n in g2.graph.nodes if n.op == "output")
    old = out_node.args[0]
    out_node.args = (tuple(old) + tuple(nodes),)
    g2.recompile()
    with torch.no_grad():
        want = g2(*inputs)
    try:
        got = plain("5", graph=g2, name="5-all-outputs")
        first = None
        for i, n in enumerate(nodes):
            a, b = want[len(old) + i], got[len(old) + i]
            if isinstance(a, torch.Tensor) and a.is_floating_point() and a.shape == b.shape:
                e = (a - b).abs().max().item() if a.numel() else 0.0
                if e > 1e-3:
                    first = (n.name, n.format_node()[:300], e)
                    break
        record("5. all intermediates as outputs, plain Inductor", err_of(got[0]), {"first_wrong": first})
        print("first wrong intermediate:", first)
    except Exception as e:
        rows.append(dict(label="5", error=repr(e)[:300]))
        print("5 failed:", repr(e)[:300])

json.dump({"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "torch": torch.__version__, "max_group": MAX_GROUP, "rows": rows},
          open(os.path.join(OUT, "diag-cut.json"), "w"), indent=1)
print("\nvariant                                              error      ok")
for r in rows:
    print(f"{r['label']:52s} {r.get('max_abs_err', float('nan')):.2e}  {r.get('ok')}")
