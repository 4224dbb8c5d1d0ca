"""The command line on a model of the user's (``MODULE:FACTORY``), rule exclusion from the
command line, the one ``--json`` convention, the tables and the demo's compile timing.
Every command runs in a subprocess, as a user runs it."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USER_MODULE = textwrap.dedent('''
    import torch


    class Towers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.towers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(4)])

        def forward(self, x):
            return torch.cat([t(c).relu() for t, c in zip(self.towers, x.split(8, dim=1))], dim=1)


    def build():
        return Towers(), torch.randn(4, 32)


    def bare():
        return Towers()


    def pair():
        return Towers(), (torch.randn(2, 32),)


    def not_a_module():
        return 3
''')


def optimus_cli(*args, cwd=None, timeout=600):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "optimus.tools.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def user_dir(tmp_path):
    (tmp_path / "my_models.py").write_text(USER_MODULE)
    return tmp_path


def test_explain_a_model_of_ones_own(user_dir, tmp_path):
    path = tmp_path / "report.json"
    out = optimus_cli("explain", f"{user_dir / 'my_models.py'}:bare", "--inputs", "2x32", "--device", "cpu",
                      "--json-out", str(path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"model: {user_dir / 'my_models.py'}:bare")
    assert "Optimus report (passes: auto)" in out.stdout and "nodes before" in out.stdout
    report = json.loads(path.read_text())
    assert report["passes"] == "auto" and report["graphs"]
    assert sum(r["matched"] for g in report["graphs"] for r in g["rules"].values()) > 0


def test_a_wrong_model_is_a_clear_error(user_dir):
    out = optimus_cli("explain", "my_models:bare", "--device", "cpu", cwd=user_dir, timeout=300)
    assert out.returncode == 2 and "without example inputs: give them with --inputs" in out.stderr, out.stderr


@pytest.mark.parametrize("argv, message", [
    (["explain", "my_models:not_a_module"], "must return an nn.Module"),
    (["explain", "my_models:missing"], "has no 'missing'"),
    (["explain", "no_such_module:build"], "cannot import 'no_such_module'"),
    (["explain", "my_models:bare", "--inputs", "2by32"], "sizes joined by 'x'"),
    (["explain", "--inputs", "2x32"], "--inputs goes with a model of yours"),
    (["bench", "--model", "my_models:not_a_module"], "must return an nn.Module"),
    (["bench", "--model", "towers32", "--inputs", "2x32"], "--inputs goes with a model of yours"),
])
def test_wrong_models_and_inputs_say_what_is_wrong(user_dir, monkeypatch, capsys, argv, message):
    from optimus.tools.cli import main

    monkeypatch.chdir(user_dir)
    monkeypatch.syspath_prepend(str(user_dir))
    assert main([*argv, "--device", "cpu"]) == 2
    assert message in capsys.readouterr().err


def test_factory_forms(user_dir, monkeypatch):
    """The factory returns (module, inputs) with one tensor or a tuple, or the module alone
    with --inputs; weights and inputs come from the seed; the current directory is searched
    even where it is not on the path (the installed ``optimus`` script)."""
    import sys as _sys

    import torch

    from optimus.tools import user_model

    monkeypatch.chdir(user_dir)
    monkeypatch.setattr(_sys, "path", [p for p in _sys.path if p not in ("", str(user_dir))])
    model, inputs = user_model.load("my_models:build")
    assert isinstance(model, torch.nn.Module) and [t.shape for t in inputs] == [(4, 32)]
    again, _ = user_model.load("my_models:build")
    torch.testing.assert_close(again.towers[0].weight, model.towers[0].weight)
    _, inputs = user_model.load("my_models:pair")
    assert [t.shape for t in inputs] == [(2, 32)]
    _, inputs = user_model.load("my_models:pair", inputs="3x32,3x5:int64:7")
    assert inputs[0].dtype == torch.float32 and inputs[1].dtype == torch.int64 and int(inputs[1].max()) < 7


def test_exclusion_on_the_command_line(capsys):
    out = optimus_cli("explain", "--small", "--device", "cpu", "--passes", "auto,-split_cat_to_identity", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["passes"] == "auto,-split_cat_to_identity"
    assert not any("split_cat_to_identity" in g["rules"] for g in report["graphs"])
    assert any(n.startswith("excluded: split_cat_to_identity") for n in report["notes"])
    from optimus.tools.cli import main

    assert main(["explain", "--small", "--device", "cpu", "--passes", "auto,-split_cat_identity"]) == 2
    assert "Did you mean: split_cat_to_identity" in capsys.readouterr().err


def test_bench_a_model_of_ones_own_as_json(user_dir):
    out = optimus_cli("bench", "--model", "my_models:bare", "--inputs", "3x32", "--mode", "train", "--configs",
                      "eager,optimus", "--iters", "1", "--warmup", "0", "--device", "cpu", "--json", cwd=user_dir)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]  # stdout holds the JSON alone
    assert set(rows) == {f"my_models:bare[3x32]/train/{c}" for c in ("eager", "optimus")}
    assert all(r["status"] == "ok" and r["parity"]["ok"] and r["parity"]["grads_ok"] for r in rows.values())
    assert all(r["batch_size"] == 3 for r in rows.values())
    # the table went to stderr, in readable units, and no profiler line landed in it
    assert "peak memory" in out.stderr and " KiB" in out.stderr
    assert "profiler_start" not in out.stderr and "Completed Stage" not in out.stderr


def test_the_old_json_file_form_still_works(tmp_path, capsys):
    import argparse

    from optimus.tools.cli_json import add_json_arguments, json_targets

    p = argparse.ArgumentParser()
    add_json_arguments(p, file_form=True)
    assert json_targets(p.parse_args(["--json"])) == (True, None)
    assert json_targets(p.parse_args(["--json-out", "a.json"])) == (False, "a.json")
    assert json_targets(p.parse_args(["--json", "a.json"])) == (False, "a.json")
    assert "deprecated; use --json-out FILE" in capsys.readouterr().err
    assert json_targets(p.parse_args([])) == (False, None)


def test_rules_table_and_json_convention(tmp_path, capsys):
    path = tmp_path / "rules.json"
    out = optimus_cli("rules", "--json-out", str(path), timeout=300)
    assert out.returncode == 0, out.stderr
    head, rule, first = out.stdout.splitlines()[:3]  # the text still on stdout
    assert head.split() == ["rule", "kind", "levels", "anchor", "summary"]
    starts = [i for i in range(len(rule)) if rule[i] == "-" and (i == 0 or rule[i - 1] == " ")]
    assert starts == [head.index(h) for h in head.split()]  # five columns under five headings
    assert first[starts[1] - 2:starts[1]] == "  "  # the columns do not run together
    listed = json.loads(path.read_text())
    assert {"name", "kind", "levels", "anchors", "summary"} <= set(listed[0])
    from optimus.tools.cli import main

    assert main(["rules", "--upstream", "--json"]) == 0
    assert any(p["name"] == "split_cat_pass" for p in json.loads(capsys.readouterr().out))


def test_demo_measures_fairly_and_says_how(tmp_path):
    path = tmp_path / "demo.json"
    out = optimus_cli("demo", "--small", "--device", "cpu", "--iters", "2", "--json-out", str(path))
    assert out.returncode == 0, out.stderr
    assert "cold compile: each configuration compiled with an empty Inductor cache, after a warm-up compile" in out.stdout
    result = json.loads(path.read_text())
    assert result["warm_up_s"] > 0 and "warm-up compile of a tiny unrelated function" in result["compile_timing"]
    assert isinstance(result["device"], str) and isinstance(result["torch"], str)
    for name in ("inductor", "optimus"):
        cfg = result["configs"][name]
        assert isinstance(cfg["kernels"], int) and isinstance(cfg["median_ms"], float)
        assert cfg["outputs_match"] is True
    opt, ind = result["configs"]["optimus"], result["configs"]["inductor"]
    assert opt["kernels"] < ind["kernels"]
    assert opt["nodes"]["torch_ir"]["after"] < opt["nodes"]["torch_ir"]["before"]
    assert opt["errors"] == []


def test_demo_warm_up_runs_before_the_first_timed_compile(monkeypatch):
    """The warm-up comes before the first configuration's (timed) compile, not after it."""
    from optimus.tools import demo

    calls = []

    class Stop(Exception):
        pass

    def first_compile(name, model, passes):
        calls.append(name)
        raise Stop

    monkeypatch.setattr(demo, "_warm_up", lambda configs, device, passes: calls.append(("warm", configs)))
    monkeypatch.setattr(demo, "_compile_config", first_compile)
    with pytest.raises(Stop):
        demo.run_demo("cpu", demo.DemoConfig.small(), configs=("inductor", "optimus"))
    assert calls == [("warm", ("inductor", "optimus")), "inductor"]
