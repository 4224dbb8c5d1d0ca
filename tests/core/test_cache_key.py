"""The compile-cache key hashes what decides compiled code, and nothing else: every module of
the package outside its tools folder, and the kernels package. Folders say which is which;
these tests derive both sides from the file tree."""

import importlib
import importlib.util
import pathlib
import shutil

oc = importlib.import_module("optimus.compile")  # the module (optimus.compile is also the function)

PACKAGE = pathlib.Path(oc.__file__).parent
TOOLS = PACKAGE / oc.TOOLS_FOLDER


def _kernel_folders() -> list[pathlib.Path]:
    spec = importlib.util.find_spec("optimus.kernels")
    return [pathlib.Path(p) for p in spec.submodule_search_locations]


def _package_modules(root: pathlib.Path) -> set[str]:
    """Every .py under ``root`` but the tools folder and an installed kernels folder."""
    return {f.relative_to(root).as_posix() for f in root.rglob("*.py")
            if f.relative_to(root).parts[0] not in (oc.TOOLS_FOLDER, "kernels")}


def test_key_hashes_every_module_outside_the_tools_and_no_tool():
    names = [name for name, _ in oc.compiled_source_files()]
    assert names == sorted(names) and len(names) == len(set(names))
    kernels = {f"kernels/{f.relative_to(folder).as_posix()}" for folder in _kernel_folders() for f in folder.rglob("*.py")}
    assert set(names) == _package_modules(PACKAGE) | kernels
    # the tools folder exists, holds the tools, and none of it is hashed
    tools = {f.relative_to(PACKAGE).as_posix() for f in TOOLS.rglob("*.py")}
    assert {"tools/cli.py", "tools/bench/harness.py", "tools/models/__init__.py", "tools/fuzz/cli.py",
            "tools/measure.py", "tools/bench/kernels/aot_check.py"} <= tools
    assert not tools & set(names) and not any(n.startswith(f"{oc.TOOLS_FOLDER}/") for n in names)
    # the parts of the compiler are there, each under its own name
    for required in ("__init__.py", "compile.py", "core/rule.py", "torch_ir/view.py", "aten_ir/view.py",
                     "inductor_ir/passes.py", "rules/split_cat.py", "planner/plan.py", "graph_pictures.py",
                     "kernels/__init__.py", "kernels/linear/op.py", "kernels/runtime/registration.py"):
        assert required in names, required


def test_key_hashes_the_whole_kernels_package():
    """The kernels are compiler, every file of them (a folder, not a list): their benchmarks
    live with the bench (optimus/tools/bench/kernels), outside the package."""
    (folder,) = _kernel_folders()
    on_disk = {f"kernels/{f.relative_to(folder).as_posix()}" for f in folder.rglob("*.py")}
    names = {name for name, _ in oc.compiled_source_files() if name.startswith("kernels/")}
    assert names == on_disk
    assert not any("bench" in n or "aot_check" in n for n in names), sorted(names)


def test_key_changes_with_a_compiling_source(monkeypatch, tmp_path):
    before = oc.source_fingerprint.__wrapped__()
    files = oc.compiled_source_files()
    name, path = next((n, p) for n, p in files if n == "rules/split_cat.py")
    edited = tmp_path / "split_cat.py"
    edited.write_bytes(path.read_bytes() + b"\n# edited\n")
    monkeypatch.setattr(oc, "compiled_source_files", lambda: [(n, edited if n == name else p) for n, p in files])
    assert oc.source_fingerprint.__wrapped__() != before


def test_editing_a_tool_keeps_the_key_editing_anything_else_changes_it(tmp_path):
    """On a copy of the package: appending to every tool file, or adding a tool, leaves the
    key as it was; appending to any one other module, or adding one, changes it."""
    copy = tmp_path / "optimus"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    kernels = _kernel_folders()

    def key() -> str:
        return oc.hash_sources(oc.compiled_source_files(copy, kernels))

    before = key()
    assert before == oc.source_fingerprint()  # the copy hashes as the package does

    tool_files = sorted((copy / oc.TOOLS_FOLDER).rglob("*.py"))
    assert len(tool_files) > 20
    for f in tool_files:
        f.write_text(f.read_text() + "\n# a tool edited\n")
    (copy / oc.TOOLS_FOLDER / "new_tool.py").write_text("X = 1\n")
    (copy / oc.TOOLS_FOLDER / "bench" / "new_bench.py").write_text("Y = 2\n")
    assert key() == before

    compiler = sorted(_package_modules(copy))
    assert len(compiler) > 50
    for rel in compiler:
        path = copy / rel
        text = path.read_text()
        path.write_text(text + "\n# edited\n")
        assert key() != before, rel
        path.write_text(text)
    assert key() == before
    (copy / "rules" / "new_family.py").write_text("Z = 3\n")
    assert key() != before


def test_compiling_sources_import_nothing_unhashed():
    """What the key hashes must not depend on what it does not hash (else an edit there
    would change compiled code under an unchanged key): no module outside the tools folder
    imports one inside it."""
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from test_architecture import import_graph

    tools = f"optimus.{oc.TOOLS_FOLDER}"
    in_tools = lambda name: name == tools or name.startswith(tools + ".")  # noqa: E731
    bad = sorted((src, dst) for src, edges in import_graph().items() if not in_tools(src) for dst in edges if in_tools(dst))
    assert not bad, f"hashed modules importing tools (unhashed): {bad}"
