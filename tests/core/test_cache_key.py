"""The compile-cache key hashes what decides compiled code, and nothing else."""

import importlib
import pathlib

oc = importlib.import_module("optimus.compile")  # the module (optimus.compile is also the function)

# Top-level parts of the package that do not decide compiled code (so are not hashed). A
# new module or package must be put here or in compile.COMPILED_SOURCES.
NOT_COMPILING = {"__init__.py", "graph_pictures.py", "tools"}


def test_key_covers_the_compiling_sources_only():
    names = [name for name, _ in oc.compiled_source_files()]
    for required in ("core/rule.py", "core/driver.py", "torch_ir/view.py", "aten_ir/view.py", "inductor_ir/passes.py",
                     "rules/split_cat.py", "rules/kernel_fusion.py", "planner/plan.py", "compile.py", "torch_api.py", "safety_net.py",
                     "kernels/__init__.py", "kernels/linear/op.py", "kernels/linear/eager.py", "kernels/linear/kernel.py",
                     "kernels/embedding_bag/op.py", "kernels/runtime/registration.py"):
        assert required in names, required
    for tool in ("tools/", "bench/", "models/", "measure.py", "cli.py", "graph_pictures.py"):
        assert not any(n.startswith(tool) for n in names), tool
    assert names == sorted(names)


def test_key_hashes_the_whole_kernels_package():
    """The kernels are compiler, every file of them (a folder, not a list): their benchmarks
    live with the bench (optimus/tools/bench/kernels), outside the package."""
    import optimus.kernels

    folder = pathlib.Path(optimus.kernels.__file__).parent
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


def test_every_part_of_the_package_is_classified():
    root = pathlib.Path(oc.__file__).parent
    parts = {p.name for p in root.iterdir() if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").is_file())}
    parts.discard("kernels")  # an installed layout: hashed as the optimus.kernels package
    assert parts == set(oc.COMPILED_SOURCES) | NOT_COMPILING, (
        f"classify {sorted(parts - set(oc.COMPILED_SOURCES) - NOT_COMPILING)} (compile.COMPILED_SOURCES or NOT_COMPILING); "
        f"gone: {sorted((set(oc.COMPILED_SOURCES) | NOT_COMPILING) - parts)}"
    )


def test_compiling_sources_import_nothing_unhashed():
    """What the key hashes must not depend on what it does not hash (else an edit there
    would change compiled code under an unchanged key). Drawing pictures in ``explain`` is
    the one exception: it reads graphs and changes nothing."""
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from test_architecture import import_graph

    allowed = {("optimus.compile", "optimus.graph_pictures")}
    hashed = lambda name: any(  # noqa: E731
        name == f"optimus.{e.removesuffix('.py')}" or name.startswith(f"optimus.{e}.") for e in oc.COMPILED_SOURCES
    ) or name.startswith("optimus.kernels")
    unhashed = {f"optimus.{e.removesuffix('.py')}" for e in NOT_COMPILING if e != "__init__.py"}
    bad = sorted(
        (src, dst)
        for src, edges in import_graph().items()
        if hashed(src)
        for dst in edges
        if any(dst == u or dst.startswith(u + ".") for u in unhashed) and (src, dst) not in allowed
    )
    assert not bad, f"compiling modules importing unhashed ones (hash them: compile.COMPILED_SOURCES): {bad}"
