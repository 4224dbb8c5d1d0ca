"""Pictures of each FX graph before and after each Optimus level.

``optimus explain --graph DIR`` (and ``with graph_pictures.recording(DIR): ...`` around
any compile-and-run) writes, per graph and level that ran::

    DIR/01-torch_ir-graph_0-before.svg   the graph as Optimus got it; nodes the rewrites
                                         removed in red, nodes whose inputs changed in amber
    DIR/01-torch_ir-graph_0-after.svg    the graph as Optimus left it; nodes the rewrites
                                         added in green, nodes whose inputs changed in amber
    DIR/index.html                       every pair side by side, with the level's summary
                                         (when any picture is SVG)

Each node shows its name, its op with the arguments that are not graph values (split
sizes, dims), and its shape. Which nodes changed is read off the graphs themselves
(node names are unique in an FX graph and survive rewrites): present before only =
removed, after only = added, in both with other inputs = rewired. Graphs of more than
``max_nodes`` nodes are drawn around what changed: the changed nodes and their direct
neighbours.

Rendering needs Graphviz's ``dot`` program (through pydot, the ``graph`` extra, when it
is installed; else ``dot`` on the PATH). Without it the DOT sources are written instead
and the message says what to install; nothing else fails.
"""

from __future__ import annotations

import dataclasses
import html
import os
import shutil
import subprocess
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx as fx

from .core import logs
from .core.report import GraphReport

REMOVED = "#f6b8b8"  # red: gone after the level
ADDED = "#bfe8bf"  # green: new after the level
REWIRED = "#fbe3a4"  # amber: same node, other inputs
MAX_NODES = 400
INSTALL_HINT = (
    "Graphviz's `dot` program was not found: install Graphviz (apt-get install graphviz, "
    "brew install graphviz or conda install graphviz); `pip install 'optimus[graph]'` adds pydot"
)

_DTYPES = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "b8",
}


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """What a picture shows of one node (a copy: the graph changes afterwards)."""

    name: str
    op: str  # the FX opcode
    what: str  # "aten.split_with_sizes([4, 4, 8], 1)", "input", ".view(2, -1)"
    inputs: tuple[str, ...]
    shape: str


@dataclasses.dataclass
class GraphChange:
    """One graph at one level: before, after, and which nodes changed."""

    level: str
    graph: str
    before: list[NodeInfo]
    after: list[NodeInfo]
    summary: str

    @property
    def removed(self) -> set[str]:
        return {n.name for n in self.before} - {n.name for n in self.after}

    @property
    def added(self) -> set[str]:
        return {n.name for n in self.after} - {n.name for n in self.before}

    @property
    def rewired(self) -> set[str]:
        old = {n.name: n.inputs for n in self.before}
        return {n.name for n in self.after if n.name in old and old[n.name] != n.inputs}


@dataclasses.dataclass
class PictureResult:
    """What :func:`write_pictures` wrote, and why not more."""

    directory: str
    files: list[str] = dataclasses.field(default_factory=list)
    message: str = ""  # empty when every picture was rendered

    @property
    def note(self) -> str:
        """One line for a report."""
        svgs = sum(f.endswith(".svg") for f in self.files)
        dots = sum(f.endswith(".dot") for f in self.files)
        text = f"graph pictures: {svgs} SVG" + (f" and {dots} DOT" if dots else "") + f" file(s) in {self.directory}"
        return text + (f" ({self.message})" if self.message else "")


def describe(gm: fx.GraphModule) -> list[NodeInfo]:
    """A snapshot of ``gm``'s nodes for a picture."""
    return [
        NodeInfo(n.name, n.op, _what(n), tuple(dict.fromkeys(i.name for i in n.all_input_nodes)), _shape(n))
        for n in gm.graph.nodes
    ]


class GraphRecorder:
    """A ``logs.LevelListener`` keeping each FX graph before and after each level."""

    def __init__(self) -> None:
        self.changes: list[GraphChange] = []
        self.result: PictureResult | None = None

    def before(self, level: str, graph_name: str, gm: fx.GraphModule) -> list[NodeInfo]:
        return describe(gm)

    def after(self, state: list[NodeInfo], report: GraphReport, gm: fx.GraphModule) -> None:
        self.changes.append(GraphChange(report.level, report.graph, state, describe(gm), report.summary()))


@contextmanager
def recording(directory: str | os.PathLike[str], max_nodes: int = MAX_NODES) -> Iterator[GraphRecorder]:
    """Record every graph Optimus rewrites inside the block; on leaving it, write the
    pictures to ``directory`` (``recorder.result`` says what was written)."""
    recorder = GraphRecorder()
    with logs.listening(recorder):
        yield recorder
    recorder.result = write_pictures(recorder.changes, directory, max_nodes=max_nodes)


def write_pictures(
    changes: Sequence[GraphChange],
    directory: str | os.PathLike[str],
    max_nodes: int = MAX_NODES,
    renderer: Callable[[str], bytes] | None | str = "auto",
) -> PictureResult:
    """Write a before and an after picture per change (SVG, or DOT when Graphviz is
    missing) and an ``index.html``. ``renderer``: DOT text -> SVG bytes; ``"auto"`` finds
    one, ``None`` writes DOT only."""
    out = os.fspath(directory)
    os.makedirs(out, exist_ok=True)
    result = PictureResult(out)
    render = find_renderer() if renderer == "auto" else renderer
    if render is None:
        result.message = INSTALL_HINT + "; wrote DOT sources instead (`dot -Tsvg FILE.dot -o FILE.svg` draws one)"
    pairs: list[tuple[GraphChange, str, str]] = []
    for index, change in enumerate(changes, 1):
        stem = f"{index:02d}-{change.level}-{'_'.join(change.graph.split())}"
        names = []
        for side in ("before", "after"):
            text = to_dot(change, side, max_nodes)
            path = os.path.join(out, f"{stem}-{side}")
            svg = _render(render, text, result) if render is not None else None
            if svg is None:
                path += ".dot"
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            else:
                path += ".svg"
                with open(path, "wb") as f:
                    f.write(svg)
            result.files.append(path)
            names.append(os.path.basename(path))
        pairs.append((change, names[0], names[1]))
    if any(f.endswith(".svg") for f in result.files):
        index_path = os.path.join(out, "index.html")
        with open(index_path, "w", encoding="utf-8") as f:
            f.write(_index_html(pairs))
        result.files.append(index_path)
    return result


def _render(render: Callable[[str], bytes], text: str, result: PictureResult) -> bytes | None:
    try:
        return render(text)
    except Exception as e:  # noqa: BLE001 - one graph Graphviz chokes on: DOT for it
        if not result.message:
            result.message = f"Graphviz failed on a graph ({type(e).__name__}: {str(e)[:160]}); wrote its DOT source"
        return None


def find_renderer() -> Callable[[str], bytes] | None:
    """DOT text -> SVG bytes through pydot, else through ``dot`` on the PATH; ``None``
    when neither can run Graphviz."""
    try:
        import pydot  # noqa: F401
    except ImportError:
        pydot = None
    if pydot is not None:

        def with_pydot(text: str) -> bytes:
            (graph,) = pydot.graph_from_dot_data(text)
            return graph.create_svg()

        try:
            with_pydot("digraph probe { a -> b }")
            return with_pydot
        except Exception:  # noqa: BLE001 - pydot present, dot missing: try the PATH
            pass
    dot = shutil.which("dot")
    if dot is None:
        return None

    def with_dot(text: str) -> bytes:
        done = subprocess.run([dot, "-Tsvg"], input=text.encode(), capture_output=True, timeout=300, check=False)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.decode(errors="replace").strip() or f"dot exited {done.returncode}")
        return done.stdout

    return with_dot


def to_dot(change: GraphChange, side: str, max_nodes: int = MAX_NODES) -> str:
    """The DOT source of one side (``"before"`` or ``"after"``) of a change."""
    nodes = change.before if side == "before" else change.after
    marked = change.removed if side == "before" else change.added
    rewired = change.rewired
    fill = {name: (REMOVED if side == "before" else ADDED) for name in marked}
    fill.update({name: REWIRED for name in rewired})
    shown = _shown(nodes, set(fill), max_nodes)
    legend = "red: removed by Optimus" if side == "before" else "green: added by Optimus"
    title = [f"{change.level} {change.graph} — {side} Optimus ({len(nodes)} nodes; {legend}; amber: inputs changed)"]
    if len(shown) < len(nodes):
        title.append(f"showing {len(shown)} of {len(nodes)} nodes: what changed and its neighbours")
    if side == "after":
        title.append(change.summary)
    lines = [
        f"digraph {_quote(f'{change.level} {change.graph} {side}')} {{",
        f"  graph [label={_quote(chr(10).join(title))}, labelloc=t, fontname=Helvetica, fontsize=12];",
        '  node [shape=box, style="rounded,filled", fillcolor=white, fontname=Helvetica, fontsize=10];',
        "  edge [color=gray40, arrowsize=0.6];",
    ]
    for n in nodes:
        if n.name not in shown:
            continue
        attrs = [f"label={_quote(_label(n))}"]
        if n.name in fill:
            attrs.append(f'fillcolor="{fill[n.name]}"')
            attrs.append("penwidth=2")
        if n.op in ("placeholder", "output"):
            attrs.append("shape=ellipse")
        lines.append(f"  {_quote(n.name)} [{', '.join(attrs)}];")
    for n in nodes:
        if n.name not in shown:
            continue
        for i in n.inputs:
            if i in shown:
                lines.append(f"  {_quote(i)} -> {_quote(n.name)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _shown(nodes: list[NodeInfo], changed: set[str], max_nodes: int) -> set[str]:
    names = {n.name for n in nodes}
    if len(nodes) <= max_nodes:
        return names
    keep = set(changed & names)
    for n in nodes:  # direct neighbours: inputs of changed nodes, and their users
        if n.name in changed:
            keep.update(i for i in n.inputs if i in names)
        elif any(i in changed for i in n.inputs):
            keep.add(n.name)
    if len(keep) > max_nodes:  # changed nodes first, in graph order
        order = [n.name for n in nodes if n.name in changed] + [n.name for n in nodes if n.name in keep - changed]
        keep = set(order[:max_nodes])
    return keep


def _label(n: NodeInfo) -> str:
    parts = [n.name]
    if n.what and n.what != n.name:
        parts.append(n.what)
    if n.shape:
        parts.append(n.shape)
    return "\n".join(parts)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _what(n: fx.Node) -> str:
    if n.op == "placeholder":
        return "input"
    if n.op == "output":
        return "output"
    if n.op == "get_attr":
        return f"attr {n.target}"
    if n.op == "call_module":
        head = f"module {n.target}"
    elif n.op == "call_method":
        head = f".{n.target}"
    else:
        head = _target_name(n.target)
        if head == "getitem" and len(n.args) == 2 and isinstance(n.args[1], int):
            return f"[{n.args[1]}]"
    args = [_arg_text(a) for a in n.args]
    args += [f"{k}={_arg_text(v)}" for k, v in n.kwargs.items()]
    shown = ", ".join(a for a in args if a is not None)
    return _clip(f"{head}({shown})", 48) if shown else head


def _target_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        text = str(target)  # aten.cat.default
        return text[: -len(".default")] if text.endswith(".default") else text
    if isinstance(target, torch._ops.OpOverloadPacket):
        return str(target)
    name = getattr(target, "__name__", None) or str(target)
    module = getattr(target, "__module__", None) or ""
    return f"torch.{name}" if module in ("torch", "torch.functional") else name


def _arg_text(value: Any) -> str | None:
    """Non-graph arguments (constants) in a few characters; graph values are edges."""
    if isinstance(value, fx.Node):
        return None
    if isinstance(value, (list, tuple)):
        if any(isinstance(v, fx.Node) for v in value):
            items = [_arg_text(v) for v in value]
            consts = [i for i in items if i is not None]
            return f"[×{len(value)}]" if not consts else _clip("[" + ", ".join(i if i is not None else "·" for i in items) + "]", 24)
        return _clip(repr(list(value)), 24)
    if isinstance(value, torch.dtype):
        return _DTYPES.get(value, str(value).replace("torch.", ""))
    if isinstance(value, (torch.device, torch.memory_format, torch.layout)):
        return str(value).replace("torch.", "")
    return _clip(repr(value), 16)


def _shape(n: fx.Node) -> str:
    value = n.meta.get("val", n.meta.get("example_value"))
    if value is None and "tensor_meta" in n.meta:
        tm = n.meta["tensor_meta"]
        return _tensor_text(getattr(tm, "dtype", None), getattr(tm, "shape", ()))
    return _value_text(value)


def _value_text(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return _tensor_text(value.dtype, value.shape)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        parts = [_tensor_text(v.dtype, v.shape) for v in value[:3]]
        more = f", … {len(value)} in all" if len(value) > 3 else ""
        return "(" + ", ".join(parts) + more + ")"
    if isinstance(value, (int, float, bool, torch.SymInt, torch.SymFloat)):
        return _clip(str(value), 24)
    return ""


def _tensor_text(dtype: Any, shape: Any) -> str:
    return f"{_DTYPES.get(dtype, str(dtype).replace('torch.', ''))}[{', '.join(str(s) for s in shape)}]"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _figure(name: str, caption: str) -> str:
    src = html.escape(name)
    shown = f'<img src="{src}">' if name.endswith(".svg") else f'<a href="{src}">{src}</a> (DOT source)'
    return f"<figure>{shown}<figcaption>{caption}</figcaption></figure>"


def _index_html(pairs: list[tuple[GraphChange, str, str]]) -> str:
    rows = []
    for change, before, after in pairs:
        rows.append(
            f"<h2>{html.escape(change.level)} {html.escape(change.graph)}</h2>\n"
            f"<p>{html.escape(change.summary)}</p>\n"
            f'<div class="pair">{_figure(before, "before")}{_figure(after, "after")}</div>'
        )
    style = (
        "body{font-family:sans-serif;margin:1em}.pair{display:flex;gap:1em;align-items:flex-start}"
        "figure{margin:0;flex:1;overflow:auto}img{max-width:100%}"
        f".k{{display:inline-block;width:1em;height:1em;vertical-align:middle}}"
    )
    legend = (
        f'<p><span class="k" style="background:{REMOVED}"></span> removed '
        f'<span class="k" style="background:{ADDED}"></span> added '
        f'<span class="k" style="background:{REWIRED}"></span> inputs changed</p>'
    )
    return (
        f"<!doctype html><meta charset=utf-8><title>Optimus: graphs before and after</title><style>{style}</style>\n"
        f"<h1>Optimus: graphs before and after each level</h1>\n{legend}\n" + "\n".join(rows) + "\n"
    )
