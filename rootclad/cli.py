"""The ``rootclad`` command line: ``doctor``, ``demo`` and the ``gw`` tools."""

from __future__ import annotations

import argparse
import os
import sys

from rootclad.data.errors import DataError
from rootclad.toolchain import CompileError, ToolchainError

# What bad arguments or input raise; anything else is a bug and keeps its traceback.
_USER_ERRORS = (ValueError, TypeError, KeyError, OSError, DataError, ToolchainError, CompileError)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from rootclad.doctor import report

    print(report())
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from rootclad.demo import run_demo

    return run_demo(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rootclad", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="show which engines, compilers, BLAS and ROOT were found")
    p.set_defaults(func=_cmd_doctor)

    from rootclad.demo import add_arguments as add_demo_arguments

    p = sub.add_parser(
        "demo",
        help="train a small 1-d CNN on synthetic signal-vs-noise data, timed against torch "
        "(not yet the GW workflow, which will replace it)",
    )
    add_demo_arguments(p)
    p.set_defaults(func=_cmd_demo)

    try:
        from rootclad.gw.cli import register as register_gw
    except ImportError:
        register_gw = None
    if register_gw is not None:
        register_gw(sub)

    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except _USER_ERRORS as err:
        # a mistake in the arguments or the input, not a bug: one line, no traceback
        # (ROOTCLAD_TRACEBACK=1 shows it)
        if os.environ.get("ROOTCLAD_TRACEBACK"):
            raise
        msg = (
            err.strerror + f": {err.filename}" if isinstance(err, OSError) and err.filename else err
        )
        command = " ".join(filter(None, (args.command, getattr(args, "gw_command", None))))
        print(f"rootclad {command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
