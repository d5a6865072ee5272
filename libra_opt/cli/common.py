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
    p.add_argument("--executor", choices=["eager", "inductor"],
                   help="price recomputes as this executor runs them (libra_opt.costs.for_executor; default: as "
                        "the file says, eager for files without the field)")
    p.add_argument("--memory-bandwidth", metavar="BYTES_PER_S", type=float,
                   help="device-memory bandwidth (read + written, bytes per second) for --executor inductor on "
                        "problems profiled before it was measured")


def report_unreadable(command: str, e: OSError) -> None:
    """Print the one-line error for a file that cannot be read."""
    print(f"libra-opt {command}: error: cannot read {e.filename}: {e.strerror}", file=sys.stderr)


def read_problem(args: argparse.Namespace, command: str):
    """The problem named by ``args.file`` (via
    :func:`libra_opt.importers.load_problem_any`), or ``None`` after printing
    the error when the file cannot be read (the command then exits 2).
    Corrupt files raise :class:`~libra_opt.errors.ProblemFileError`, which
    ``libra_opt.cli.main`` reports.  With ``--executor`` the problem is priced
    for that executor (:func:`libra_opt.costs.for_executor`, whose
    :class:`~libra_opt.errors.ProblemError` names a missing bandwidth)."""
    from libra_opt.importers import load_problem_any

    try:
        problem = load_problem_any(args.file, bandwidth_bytes_per_s=args.bandwidth)
    except OSError as e:
        report_unreadable(command, e)
        return None
    executor = getattr(args, "executor", None)
    if executor is not None or getattr(args, "memory_bandwidth", None) is not None:
        from libra_opt.costs import for_executor

        problem = for_executor(problem, executor or problem.executor, memory_bytes_per_s=args.memory_bandwidth)
    return problem
