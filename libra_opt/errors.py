"""One error hierarchy for libra-opt, rooted in :class:`LibraOptError`.

Every message says what to change.  Catch :class:`LibraOptError` to catch
anything the library raises on purpose.
"""
from __future__ import annotations


class LibraOptError(Exception):
    """Root of every error libra-opt raises on purpose."""


class ProblemError(LibraOptError, ValueError):
    """A :class:`~libra_opt.problem.RematProblem` breaks an invariant
    (order, producers before consumers, storage accounting)."""


class ProblemFileError(ProblemError):
    """A problem JSON file is corrupt, has the wrong schema version, or a bad
    field.  ``field`` names the offending field (dotted path)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message if field is None else f"{message} (field: {field})")
        self.field = field


class ScheduleError(LibraOptError, ValueError):
    """The simulator rejected a :class:`~libra_opt.schedule.Schedule`.

    ``index`` is the position of the failing instruction (``None`` for an
    end-of-schedule check) and ``instruction`` its text.
    """

    def __init__(self, message: str, index: int | None = None, instruction: str | None = None):
        where = "" if index is None else f"instruction {index} ({instruction}): "
        super().__init__(where + message)
        self.index = index
        self.instruction = instruction


class BudgetError(LibraOptError, ValueError):
    """A memory budget or byte size that does not follow the budget contract
    (DESIGN.md, "The budget contract"): a bare number string, a float above 1,
    zero, a negative, NaN, infinity or an unknown unit.  The message says what
    was meant to be written (e.g. "did you mean 80% or 80MiB?")."""


class BudgetExceededError(ScheduleError):
    """A schedule's simulated peak is over the memory budget."""


class InfeasibleBudgetError(LibraOptError, ValueError):
    """No plan fits the budget.  ``min_feasible_bytes`` is the smallest budget
    the solver found a plan for (``None`` if it could not tell)."""

    def __init__(self, budget_bytes: int, min_feasible_bytes: int | None, solver: str,
                 detail: str = ""):
        from .ir.units import format_bytes

        msg = f"solver {solver!r}: no plan fits a budget of {format_bytes(budget_bytes)}"
        if min_feasible_bytes is not None:
            msg += (f"; the smallest feasible budget it found is {format_bytes(min_feasible_bytes)} "
                    f"({min_feasible_bytes} bytes): raise the budget to at least that")
        else:
            msg += "; raise the budget"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)
        self.budget_bytes = budget_bytes
        self.min_feasible_bytes = min_feasible_bytes
        self.solver = solver


class CalibrationError(InfeasibleBudgetError):
    """The closed loop (``optimize(calibrate=True)``, :mod:`libra_opt.calibrate`)
    found no plan whose measured reserved peak fits the budget.
    ``min_feasible_bytes`` is the smallest budget that would work (measured
    where a step ran, else estimated); ``records`` the iterations
    (:class:`~libra_opt.calibrate.CalibrationStep`)."""

    def __init__(self, budget_bytes: int, min_feasible_bytes: int | None, solver: str, detail: str,
                 records: list):
        super().__init__(budget_bytes, min_feasible_bytes, solver, detail)
        self.records = list(records)


class SolverError(LibraOptError):
    """A solver failed for a reason other than an infeasible budget."""


class SolverOptionError(SolverError, ValueError):
    """A solver option has a value the solver cannot use (an unknown backend,
    a non-positive time limit); the message names the option and the values
    it accepts.  Raised before any model is built."""


class SolverNotFoundError(SolverError, ValueError):
    """An unknown solver name; the message lists the known ones."""


class SolverUnavailableError(SolverError, ImportError):
    """A solver's optional backend is not installed; the message says what to
    install."""


class CaptureError(LibraOptError):
    """A model could not be captured as one joint forward+backward graph; the
    message names the graph break or the unsupported op."""


class ShapeMismatchError(LibraOptError, ValueError):
    """An optimized module was called with inputs whose shapes differ from the
    example inputs the plan was made for, and it makes no plan for new shapes
    (``optimize(..., max_shapes=1)``, or ``max_shapes`` plans made already);
    or a batch does not fit any bucket of :func:`libra_opt.pad_to_bucket`."""


class InputMismatchError(LibraOptError, TypeError):
    """An optimized module was called with other inputs than the example the
    plan was made for: a missing or extra argument, or another number of
    input tensors; the message says which."""


class RuntimeExecutionError(LibraOptError, RuntimeError):
    """The runtime could not execute a plan."""


class ExecutorError(LibraOptError, ValueError):
    """An unknown executor, or an executor option that cannot apply (e.g.
    ``cuda_graphs=True`` with swaps or without Inductor); the message says
    what to change."""


class IntegrationError(LibraOptError, ValueError):
    """A training framework's setting conflicts with the plan (e.g. Hugging
    Face ``gradient_checkpointing=True``, which the plan's recomputation
    replaces); the message names the setting and what to change
    (:mod:`libra_opt.integrations`)."""


class PlotError(LibraOptError, ValueError):
    """The data given to a plot function cannot be plotted; the message says why."""


class OutputPathError(LibraOptError, OSError):
    """A file cannot be written where asked (a missing or read-only directory,
    a full disk); the message names the file and what to change.  Nothing is
    left behind: the old file, if any, is unchanged (see
    :mod:`libra_opt.atomic`)."""


class MissingExtraError(LibraOptError, ImportError):
    """An optional dependency is not installed; the message names the
    ``pip install 'libra-opt[EXTRA]'`` command that installs it.
    ``extra`` is that extra's name."""

    def __init__(self, message: str, extra: str, name: str | None = None):
        super().__init__(message, name=name)
        self.extra = extra
