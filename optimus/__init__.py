"""Optimus: a multi-level graph optimizer for PyTorch 2.x.

Vertical rewrites delete pointless chains (split-then-cat, unbind-then-stack);
horizontal rewrites merge independent identical ops. FX rules are written once against a
canonical op vocabulary and run at Torch-IR (Dynamo's pre-grad graph) and Aten-IR
(post-grad forward/backward graphs); Inductor-IR rules, in the same form, decide which
scheduler nodes become one kernel.

Quick start::

    import optimus
    model = optimus.compile(model)              # torch.compile + Optimus passes
    report = optimus.explain(model, x)          # what changed, per level and rule
    gm = optimus.optimize(fx_graph_module)      # rewrite a bare FX graph
    optimus.pack_parameters(model)              # sibling weights in one buffer each
"""

from __future__ import annotations

import os as _os

__version__ = "0.1.0"

# The Triton kernels live in the top-level ``kernels/`` folder and are installed as
# ``optimus.kernels``; in a source checkout (no install) make the same import work.
# A finder for that one name, not the checkout root on ``__path__``: the root holds
# ``optimus/`` itself, so ``optimus.optimus.optimus...`` would be a package without end
# and anything walking the package (``TORCH_LOGS="+optimus"``: torch imports every
# subpackage of a module it does not know) would never finish.
_here = _os.path.dirname(_os.path.abspath(__file__))
if not _os.path.isdir(_os.path.join(_here, "kernels")):
    _kernels = _os.path.join(_os.path.dirname(_here), "kernels")
    if _os.path.isfile(_os.path.join(_kernels, "__init__.py")):
        import importlib.machinery as _ilm
        import importlib.util as _ilu
        import sys as _sys

        class _SourceKernelsFinder:
            """Finds ``optimus.kernels`` in the checkout's top-level ``kernels/`` folder."""

            @staticmethod
            def find_spec(fullname: str, path: object = None, target: object = None) -> _ilm.ModuleSpec | None:
                if fullname != "optimus.kernels":
                    return None
                return _ilu.spec_from_file_location(
                    fullname, _os.path.join(_kernels, "__init__.py"), submodule_search_locations=[_kernels]
                )

        _sys.meta_path.insert(0, _SourceKernelsFinder())

# The levels register their graph views with the core, the rule modules register the
# built-in rules: importing any optimus module runs this file first, so every entry point
# (optimus.compile, optimus.core.registry.resolve, the command line) sees them.
from . import aten_ir, torch_ir  # noqa: E402,F401
from . import rules as _builtin_rules  # noqa: E402,F401
from .compile import compile, explain, last_report, make_backend, optimize  # noqa: E402
from .core.pattern import ANY, Alt, Each, ListOf, Lit, Op, Var  # noqa: E402
from .core.registry import REGISTRY, DriverOptions, PassConfig, resolve  # noqa: E402
from .core.report import Report  # noqa: E402
from .core.rule import Builder, Decline, Match, Rule, rule  # noqa: E402
from .packing import PackReport, pack_parameters, unpack_parameters  # noqa: E402


def register_rule(r: Rule, replace: bool = False) -> Rule:
    """Register a ``Rule`` built without the ``@optimus.rule`` decorator."""
    return REGISTRY.add(r, replace=replace)


def list_rules(level: str | None = None) -> list[Rule]:
    """Registered rules (built-in and user), in the order the driver tries them."""
    return REGISTRY.rules(level)


__all__ = [
    "ANY",
    "Alt",
    "Builder",
    "Decline",
    "DriverOptions",
    "Each",
    "ListOf",
    "Lit",
    "Match",
    "Op",
    "PassConfig",
    "REGISTRY",
    "Report",
    "Rule",
    "Var",
    "compile",
    "explain",
    "last_report",
    "list_rules",
    "make_backend",
    "optimize",
    "PackReport",
    "pack_parameters",
    "register_rule",
    "resolve",
    "rule",
    "unpack_parameters",
]
