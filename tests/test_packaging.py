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
    assert proj["scripts"]["optimus"] == "optimus.tools.cli:main"
    assert proj["entry-points"]["torch_dynamo_backends"]["optimus"] == "optimus.compile:optimus_backend"


# --- the distribution: its name, metadata, licence and type marker -------------------------

import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DIST = "optimus-graph"
OLDEST, NEWEST = "2.11", "2.15"  # the torch releases CI tests on (.ci/run)


def test_distribution_name_is_our_own():
    # PyPI's `optimus` is an unrelated project: installing or upgrading by that name would take it
    assert PROJECT["name"] == DIST
    assert PROJECT["scripts"]["optimus"] == "optimus.tools.cli:main"


def test_metadata_is_complete():
    assert PROJECT["license"] == "BSD-3-Clause" and PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License") and "Neither the name of the copyright holder" in text
    assert PROJECT["authors"] and PROJECT["urls"]["Homepage"]
    classifiers = set(PROJECT["classifiers"])
    assert {"Typing :: Typed", "Programming Language :: Python :: 3.11", "Development Status :: 3 - Alpha"} <= classifiers
    assert not any(c.startswith("License ::") for c in classifiers)  # the SPDX expression says it (PEP 639)
    import optimus

    assert optimus.__version__ == PROJECT["version"]


def test_torch_range_is_the_tested_one():
    """torch from the oldest release CI tests up to, not including, the minor after the newest."""
    (torch_req,) = [d for d in PROJECT["dependencies"] if re.match(r"torch\b", d)]
    major, minor = NEWEST.split(".")
    assert torch_req == f"torch>={OLDEST},<{major}.{int(minor) + 1}"
    ci = (ROOT / ".ci" / "run").read_text()
    tested = re.search(r"for version in ([\d. ]+);", ci).group(1).split()  # the venvs CI tests them in
    assert [v.rsplit(".", 1)[0] for v in tested] == [OLDEST, NEWEST]
    readme = (ROOT / "README.md").read_text()
    assert f"torch {OLDEST} to {NEWEST}" in readme


def test_readme_installs_anywhere():
    """The set-up names PyTorch's CPU index (PyPI's Linux torch is the multi-GB CUDA build),
    says what to do on a CUDA machine, and keeps its two commands: install + demo, the tests."""
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    assert ('pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install -e ".[dev]" '
            "&& optimus demo") in setup
    assert "python -m pytest -q" in setup
    assert "On a CUDA machine" in setup and "Triton comes with torch's CUDA build" in setup


def test_type_marker_ships():
    assert (ROOT / "optimus" / "py.typed").is_file()
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in cfg["package-data"]["optimus"]


def _run(*cmd, cwd, timeout=600):
    out = subprocess.run(list(map(str, cmd)), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


_CHECK = r"""
import importlib.metadata as md, json, os, sys
import optimus
dist = md.distribution("optimus-graph")
eps = {(e.group, e.name): e.value for e in dist.entry_points}
files = {str(f) for f in dist.files}
print(json.dumps({
    "file": optimus.__file__,
    "typed": os.path.isfile(os.path.join(os.path.dirname(optimus.__file__), "py.typed")),
    "kernels": os.path.dirname(__import__("optimus.kernels").kernels.__file__),
    "license": any(f.endswith("licenses/LICENSE") for f in files),
    "meta": {k: dist.metadata.get_all(k) for k in ("Name", "License-Expression", "Requires-Dist", "Project-URL")},
    "eps": {f"{g}:{n}": v for (g, n), v in eps.items()},
}))
"""


@pytest.mark.slow
def test_built_wheel_installs_and_runs(tmp_path):
    """Build the wheel from a copy of the source, install it in a fresh venv (no deps: torch
    and the rest come from the system site), and use it from outside the checkout."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                              "__pycache__", ".pytest_cache", "results"))
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "dist", src, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("optimus_graph-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--system-site-packages", venv, cwd=tmp_path)
    _run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    info = __import__("json").loads(_run(venv / "bin" / "python", "-c", _CHECK, cwd=tmp_path))
    assert info["file"].startswith(str(venv)), info["file"]  # the installed copy, not the checkout
    assert info["kernels"].startswith(str(venv))  # kernels/ installed as optimus.kernels
    assert info["typed"] and info["license"]
    assert info["meta"]["Name"] == [DIST] and info["meta"]["License-Expression"] == ["BSD-3-Clause"]
    assert any(r.startswith("torch") and "<" in r and ">=" in r for r in info["meta"]["Requires-Dist"])
    assert info["eps"]["console_scripts:optimus"] == "optimus.tools.cli:main"
    assert info["eps"]["torch_dynamo_backends:optimus"] == "optimus.compile:optimus_backend"
    assert info["eps"]["torch.backends:optimus_logs"] == "_optimus_torch_logs:autoload"
    help_text = _run(venv / "bin" / "optimus", "--help", cwd=tmp_path)
    for command in ("demo", "explain", "rules", "bench", "fuzz"):
        assert command in help_text
