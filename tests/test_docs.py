"""Code and docs state what is true now; the history lives in git.

* Library code (``optimus/``, and ``kernels/``, installed as ``optimus.kernels``), its
  comments, docstrings and user-facing strings included, cites no run number, date, issue
  or session: a reason or an invariant says why, docs/ says what was measured.
* docs/benchmarks.md is a document (protocol, current figures, how to reproduce), not a
  run log: under 400 lines.
* Every ``docs/results/`` file that the docs, the README, the library code or the scripts
  in docs/results cite exists.
"""

from __future__ import annotations

import glob
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# A run ("run 21", "runs 16 to 39", "H200 run 4"), a date (2026-12-01), an issue or a
# session of work.
HISTORY = re.compile(
    r"\b(runs? [0-9]+[a-z]?\b|H[12]00 runs?\b|20[0-9]{2}-[0-9]{2}-[0-9]{2}|issues? [0-9]+|sessions? [0-9]+"
    r"|(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh) session)",
    re.IGNORECASE,
)
# (path relative to the repository, the exact text of the match) that may stay: none today.
# Keep entries few and say why, e.g. a date that is data, not history.
ALLOWED: set[tuple[str, str]] = set()


def _history_in(folder: str) -> list[str]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for m in HISTORY.finditer(line):
                if (rel, m.group(0)) not in ALLOWED:
                    found.append(f"{rel}:{lineno}: {m.group(0)!r} in {line.strip()!r}")
    return found


def test_the_pattern_finds_what_it_is_for():
    for text in ("H200 run 4", "runs 16 to 39", "run 39c", "(Run 13)", "2026-12-01", "issue 15 item 3",
                 "issues 15-17", "session 4", "the fifth session"):
        assert HISTORY.search(text), text
    for text in ("runs the rule", "rerun 3 times?", "an issue", "2026", "12-01", "sessions", "run_config"):
        assert not HISTORY.search(text), text


def test_library_code_cites_no_run_date_or_issue():
    found = _history_in("optimus")
    assert not found, "state the invariant or the reason instead:\n" + "\n".join(found)


def test_kernel_code_cites_no_run_date_or_issue():
    found = _history_in("kernels")
    assert not found, "state the invariant or the reason instead:\n" + "\n".join(found)


def test_benchmarks_doc_is_a_document_not_a_run_log():
    lines = (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
    assert len(lines) < 400, f"docs/benchmarks.md has {len(lines)} lines: the run history belongs in git"


# ``results/x`` relative to docs/ (a markdown link) or ``docs/results/x`` from the root; a
# ``*`` is a glob, a trailing ``/`` a folder.
RESULTS_PATH = re.compile(r"(?<![\w/$.])(docs/)?results/[\w.*/-]*[\w*/]")


def _cited_results() -> dict[str, set[str]]:
    citing = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    citing += sorted((ROOT / "optimus").rglob("*.py")) + sorted((ROOT / "kernels").rglob("*.py"))
    citing += sorted((ROOT / "docs" / "results").glob("*.sh")) + sorted((ROOT / "docs" / "results").glob("*.py"))
    cited: dict[str, set[str]] = {}
    for path in citing:
        rel = path.relative_to(ROOT).as_posix()
        for m in RESULTS_PATH.finditer(path.read_text()):
            target = m.group(0) if m.group(1) else "docs/" + m.group(0)
            cited.setdefault(target, set()).add(rel)
    return cited


def test_every_cited_results_file_exists():
    cited = _cited_results()
    assert "docs/results/zoo-paired.sh" in cited  # the scan sees the benchmark doc's sources
    missing = [
        f"{target} (cited by {', '.join(sorted(by))})"
        for target, by in sorted(cited.items())
        if not glob.glob(str(ROOT / target))
    ]
    assert not missing, "cited but not in docs/results:\n" + "\n".join(missing)
