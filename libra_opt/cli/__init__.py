"""The ``libra-opt`` command line: one module per subcommand.

Each module in :data:`COMMANDS` defines ``add_parser(subparsers)`` (which
registers its arguments) and ``run(args) -> int`` (the exit code).  Library
errors (:class:`~libra_opt.errors.LibraOptError`) are printed as one line and
exit with status 2.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

#: subcommand -> module under libra_opt.cli
COMMANDS = {
    "demo": "demo",
    "profile": "profile",
    "simulate": "simulate",
    "solve": "solve",
    "sweep": "sweep",
    "compare": "compare",
    "max-batch": "max_batch",
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand."""
    parser = argparse.ArgumentParser(prog="libra-opt", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in COMMANDS.items():
        try:
            module = importlib.import_module(f"libra_opt.cli.{mod}")
        except ModuleNotFoundError as e:
            if e.name == f"libra_opt.cli.{mod}":
                continue  # subcommand not present in this build
            raise
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``libra-opt`` console script."""
    from libra_opt.errors import LibraOptError

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 1
    try:
        return int(args._run(args) or 0)
    except LibraOptError as e:
        print(f"libra-opt {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
