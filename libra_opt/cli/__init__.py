"""The ``libra-opt`` command line: one module per subcommand.

Each module in :data:`COMMANDS` defines ``add_parser(subparsers)`` (which
registers its arguments) and ``run(args) -> int`` (the exit code).

Exit status: 0 done; 1 "infeasible" or "over budget" (no plan fits,
:class:`~libra_opt.errors.InfeasibleBudgetError`,
:class:`~libra_opt.errors.BudgetExceededError`); 2 a usage error (a bad
argument, a file that cannot be read, any other
:class:`~libra_opt.errors.LibraOptError`).  Every error is one line on
stderr.  Only what ``--help`` needs is imported before a command runs, so
``libra-opt --help`` does not import torch.
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


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (exit status 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser.  Only the subcommand named in ``argv`` (all of them when ``argv`` is
    ``None``) gets its full arguments; the others get their one-line help, so that
    ``libra-opt --help`` imports nothing but the command modules (no numpy, no torch)."""
    parser = _Parser(prog="libra-opt", description="Train PyTorch models in less GPU memory by tensor "
                                                   "rematerialization: profile, plan, simulate, compare.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, mod in COMMANDS.items():
        try:
            module = importlib.import_module(f"libra_opt.cli.{mod}")
        except ModuleNotFoundError as e:
            if e.name == f"libra_opt.cli.{mod}":
                continue  # subcommand not present in this build
            raise
        if chosen is None or chosen == name:
            p = module.add_parser(sub)
            p.set_defaults(_run=module.run)
        else:
            sub.add_parser(name, help=module.HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``libra-opt`` console script."""
    from libra_opt.errors import BudgetExceededError, InfeasibleBudgetError, LibraOptError

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2, already printed as one line)
        return e.code if isinstance(e.code, int) else 2
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except (InfeasibleBudgetError, BudgetExceededError) as e:
        print(f"libra-opt {args.command}: {e}", file=sys.stderr)
        return 1
    except LibraOptError as e:
        print(f"libra-opt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # every file is written whole or not at all (libra_opt.atomic), so nothing partial is left
        print(f"libra-opt {args.command}: interrupted (KeyboardInterrupt); no output was written after it",
              file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
