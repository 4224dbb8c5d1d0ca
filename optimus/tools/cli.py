"""The ``optimus`` command: ``demo``, ``explain``, ``rules`` (and ``bench``, ``fuzz`` when present)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from .cli_json import add_json_arguments, emit, json_targets
from ..core.table import format_table
from . import user_model
from .user_model import INPUTS_HELP, SPEC_HELP


def _passes_arg(value: str) -> Any:
    """``auto`` / ``all`` / ``vertical`` / a comma list of names (``-name`` leaves one out) / a JSON dict per level."""
    value = value.strip()
    if value.startswith("{"):
        return json.loads(value)
    if "," in value:
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DemoConfig, format_demo, run_demo

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda but no CUDA device is available", file=sys.stderr)
            return 2
    cfg = DemoConfig.small() if args.small else DemoConfig()
    if args.iters is not None:
        cfg.iters = args.iters
    configs = ("inductor", "upstream", "optimus-vertical", "optimus") if args.compare_upstream else ("inductor", "optimus")
    result = run_demo(args.device, cfg, passes=args.passes, configs=configs, model_name=args.model,
                      warm=not args.no_warm)
    if not emit(result, args):
        print(format_demo(result))
    ok = all(c["outputs_match"] for c in result["configs"].values())
    return 0 if ok else 1


def _explain_target(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...], str]:
    """The model ``explain`` works on: the user's ``MODULE:FACTORY``, else the demo model."""
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.model is not None:
        model, inputs = user_model.load(args.model, args.inputs, device)
        return model, inputs, args.model
    if args.inputs is not None:
        raise ValueError("--inputs goes with a model of yours: optimus explain MODULE:FACTORY --inputs ...")
    from .demo import DemoConfig, SplitCatDemo

    cfg = DemoConfig.small() if args.small else DemoConfig()
    torch.manual_seed(0)
    model = SplitCatDemo(cfg.features, cfg.width, cfg.rounds).to(device)
    return model, (torch.randn(cfg.batch, cfg.features * cfg.width, device=device),), "the built-in demo model"


def _cmd_explain(args: argparse.Namespace) -> int:
    import optimus

    model, inputs, what = _explain_target(args)
    as_json, _ = json_targets(args)
    if not as_json and args.model is not None:  # a model of the user's: say which
        print(f"model: {what}")
    if not args.graph:
        report = optimus.explain(model, *inputs, passes=args.passes, print_report=not as_json)
        emit(report.to_dict(), args)
        return 0
    from ..graph_pictures import recording

    with recording(args.graph) as pictures:
        report = optimus.explain(model, *inputs, passes=args.passes, print_report=False)
    result = pictures.result
    assert result is not None
    if result.message:  # e.g. Graphviz missing: said on stderr, the rest of the output as usual
        print(f"optimus explain --graph: {result.message}", file=sys.stderr)
    data = report.to_dict()
    data["pictures"] = {"directory": result.directory, "files": result.files, "message": result.message}
    if not emit(data, args):
        print(report.table())
        print()
        print(result.note)
    return 0


def _cmd_rules(args: argparse.Namespace) -> int:
    import optimus

    if args.upstream:
        return _print_upstream_names(args)
    rules = optimus.list_rules(args.level)
    if args.markdown:
        print(rules_markdown(rules))
        return 0
    data = [{"name": r.name, "kind": r.kind, "levels": list(r.levels), "anchors": list(r.anchors), "stage": r.stage,
             "options": {k: v if isinstance(v, (bool, int, float, str, type(None))) else repr(v) for k, v in r.option_defaults().items()},
             "summary": _summary(r)} for r in rules]
    if emit(data, args):
        return 0
    rows = [[r.name, r.kind, ",".join(r.levels), _anchors(r), _summary(r)] for r in rules]
    print(format_table(["rule", "kind", "levels", "anchor", "summary"], rows))
    return 0


def _anchors(rule: Any, most: int = 3) -> str:
    """The rule's anchor ops; past ``most``, the count of the rest (``--json`` lists them all)."""
    shown = "|".join(rule.anchors[:most])
    return shown + (f"|+{len(rule.anchors) - most} more" if len(rule.anchors) > most else "")


def _summary(rule: Any) -> str:
    """The first line of a rule's docstring."""
    return (rule.doc.strip().splitlines() or [""])[0]


def _print_upstream_names(args: argparse.Namespace) -> int:
    from ..core.upstream_names import UPSTREAM_PASSES

    data = [{"name": p.name, "option": p.option, "level": p.level, "rules": list(p.rules),
             "implemented": p.implemented, "note": p.instead or p.note} for p in UPSTREAM_PASSES.values()]
    if emit(data, args):
        return 0
    rows = [[p.name, p.level, ", ".join(p.rules) if p.rules else ("(nothing)" if p.implemented else "not implemented")]
            for p in UPSTREAM_PASSES.values()]
    print(format_table(["upstream name", "level", "Optimus rule(s)"], rows))
    print("\nupstream option names: min_fuse_set_size -> min_group, max_fuse_set_size -> max_group, "
          "threshold_to_cat -> min_run (others accepted and ignored); docs/upstream-names.md has the notes")
    return 0


def rules_markdown(rules: list[Any]) -> str:
    """The catalogue of rules, grouped by kind, each with its docstring (before -> after)."""
    lines = ["# Rule catalogue", "", "Generated by `optimus rules --markdown` from the rules' docstrings.", ""]
    for kind in ("canonicalize", "vertical", "horizontal"):
        chosen = [r for r in rules if r.kind == kind]
        if not chosen:
            continue
        lines += [f"## {kind}", ""]
        for r in chosen:
            default = "" if r.default else " (off by default: enable by name)"
            lines += [f"### `{r.name}`{default}", "", f"levels: {', '.join(r.levels)} · anchor: {', '.join(r.anchors)} · stage {r.stage}"]
            if r.option_defaults():
                lines.append(f"· options: {', '.join(f'{k}={v!r}' for k, v in r.option_defaults().items())}")
            lines += ["", "```", r.doc.strip() or "(no docstring)", "```", ""]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="optimus", description="Multi-level graph optimizer for PyTorch 2.x")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="plain Inductor vs Inductor + Optimus on a built-in split/cat-heavy model")
    demo.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available, else cpu")
    demo.add_argument("--passes", type=_passes_arg, default="auto",
                      help="auto (the default: the planner chooses), a preset (all, vertical, ...), a comma list of "
                           "names (a name after '-' is left out: auto,-merge_splits), or a JSON dict per level")
    demo.add_argument("--small", action="store_true", help="a tiny model (seconds), for smoke tests")
    demo.add_argument("--iters", type=int, default=None, help="timed steps (default 30)")
    add_json_arguments(demo, "the measurements")
    demo.add_argument("--no-warm", action="store_true",
                      help="skip the warm-up compile (the first configuration then also pays the process's one-time start-up)")
    demo.add_argument("--compare-upstream", action="store_true",
                      help="also Inductor with upstream PyTorch's Optimus options, and Optimus' vertical rules alone")
    demo.add_argument("--model", default=None, help="a zoo model instead of the built-in demo model (e.g. splitcat)")
    demo.set_defaults(func=_cmd_demo)

    explain = sub.add_parser("explain", help="compile a model (yours, or the demo model) and print what each rule did",
                             description="Compile a model with Optimus, run it once and print what each rule did. "
                                         "MODEL is MODULE:FACTORY, a function of yours returning an nn.Module or "
                                         "(module, example_inputs); without it, the built-in demo model.")
    explain.add_argument("model", nargs="?", default=None, metavar="MODEL", help=SPEC_HELP + " (default: the built-in demo model)")
    explain.add_argument("--inputs", default=None, help=INPUTS_HELP)
    explain.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available, else cpu")
    explain.add_argument("--passes", type=_passes_arg, default="auto", help="as for demo (default auto)")
    explain.add_argument("--small", action="store_true", help="the demo model's small size")
    add_json_arguments(explain, "the report")
    explain.add_argument("--graph", metavar="DIR", default=None,
                         help="write before/after pictures of each graph per level to DIR (SVG with Graphviz, else DOT)")
    explain.set_defaults(func=_cmd_explain)

    rules = sub.add_parser("rules", help="list registered rules")
    rules.add_argument("--level", choices=["torch_ir", "aten_ir", "inductor_ir"], default=None)
    add_json_arguments(rules, "the catalogue")
    rules.add_argument("--markdown", action="store_true", help="the rule catalogue as markdown (docs/rules.md)")
    rules.add_argument("--upstream", action="store_true",
                       help="upstream PyTorch's pass names and the Optimus rules each one selects")
    rules.set_defaults(func=_cmd_rules)

    for module in ("optimus.tools.bench.cli", "optimus.tools.fuzz"):
        try:
            mod = __import__(module, fromlist=["register"])
        except ImportError:
            continue
        register = getattr(mod, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
