"""Before/after pictures of graphs (``optimus explain --graph DIR``)."""

from __future__ import annotations

import html
import json
import os
import shutil

import pytest
import torch
import torch.fx as fx

import optimus
from optimus import graph_pictures
from optimus.tools import cli
from optimus.graph_pictures import ADDED, REMOVED, REWIRED, GraphChange, NodeInfo, recording, to_dot, write_pictures


def split_cat_then_relu(x):
    a, b, c = torch.split(x, [4, 4, 8], dim=1)
    return torch.relu(torch.cat([a, b, c], dim=1)) + 1


def record_one(fn=split_cat_then_relu, x=None) -> GraphChange:
    recorder = graph_pictures.GraphRecorder()
    from optimus.core import logs

    with logs.listening(recorder):
        optimus.optimize(fx.symbolic_trace(fn), passes="vertical", example_inputs=[x if x is not None else torch.randn(2, 16)])
    (change,) = recorder.changes
    return change


def test_the_change_names_removed_added_and_rewired_nodes():
    change = record_one()
    before = {n.name for n in change.before}
    after = {n.name for n in change.after}
    assert "cat" in change.removed and "split" in change.removed  # the round trip is gone
    assert change.removed == before - after and change.added == after - before
    assert "relu" in change.rewired  # it now reads the input directly
    relu = next(n for n in change.after if n.name == "relu")
    assert relu.inputs == ("x",)
    split = next(n for n in change.before if n.name == "split")
    assert "[4, 4, 8]" in split.what and split.shape.startswith("(f32[2, 4]")


def test_dot_highlights_what_changed():
    change = record_one()
    before, after = to_dot(change, "before"), to_dot(change, "after")
    cat_line = next(line for line in before.splitlines() if line.strip().startswith('"cat" ['))
    assert REMOVED in cat_line and "torch.cat" in cat_line and "f32[2, 16]" in cat_line
    relu_after = next(line for line in after.splitlines() if line.strip().startswith('"relu" ['))
    assert REWIRED in relu_after
    assert '"x" -> "relu";' in after and '"cat" -> "relu";' in before
    assert "before Optimus" in before and "after Optimus" in after
    assert change.summary in after.replace("\\n", "\n")
    assert '"cat"' not in after


def test_a_big_graph_is_drawn_around_the_change():
    nodes = [NodeInfo(f"n{i}", "call_function", "add", (f"n{i - 1}",) if i else (), "f32[4]") for i in range(1000)]
    after = [n for n in nodes if n.name != "n500"]
    after[500] = NodeInfo("n501", "call_function", "add", ("n499",), "f32[4]")
    change = GraphChange("torch_ir", "graph 0", nodes, after, "summary")
    text = to_dot(change, "before", max_nodes=50)
    drawn = {line.split('"')[1] for line in text.splitlines() if line.startswith('  "n') and "->" not in line}
    # removed n500, rewired n501 (it reads n499 now), and their direct neighbours
    assert drawn == {"n499", "n500", "n501", "n502"}
    assert "showing 4 of 1000 nodes" in text


def test_without_graphviz_dot_sources_and_a_clear_message(tmp_path):
    change = record_one()
    result = write_pictures([change], tmp_path, renderer=None)
    assert sorted(os.listdir(tmp_path)) == ["01-torch_ir-graph_0-after.dot", "01-torch_ir-graph_0-before.dot"]
    assert "optimus[graph]" in result.message and "Graphviz" in result.message and "dot -Tsvg" in result.message
    assert "2 DOT" in result.note
    assert (tmp_path / "01-torch_ir-graph_0-before.dot").read_text().startswith("digraph ")


def test_with_a_renderer_svgs_and_an_index(tmp_path):
    change = record_one()
    seen = []
    result = write_pictures([change], tmp_path, renderer=lambda text: seen.append(text) or b"<svg/>")
    assert len(seen) == 2 and result.message == ""
    assert sorted(os.listdir(tmp_path)) == ["01-torch_ir-graph_0-after.svg", "01-torch_ir-graph_0-before.svg", "index.html"]
    index = (tmp_path / "index.html").read_text()
    assert 'src="01-torch_ir-graph_0-before.svg"' in index and 'src="01-torch_ir-graph_0-after.svg"' in index
    assert html.escape(change.summary) in index


def test_a_renderer_that_fails_falls_back_to_dot(tmp_path):
    change = record_one()

    def broken(text: str) -> bytes:
        raise RuntimeError("syntax error in line 3")

    result = write_pictures([change], tmp_path, renderer=broken)
    assert all(f.endswith(".dot") for f in result.files)
    assert "Graphviz failed" in result.message and "syntax error" in result.message


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot program is not installed")
def test_graphviz_draws_the_highlighted_nodes(tmp_path):
    change = record_one()
    render = graph_pictures.find_renderer()
    assert render is not None
    result = write_pictures([change], tmp_path, renderer=render)
    svg = (tmp_path / "01-torch_ir-graph_0-before.svg").read_text()
    assert result.message == "" and svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert REMOVED in svg and ">cat</text>" in svg  # the removed cat, filled red
    after = (tmp_path / "01-torch_ir-graph_0-after.svg").read_text()
    assert ">cat</text>" not in after and REWIRED in after


def test_recording_writes_on_leaving_the_block(tmp_path, monkeypatch):
    monkeypatch.setattr(graph_pictures, "find_renderer", lambda: None)
    with recording(tmp_path / "pics") as rec:
        optimus.optimize(fx.symbolic_trace(split_cat_then_relu), passes="vertical", example_inputs=[torch.randn(2, 16)])
        assert rec.result is None
    assert rec.result is not None and len(rec.result.files) == 2
    assert (tmp_path / "pics" / "01-torch_ir-graph_0-before.dot").exists()


def _fake_explain(model, x, passes="all", print_report=True):
    """optimus.explain without Inductor: one Torch-IR rewrite, the same listeners."""
    optimus.optimize(fx.symbolic_trace(split_cat_then_relu), passes="vertical", example_inputs=[torch.randn(2, 16)])
    report = optimus.last_report()
    if print_report:
        print(report.table())
    return report


@pytest.mark.parametrize("as_json", [False, True])
def test_explain_graph_command(tmp_path, monkeypatch, capsys, as_json):
    monkeypatch.setattr(optimus, "explain", _fake_explain)
    monkeypatch.setattr(graph_pictures, "find_renderer", lambda: None)
    out_dir = tmp_path / "pics"
    assert cli.main(["explain", "--small", "--graph", str(out_dir)] + (["--json"] if as_json else [])) == 0
    captured = capsys.readouterr()
    assert "optimus explain --graph:" in captured.err and "optimus[graph]" in captured.err
    assert sorted(os.listdir(out_dir)) == ["01-torch_ir-graph_0-after.dot", "01-torch_ir-graph_0-before.dot"]
    if as_json:
        data = json.loads(captured.out)  # nothing but the JSON on stdout
        assert data["graphs"][0]["level"] == "torch_ir"
        assert data["pictures"]["files"] == [str(out_dir / f) for f in ("01-torch_ir-graph_0-before.dot", "01-torch_ir-graph_0-after.dot")]
    else:
        assert captured.out.startswith("Optimus report")
        assert captured.out.rstrip().endswith(f"in {out_dir} ({captured.err.split(': ', 1)[1].strip()})")


@pytest.mark.slow
def test_explain_graph_without_graphviz(tmp_path, monkeypatch, capsys):
    # the whole command: compile the small demo, run it, draw each graph per level
    monkeypatch.setattr(graph_pictures, "find_renderer", lambda: None)
    out_dir = tmp_path / "pics"
    assert cli.main(["explain", "--small", "--graph", str(out_dir), "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # stdout is the JSON alone
    assert data["graphs"] and data["pictures"]["directory"] == str(out_dir)
    files = sorted(os.listdir(out_dir))
    assert "01-torch_ir-graph_0-before.dot" in files and any("aten_ir" in f for f in files)
    assert len(data["pictures"]["files"]) == len(files)
    assert "optimus[graph]" in captured.err  # the message goes to stderr
    before = (out_dir / "01-torch_ir-graph_0-before.dot").read_text()
    assert REMOVED in before  # the demo's split/cat round trips are drawn as removed
    after = (out_dir / "01-torch_ir-graph_0-after.dot").read_text()
    assert ADDED in after
