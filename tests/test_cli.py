import json
import subprocess
import sys

from optimus.tools.cli import main


def test_help_lists_subcommands(capsys):
    try:
        main(["--help"])
    except SystemExit:
        pass
    out = capsys.readouterr().out
    for cmd in ("demo", "explain", "rules"):
        assert cmd in out


def test_rules_listing(capsys):
    assert main(["rules", "--json"]) == 0
    rules = json.loads(capsys.readouterr().out)
    names = {r["name"] for r in rules}
    assert {"split_cat_to_identity", "merge_splits", "remove_single_section_split", "canonicalize_split_cat_args"} <= names


def test_bad_passes_is_a_clear_error(capsys):
    assert main(["explain", "--small", "--passes", "split_cat_identity"]) == 2
    assert "Did you mean" in capsys.readouterr().err


def test_console_script_installed():
    out = subprocess.run([sys.executable, "-m", "optimus.tools.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "demo" in out.stdout
