"""``python3 -m zerohop [--path DIR] MODULE:FUNCTION``: runs ``MODULE.FUNCTION`` as the
function's handler. This is what a chain spec's ``runtime: python`` with
``handler: MODULE:FUNCTION`` starts (``--path`` is the spec's folder, searched first)."""

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
    parser.add_argument("handler", help="MODULE:FUNCTION, e.g. greet:handle")
    args = parser.parse_args(argv)
    module_name, sep, function_name = args.handler.partition(":")
    if not sep or not module_name or not function_name:
        parser.error(f"{args.handler!r} is not MODULE:FUNCTION, e.g. greet:handle")
    for folder in reversed(args.path):
        sys.path.insert(0, folder)
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
    run(handler)


if __name__ == "__main__":
    main()
