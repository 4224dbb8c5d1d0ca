"""The command line's one JSON convention, shared by every subcommand.

* ``--json``: JSON on stdout, and nothing else there (tables and progress go to stderr
  or are left out);
* ``--json-out FILE``: the same JSON written to FILE (``optimus bench`` merges into an
  existing file); the usual text output still goes to stdout.

``optimus bench`` and ``optimus fuzz`` used to take ``--json FILE``; that spelling still
works and says on stderr that it is deprecated.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

DEPRECATED_FILE_FORM = "--json FILE is deprecated; use --json-out FILE (--json alone prints JSON to stdout)"


def add_json_arguments(p: argparse.ArgumentParser, what: str = "the results", file_form: bool = False,
                       out_help: str | None = None) -> None:
    """``--json`` and ``--json-out FILE``; ``file_form``: also accept the old ``--json FILE``."""
    if file_form:
        p.add_argument("--json", nargs="?", const=True, default=False, metavar="FILE",
                       help=f"print {what} as JSON to stdout (the old '--json FILE' still works: use --json-out FILE)")
    else:
        p.add_argument("--json", action="store_true", help=f"print {what} as JSON to stdout instead of text")
    p.add_argument("--json-out", metavar="FILE", default=None, help=out_help or f"also write {what} as JSON to FILE")


def json_targets(args: argparse.Namespace) -> tuple[bool, str | None]:
    """(JSON to stdout?, file to write), with the old ``--json FILE`` read as ``--json-out FILE``."""
    to_stdout, path = args.json, args.json_out
    if isinstance(to_stdout, str):  # the deprecated file form
        print(f"warning: {DEPRECATED_FILE_FORM}", file=sys.stderr)
        if path is not None and path != to_stdout:
            raise ValueError(f"--json {to_stdout} and --json-out {path}: give one file")
        to_stdout, path = False, to_stdout
    return bool(to_stdout), path


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)


def emit(data: Any, args: argparse.Namespace) -> bool:
    """Write ``data`` where ``--json`` / ``--json-out`` ask; True when stdout got the JSON
    (the caller then prints no text there)."""
    to_stdout, path = json_targets(args)
    if path is not None:
        with open(path, "w") as fh:
            fh.write(dumps(data) + "\n")
    if to_stdout:
        print(dumps(data))
    return to_stdout
