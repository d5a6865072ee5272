"""The closed loop: plan, run one step, measure what the device held, re-plan.

A plan's simulated peak counts tensor bytes; the device holds more: the
caching allocator rounds requests up, keeps freed blocks cached and carves
blocks from fixed-size segments, so ``max_memory_reserved`` can exceed the
planned peak by 10-25 % (``gpu-measurements/README.md``).  The budget contract
(``DESIGN.md``) asks that, during a planned step, the reserved peak stays
within the memory allocated before the step plus the budget.

:func:`calibrate` makes that hold by measurement: plan for ``budget - margin``
(iteration 0), run one step (after releasing the allocator's cache), measure
the reserved peak above what was allocated before the step; if it exceeds the
budget, take the overshoot off the solver budget (off the plan's peak when
that is lower) and plan again; at most
``max_iterations`` times.  Every iteration is a :class:`CalibrationStep`
(logged, and kept on the optimized module as ``.calibration``).  When no plan
fits, :class:`CalibrationError` (an
:class:`~libra_opt.errors.InfeasibleBudgetError`) gives the smallest budget
that would work.

Sources: the budget contract of ``DESIGN.md``; ``torch.cuda.max_memory_reserved``
and ``reset_peak_memory_stats`` (through :mod:`libra_opt.runtime.memory`);
measuring the step and correcting the plan is the feedback idea of Capuchin
(Peng et al., ASPLOS 2020, sec. 4: a measured pass guides the policy).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..errors import CalibrationError, InfeasibleBudgetError
from ..ir.units import format_bytes

logger = logging.getLogger(__name__)

__all__ = ["CalibrationStep", "CalibrationError", "StepMemory", "measure_step", "calibrate",
           "DEFAULT_MAX_ITERATIONS", "default_margin", "preserved_state"]

#: re-plans at most this many times (the first plan included)
DEFAULT_MAX_ITERATIONS = 3
#: allocator margin on CUDA when none is given: this fraction of the budget
CUDA_MARGIN_FRACTION = 0.05
#: a measured step that ran out of memory counts as over the budget by at least this fraction of it
OOM_STEP = 0.05


def default_margin(budget_bytes: int, device: torch.device | str) -> int:
    """The allocator margin a plan leaves under the budget by default (bytes):
    :data:`CUDA_MARGIN_FRACTION` of it on CUDA (the caching allocator's
    rounding and caching; the closed loop measures the real overhead), 0
    elsewhere (a CPU step allocates exactly its storages)."""
    return int(CUDA_MARGIN_FRACTION * budget_bytes) if torch.device(device).type == "cuda" else 0


@dataclass(frozen=True)
class StepMemory:
    """What one measured step held (bytes).

    Attributes
    ----------
    before_bytes : int
        Allocated before the step (parameters, inputs, optimizer state, ...).
    allocated_bytes : int
        Peak allocated during the step, above ``before_bytes``.
    reserved_bytes : int
        Peak reserved during the step, above ``before_bytes``: the quantity
        the budget bounds.
    """

    before_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    out_of_memory: bool = False


def measure_step(run: Callable[[], Any], memory, *, module: Any = None, steps: int = 1) -> StepMemory:
    """Run ``run()`` ``steps`` times after releasing the allocator's cache and
    measure the peaks above what was allocated before.

    Parameters
    ----------
    run : callable
        One training step (forward and backward at least).
    memory : DeviceMemory
        From :func:`libra_opt.runtime.memory.memory_for` (or a fake allocator).
    module : OptimizedModule, optional
        Where a CPU tracker is installed (see ``DeviceMemory.tracking``).
    steps : int
        Steps measured (>= 1); the peak over all of them (the second step
        starts with the cache the first left).

    Returns
    -------
    StepMemory
        ``out_of_memory`` when the step ran out of memory (a cap, or a full
        device): the peaks are then those reached before it failed, and the
        failed step's memory has been released.
    """
    from ..runtime.memory import is_out_of_memory

    memory.synchronize()
    memory.empty_cache()
    before = memory.allocated()
    memory.reset_peak()
    oom = False
    try:
        with memory.tracking(module):
            for _ in range(max(1, int(steps))):
                run()
    except Exception as e:  # noqa: BLE001 - re-raised unless it is an out-of-memory error
        if not is_out_of_memory(e):
            raise
        oom = True
    out = StepMemory(before, memory.peak_allocated() - before, memory.peak_reserved() - before, oom)
    if oom:                              # outside the except block: the failed step's frames are gone
        memory.empty_cache()
    else:
        memory.synchronize()
    return out


@dataclass(frozen=True)
class CalibrationStep:
    """One iteration of the closed loop (bytes).

    Attributes
    ----------
    iteration : int
        0 for the first plan.
    solver_budget_bytes : int
        The budget the solver planned to.
    planned_peak_bytes : int
        The plan's simulated peak.
    measured_allocated_bytes : int
        Peak allocated during the measured step, above what was allocated before it.
    measured_reserved_bytes : int
        Peak reserved during the step, above what was allocated before it.
    overshoot_bytes : int
        ``measured_reserved_bytes - budget`` (the user's budget): > 0 is over.
        After an out-of-memory error, at least :data:`OOM_STEP` of the budget.
    out_of_memory : bool
        The measured step ran out of memory (the device could not hold it).
    """

    iteration: int
    solver_budget_bytes: int
    planned_peak_bytes: int
    measured_allocated_bytes: int
    measured_reserved_bytes: int
    overshoot_bytes: int
    out_of_memory: bool = False

    @property
    def fits(self) -> bool:
        """True if the measured reserved peak is within the budget."""
        return self.overshoot_bytes <= 0

    def __str__(self) -> str:
        return (f"iteration {self.iteration}: solver budget {format_bytes(self.solver_budget_bytes)}, planned "
                f"peak {format_bytes(self.planned_peak_bytes)}, measured allocated "
                f"{format_bytes(self.measured_allocated_bytes)}, reserved {format_bytes(self.measured_reserved_bytes)}"
                f"{' (out of memory)' if self.out_of_memory else ''}"
                f", {'fits' if self.fits else 'over by ' + format_bytes(self.overshoot_bytes)}")


def calibrate(plan: Callable[[int], Any], run: Callable[[Any], Any], budget_bytes: int, memory, *,
              margin_bytes: int = 0, max_iterations: int = DEFAULT_MAX_ITERATIONS, steps: int = 1,
              solver: str = "?") -> tuple[Any, list[CalibrationStep]]:
    """Plan, measure one step, re-plan with the overshoot removed.

    Parameters
    ----------
    plan : callable
        ``plan(solver_budget_bytes) -> module`` with ``module.plan.peak_bytes``
        (an :class:`~libra_opt.runtime.module.OptimizedModule`); raises
        :class:`~libra_opt.errors.InfeasibleBudgetError` when no plan fits.
    run : callable
        ``run(module)``: one training step with it.
    budget_bytes : int
        The budget the measured reserved peak must meet (bytes, > 0).
    memory : DeviceMemory
    margin_bytes : int
        Left under the budget by the first plan (allocator margin, >= 0).
    max_iterations : int
        Plans made at most (>= 1).
    steps : int
        Steps measured per plan (:func:`measure_step`).
    solver : str
        For messages.

    Returns
    -------
    (module, records)
        The first module whose measured reserved peak fits, and one
        :class:`CalibrationStep` per iteration.

    Raises
    ------
    CalibrationError
        No plan fitted within ``max_iterations``, or the solver found none
        for a reduced budget; the message gives every iteration and the
        smallest budget that would work.
    ValueError
        A bad ``budget_bytes``, ``margin_bytes`` or ``max_iterations``.
    """
    budget_bytes, margin_bytes, max_iterations = int(budget_bytes), int(margin_bytes), int(max_iterations)
    if budget_bytes <= 0 or margin_bytes < 0 or max_iterations < 1:
        raise ValueError(f"need budget > 0, margin >= 0, max_iterations >= 1; got {budget_bytes}, {margin_bytes}, "
                         f"{max_iterations}")
    records: list[CalibrationStep] = []
    solver_budget = budget_bytes - margin_bytes
    for i in range(max_iterations):
        if solver_budget <= 0:
            break
        try:
            module = plan(solver_budget)
        except InfeasibleBudgetError as e:
            raise _no_plan(budget_bytes, solver_budget, e, records, solver) from None
        m = measure_step(lambda: run(module), memory, module=module, steps=steps)
        over = m.reserved_bytes - budget_bytes
        if m.out_of_memory:              # the step needed more than the device gave: over by an unknown amount
            over = max(over, int(OOM_STEP * budget_bytes), 1)
        solver_budget = int(module.plan.budget_bytes)   # what the plan was made for (``plan`` may widen it)
        rec = CalibrationStep(i, solver_budget, int(module.plan.peak_bytes), m.allocated_bytes, m.reserved_bytes,
                              over, m.out_of_memory)
        records.append(rec)
        logger.info("calibration %s (budget %s)", rec, format_bytes(budget_bytes))
        if rec.fits:
            return module, records
        del module
        # the overshoot comes off what the plan used (it may sit under its solver budget)
        solver_budget = min(solver_budget, rec.planned_peak_bytes) - rec.overshoot_bytes
    held = [r.measured_reserved_bytes for r in records if not r.out_of_memory]
    raise CalibrationError(budget_bytes, min(held) if held else None, solver, _history(records) + (
        "; a budget of the smallest measured reserved peak would have held that plan" if held else
        "; every measured step ran out of memory: free device memory or lower the budget"), records)


def _history(records: list[CalibrationStep]) -> str:
    return "calibration: " + ("; ".join(str(r) for r in records) if records else "no step measured")


def _no_plan(budget_bytes: int, solver_budget: int, e: InfeasibleBudgetError, records: list[CalibrationStep],
             solver: str) -> CalibrationError:
    """The solver found no plan for ``solver_budget``: the smallest budget that
    would work is estimated as the solver's smallest feasible budget plus the
    allocator overhead measured so far (reserved above planned), and above
    the budget if a step ran out of memory within it."""
    overhead = max((r.measured_reserved_bytes - r.planned_peak_bytes for r in records if not r.out_of_memory),
                   default=0)
    need = None if e.min_feasible_bytes is None else int(e.min_feasible_bytes) + max(0, overhead)
    ran_out = [r for r in records if r.out_of_memory]
    if need is not None and ran_out:     # a step ran out of memory within the budget: more than it is needed
        need = max(need, budget_bytes + max(r.overshoot_bytes for r in ran_out))
    detail = (f"no plan within the solver budget {format_bytes(solver_budget)}; " + _history(records)
              + (f"; estimated need: the solver's smallest feasible budget {format_bytes(e.min_feasible_bytes)} plus "
                 f"the measured allocator overhead {format_bytes(max(0, overhead))}" if need is not None else ""))
    return CalibrationError(budget_bytes, need, e.solver or solver, detail, records)


class preserved_state:
    """Context: the model's gradients, buffers and the RNG states as they
    were on entry are restored on exit, so a measuring step leaves the user's
    training state untouched.  Gradients are set to ``None`` inside (the step
    allocates fresh ones, as a step after ``zero_grad(set_to_none=True)``
    does).  The buffers' saved values are kept in host memory, so a measured
    step inside the context does not count them as device memory.

    Sources: ``torch.get_rng_state`` / ``torch.cuda.get_rng_state_all``.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __enter__(self):
        self.grads = [(p, p.grad) for p in self.model.parameters()]
        for p, _ in self.grads:
            p.grad = None
        self.buffers = [(b, b.detach().to("cpu", copy=True)) for b in self.model.buffers()]
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and \
            torch.cuda.is_initialized() else None
        return self

    def __exit__(self, *exc):
        with torch.no_grad():
            for b, saved in self.buffers:
                b.copy_(saved)
        for p, g in self.grads:
            p.grad = g
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        self.grads = self.buffers = None
        return False
