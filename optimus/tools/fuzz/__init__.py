"""Differential fuzzer for the canonicalization and vertical rules (``optimus fuzz``).

Every case is a small random program, written as Python source::

    def f(x0, x1):
        v0 = x0.split([1, 3], dim=-1)
        v1 = torch.cat([v0[1], x1, v0[0]], 1)
        v2 = v1.view(3, 2, -1).relu()
        ...
        return (v2, v0[1])

built from a pool of live tensors with split / chunk / cat / stack / unbind / getitem /
slice / select / view / reshape / flatten / permute / transpose / squeeze / unsqueeze /
pointwise ops, in every spelling the Torch-IR view reads (keyword and positional, negative
dims, ``torch.concat(..., axis=)``), with shapes that make split sizes not divide, chunks
empty, slices run out of range, and in-place writes to intermediates, views and chunks.

Each case runs eagerly (the reference) and through ``torch.compile`` with a backend that
rewrites the captured graph with every registered ``canonicalize`` and ``vertical`` rule
(``passes="vertical"``) at both levels:

* **Torch-IR**: ``optimus.optimize(gm, level="torch_ir")`` on Dynamo's graph, which then
  runs eagerly (autograd supplies gradients);
* **Aten-IR**: ``aot_autograd`` with Inductor's decompositions and forward/backward
  compilers that call ``optimus.optimize(gm, level="aten_ir")``.

Outputs, input gradients, inputs written in place and (at Torch-IR) which outputs alias
which inputs must equal eager's; the report must hold no rule errors, level rollbacks or
exhausted rewrite budgets. A failing case is shrunk (statements, outputs, inputs, flags,
shapes) and printed as a reproducer ready to paste into a test.

Speed: Dynamo and AOTAutograd cost a few hundred milliseconds per compile, mostly fixed.
So one compile serves both levels (the backend builds both rewritten versions and a
switch picks one per call), and several cases are compiled together as one function
(``batch``); a batch that fails is re-run case by case to find the culprit.

Command line: ``optimus fuzz --cases N --seed S`` (also ``python -m optimus.tools.fuzz``);
library: ``fuzz(...)``, ``generate(seed, index)``, ``check_case(...)``, ``check_source(...)``.

Modules: ``program`` (cases as source), ``generate`` (the generator), ``oracle`` (eager
against compiled, per level), ``shrink`` (minimizing a failure, the reproducer),
``campaign`` (``fuzz()``: batches, counts), ``cli``.
"""

from __future__ import annotations

from .campaign import FuzzResult, fuzz
from .cli import add_arguments, main, register, run_cli
from .generate import generate
from .oracle import (
    ALIASING_MODES,
    FAILURE_KINDS,
    OK,
    SKIP,
    CaseResult,
    LevelResult,
    check_case,
    check_source,
    reference,
    resolve_passes,
)
from .program import DTYPES, FAMILIES, LEVELS, Case, InputSpec, Stmt, combine
from .shrink import Failure, format_reproducer, investigate, shrink, signature

__all__ = [
    "ALIASING_MODES",
    "DTYPES",
    "FAILURE_KINDS",
    "FAMILIES",
    "LEVELS",
    "OK",
    "SKIP",
    "Case",
    "CaseResult",
    "Failure",
    "FuzzResult",
    "InputSpec",
    "LevelResult",
    "Stmt",
    "add_arguments",
    "check_case",
    "check_source",
    "combine",
    "format_reproducer",
    "fuzz",
    "generate",
    "investigate",
    "main",
    "reference",
    "register",
    "resolve_passes",
    "run_cli",
    "shrink",
    "signature",
]
