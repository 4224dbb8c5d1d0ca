"""Optimus in PyTorch's logging: TORCH_LOGS names, artifacts, TORCH_TRACE for tlparse.

The environment-variable cases run in a subprocess: torch parses TORCH_LOGS once, inside
``import torch``, so only a fresh interpreter shows what a user gets.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.fx as fx

import optimus
from optimus.core import logs, torch_logging
from optimus.core.report import GraphReport, Report, format_table

ROOT = Path(__file__).resolve().parents[1]
TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])

# A graph with a rewrite (the split/cat pair becomes a view) and a decline (two small
# linears are not worth batching).
SCRIPT = textwrap.dedent(
    """
    import torch, torch.fx as fx, optimus

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            a, b = torch.split(x, [4, 4], dim=1)
            y = torch.cat([self.l1(a), self.l2(b)], dim=1)
            a2, b2 = torch.split(y, [4, 4], dim=1)
            return torch.cat([a2, b2], dim=1).view(2, 2, 4) + 1

    gm = fx.symbolic_trace(M())
    optimus.optimize(gm, example_inputs=[torch.randn(2, 8)])
    print("done")
    """
)


def run_python(code: str, env: dict[str, str], tmp_path: Path, entry_point: bool = False, timeout: int = 180) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with this checkout first on the path; with
    ``entry_point``, Optimus's torch.backends entry point is installed (a dist-info of
    its own on the path, as ``pip install`` writes it)."""
    paths = [str(ROOT)]
    if entry_point:
        dist = tmp_path / "ep" / "optimus_logs_probe-0.dist-info"
        dist.mkdir(parents=True, exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: optimus-logs-probe\nVersion: 0\n")
        (dist / "entry_points.txt").write_text("[torch.backends]\noptimus_logs = _optimus_torch_logs:autoload\n")
        paths.append(str(tmp_path / "ep"))
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_LOGS", "TORCH_TRACE"))}
    full["PYTHONPATH"] = os.pathsep.join(paths + [full.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=full, capture_output=True, text=True, timeout=timeout)


def test_the_package_does_not_contain_itself():
    """The TORCH_LOGS hang: a checkout root on ``optimus.__path__`` made
    optimus.optimus.optimus... a package without end, which torch walks."""
    names = [m.name for m in pkgutil.iter_modules(optimus.__path__)]
    assert "optimus" not in names and "core" in names
    import importlib

    kernels = importlib.import_module("optimus.kernels")  # still importable from a source checkout
    assert kernels.__name__ == "optimus.kernels"


def test_plus_optimus_prints_rewrites_and_declines(tmp_path):
    # TORCH_DEVICE_BACKEND_AUTOLOAD=0: no entry point, so torch meets "optimus" as an
    # unknown module name and imports and walks the package (torch 2.11's only path):
    # it must finish, and print what Optimus did.
    done = run_python(SCRIPT, {"TORCH_LOGS": "+optimus", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    err = done.stderr
    assert "done" in done.stdout
    assert "optimus: torch_ir graph 0: split_stack_to_view rewrote" in err
    assert "optimus: torch_ir graph 0: batch_linear declined at" in err and "not profitable" in err
    summary = [line for line in err.splitlines() if "torch_ir graph 0:" in line and " nodes, " in line]
    assert summary and " rewrites (" in summary[0]
    assert "[__optimus_report]" in err  # the per-graph table comes with +optimus
    assert "[__optimus_graphs]" not in err  # graphs only when named


def test_artifacts_after_optimus_work_without_the_entry_point(tmp_path):
    # torch 2.11's path (and an install without the entry point): torch imports the
    # package for "optimus", which registers the artifact names that follow it.
    done = run_python(SCRIPT, {"TORCH_LOGS": "optimus,optimus_graphs", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[__optimus_graphs] optimus: torch_ir graph 0 before Optimus:" in done.stderr
    assert "rewrote" not in done.stderr  # INFO: summaries, not each rewrite


@pytest.mark.skipif(TORCH < (2, 13), reason="torch < 2.13 parses TORCH_LOGS before loading torch.backends entry points")
def test_entry_point_registers_before_torch_parses(tmp_path):
    # An artifact name alone, before anything imported Optimus: only the entry point can
    # have registered it; and `import torch` must not import the optimus package.
    code = "import sys, torch\nprint('optimus imported:', 'optimus' in sys.modules)\n" + SCRIPT
    done = run_python(code, {"TORCH_LOGS": "optimus_graphs", "TORCH_TRACE": str(tmp_path / "trace")}, tmp_path, entry_point=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "optimus imported: False" in done.stdout
    err = done.stderr
    assert "[__optimus_graphs] optimus: torch_ir graph 0 before Optimus:" in err
    assert "[__optimus_graphs] optimus: torch_ir graph 0 after Optimus" in err
    assert "torch.cat(" in err  # the graph code itself
    assert "rewrote" not in err  # the log level of `optimus` itself was not raised

    # TORCH_TRACE: the artifacts tlparse shows
    records = _trace_artifacts(tmp_path / "trace")
    names = [r["name"] for r in records]
    for suffix in ("before", "after", "report"):
        assert f"optimus_torch_ir_graph_0_{suffix}" in names
    by_name = {r["name"]: r for r in records}
    assert "torch.cat(" in by_name["optimus_torch_ir_graph_0_before"]["payload"]
    report = json.loads(by_name["optimus_torch_ir_graph_0_report"]["payload"])
    assert report["rules"]["split_stack_to_view"]["matched"] >= 1
    assert report["nodes_after"] < report["nodes_before"]


@pytest.mark.skipif(TORCH < (2, 13), reason="torch < 2.13 parses TORCH_LOGS before loading torch.backends entry points")
def test_unknown_artifact_is_pytorchs_own_error(tmp_path):
    done = run_python("import torch", {"TORCH_LOGS": "optimus_no_such_artifact"}, tmp_path, entry_point=True, timeout=120)
    assert done.returncode != 0
    assert "Invalid log settings: optimus_no_such_artifact" in done.stderr
    assert "optimus_graphs" in done.stderr  # our names are among the valid ones torch lists


def _trace_artifacts(trace_dir: Path) -> list[dict]:
    """``artifact`` records of a TORCH_TRACE directory: metadata lines are JSON, each
    followed by its payload lines (tab-indented)."""
    out = []
    for path in glob.glob(str(trace_dir / "*.log")):
        lines = Path(path).read_text().splitlines()
        i = 0
        while i < len(lines):
            head = lines[i]
            i += 1
            start = head.find("{")
            if start < 0:
                continue
            meta = json.loads(head[start:])
            payload = []
            while i < len(lines) and lines[i].startswith("\t"):
                payload.append(lines[i][1:])
                i += 1
            if "artifact" in meta:
                out.append({"name": meta["artifact"]["name"], "payload": "\n".join(payload), "meta": meta})
    return out


@pytest.fixture
def optimus_log_state():
    """Put the optimus logger (and torch's log settings) back as they were."""
    log = logging.getLogger("optimus")
    saved = (log.level, log.propagate, list(log.handlers))
    yield log
    torch._logging.set_logs()
    log.setLevel(saved[0])
    log.propagate = saved[1]
    for h in list(log.handlers):
        if h not in saved[2]:
            log.removeHandler(h)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _optimize_split_cat() -> None:
    def f(x):
        a, b = torch.split(x, [4, 4], dim=1)
        return torch.cat([a, b], dim=1) * 2

    optimus.optimize(fx.symbolic_trace(f), passes="vertical", example_inputs=[torch.randn(2, 8)])


def test_set_logs_info_gives_one_summary_per_graph(optimus_log_state):
    assert torch_logging.register()
    torch._logging.set_logs(modules={"optimus": logging.INFO})
    records = _Records()
    optimus_log_state.addHandler(records)
    _optimize_split_cat()
    messages = [r.getMessage() for r in records.records]
    assert any(m.startswith("optimus: torch_ir graph 0: ") and "split_cat_to_identity x1" in m for m in messages), messages
    assert not any("rewrote" in m for m in messages)  # per-rewrite lines are DEBUG


def test_set_logs_debug_gives_each_rewrite(optimus_log_state):
    torch._logging.set_logs(modules={"optimus": logging.DEBUG})
    records = _Records()
    optimus_log_state.addHandler(records)
    _optimize_split_cat()
    messages = [r.getMessage() for r in records.records]
    assert any("torch_ir graph 0: split_cat_to_identity rewrote cat" in m for m in messages), messages


def test_nothing_is_computed_when_nothing_listens(monkeypatch):
    calls = []
    monkeypatch.setattr(logs, "graph_code", lambda gm: calls.append(gm) or "")
    _optimize_split_cat()
    assert calls == []  # no optimus_graphs, no trace, no listener: no graph printing


def test_listeners_see_each_graph_before_and_after():
    seen = []

    class Listener:
        def before(self, level, graph_name, gm):
            return len(gm.graph.nodes)

        def after(self, state, report, gm):
            seen.append((report.level, report.graph, state, len(gm.graph.nodes), report.matched))

    with logs.listening(Listener()):
        _optimize_split_cat()
    assert len(seen) == 1
    level, graph, before, after, matched = seen[0]
    assert (level, graph) == ("torch_ir", "graph 0") and before > after and matched >= 1


def test_a_failing_listener_does_not_break_the_rewrite(caplog):
    class Broken:
        def before(self, level, graph_name, gm):
            raise RuntimeError("listener boom")

        def after(self, state, report, gm):
            raise RuntimeError("listener boom")

    log = logging.getLogger("optimus")
    log.addHandler(caplog.handler)
    try:
        with logs.listening(Broken()):
            _optimize_split_cat()
    finally:
        log.removeHandler(caplog.handler)
    assert optimus.last_report().graphs[0].matched >= 1
    assert "listener" in caplog.text


def test_without_torchs_private_logging_api_nothing_fails(monkeypatch):
    monkeypatch.setattr(torch_logging, "_internal", lambda: None)
    assert torch_logging.register() is False
    assert torch_logging.tracing() is False
    assert isinstance(torch_logging.artifact_logger("optimus_graphs"), logging.Logger)
    _optimize_split_cat()
    assert optimus.last_report().graphs[0].matched >= 1


def test_graph_summary_line():
    g = GraphReport("aten_ir", "forward 0", nodes_before=40, nodes_after=12, time_s=0.0123)
    for name, n in [("a", 3), ("b", 9), ("c", 1), ("d", 2), ("e", 5)]:
        g.stats(name).matched = n
    g.stats("b").decline("cat_1", "why")
    g.notes.append("a note")
    line = g.summary()
    assert line.startswith("aten_ir forward 0: 40 -> 12 nodes, 20 rewrites (b x9, e x5, a x3, d x2, +1 more rules)")
    assert ", 1 declined" in line and "12.3 ms" in line and line.endswith("; a note")
    assert g.stats("b").where == "aten_ir forward 0: b"


def test_report_note_once_and_format_table():
    r = Report("all")
    r.note_once("x")
    r.note_once("x")
    assert r.notes == ["x"]
    text = format_table(["rule", "matched"], [["split_cat_to_identity", 12], ["merge_splits", 3]])
    lines = text.splitlines()
    assert lines[0].split() == ["rule", "matched"]
    assert lines[2].endswith(" 12") and lines[3].endswith("  3")  # numbers right-aligned
    assert len({len(line) for line in lines[:2]}) == 1


def test_artifact_names_are_file_names():
    assert logs.artifact_prefix("aten_ir", "backward 3") == "optimus_aten_ir_backward_3"


@pytest.mark.slow
def test_torch_trace_of_a_compile_attributes_artifacts_to_the_compile(tmp_path):
    code = textwrap.dedent(
        """
        import torch, optimus
        def f(x):
            a, b = torch.split(x, [4, 4], dim=1)
            return torch.cat([a, b], dim=1).relu()
        optimus.compile(f, passes="vertical")(torch.randn(2, 8))
        """
    )
    done = run_python(code, {"TORCH_TRACE": str(tmp_path / "trace")}, tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = {r["name"]: r for r in _trace_artifacts(tmp_path / "trace")}
    assert "optimus_torch_ir_graph_0_after" in records and "optimus_aten_ir_inference_0_report" in records
    assert records["optimus_torch_ir_graph_0_after"]["meta"].get("frame_id") == 0  # under the compile's id


def test_pyproject_declares_the_entry_point_and_the_extra():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["torch.backends"]["optimus_logs"] == "_optimus_torch_logs:autoload"
    assert "_optimus_torch_logs" in project["tool"]["setuptools"]["py-modules"]
    assert project["project"]["optional-dependencies"]["graph"] == ["pydot"]
    assert "pydot" not in " ".join(project["project"]["dependencies"])


def test_the_entry_point_never_raises(monkeypatch):
    import importlib.util

    import _optimus_torch_logs

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: (_ for _ in ()).throw(RuntimeError("boom")))
    assert _optimus_torch_logs.autoload() is None  # an entry point that raises breaks `import torch`


@pytest.mark.slow
def test_explain_json_is_not_polluted_by_logs(tmp_path):
    code = "import sys, optimus.tools.cli; sys.exit(optimus.tools.cli.main(['explain', '--small', '--json']))"
    done = run_python(code, {"TORCH_LOGS": "+optimus"}, tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)  # the logs went to stderr
    assert data["graphs"] and "rewrote" in done.stderr
