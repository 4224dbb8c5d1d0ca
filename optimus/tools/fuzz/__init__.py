"""Differential fuzzer for Optimus's rules (``optimus fuzz``).

Every case is a small random program, written as Python source::

    def f(x0, x1, w0, w1, w2, b0):
        v0 = x0.split([1, 3], dim=-1)
        v1 = torch.cat([v0[1], x1, v0[0]], 1)
        with torch.no_grad():
            v2 = F.linear(v1, w0)
        v3 = F.linear(v1, w1) + F.linear(v1, w2)
        b0.mul_(0.9).add_(v3.detach().mean(0), alpha=0.1)
        ...
        return (v2, v0[1], b0)

built from a pool of live tensors with split / chunk / cat / stack / unbind / getitem /
slice / select / view / reshape / flatten / permute / transpose / squeeze / unsqueeze /
pointwise ops, in every spelling the Torch-IR view reads (keyword and positional, negative
dims, ``torch.concat(..., axis=)``), with shapes that make split sizes not divide, chunks
empty, slices run out of range, and in-place writes to intermediates, views and chunks;
with grad-mode, inference-mode and autocast regions; with parameters (``w<i>``: trained,
frozen, detached) in towers of linears, matmuls and layer norms, the horizontal rules'
material; with buffers (``b<i>``) and arguments updated in place; with outputs that alias
arguments or each other.

Each case runs as a module (parameters and buffers its own) eagerly (the reference) and
compiled, twice (fresh data, the same state), at each level:

* **Torch-IR**: ``optimus.optimize(gm, level="torch_ir")`` on Dynamo's graph, which then
  runs eagerly (autograd supplies gradients);
* **Aten-IR**: ``aot_autograd`` with Inductor's decompositions and forward/backward
  compilers that call ``optimus.optimize(gm, level="aten_ir")``;
* **compile**: ``optimus.compile`` end to end (Inductor, the safety net, the output guard).

Outputs (values, dtypes, ``requires_grad``), gradients of inputs and parameters (a
parameter eager leaves without a gradient must stay without one), every argument written
in place and which outputs share memory with which arguments or outputs must equal eager's
after each call; the report must hold no rule errors, level rollbacks, exhausted rewrite
budgets or fallbacks. The passes are ``"vertical"`` by default, any ``passes`` value
otherwise (``"all"`` adds the horizontal rules). A failing case is shrunk (statements,
regions, outputs, inputs, roles, flags, shapes) and printed as a reproducer ready to paste
into a test.

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
from .program import DTYPES, FAMILIES, LEVELS, ROLES, Case, InputSpec, Stmt, combine
from .shrink import Failure, format_reproducer, investigate, shrink, signature

__all__ = [
    "ALIASING_MODES",
    "DTYPES",
    "FAILURE_KINDS",
    "FAMILIES",
    "LEVELS",
    "OK",
    "ROLES",
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
