"""The ``rootclad`` command line: ``doctor``, ``demo`` and the ``gw`` tools."""

from __future__ import annotations

import argparse
import sys


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

    p = sub.add_parser("demo", help="run the main job (the GW workflow on a small default)")
    add_demo_arguments(p)
    p.set_defaults(func=_cmd_demo)

    try:
        from rootclad.gw.cli import register as register_gw
    except ImportError:
        register_gw = None
    if register_gw is not None:
        register_gw(sub)

    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
