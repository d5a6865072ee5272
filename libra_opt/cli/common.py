"""Arguments and steps shared by the commands that read a problem file
(``simulate``, ``solve``, ``sweep``, ``compare``)."""
from __future__ import annotations

import argparse
import math
import re
import sys


def description(doc: str | None) -> str | None:
    """A command's ``--help`` description: its module docstring after the
    first paragraph, without reStructuredText markup (````x````,
    ``:func:`x```, ``**x**``)."""
    if not doc or "\n\n" not in doc:
        return None
    text = doc.split("\n\n", 1)[1]
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    text = text.replace("``", "").replace("**", "")
    return text


def add_problem_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``FILE`` (our problem JSON or a node-link remat graph) and
    ``--bandwidth`` (bytes per second, or per cost unit for remat graphs)."""
    p.add_argument("file", metavar="FILE", help="problem JSON (libra-opt schema) or node-link remat graph")
    p.add_argument("--bandwidth", metavar="BYTES_PER_S", type=float,
                   help="for remat graphs only: host<->device bandwidth each way (bytes per cost unit)")
    p.add_argument("--executor", choices=["eager", "inductor"],
                   help="price recomputes as this executor runs them (libra_opt.costs.for_executor; default: as "
                        "the file says, eager for files without the field)")
    p.add_argument("--memory-bandwidth", metavar="BYTES_PER_S", type=positive_float,
                   help="device-memory bandwidth (read + written, bytes per second) for --executor inductor on "
                        "problems profiled before it was measured")


def add_libra_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``libra`` solver's ``--policy``, ``--exchange-effort`` and
    ``--added-gap-tol`` (``LibraOptions.policy`` / ``exchange_effort`` /
    ``added_gap_tol``; :func:`~libra_opt.cli.solve.solver_options` refuses
    them for another solver)."""
    p.add_argument("--policy", choices=["hybrid", "recompute", "swap"],
                   help="libra only: recompute + swap (default), recompute only, swap only")
    p.add_argument("--exchange-effort", choices=["default", "thorough"],
                   help="libra only: how hard its exchange moves search (thorough: more decisions given back and "
                        "more evaluations; a slower solve, sometimes a cheaper plan)")
    p.add_argument("--added-gap-tol", metavar="TOL", type=nonnegative_float,
                   help="libra only: no exchange moves where a plan already adds at most 1 + TOL times the least "
                        "added time the cut bound allows (default 0.025; 0: they always run)")


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
    from libra_opt.frontend.importers import load_problem_any

    try:
        problem = load_problem_any(args.file, bandwidth_bytes_per_s=args.bandwidth)
    except OSError as e:
        report_unreadable(command, e)
        return None
    executor = getattr(args, "executor", None)
    if executor is not None or getattr(args, "memory_bandwidth", None) is not None:
        from libra_opt.passes.costs import for_executor

        problem = for_executor(problem, executor or problem.executor, memory_bytes_per_s=args.memory_bandwidth)
    return problem


def check_outputs(*paths: str | None) -> None:
    """Check every given output path (``None`` skipped) with
    :func:`libra_opt.atomic.check_writable` before a command does its work;
    raises :class:`~libra_opt.errors.OutputPathError` (exit status 2)."""
    from libra_opt.atomic import check_writable

    for p in paths:
        if p is not None:
            check_writable(p)


# ------------------------------------------------------------ argument types
# argparse calls these on the text; ArgumentTypeError becomes a one-line usage
# error with exit status 2, before any file is read or any model profiled.
#: the --budget help of every command
BUDGET_HELP = ("graph-memory budget: 60%% or 0.6 (of the no-remat peak), 12GiB, 800MB or 1000000B; a bare "
               "number above 1 is rejected")


def budget_arg(text: str):
    """``--budget``: the budget contract (:mod:`libra_opt.units`); returns a
    float fraction for ``0.6`` / ``1``, else the string."""
    from libra_opt.ir.units import budget_from_text, check_budget

    value = budget_from_text(text)
    try:
        check_budget(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def budget_list_arg(text: str) -> list:
    """``--budgets 0.9,80%,12GiB``: comma-separated budgets, each as
    :func:`budget_arg` reads it."""
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError(f"empty budget list {text!r}; write e.g. 0.9,0.8,0.7")
    if not all(items):
        raise argparse.ArgumentTypeError(f"empty budget in {text!r}; write e.g. 0.9,0.8,0.7")
    return [budget_arg(t) for t in items]


def _finite(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return v


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, a learning rate)."""
    v = _finite(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return v


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (a tolerance)."""
    v = _finite(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return v


def positive_int(text: str) -> int:
    """An integer >= 1 (a batch size, a sequence length, a step count)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def solver_names_help() -> str:
    """The registered solver names, for ``--help`` (from the registry:
    built-ins, then registered and plug-in solvers)."""
    from libra_opt.solvers import available_solvers

    return ", ".join(available_solvers())
