"""Arguments and steps shared by the commands that read a problem file
(``simulate``, ``solve``, ``sweep``, ``compare``)."""
from __future__ import annotations

import argparse
import sys


def add_problem_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``FILE`` (our problem JSON or a node-link remat graph) and
    ``--bandwidth`` (bytes per second, or per cost unit for remat graphs)."""
    p.add_argument("file", metavar="FILE", help="problem JSON (libra-opt schema) or node-link remat graph")
    p.add_argument("--bandwidth", metavar="BYTES_PER_S", type=float,
                   help="for remat graphs only: host<->device bandwidth each way (bytes per cost unit)")


def report_unreadable(command: str, e: OSError) -> None:
    """Print the one-line error for a file that cannot be read."""
    print(f"libra-opt {command}: error: cannot read {e.filename}: {e.strerror}", file=sys.stderr)


def read_problem(args: argparse.Namespace, command: str):
    """The problem named by ``args.file`` (via
    :func:`libra_opt.importers.load_problem_any`), or ``None`` after printing
    the error when the file cannot be read (the command then exits 2).
    Corrupt files raise :class:`~libra_opt.errors.ProblemFileError`, which
    ``libra_opt.cli.main`` reports."""
    from libra_opt.importers import load_problem_any

    try:
        return load_problem_any(args.file, bandwidth_bytes_per_s=args.bandwidth)
    except OSError as e:
        report_unreadable(command, e)
        return None


def check_outputs(*paths: str | None) -> None:
    """Check every given output path (``None`` skipped) with
    :func:`libra_opt.atomic.check_writable` before a command does its work;
    raises :class:`~libra_opt.errors.OutputPathError` (exit status 2)."""
    from libra_opt.atomic import check_writable

    for p in paths:
        if p is not None:
            check_writable(p)
