"""The fuzzer's program generator (no compiles: fast): it covers every op family and
spelling the issue lists, grad-mode / inference-mode / autocast regions, parameters and
buffers, it is deterministic, combined cases compute what their parts compute, and the
shrinker reduces a program to what a failure needs."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re
import subprocess
import sys

import pytest
import torch

from optimus.tools import fuzz
from optimus.tools.fuzz import Case, InputSpec, Stmt, combine, generate, shrink
from optimus.tools.fuzz.program import BARE

N = 600  # programs for the coverage statistics (about 5 s)


@pytest.fixture(scope="module")
def programs() -> list[Case]:
    return [generate(0, i) for i in range(N)]


def _values(case: Case) -> dict[str, object]:
    """Run a program statement by statement, each in its regions; every value by name."""
    ns: dict[str, object] = {"torch": torch, "F": torch.nn.functional}
    for spec in case.inputs:
        ns[spec.name] = spec.make(case.grad)
    for s in case.stmts:
        if s.family == "invalid":
            break
        with contextlib.ExitStack() as stack:
            for entry in s.ctx:
                stack.enter_context(eval(entry[len(BARE) :] if entry.startswith(BARE) else entry, ns))
            exec(s.text, ns)
    return ns


# One regex per feature the issue asks the generator to produce, matched on the source.
SOURCE_FEATURES = {
    "Tensor.split": r"\.split\(",
    "torch.split": r"torch\.split\(",
    "torch.chunk": r"torch\.chunk\(",
    "Tensor.chunk": r"\.chunk\(",
    "split_with_sizes": r"split_with_sizes\(",
    "split size as keyword": r"split_size(_or_sections)?=",
    "split sizes as a list": r"split\([^)]*\[\d+(, \d+)+\]",
    "getitem of a chunk": r"v\d+\[-?\d+\]",
    "negative getitem": r"v\d+\[-\d+\]",
    "unpacked chunks": r"^\s+v\d+, (v\d+(, )?)*= ",
    "torch.cat": r"torch\.cat\(",
    "torch.concat axis=": r"torch\.concat\([^\n]*axis=",
    "torch.concatenate": r"torch\.concatenate\(",
    "cat tensors= keyword": r"torch\.cat\(tensors=",
    "cat of a whole tuple": r"torch\.(cat|concat|concatenate)\((list\()?v\d+[,)]",
    "cat of a tuple slice": r"\(v\d+\[\d+:\]",
    "torch.stack": r"torch\.stack\(",
    "unbind": r"unbind\(",
    "slice": r"\[(:, )*-?\d*:-?\d*(:\d+)?\]",
    "slice with ellipsis": r"\[\.\.\., -?\d*:",
    "slice with step": r":\d*:2\]",
    "narrow": r"narrow\(",
    "select by index": r"\[(:, )+-?\d+\]",
    "select()": r"\.select\(",
    "view": r"\.view\(",
    "reshape": r"reshape\(",
    "view with -1": r"(view|reshape)\([^)]*-1",
    "view from .size()": r"\.(size\(0\)|shape\[0\])",
    "flatten": r"flatten\(",
    "unflatten": r"unflatten\(",
    "permute": r"permute\(",
    "transpose": r"transpose\(",
    "movedim": r"movedim\(",
    "squeeze": r"squeeze\(",
    "squeeze of a tuple of dims": r"squeeze\([^)]*\(-?\d+, -?\d+\)",
    "unsqueeze": r"unsqueeze\(",
    "relu": r"relu\(",
    "tanh": r"tanh\(",
    "sigmoid": r"sigmoid\(",
    "exp": r"exp\(",
    "neg": r"(= -\w|neg\()",
    "abs": r"abs\(\)",
    "add": r"( \+ |\.add\(|torch\.add\()",
    "sub": r"( - |torch\.sub\(|\.sub\()",
    "mul": r"( \* |torch\.mul\(|\.mul\()",
    "div": r"( / |torch\.div\(|\.div\()",
    "alpha=": r"alpha=",
    "in-place method": r"^\s+[^=\n]*\.\w+_\(",
    "in-place +=": r" \+= ",
    "in-place through a view": r"\]\.mul_\(",
    "dim= keyword": r"dim=",
    "negative dim": r"(dim=|axis=|, )-\d\)",
    "clone/contiguous": r"(clone|contiguous)\(",
    # regions
    "with torch.no_grad()": r"^\s+with torch\.no_grad\(\):$",
    "with torch.set_grad_enabled(False)": r"^\s+with torch\.set_grad_enabled\(False\):$",
    "bare set_grad_enabled(False) ... (True)": r"^( +)torch\.set_grad_enabled\(False\)\n(\1[^\n]*\n)*?\1torch\.set_grad_enabled\(True\)$",
    "enable_grad inside no_grad": r"^( +)with torch\.(no_grad\(\)|set_grad_enabled\(False\)):\n(\1    [^\n]*\n)*?\1    ( *)with torch\.(enable_grad\(\)|set_grad_enabled\(True\)):$",
    "inference_mode": r"^\s+with torch\.inference_mode\(\):$",
    "autocast bfloat16": r'^\s+with torch\.(amp\.)?autocast\((device_type=)?"cpu"(, dtype=torch\.bfloat16)?\):$',
    "autocast disabled inside autocast": r'^( +)with torch\.(amp\.)?autocast\([^\n]*\):\n(\1    [^\n]*\n)*?\1    ( *)with torch\.autocast\([^\n]*enabled=False\):$',
    "detach": r"\.detach\(\)|torch\.detach\(",
    # parameters, towers, state
    "F.linear": r"(F|torch\.nn\.functional)\.linear\(",
    "linear with bias": r"linear\(\S+, w\d+(\.detach\(\))?, (bias=)?w\d+\)",
    "matmul with a parameter": r"( @ w\d+|torch\.matmul\(\S+, w\d+\))",
    "mm": r"(torch\.mm\(|\.mm\()",
    "addmm": r"addmm\(",
    "bmm": r"bmm\(",
    "layer_norm with affine parameters": r"layer_norm\([^\n]*w\d+",
    "layer_norm without affine": r"layer_norm\(v\d+(\[-?\d+\])?, [\[(]\d+,?[\])](, eps=1e-06)?\)",
    "detached parameter": r"w\d+\.detach\(\)",
    "buffer running average": r"b\d+\.mul_\(0\.\d+\)",
    "buffer copy_": r"b\d+\.copy_\(",
    "buffer counter": r"b\d+\.add_\(1\)",
    "argument updated under no_grad": r"^( +)with torch\.(no_grad\(\)|set_grad_enabled\(False\)):\n\1    [xw]\d+(\[[^\]\n]*\])?\.\w+_\(",
    "cast from bfloat16": r"\.float\(\)|\.to\(torch\.float32\)",
    "cast to bfloat16": r"\.to\(torch\.bfloat16\)|\.bfloat16\(\)",
}


@pytest.mark.parametrize("feature", sorted(SOURCE_FEATURES))
def test_generator_covers(programs, feature):
    pattern = re.compile(SOURCE_FEATURES[feature], re.M)
    hits = sum(1 for c in programs if pattern.search(c.source()))
    assert hits >= 3, f"{feature!r} appears in {hits} of {N} programs"


def test_generator_families_and_flags(programs):
    fam = collections.Counter()
    for c in programs:
        fam.update(c.families())
    for name in fuzz.FAMILIES:
        assert fam[name] >= 3, (name, fam)
    assert sum(c.dynamic for c in programs) >= N // 20
    assert sum(not c.grad for c in programs) >= N // 20
    assert any(0 in spec.shape for c in programs for spec in c.inputs), "zero-size dims"
    assert any(spec.dtype == "float64" for c in programs for spec in c.inputs)
    data = [spec for c in programs for spec in c.inputs if not spec.state]
    assert all(1 <= len(spec.shape) <= 4 and all(0 <= s <= 6 for s in spec.shape) for spec in data)
    roles = collections.Counter(spec.role for c in programs for spec in c.inputs)
    for role in fuzz.ROLES:
        assert roles[role] >= 20, roles
    assert sum(c.low_precision for c in programs) >= N // 20
    # about a third of the programs have a region, a quarter parameters
    assert sum(any(s.ctx for s in c.stmts) for c in programs) >= N // 4
    assert sum(any(spec.role in ("param", "frozen") for spec in c.inputs) for c in programs) >= N // 5


def test_generator_outputs_alias_arguments_and_each_other(programs):
    """Outputs that are arguments (an updated buffer), views of arguments, the same tensor
    twice, and an output with a view of it."""
    counts = collections.Counter()
    for c in programs:
        defs = {d: s for s in c.stmts for d in s.defs}
        args = {spec.name: spec for spec in c.inputs}
        outs = list(c.outputs)
        if any(o in args and args[o].role == "buffer" for o in outs):
            counts["buffer returned"] += 1
        if any(o in args and args[o].role != "buffer" for o in outs):
            counts["argument returned"] += 1
        if len(outs) != len(set(outs)):
            counts["one tensor twice"] += 1
        for o in outs:
            s = defs.get(o)
            if s is None or s.family != "view":
                continue
            read = s.uses[0] if s.uses else None
            if read in args:
                counts["view of an argument returned"] += 1
            elif read in outs:
                counts["an output and a view of it"] += 1
    for what in ("buffer returned", "argument returned", "one tensor twice", "view of an argument returned", "an output and a view of it"):
        assert counts[what] >= 3, (what, counts)


def test_generator_builds_towers_for_the_horizontal_rules(programs):
    """Groups of three or more linears/matmuls with one weight shape: some with a member
    under a grad-off region, some with frozen parameters, some in an autocast region."""
    counts = collections.Counter()
    off = ("torch.no_grad()", "torch.set_grad_enabled(False)", BARE + "torch.set_grad_enabled(False)", "torch.inference_mode()")
    for c in programs:
        args = {spec.name: spec for spec in c.inputs}
        groups = collections.defaultdict(list)
        for s in c.stmts:
            if s.family != "linear":
                continue
            weights = [u for u in s.uses if u in args and args[u].role in ("param", "frozen")]
            if weights:
                groups[(s.text.split(" = ", 1)[1].split("(")[0].split(" ")[-1], args[weights[0]].shape)].append((s, args[weights[0]]))
        for members in groups.values():
            if len(members) < 3:
                continue
            counts["group"] += 1
            ctxs = {any(e in off for e in s.ctx) for s, _ in members}
            if ctxs == {True, False}:
                counts["group with a grad-off member"] += 1
            if {w.role for _, w in members} == {"param", "frozen"}:
                counts["group with frozen members"] += 1
            if any("autocast" in e for s, _ in members for e in s.ctx):
                counts["group with an autocast member"] += 1
    for what in ("group", "group with a grad-off member", "group with frozen members", "group with an autocast member"):
        assert counts[what] >= 5, (what, counts)


def test_generator_chunk_structure(programs):
    """Non-divisible splits, empty chunks, chunks with several users, chunks returned
    directly, cats mixing chunks of two splits or chunks and other tensors, shuffled and
    repeated chunks."""
    counts = collections.Counter()
    for c in programs:
        ns = _values(c)
        chunk_names: set[str] = set()
        for s in c.stmts:
            if s.family not in ("split", "unbind"):
                continue
            vals = [ns[d] for d in s.defs]
            chunks = list(vals[0]) if len(s.defs) == 1 and isinstance(vals[0], tuple) else vals
            if s.family == "split" and len(s.defs) == 1:
                sizes = {tuple(t.shape) for t in chunks}
                if len(sizes) > 1:
                    counts["unequal chunks (non-divisible or listed sizes)"] += 1
                if re.search(r"split\((\w|\[|\]|-)+, \d+", s.text) and len(sizes) > 1:
                    counts["int split size not dividing the dim"] += 1
            if any(t.numel() == 0 for t in chunks):
                counts["empty chunk"] += 1
            chunk_names.update(s.defs)
        body = "\n".join(s.text for s in c.stmts)
        refs = re.findall(r"\b(v\d+(?:\[-?\d+\])?)", body)
        uses = collections.Counter(r for r in refs if "[" in r or r in chunk_names)
        if any(n >= 3 for n in uses.values()):  # defined once, read at least twice
            counts["chunk used several times"] += 1
        if any(re.fullmatch(r"v\d+\[-?\d+\]", o) or o in chunk_names for o in c.outputs):
            counts["chunk returned as an output"] += 1
        for items in _list_args(body):
            tuples = {re.match(r"(v\d+)\[", i).group(1) for i in items if re.match(r"v\d+\[-?\d+\]$", i)}
            if len(tuples) >= 2:
                counts["cat of chunks of two splits"] += 1
            if tuples and any(re.fullmatch(r"[xv]\d+", i) and i not in chunk_names for i in items):
                counts["cat of chunks and another tensor"] += 1
            idx = [int(re.search(r"\[(-?\d+)\]$", i).group(1)) for i in items if re.fullmatch(r"v\d+\[\d+\]", i)]
            if len(idx) >= 2 and idx != sorted(idx):
                counts["shuffled chunks"] += 1
            if len(items) != len(set(items)):
                counts["repeated input"] += 1
    for what in (
        "unequal chunks (non-divisible or listed sizes)",
        "int split size not dividing the dim",
        "empty chunk",
        "chunk used several times",
        "chunk returned as an output",
        "cat of chunks of two splits",
        "cat of chunks and another tensor",
        "shuffled chunks",
        "repeated input",
    ):
        assert counts[what] >= 3, (what, counts)


def _list_args(body: str) -> list[list[str]]:
    """The items of every list literal passed to cat/concat/concatenate/stack."""
    found = []
    for m in re.finditer(r"torch\.(?:cat|concat|concatenate|stack)\((?:tensors=)?\[", body):
        depth, i, items, cur = 1, m.end(), [], ""
        while depth:
            ch = body[i]
            depth += ch in "[(" 
            depth -= ch in "])"
            if depth == 1 and ch == ",":
                items.append(cur.strip())
                cur = ""
            elif depth:
                cur += ch
            i += 1
        items.append(cur.strip())
        found.append([x for x in items if x])
    return found


def test_generator_is_deterministic():
    a = [generate(7, i) for i in range(40)]
    b = [generate(7, i) for i in range(40)]
    assert [c.source() for c in a] == [c.source() for c in b]
    assert [c.inputs for c in a] == [c.inputs for c in b]
    assert [(c.grad, c.dynamic) for c in a] == [(c.grad, c.dynamic) for c in b]
    c = [generate(8, i) for i in range(40)]
    assert sum(x.source() != y.source() for x, y in zip(a, c)) > 30


def test_generator_is_deterministic_across_processes():
    """``python -m optimus.tools.fuzz --list`` in another interpreter, with another hash seed,
    prints the same programs (this also checks the module entry point)."""
    cmd = [sys.executable, "-m", "optimus.tools.fuzz", "--list", "--cases", "25", "--seed", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONHASHSEED="12345"), timeout=600)
    assert out.returncode == 0, out.stderr
    here = []
    for i in range(25):
        c = generate(3, i)
        here.append(f"# {c.label}: grad={c.grad} dynamic={c.dynamic}; " + "; ".join(str(s) for s in c.inputs))
        here.append(c.source())
    assert out.stdout == "\n".join(here) + "\n"


def test_programs_run_eagerly(programs):
    """Almost every program is valid (the rest hold a deliberately invalid op)."""
    bad = []
    for c in programs[:150]:
        ran, ref, why = fuzz.reference(c)
        if ref is None and "invalid" not in c.families():
            bad.append((c.label, why, c.source()))
    assert len(bad) <= 3, bad[:3]


def test_combine_computes_what_the_parts_compute():
    cases = [c for c in (generate(2, i) for i in range(12)) if fuzz.reference(c)[1] is not None][:5]
    cases = [fuzz.reference(c)[0] for c in cases]
    cases = [dataclasses.replace(c, grad=False) for c in cases]
    joined = combine(cases)
    assert len(joined.inputs) == sum(len(c.inputs) for c in cases)
    assert len(set(re.findall(r"\bv\d+\b", joined.source()))) == len({d for s in joined.stmts for d in s.defs})
    ref = fuzz.reference(joined)[1][0]
    parts = [fuzz.reference(c)[1][0] for c in cases]
    flat = [o for p in parts for o in p.outputs]
    assert len(flat) == len(ref.outputs)
    for a, b in zip(flat, ref.outputs):
        torch.testing.assert_close(a, b, equal_nan=True)


def test_shrink_keeps_what_the_failure_needs():
    """A predicate standing in for 'the compiled program fails': the program has a tanh
    of a chunk. The shrinker must get rid of everything else."""
    case = Case(
        (InputSpec("x0", (4, 6), seed=1), InputSpec("x1", (4, 6), seed=2)),
        (
            Stmt("v0 = x0 + x1", ("v0",), "binary"),
            Stmt("v1 = v0.split([2, 4], dim=-1)", ("v1",), "split"),
            Stmt("v2 = torch.cat([v1[1], v1[0]], 1)", ("v2",), "cat"),
            Stmt("v3 = v1[1].tanh()", ("v3",), "unary"),
            Stmt("v4 = v3.permute(1, 0)", ("v4",), "permute"),
            Stmt("v4.mul_(2)", (), "inplace", True),
            Stmt("v5 = v2.relu()", ("v5",), "unary"),
        ),
        ("v5", "v4", "v1[0]"),
        dynamic=True,
    )

    def fails(c: Case) -> bool:
        src = c.source()
        return ".split(" in src and ".tanh()" in src and fuzz.reference(c)[1] is not None

    small, tries = shrink(case, fails)
    assert fails(small)
    assert len(small.stmts) <= 2, small.source()
    assert len(small.outputs) == 1 and not small.dynamic and not small.grad
    assert [i.name for i in small.inputs] == ["x0"] or len(small.inputs) == 1
    assert small.inputs[0].shape[0] == 1  # the batch dim did not matter
    assert tries < 200


def test_source_round_trip():
    c = generate(1, 3)
    fn = c.function()
    args = [s.make() for s in c.inputs]
    ran, ref, why = fuzz.reference(c)
    assert why is None or "invalid" in c.families()
    if why is None:
        out = fn(*args)
        assert len(torch.utils._pytree.tree_leaves(out)) == len(ref[0].outputs)


def test_regions_render_as_blocks_and_bare_calls():
    """Consecutive statements under one region share its block; a bare
    ``torch.set_grad_enabled(False)`` region ends with the call restoring the mode around
    it; the program then runs with each value in its state."""
    nograd, autocast = "torch.no_grad()", 'torch.autocast("cpu", dtype=torch.bfloat16)'
    bare = BARE + "torch.set_grad_enabled(False)"
    stmts = (
        Stmt("v0 = x0 * 2", ("v0",), "binary"),
        Stmt("v1 = v0 + 1", ("v1",), "binary", ctx=(nograd,)),
        Stmt("v2 = v1 * x0", ("v2",), "binary", ctx=(nograd, "torch.enable_grad()")),
        Stmt("v3 = v0 * 3", ("v3",), "binary", ctx=(nograd, bare)),
        Stmt("v4 = v0 * 3", ("v4",), "binary", ctx=(bare,)),
        Stmt("v5 = v4 @ v0.t()", ("v5",), "linear", ctx=(bare, autocast)),
    )
    case = Case((InputSpec("x0", (2, 2), seed=1),), stmts, ("v1", "v2", "v3", "v5"))
    assert case.source() == (
        "def f(x0):\n"
        "    v0 = x0 * 2\n"
        "    with torch.no_grad():\n"
        "        v1 = v0 + 1\n"
        "        with torch.enable_grad():\n"
        "            v2 = v1 * x0\n"
        "        torch.set_grad_enabled(False)\n"
        "        v3 = v0 * 3\n"
        "        torch.set_grad_enabled(False)\n"  # restores the no_grad around it
        "    torch.set_grad_enabled(False)\n"
        "    v4 = v0 * 3\n"
        '    with torch.autocast("cpu", dtype=torch.bfloat16):\n'
        "        v5 = v4 @ v0.t()\n"
        "    torch.set_grad_enabled(True)\n"
        "    return (v1, v2, v3, v5)\n"
    )
    ran, runs, why = fuzz.reference(case)
    assert why is None and ran.grad
    assert runs[0].requires_grad == [False, True, False, False]
    assert runs[0].outputs[3].dtype == torch.bfloat16 and case.low_precision
    assert torch.is_grad_enabled()
    renamed = combine([case, case])  # regions survive renaming
    assert renamed.source().count("with torch.no_grad():") == 2 and "v6 = v5 * 2" not in renamed.source()


def test_shrink_drops_regions_and_roles_a_failure_does_not_need():
    """A predicate standing in for 'fails': a relu of x0 under no_grad. The autocast and
    inference-mode regions, the parameter, the buffer and its update go."""
    nograd = "torch.no_grad()"
    case = Case(
        (InputSpec("x0", (4, 6), seed=1), InputSpec("w0", (3, 6), seed=2, role="frozen"), InputSpec("b0", (6,), seed=3, role="buffer")),
        (
            Stmt("v0 = F.linear(x0, w0)", ("v0",), "linear", ctx=('torch.autocast("cpu", dtype=torch.bfloat16)',)),
            Stmt("v1 = x0.relu()", ("v1",), "unary", ctx=("torch.inference_mode()", nograd)),
            Stmt("b0.add_(1)", (), "state", True, ctx=(nograd,)),
            Stmt("v2 = v1 + b0", ("v2",), "binary"),
        ),
        ("v0", "v2"),
    )

    def fails(c: Case) -> bool:
        return re.search(r"with torch\.no_grad\(\):\n +v\d+ = x0\.relu\(\)", c.source()) is not None and fuzz.reference(c)[1] is not None

    assert fails(case)
    small, tries = shrink(case, fails)
    src = small.source()
    assert fails(small)
    assert "inference_mode" not in src and "autocast" not in src and "w0" not in src and "b0" not in src, src
    assert len(small.stmts) == 1 and [i.name for i in small.inputs] == ["x0"], src


def test_an_invalid_op_is_never_read():
    """An invalid op's value never exists (eager rejects the op): no later statement reads
    it. Seed 0, case 747 once returned a view of it (the generator raised NameError)."""
    c = generate(0, 747)
    invalid = [s for s in c.stmts if s.family == "invalid"]
    assert invalid, c.source()
    name = invalid[0].defs[0]
    assert not any(name in s.uses for s in c.stmts if s is not invalid[0]), c.source()
