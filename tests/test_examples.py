"""Every script in examples/ runs as a user runs it (a subprocess, CPU) and checks itself."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NEEDS = {"hf_bert.py": "transformers"}


def _run(script: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, str(ROOT / "examples" / script)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_every_example_is_tested():
    assert {p.name for p in (ROOT / "examples").glob("*.py")} == {"torchrec_style.py", "hf_bert.py"}


@pytest.mark.parametrize("script", ["torchrec_style.py", "hf_bert.py"])
def test_example_runs_and_matches_eager(script):
    if script in NEEDS and importlib.util.find_spec(NEEDS[script]) is None:
        pytest.skip(f"{NEEDS[script]} is not installed")
    out = _run(script)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "inference: outputs match eager: True" in out.stdout
    rewrites = [line for line in out.stdout.splitlines() if line.startswith("rewrites: ")]
    assert rewrites and rewrites[0] != "rewrites: none"


def test_docs_index_links_every_document():
    import re

    index = (ROOT / "docs" / "index.md").read_text()
    links = set(re.findall(r"\]\(([^)#]+)\)", index))
    for link in links:
        assert (ROOT / "docs" / link).resolve().exists(), f"docs/index.md links to a missing {link}"
    docs = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert docs <= links, f"docs/index.md does not link {sorted(docs - links)}"
    assert {"../README.md", "../CHANGELOG.md", "../examples/torchrec_style.py", "../examples/hf_bert.py"} <= links
    assert "docs/index.md" in (ROOT / "README.md").read_text()


def test_changelog_keeps_an_unreleased_section():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog") and "Keep a Changelog" in text
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    assert "### Added" in unreleased and "optimus-graph" in unreleased
