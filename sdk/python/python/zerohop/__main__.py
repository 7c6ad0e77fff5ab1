"""``python3 -m zerohop [--path DIR] MODULE:FUNCTION``: runs ``MODULE.FUNCTION`` as the
function's handler. This is what a chain spec's ``runtime: python`` with
``handler: MODULE:FUNCTION`` starts (``--path`` is the spec's folder, searched first).

``python3 -m zerohop [--path DIR] NAME=MODULE:FUNCTION ...``: one interpreter serving several
functions, each request with the handler of its function (``zerohop.run`` with a mapping).
This is what a fused group of ``runtime: python`` functions starts (``fuse:`` in the spec):
each function's module loaded into the one interpreter."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python3 -m zerohop",
        description="Run a zerohop function's handler, given as MODULE:FUNCTION.",
    )
    parser.add_argument(
        "--path",
        action="append",
        default=[],
        help="a folder to import MODULE from (searched before sys.path; repeatable)",
    )
    parser.add_argument(
        "handler",
        nargs="+",
        help="MODULE:FUNCTION, e.g. greet:handle; or NAME=MODULE:FUNCTION for each function "
        "of a fused group",
    )
    args = parser.parse_args(argv)
    for folder in reversed(args.path):
        sys.path.insert(0, folder)
    named = [h.partition("=") for h in args.handler]
    if len(args.handler) == 1 and not named[0][1]:
        run(_load(parser, args, args.handler[0]))
    if not all(sep and name for name, sep, _ in named):
        parser.error("several handlers are given as NAME=MODULE:FUNCTION each")
    run({name: _load(parser, args, spec) for name, _, spec in named})


def _load(parser: argparse.ArgumentParser, args: argparse.Namespace, spec: str):
    """Imports ``MODULE`` of ``MODULE:FUNCTION`` and returns its function; exits with status
    2 saying why when it cannot."""
    module_name, sep, function_name = spec.partition(":")
    if not sep or not module_name or not function_name:
        parser.error(f"{spec!r} is not MODULE:FUNCTION, e.g. greet:handle")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure ends the program with why
        print(
            f"zerohop: cannot import {module_name!r} (from {args.path or sys.path[:1]}): "
            f"{type(e).__name__}: {e}",
            file=sys.stderr,
        )
        sys.exit(2)
    handler = getattr(module, function_name, None)
    if not callable(handler):
        print(
            f"zerohop: {module_name} has no function {function_name!r}",
            file=sys.stderr,
        )
        sys.exit(2)
    return handler


if __name__ == "__main__":
    main()
