"""A new kernel family is a copied folder: the template family ``scale`` (tests/kernels/template,
the one docs/writing-a-kernel.md walks through) is copied beside a copy of the shared runtime,
imported, and shown to register its op, pass ``torch.library.opcheck``, train, and run its Triton
kernel under the interpreter on the CPU (small shapes)."""

import ast
import importlib
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from kernels_testutil import HAS_TRITON, INTERPRETER_PROBLEM, REPO

TEMPLATE = Path(__file__).resolve().parent / "template" / "scale"
PACKAGE = "optimus_toy_kernels"


@pytest.fixture(scope="module")
def scale_family(tmp_path_factory):
    """``PACKAGE.scale``: the template copied into a package holding a copy of kernels/runtime."""
    root = tmp_path_factory.mktemp("family")
    pkg = root / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""A kernels package with one family, copied from the template."""\n')
    shutil.copytree(REPO / "kernels" / "runtime", pkg / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(TEMPLATE, pkg / "scale", ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module(f"{PACKAGE}.scale")
    finally:
        sys.path.remove(str(root))


def _members(dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(grad) for shape in ((3, 5), (0, 4), (130,), (2, 2, 3))]
    s = torch.randn(len(xs), generator=g, dtype=dtype).requires_grad_(grad)
    return xs, s


def test_the_template_imports_only_itself_and_the_runtime():
    """What tests/test_architecture.py asks of every family, checked on the template."""
    for path in TEMPLATE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 or (node.level == 2 and (node.module or "").startswith("runtime")), (path.name, node.module)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert not any(n.split(".")[0] == "optimus" for n in names), (path.name, names)


def test_the_copied_family_registers_its_op(scale_family):
    op = torch.ops.optimus.toy_scale.default
    assert str(op._schema) == "optimus::toy_scale(Tensor x, Tensor s, SymInt[] sizes) -> Tensor"
    assert torch.Tag.pt2_compliant_tag in op.tags
    xs, s = _members()
    ys = scale_family.scale(xs, s)
    for x, y, sg in zip(xs, ys, s):
        torch.testing.assert_close(y, x * sg)


def test_the_copied_family_passes_opcheck(scale_family):
    xs, s = _members(grad=True)
    x = torch.cat([t.detach().reshape(-1) for t in xs]).requires_grad_()
    torch.library.opcheck(torch.ops.optimus.toy_scale.default, (x, s, [t.numel() for t in xs]))


def test_the_copied_family_trains(scale_family):
    xs, s = _members(torch.float64, grad=True)
    assert torch.autograd.gradcheck(lambda *a: scale_family.scale(list(a[:-1]), a[-1]), (*xs, s))
    compiled = torch.compile(lambda *a: scale_family.scale(list(a[:-1]), a[-1]), fullgraph=True, backend="aot_eager")
    for a, b in zip(compiled(*xs, s), scale_family.scale(xs, s)):
        torch.testing.assert_close(a, b)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter test is for CPU-only machines")
@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.skipif(INTERPRETER_PROBLEM is not None, reason=str(INTERPRETER_PROBLEM))
def test_the_copied_family_runs_its_triton_kernel_in_the_interpreter(scale_family, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    xs, s = _members(grad=True)
    x = torch.cat([t.detach().reshape(-1) for t in xs]).requires_grad_()
    sizes = [t.numel() for t in xs]
    y = torch.ops.optimus.toy_scale(x, s, sizes)
    assert f"{PACKAGE}.scale.kernel" in sys.modules  # the Triton path ran, not the reference
    torch.testing.assert_close(y, scale_family.reference.scale_packed(x, s, sizes))
    dx, ds = torch.autograd.grad(y, (x, s), torch.ones_like(y))
    torch.testing.assert_close(dx, scale_family.reference.scale_packed(torch.ones_like(x), s, sizes))
    torch.testing.assert_close(ds, scale_family.reference.member_sums(x.detach(), sizes))
    torch.library.opcheck(torch.ops.optimus.toy_scale.default, (x, s, sizes))
    assert os.environ["TRITON_INTERPRET"] == "1"
