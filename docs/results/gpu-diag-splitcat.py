"""H200 diagnosis: a plan of splitcat inference under passes="auto" gave a wrong result
(RMSE 0.11 against fp64; "all" was right; docs/planner.md, "Memory"). Which rule, and which of its rewrites?
Variants in one process, each against an fp64 eager reference; then a bisection on the number of
Inductor-IR actions while time is left. Prints a table last; JSON to $OUT/diag-splitcat.json."""
import copy, json, os, sys, time
import torch
import optimus
from optimus.tools.models import get_model
from optimus.planner import plan
from optimus.inductor_ir import passes as ipasses

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
T0 = time.time()
LIMIT = float(os.environ.get("DIAG_SECONDS", "330"))
z = get_model("splitcat", os.environ.get("DIAG_SIZE", "realistic"), device=os.environ.get("DIAG_DEVICE", "cuda"))
ref_model = copy.deepcopy(z.model).double()
with torch.no_grad():
    ref = ref_model(*[x.double() if x.is_floating_point() else x for x in z.inputs]).float()
orig_configure = plan.Planner.configure
orig_init = ipasses.Driver.__init__
state = {"drop": (), "max_actions": None}

def configure(self, rules):
    out, notes = orig_configure(self, rules)
    out = dict(out)
    for level in out:
        out[level] = tuple(r for r in out[level] if r not in state["drop"])
    return out, notes

def init(self, scheduler, nodes, rules, report, max_actions):
    orig_init(self, scheduler, nodes, rules, report, state["max_actions"] if state["max_actions"] is not None else max_actions)

plan.Planner.configure = configure
ipasses.Driver.__init__ = init
rows = []

def run(label, passes="auto", drop=(), max_actions=None):
    state["drop"], state["max_actions"] = drop, max_actions
    torch._dynamo.reset()
    t = time.time()
    fn = optimus.compile(z.model, passes=passes, fullgraph=True)
    with torch.no_grad():
        out = fn(*z.inputs)
    err = (out.float() - ref).abs().max().item()
    rep = optimus.last_report()
    counts = {k: v.matched for k, v in rep.rule_totals().items() if v.matched}
    ok = err < 1e-3
    rows.append(dict(label=label, max_abs_err=err, ok=ok, compile_s=round(time.time() - t, 1), rules=counts))
    print(f"{label:40s} err {err:.3e} {'ok' if ok else 'WRONG'}  {time.time() - t:.0f}s  {counts}", flush=True)
    if not ok:
        with open(os.path.join(os.environ.get("OUT", "."), f"report-{len(rows)}.txt"), "w") as f:
            f.write(str(rep))
    return ok

STAGE = os.environ.get("DIAG_STAGE", "inductor_ir")
if STAGE == "inductor_ir":
    run("auto")
    run("auto without fuse_independent_kernels", drop=("fuse_independent_kernels",))
    run("auto without fuse_producer_consumer", drop=("fuse_producer_consumer",))
    run("auto without inductor_ir rules", drop=("fuse_independent_kernels", "fuse_producer_consumer", "combo_small_kernels"))
else:  # DIAG_STAGE=rule,rule: leave each FX rule out in turn, the Inductor-IR rules off
    NO_IIR = ("fuse_independent_kernels", "fuse_producer_consumer", "combo_small_kernels")
    for rule in STAGE.split(","):
        run(f"auto without {rule}", drop=NO_IIR + (rule,))
lo, hi = 0, 400  # actions: lo known good, hi known bad (if auto was wrong)
if STAGE == "inductor_ir" and not rows[0]["ok"]:
    while hi - lo > 1 and time.time() - T0 < LIMIT:
        mid = (lo + hi) // 2
        if run(f"auto, inductor_ir max_actions={mid}", max_actions=mid):
            lo = mid
        else:
            hi = mid
json.dump({"rows": rows, "first_bad_actions": hi if not rows[0]["ok"] else None}, open(os.path.join(os.environ.get("OUT", "."), "diag-splitcat.json"), "w"), indent=1)
print("\nlabel                                    error      ok  compile s")
for r in rows:
    print(f"{r['label']:40s} {r['max_abs_err']:.2e}  {str(r['ok']):5s} {r['compile_s']}")
print("first bad action count:", hi if not rows[0]["ok"] else None)
