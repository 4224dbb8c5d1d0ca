"""pyproject lists every package (the kernels/ mapping needs an explicit list)."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_package_is_listed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "optimus").rglob("__init__.py")}
    # kernels/ is installed as optimus.kernels: its subpackages (the families, the runtime) too
    found |= {".".join(("optimus", *p.parent.relative_to(ROOT).parts)) for p in (ROOT / "kernels").rglob("__init__.py")}
    assert found <= listed, f"add to pyproject packages: {sorted(found - listed)}"
    assert listed <= found, f"listed in pyproject but not in the tree: {sorted(listed - found)}"
    assert cfg["package-dir"]["optimus.kernels"] == "kernels"


def test_entry_points_declared():
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert proj["scripts"]["optimus"] == "optimus.cli:main"
    assert proj["entry-points"]["torch_dynamo_backends"]["optimus"] == "optimus.compile:optimus_backend"
