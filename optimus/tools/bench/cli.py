"""The ``bench`` subcommand.

    optimus bench --model NAME|MODULE:FACTORY|all --mode infer|train [--device cuda|cpu]
                  [--inputs SHAPES] [--suite zoo|external|all] [--size small|realistic]
                  [--configs a,b] [--json] [--json-out FILE] [--plot FILE] [--workers N]
                  [--repeats R] [--precision fp32|tf32|amp-bf16|amp-fp16|bf16[,...]] [--dynamic]
                  [--time-split]

``--model`` and ``--mode`` also take comma lists; ``--model all`` means every model of
``--suite`` (the zoo by default; ``external``: TorchRec and Hugging Face models,
``optimus.tools.bench.external``). ``--model MODULE:FACTORY`` benchmarks a model of yours
(``optimus.tools.user_model``: the factory returns the module, or the module and its example
inputs; ``--inputs`` gives them otherwise); it must return one tensor, and training
minimizes the mean of its square. ``--precision`` takes a comma list: each row runs in one
precision (``optimus.tools.bench.precision``), a model's precisions back to back in one process;
``--tf32`` is ``--precision tf32``. An external model whose library is not installed gets a
``skipped`` line in the table (never an error); when every model asked for is skipped
the command fails with a message naming the extras to install. ``--json`` prints this
run's rows as JSON on stdout (the table then goes to stderr); ``--json-out FILE`` merges
into an existing file, keyed by model/mode/config (and precision, when not fp32), and is rewritten after every row, so
runs made in pieces (or cut short) accumulate into one file. ``--workers N`` compiles N rows at a
time in worker processes and times one at a time (``optimus.tools.bench.parallel``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Any, Sequence

from .. import user_model
from ..cli_json import add_json_arguments, dumps, json_targets
from ...core.table import format_table
from ..models import MODELS, SIZES
from . import external
from . import precision as precisions
from .configs import CONFIG_NAMES
from .harness import MODES
from .results import key as row_key


def _choices(value: str, allowed: Sequence[str], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if items == ["all"]:
        return list(allowed)
    unknown = [v for v in items if v not in allowed]
    if unknown or not items:
        raise ValueError(f"unknown {what} {', '.join(map(repr, unknown)) or repr(value)}; "
                         f"choose from: {', '.join(allowed)} (or 'all', or a comma list)")
    return items


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="all",
                   help=f"model(s): {', '.join(external.all_model_names())}, all (the --suite), a model of yours as "
                        "MODULE:FACTORY (a function returning an nn.Module or (module, example_inputs)), or a comma list")
    p.add_argument("--inputs", default=None, help="for a MODULE:FACTORY model: " + user_model.INPUTS_HELP)
    p.add_argument("--suite", choices=list(external.SUITES), default="zoo",
                   help="what --model all means: the zoo (default), the external models (TorchRec, Hugging "
                        "Face: optional extras), or all of both")
    p.add_argument("--mode", default="train", help="train, infer, all, or a comma list (default: train)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available, else cpu")
    p.add_argument("--size", choices=list(SIZES), default=None,
                   help="model size (default: realistic on cuda, small on cpu)")
    p.add_argument("--configs", default="all", help=f"configurations: {', '.join(CONFIG_NAMES)}, all, or a comma list")
    p.add_argument("--iters", type=int, default=30, help="timed steps per configuration (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps after compilation (default 5)")
    p.add_argument("--repeats", type=int, default=1,
                   help="take the median of --iters steps this many times and report their spread (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", default=None,
                   help="the precision(s) of every step, a comma list: fp32 (default: TF32 off), tf32 (CUDA: the "
                        "timed steps with TF32 matmuls; one extra compile per row), amp-bf16 / amp-fp16 (forward "
                        "and loss under torch.autocast), bf16 (the model and its floating inputs in bfloat16), "
                        "or all; accuracy judged with TF32 off against eager in the same precision and fp64")
    p.add_argument("--tf32", dest="tf32", action="store_true", default=False,
                   help="the same as --precision tf32")
    p.add_argument("--no-tf32", dest="tf32", action="store_false", help=argparse.SUPPRESS)  # the default now
    p.add_argument("--dynamic", action="store_true", help="compile with dynamic=True")
    p.add_argument("--time-split", action="store_true",
                   help="also profile where each row's step time goes: device busy time and host time by part "
                        "(compiled graphs, their wrappers, guards, autograd, optimizer, other)")
    p.add_argument("--workers", type=int, default=1,
                   help="compile this many rows at a time in worker processes; timed sections still run one "
                        "at a time, under a lock (default 1: every row in this process, in order)")
    p.add_argument("--compile-threads", type=int, default=None,
                   help="with --workers: TORCHINDUCTOR_COMPILE_THREADS of each worker (default: the compile "
                        "cores divided by the workers)")
    p.add_argument("--timing-cores", type=int, default=None,
                   help="with --workers: CPU cores kept free of compiles for the timed sections "
                        "(default: 2 on machines of 8+ cores, else 0)")
    p.add_argument("--isolate", action="store_true",
                   help="with --workers: no row builds, compiles or runs its first step while another is timed "
                        "(timed sections wait for the compiles in flight; slower runs, cleaner timings)")
    add_json_arguments(p, "this run's rows", file_form=True,
                       out_help="merge the rows into FILE (keyed by model/mode/config; written after every row)")
    p.add_argument("--skip-existing", action="store_true",
                   help="with --json-out: skip model/mode/config rows already measured (status ok) in FILE")
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="start no configuration that would end after this many minutes, judged by the "
                        "longest compiled configuration of the same model and mode so far (rows so far are kept)")
    p.add_argument("--plot", metavar="FILE", default=None, help="write a speedup/kernel-count plot (matplotlib)")
    p.add_argument("--warm-cache", dest="cold", action="store_false",
                   help="reuse Inductor's compiled kernels across configurations (graphs are still "
                        "recompiled; compile times are not cold): quick checks and CI only")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--list", action="store_true", help="list models and configurations and exit")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to an argparse subparsers object (used by ``optimus.tools.cli``)."""
    p = subparsers.add_parser("bench", help="benchmark the model zoo: eager, inductor, upstream and optimus")
    add_arguments(p)
    p.set_defaults(func=run_command)
    return p


def run_command(args: argparse.Namespace) -> int:
    import torch

    from . import harness, results
    from .progress import Progress

    if args.list:
        rows = [[name, spec.summary] for name, spec in MODELS.items()]
        for name, ext in external.EXTERNAL.items():
            problem = external.unavailable(name)
            rows.append([name, ext.summary + (f" [not available: {problem}]" if problem else "")])
        print(format_table(["model", "summary"], rows))
        print("configurations:", ", ".join(CONFIG_NAMES))
        return 0
    as_json, json_path = json_targets(args)
    models = _models(args.model, args.suite, args.inputs)
    modes = _choices(args.mode, list(MODES), "mode")
    configs = _choices(args.configs, CONFIG_NAMES, "configuration")
    precision_list = _precisions(args)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print(f"error: --device cuda, but no CUDA device is available (torch {torch.__version__}, "
              f"built with CUDA {torch.version.cuda})", file=sys.stderr)
        return 2
    size = args.size or ("realistic" if device == "cuda" else "small")
    if args.iters < 1 or args.warmup < 0 or args.repeats < 1:
        raise ValueError("--iters and --repeats must be >= 1 and --warmup >= 0")
    if args.workers < 1 or (args.compile_threads is not None and args.compile_threads < 1):
        raise ValueError("--workers and --compile-threads must be >= 1")
    if args.workers == 1 and (args.compile_threads is not None or args.timing_cores is not None or args.isolate):
        raise ValueError("--compile-threads, --timing-cores and --isolate apply to worker processes: add --workers N (N > 1)")
    if args.plot:
        from .plot import require_matplotlib

        require_matplotlib()
    for m in models:
        if user_model.is_spec(external.user_spec(m)[0]):
            external.check_user_model(m, device)  # a wrong name or model fails now, with its reason

    missing = {m: why for m in models if (why := external.unavailable(m, device))}
    if missing and len(missing) == len(models):
        print("error: none of the models asked for can run here:\n"
              + "\n".join(f"  {m}: {why}" for m, why in missing.items()), file=sys.stderr)
        return 2

    opts = harness.BenchOptions(device=device, size=size, iters=args.iters, warmup=args.warmup,
                                seed=args.seed, precisions=tuple(precision_list), cold=args.cold, repeats=args.repeats,
                                dynamic=args.dynamic, compile_threads=args.compile_threads, isolate=args.isolate,
                                time_split=args.time_split)
    command = "optimus bench " + " ".join(shlex.quote(a) for a in _argv_for_record(args, device, size))
    data = results.load(json_path) if json_path else results.empty()
    this_run = results.empty()

    def on_row(row: dict[str, Any]) -> None:
        row["command"] = command
        results.merge(this_run, [row])
        if json_path:
            results.merge(data, [row], command)
            results.save(json_path, data)

    skip: set[str] = set()
    if args.skip_existing:
        if not json_path:
            raise ValueError("--skip-existing needs --json-out FILE")
        skip = {k for k, r in data["rows"].items()
                if r.get("status") == "ok" and r.get("size") == size and r.get("device") == device}
    deadline = None if args.budget_minutes is None else time.perf_counter() + 60 * args.budget_minutes
    planned = [row_key(m, md, c, pr) for m, md, c, pr in harness.plan(models, modes, configs, precision_list)]
    for m in missing:  # a line in the table; in the JSON only where it replaces nothing
        for _, md, c, pr in harness.plan([m], modes, configs, precision_list):
            row = harness.skipped_row(m, md, c, opts, missing[m], precision=pr)
            row["command"] = command
            results.merge(this_run, [row])
            if json_path and results.row_key(row) not in data["rows"]:
                results.merge(data, [row], command)
    if json_path and missing:
        results.save(json_path, data)
    models = [m for m in models if m not in missing]
    progress = Progress(len(planned) - len(this_run["rows"]), enabled=not args.quiet)
    try:
        if args.workers > 1:
            from . import parallel

            prior = parallel.prior_compile_s(data, device, size)
            parallel.run_parallel(models, modes, configs, opts, args.workers, on_row=on_row, progress=progress,
                                  skip=skip, deadline=deadline, prior=prior, timing_cores=args.timing_cores)
        else:
            harness.run(models, modes, configs, opts, on_row=on_row, progress=progress, skip=skip, deadline=deadline)
    finally:
        progress.close()
    # rows arrive in completion order with workers: the table follows the plan
    this_run["rows"] = {k: this_run["rows"][k] for k in planned if k in this_run["rows"]}
    not_run = [k for k in planned if k not in skip and k not in this_run["rows"]]
    if missing:
        print(f"skipped (not available here): {', '.join(missing)}", file=sys.stderr)
    if not_run:
        print(f"budget reached; not run ({len(not_run)}): {', '.join(not_run)}", file=sys.stderr)
    if skip & set(planned):
        print(f"skipped {len(skip & set(planned))} row(s) already in {json_path}", file=sys.stderr)
    print(results.format_table(this_run), file=sys.stderr if as_json else sys.stdout)
    if as_json:
        print(dumps(this_run))
    if args.plot:
        from .plot import plot

        plot(data if json_path else this_run, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    if json_path:
        print(f"results merged into {json_path}", file=sys.stderr)
    failed = [r for r in this_run["rows"].values()
              if r["status"] not in ("ok", "skipped") or (r.get("parity") and not r["parity"]["ok"])]
    return 1 if failed else 0


def _precisions(args: argparse.Namespace) -> list[str]:
    """``--precision`` checked (``--tf32``: tf32, as before the option existed)."""
    if args.tf32:
        if args.precision not in (None, "tf32"):
            raise ValueError(f"--tf32 is --precision tf32: give one of --tf32 and --precision {args.precision}")
        return ["tf32"]
    return precisions.parse(args.precision or "fp32")


def _models(value: str, suite: str, inputs: str | None) -> list[str]:
    """The models ``--model`` names: built-in names (checked), ``all`` (the suite), and
    ``MODULE:FACTORY`` models of the user's, each carrying ``--inputs`` in its name."""
    if value.strip() == "all":
        names = external.suite_models(suite)
    else:
        items = [v.strip() for v in value.split(",") if v.strip()]
        known = [v for v in items if not user_model.is_spec(v)]
        if known or not items:
            _choices(",".join(known), external.all_model_names(), "model")
        names = [external.user_model_name(v, inputs) if user_model.is_spec(v) else v for v in items]
    if inputs is not None and not any(user_model.is_spec(n) or "[" in n for n in names):
        raise ValueError("--inputs goes with a model of yours: --model MODULE:FACTORY --inputs ...")
    return names


def _argv_for_record(args: argparse.Namespace, device: str, size: str) -> list[str]:
    argv = ["--model", args.model, "--mode", args.mode, "--device", device, "--size", size]
    if args.inputs is not None:
        argv += ["--inputs", args.inputs]
    if args.suite != "zoo":
        argv += ["--suite", args.suite]
    if args.configs != "all":
        argv += ["--configs", args.configs]
    if args.iters != 30:
        argv += ["--iters", str(args.iters)]
    if args.warmup != 5:
        argv += ["--warmup", str(args.warmup)]
    if args.repeats != 1:
        argv += ["--repeats", str(args.repeats)]
    if args.seed != 0:
        argv += ["--seed", str(args.seed)]
    chosen = _precisions(args)
    if chosen != ["fp32"]:
        argv += ["--precision", ",".join(chosen)]
    if args.dynamic:
        argv.append("--dynamic")
    if args.time_split:
        argv.append("--time-split")
    if args.workers != 1:
        argv += ["--workers", str(args.workers)]  # compile times depend on it
    if args.compile_threads is not None:
        argv += ["--compile-threads", str(args.compile_threads)]
    if args.timing_cores is not None:
        argv += ["--timing-cores", str(args.timing_cores)]
    if args.isolate:
        argv.append("--isolate")
    if not args.cold:
        argv.append("--warm-cache")
    json_path = json_targets(args)[1] if isinstance(args.json, bool) else args.json  # (warned once already)
    if json_path:
        argv += ["--json-out", json_path]
    return argv  # --skip-existing / --budget-minutes / --plot do not change what a row measures


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m optimus.tools.bench",
        description="Benchmark the model zoo: eager, inductor, upstream and optimus configurations.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
