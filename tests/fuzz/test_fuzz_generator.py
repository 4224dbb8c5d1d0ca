"""The fuzzer's program generator (no compiles: fast): it covers every op family and
spelling the issue lists, it is deterministic, combined cases compute what their parts
compute, and the shrinker reduces a program to what a failure needs."""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import subprocess
import sys

import pytest
import torch

from optimus.tools import fuzz
from optimus.tools.fuzz import Case, InputSpec, Stmt, combine, generate, shrink

N = 600  # programs for the coverage statistics (about 5 s)


@pytest.fixture(scope="module")
def programs() -> list[Case]:
    return [generate(0, i) for i in range(N)]


def _meta_values(case: Case) -> dict[str, object]:
    """Run a program on meta tensors; every statement's value by name."""
    ns: dict[str, object] = {"torch": torch, "F": torch.nn.functional}
    for spec in case.inputs:
        ns[spec.name] = spec.meta()
    for s in case.stmts:
        if s.family == "invalid":
            break
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
    assert all(1 <= len(spec.shape) <= 4 and all(0 <= s <= 6 for s in spec.shape) for c in programs for spec in c.inputs)


def test_generator_chunk_structure(programs):
    """Non-divisible splits, empty chunks, chunks with several users, chunks returned
    directly, cats mixing chunks of two splits or chunks and other tensors, shuffled and
    repeated chunks."""
    counts = collections.Counter()
    for c in programs:
        ns = _meta_values(c)
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
