"""The package's architecture: its import graph (no cycle; ``optimus/core`` imports nothing
outside it; nothing below the rules imports a rule; the planner imports no level; nothing
outside ``optimus/tools/`` imports the tools; a kernel family imports only the runtime),
and no rule named outside its own file.

Every ``import`` / ``from ... import`` statement of every module of the package (and of
``kernels/``, installed as ``optimus.kernels``) is read with ``ast``, including the ones
inside functions (lazy imports); only imports under ``if TYPE_CHECKING:`` are left out.
An edge goes to the most specific module named: ``from .core import rule`` is an edge to
``optimus.core.rule``, ``from .core.rule import Rule`` too; ``from . import x`` inside a
package names ``x``. Importing a submodule also runs its parent packages' ``__init__``,
but Python always does that first, so parents are not edges of their own (an explicit
``import optimus`` is).
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = {"optimus": ROOT / "optimus", "optimus.kernels": ROOT / "kernels"}


def _modules() -> dict[str, pathlib.Path]:
    found: dict[str, pathlib.Path] = {}
    for prefix, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, lazy ones included, except under ``if TYPE_CHECKING:``."""
    out: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def _package_of(name: str) -> str:
    path = MODULES[name]
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def _targets(name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        bases = [alias.name for alias in node.names]
        return [b for b in bases if b == "optimus" or b.startswith("optimus.")]
    if node.level:
        package = _package_of(name).split(".")
        base = package[: len(package) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    if module != "optimus" and not module.startswith("optimus."):
        return []
    out = []
    for alias in node.names:
        sub = f"{module}.{alias.name}"
        out.append(sub if sub in MODULES else module)
    return out


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: set[str] = set()
        for node in _import_nodes(tree):
            edges.update(t for t in _targets(name, node) if t != name)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_import_target_is_a_module_of_the_package():
    graph = import_graph()
    unknown = sorted({t for edges in graph.values() for t in edges if t not in MODULES})
    assert not unknown, f"imports of modules that do not exist: {unknown}"


def test_no_import_cycle():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles (each line one strongly connected set of modules):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_core_imports_only_core():
    graph = import_graph()
    outward = sorted(
        (name, target)
        for name, edges in graph.items()
        if name.startswith("optimus.core")
        for target in edges
        if not target.startswith("optimus.core")
    )
    assert not outward, f"optimus/core imports outside itself: {outward}"


BELOW_THE_RULES = ("optimus.core", "optimus.torch_ir", "optimus.aten_ir", "optimus.inductor_ir", "optimus.planner")


def test_nothing_below_the_rules_imports_a_rule():
    """The core, the levels and the planner know rules only through the registry and the
    traits rules declare: facts they share with rules (``core.segments``) live below them."""
    graph = import_graph()
    reaching = sorted(
        (name, target)
        for name, edges in graph.items()
        if name.startswith(BELOW_THE_RULES)
        for target in edges
        if target == "optimus.rules" or target.startswith("optimus.rules.")
    )
    assert not reaching, f"modules below the rules importing a rule module: {reaching}"


def test_the_planner_imports_no_level_and_not_the_compile():
    """The levels' drivers ask the planner (the FX driver through ``core.group.GroupPlanner``,
    the Inductor-IR driver calls ``ScheduleMemory`` with Inductor's estimates in hand); the
    compile asks it for a graph's passes. It reads Inductor through no one."""
    graph = import_graph()
    levels = ("optimus.torch_ir", "optimus.aten_ir", "optimus.inductor_ir", "optimus.compile")
    reaching = sorted((n, t) for n, edges in graph.items() if n.startswith("optimus.planner") for t in edges if t.startswith(levels))
    assert not reaching, f"planner modules importing a level or the compile: {reaching}"


def test_the_registry_does_not_import_the_rule_protocol_even_for_types():
    """``core.rule`` registers rules into ``core.registry``; the registry reads them through
    its own protocol (``RegisteredRule``), so the two do not import each other in any form."""
    tree = ast.parse(MODULES["optimus.core.registry"].read_text())
    every = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]  # TYPE_CHECKING ones too
    targets = {t for node in every for t in _targets("optimus.core.registry", node)}
    assert "optimus.core.rule" not in targets and "optimus.core.registry" in import_graph()["optimus.core.rule"]


def test_fixpoint_and_numeric_check_do_not_import_each_other():
    graph = import_graph()
    assert "optimus.core.numeric" not in graph["optimus.core.driver"]
    assert "optimus.core.driver" not in graph["optimus.core.numeric"]


TOOLS = "optimus.tools"


def _is_tool(name: str) -> bool:
    return name == TOOLS or name.startswith(TOOLS + ".")


def test_nothing_outside_the_tools_imports_the_tools():
    """The tools (the command line, bench, zoo, fuzzer, demo, kernel benchmarks) live in one
    folder, ``optimus/tools/``, and import the library; nothing outside that folder imports
    them (the compile-cache key hashes everything else)."""
    graph = import_graph()
    reaching = sorted((n, t) for n in graph if not _is_tool(n) for t in graph[n] if _is_tool(t))
    assert not reaching, f"modules outside optimus/tools importing tools: {reaching}"
    assert {"optimus.tools.cli", "optimus.tools.bench.harness", "optimus.tools.models", "optimus.tools.fuzz"} <= set(graph)


def test_the_tools_rule_catches_an_import_of_a_tool():
    tree = ast.parse("def f():\n    from .tools.bench import harness\n")
    targets = [t for node in _import_nodes(tree) for t in _targets("optimus.compile", node)]
    assert targets == ["optimus.tools.bench.harness"] and _is_tool(targets[0]) and not _is_tool("optimus.toolsmith")


def test_the_checker_sees_lazy_imports_and_skips_type_checking_ones():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from optimus.rules import x\n"
        "def f():\n    from .core import rule\n    import optimus.compile\n"
    )
    targets = [t for node in _import_nodes(tree) for t in _targets("optimus.packing", node)]
    assert sorted(targets) == ["optimus.compile", "optimus.core.rule"]


def test_registry_sees_the_builtin_rules_from_a_fresh_interpreter():
    """``resolve`` imports nothing; importing any optimus module runs optimus/__init__.py,
    which loads the levels and the built-in rules first."""
    import subprocess
    import sys

    code = (
        "from optimus.core.registry import resolve\n"
        "from optimus.core.levels import make_view\n"
        "cfg = resolve('all')\n"
        "assert 'merge_splits' in cfg.rules['torch_ir'] and 'batch_mm' in cfg.rules['aten_ir'], cfg.rules\n"
        "assert 'fuse_independent_kernels' in cfg.rules['inductor_ir'], cfg.rules\n"
        "import torch\n"
        "gm = torch.fx.symbolic_trace(torch.nn.ReLU())\n"
        "print(type(make_view('torch_ir', gm)).__name__, type(make_view('aten_ir', gm)).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["TorchIRView", "AtenIRView"]


KERNEL_RUNTIME = "optimus.kernels.runtime"


def _kernel_family(name: str) -> str | None:
    """The family folder a module of ``optimus.kernels`` belongs to (``linear``, ...), or None."""
    parts = name.split(".")
    if len(parts) < 3 or parts[:2] != ["optimus", "kernels"] or parts[2] == "runtime":
        return None
    return parts[2] if (ROOT / "kernels" / parts[2]).is_dir() else None


def test_a_kernel_family_imports_only_the_runtime():
    """A family (``kernels/<family>/``) imports its own modules and the shared runtime
    (besides torch, triton, numpy), never another family and nothing of ``optimus`` outside
    the kernels: so a family can be copied into a new one, and read alone. The runtime imports
    no family."""
    graph = import_graph()
    bad = []
    for name, edges in graph.items():
        family = _kernel_family(name)
        in_runtime = name.startswith(KERNEL_RUNTIME)
        if family is None and not in_runtime:
            continue
        for target in edges:
            if target.startswith(KERNEL_RUNTIME):
                continue
            if family is not None and _kernel_family(target) == family:
                continue
            bad.append((name, target))
    assert not bad, f"kernel family / runtime modules importing outside their family and the runtime: {sorted(bad)}"
    families = {_kernel_family(n) for n in graph} - {None}
    assert families >= {"linear", "layer_norm", "embedding_bag", "packed_linear"}, families


def test_kernel_family_rule_catches_a_cross_family_import():
    tree = ast.parse("from ..layer_norm import reference\n")
    targets = [t for node in _import_nodes(tree) for t in _targets("optimus.kernels.linear.eager", node)]
    assert "optimus.kernels.layer_norm.reference" in targets
    assert _kernel_family("optimus.kernels.layer_norm.reference") == "layer_norm"
    assert _kernel_family("optimus.kernels.runtime.plans") is None


# ----------------------------------------------------------------- rules named elsewhere
#: Modules outside ``optimus/rules/`` that may hold a string equal to a registered rule's
#: name, and why. ``None``: any rule name; else only the names listed.
RULE_NAMES_ALLOWED: dict[str, tuple[frozenset[str] | None, str]] = {
    "optimus/core/upstream_names.py": (None, "the table of upstream PyTorch's pass names and the Optimus rules doing each one's "
                                             "job, an alias table (tests/core/test_upstream_names.py checks every name is a rule "
                                             "running at its level)"),
    "optimus/tools/gpu_check.py": (None, "a tool: it selects rules by name, as a user does"),
    "optimus/tools/scale.py": (None, "a tool: it reads a rule's count from the report, as a user does"),
    "optimus/tools/fuzz/shrink.py": (None, "a tool: the fuzzer's shrinker names the rewrite it does not count as a finding"),
    "optimus/tools/bench/kernels/grouped.py": (frozenset({"grouped_linear", "batched_layer_norm"}), "kernel names (a rule is named after the kernel it emits)"),
    "optimus/tools/bench/kernels/overhead.py": (frozenset({"grouped_mm"}), "a route of the grouped-linear kernel (torch's grouped_mm)"),
}


def _rule_name_literals() -> dict[str, set[str]]:
    """Per module outside ``optimus/rules/``, the string constants equal to a registered
    rule's name (docstrings and prose never equal one)."""
    from optimus.core.registry import REGISTRY

    names = set(REGISTRY.names())
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "optimus").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("optimus/rules/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.setdefault(rel, set()).add(node.value)
    return found


def test_no_module_names_a_rule_but_its_own_file():
    """Policy lives on the rule (its traits, read through the registry), never in a list of
    names elsewhere: renaming a rule cannot silently lose it. The allowed exceptions are
    listed above with their reasons; an entry no longer needed is an error too."""
    found = _rule_name_literals()
    bad = {}
    for rel, names in found.items():
        allowed, _ = RULE_NAMES_ALLOWED.get(rel, (frozenset(), ""))
        extra = set() if allowed is None else names - allowed
        if extra:
            bad[rel] = sorted(extra)
    assert not bad, f"modules naming rules outside their own file (declare a trait on the rule instead): {bad}"
    stale = sorted(set(RULE_NAMES_ALLOWED) - set(found))
    assert not stale, f"allow-list entries no longer needed: {stale}"


def test_the_rule_name_check_finds_a_name():
    tree = ast.parse('POLICY = ("batch_linear",)\n"""batch_linear stacks."""\n')
    consts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    assert "batch_linear" in consts and "batch_linear stacks." in consts
