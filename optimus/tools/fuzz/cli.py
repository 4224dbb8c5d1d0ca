"""The command line: ``optimus fuzz`` and ``python -m optimus.tools.fuzz``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from ..cli_json import add_json_arguments, json_targets
from .campaign import DYNAMIC_MODES, GRAD_MODES, FuzzResult, fuzz
from .generate import generate
from .oracle import ALIASING_MODES, ALL_LEVELS, resolve_passes
from .program import LEVELS
from .shrink import Failure


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", type=int, default=200, help="number of programs (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the program stream (default 0)")
    p.add_argument(
        "--first", type=int, default=0, help="index of the first case in the seed's stream (default 0; a campaign splits a seed over processes)"
    )
    p.add_argument(
        "--level",
        choices=["both", *ALL_LEVELS],
        default="both",
        help="what to check: 'both' (default: optimus.optimize on Dynamo's graph, torch_ir, and on AOTAutograd's, aten_ir), "
        "one of them, or 'compile' (optimus.compile end to end: Inductor, the safety net, the output guard)",
    )
    p.add_argument(
        "--passes",
        default="vertical",
        help="passes to run: 'vertical' (default: the canonicalize + vertical rules on by default), 'registered' "
        "(every registered canonicalize + vertical rule, also those off by default), or any optimus passes value",
    )
    p.add_argument("--batch", type=int, default=8, help="cases compiled together (default 8; 1 = one compile per case)")
    p.add_argument(
        "--aliasing",
        choices=ALIASING_MODES,
        default="new",
        help="output aliasing check: 'new' (default): no output may newly alias an input or another output; "
        "'exact': nor stop aliasing; 'off'",
    )
    p.add_argument(
        "--dynamic",
        nargs="?",
        const="always",
        choices=DYNAMIC_MODES,
        default="mixed",
        help="symbolic shapes: 'mixed' (default: dynamic=True for ~15%% of cases), 'always' (also plain --dynamic: "
        "every case compiled with dynamic=True), 'never'",
    )
    p.add_argument(
        "--grad",
        choices=GRAD_MODES,
        default="mixed",
        help="gradients: 'mixed' (default: the generator's choice, ~80%% of cases), 'always', 'never' (forward only)",
    )
    add_json_arguments(p, "the summary and every failure", file_form=True)
    p.add_argument("--max-seconds", type=float, default=None, help="stop starting new cases after this many seconds")
    p.add_argument("--max-failures", type=int, default=10, help="stop after this many failing cases (default 10)")
    p.add_argument("--shrink-seconds", type=float, default=90.0, help="time to minimize each failure (default 90; 0 = off)")
    p.add_argument("--max-shrink", type=int, default=8, help="minimize at most this many failures, one per new class (default 8)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--list", action="store_true", help="print the generated programs (source, inputs, flags) and exit")


def run_cli(args: argparse.Namespace) -> int:
    if args.list:
        for i in range(args.first, args.first + args.cases):
            c = generate(args.seed, i)
            flags = f"grad={c.grad} dynamic={c.dynamic}"
            print(f"# {c.label}: {flags}; " + "; ".join(str(spec) for spec in c.inputs))
            print(c.source())
        return 0
    levels = LEVELS if args.level == "both" else (args.level,)
    passes: Any = args.passes
    if isinstance(passes, str) and passes.strip().startswith(("{", "[")):
        passes = json.loads(passes)
    elif isinstance(passes, str) and "," in passes:
        passes = [p.strip() for p in passes.split(",") if p.strip()]
    import optimus

    optimus.resolve(resolve_passes(passes))  # a bad name fails here, before any work
    as_json, json_path = json_targets(args)
    text = sys.stderr if as_json else sys.stdout  # with --json, stdout holds the JSON alone

    def progress(res: FuzzResult) -> None:
        print(res.progress_line(), file=text, flush=True)

    def on_failure(f: Failure) -> None:
        if f.tries:
            print(f.reproducer(), file=text, flush=True)
        else:  # not minimized (its class was seen before, or the shrink budget is spent)
            first = f.message.splitlines()[0] if f.message else ""
            print(f"FAILURE {f.kind} at {f.level} ({f.case.label}), not minimized: {first[:200]}", file=text, flush=True)

    res = fuzz(
        cases=args.cases,
        seed=args.seed,
        first=args.first,
        levels=levels,
        passes=passes,
        batch=args.batch,
        aliasing=args.aliasing,
        shrink_seconds=args.shrink_seconds or None,
        max_shrink=args.max_shrink,
        dynamic=args.dynamic,
        grad=args.grad,
        max_failures=args.max_failures,
        max_seconds=args.max_seconds,
        progress=None if args.quiet else progress,
        on_failure=on_failure,
    )
    print(res.summary(), file=text, flush=True)
    data = res.to_dict()
    if json_path is not None:
        with open(json_path, "w") as fh:
            json.dump(data, fh, indent=2, default=repr)
    if as_json:
        print(json.dumps(data, indent=2, default=repr))
    return 1 if res.failed_cases else 0


def register(subparsers: Any) -> None:
    """Add the ``fuzz`` subcommand to the ``optimus`` command line."""
    p = subparsers.add_parser("fuzz", help="differential fuzzer: random split/cat/view programs, rewritten vs eager")
    add_arguments(p)
    p.set_defaults(func=run_cli)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optimus.tools.fuzz", description="Differential fuzzer for Optimus's vertical rules")
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
