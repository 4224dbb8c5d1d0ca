"""The ``optimus`` command: ``demo``, ``explain``, ``rules`` (and ``bench``, ``fuzz`` when present)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence


def _passes_arg(value: str) -> Any:
    """``all`` / ``vertical`` / a comma list of names / a JSON dict per level."""
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
    result = run_demo(args.device, cfg, passes=args.passes)
    print(json.dumps(result, indent=2) if args.json else format_demo(result))
    ok = all(c["outputs_match"] for c in result["configs"].values())
    return 0 if ok else 1


def _cmd_explain(args: argparse.Namespace) -> int:
    import torch

    import optimus

    from .demo import DemoConfig, SplitCatDemo

    cfg = DemoConfig.small() if args.small else DemoConfig()
    model = SplitCatDemo(cfg.features, cfg.width, cfg.rounds)
    x = torch.randn(cfg.batch, cfg.features * cfg.width)
    report = optimus.explain(model, x, passes=args.passes, print_report=not args.json)
    if args.json:
        print(report.to_json())
    return 0


def _cmd_rules(args: argparse.Namespace) -> int:
    import optimus

    rules = optimus.list_rules(args.level)
    if args.json:
        print(json.dumps([{"name": r.name, "kind": r.kind, "levels": list(r.levels), "anchors": list(r.anchors), "priority": r.priority, "options": r.options} for r in rules], indent=2, default=repr))
        return 0
    print(f"{'rule':<36}{'kind':<14}{'levels':<22}{'anchor':<22}")
    for r in rules:
        summary = (r.doc.splitlines() or [""])[0]
        print(f"{r.name:<36}{r.kind:<14}{','.join(r.levels):<22}{'|'.join(r.anchors):<22}{summary}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="optimus", description="Multi-level graph optimizer for PyTorch 2.x")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="plain Inductor vs Inductor + Optimus on a built-in split/cat-heavy model")
    demo.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available, else cpu")
    demo.add_argument("--passes", type=_passes_arg, default="all", help="preset, comma list of names, or JSON dict per level")
    demo.add_argument("--small", action="store_true", help="a tiny model (seconds), for smoke tests")
    demo.add_argument("--iters", type=int, default=None, help="timed steps (default 30)")
    demo.add_argument("--json", action="store_true", help="print JSON instead of the table")
    demo.set_defaults(func=_cmd_demo)

    explain = sub.add_parser("explain", help="compile the demo model and print what each rule did")
    explain.add_argument("--passes", type=_passes_arg, default="all")
    explain.add_argument("--small", action="store_true")
    explain.add_argument("--json", action="store_true")
    explain.set_defaults(func=_cmd_explain)

    rules = sub.add_parser("rules", help="list registered rules")
    rules.add_argument("--level", choices=["torch_ir", "aten_ir", "inductor_ir"], default=None)
    rules.add_argument("--json", action="store_true")
    rules.set_defaults(func=_cmd_rules)

    for module in ("optimus.bench.cli", "optimus.fuzz"):
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
