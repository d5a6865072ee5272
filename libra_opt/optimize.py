"""``optimize``: capture, profile, plan and wrap a model in one call.

    model + example inputs -> capture -> profile -> RematProblem -> solve -> OptimizedModule

The returned module is used exactly like the model (call it, compute a loss,
``loss.backward()``, ``optimizer.step()``); every training step executes the
plan (recompute and swap) found for the memory budget.  ``.plan`` holds the
:class:`~libra_opt.solvers.SolveResult` (schedule, predicted peak bytes,
predicted step time).

Source: the pipeline of ``DESIGN.md`` ("The shape").
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable

import torch
from torch import nn

from .capture import CapturedStep, build_problem, capture
from .problem import RematProblem

logger = logging.getLogger(__name__)

__all__ = ["optimize", "problem_of"]

#: compute time given to every op when the step is not profiled (seconds)
UNIT_TIME_S = 1e-6


def problem_of(step: CapturedStep, *, optimizer: str = "adam", profile: bool = True) -> RematProblem:
    """The problem of a captured step: profiled on its device with
    :func:`libra_opt.profiling.profile_step` when ``profile`` (and the
    profiling module is present), else with every op timed
    :data:`UNIT_TIME_S` seconds and no workspace.

    Raises
    ------
    ProfilingError
        An op fails while profiling.
    """
    if profile:
        try:
            from .profiling import device_profile, profile_step, profile_summary
        except ImportError:  # pragma: no cover - profiling is written in parallel
            logger.warning("libra_opt.profiling is not available; planning with unit op times")
        else:
            t0 = time.perf_counter()
            measured = profile_step(step, progress=False)
            logger.info("profiled %s in %.1f s", step.model_name, time.perf_counter() - t0)
            problem = build_problem(step, times=measured["times"], workspace=measured["workspace"],
                                    device=device_profile(step.device), optimizer=optimizer)
            prov = problem.provenance  # the calibration and spread of the profile (profiling.profile_step)
            return problem.replace(provenance=dataclasses.replace(
                prov, extra={**prov.extra, "profile": profile_summary(measured)}))
    times = {n.name: UNIT_TIME_S for n in step.joint.graph.nodes if n.op == "call_function"}
    return build_problem(step, times=times, optimizer=optimizer)


def optimize(model: nn.Module, example_inputs: Any, budget, solver="libra", example_kwargs: dict | None = None,
             autocast_dtype: torch.dtype | None = None, loss_fn: Callable | None = None, *,
             optimizer: str = "adam", profile: bool = True, executor: str | None = None,
             cuda_graphs: bool = False, **solver_options):
    """Make ``model`` train within a memory budget.

    Parameters
    ----------
    model : torch.nn.Module
        In training mode, on its device.
    example_inputs : tensor or tuple
        Positional example inputs (a single tensor is one argument); the plan
        is valid for these shapes only.
    budget : int, float or str
        Graph-memory budget: bytes, ``"12GiB"``, ``"60%"`` or a float fraction
        of the no-remat peak (see :func:`libra_opt.units.parse_budget`).
    solver : str or Solver
        ``"libra"`` (default), ``"checkmate-milp"``, ``"checkmate-lp"``,
        ``"none"``, ``"checkpoint-all"``, ``"chen-sqrt"``, ``"chen-greedy"``,
        ``"swap-all"``, or any registered solver.
    example_kwargs : dict, optional
        Keyword example inputs.
    autocast_dtype : torch.dtype, optional
        Capture and run under ``torch.autocast`` with this dtype.
    loss_fn : callable, optional
        ``loss_fn(output) -> scalar``: plan model plus loss; the module then
        returns the loss.
    optimizer : {"adam", "adamw", "sgd", "none"}
        Optimizer whose state is counted in the fixed memory.
    profile : bool
        Measure op times on the device (default); ``False`` plans with unit
        op times (fast; for tests).
    executor : {"inductor", "eager"} or None
        How the planned forward and backward graphs run: ``"inductor"``
        compiles them with Inductor (fused kernels, swaps as side-effecting
        ``libra::`` operators; gradients as close to eager as
        ``torch.compile``'s); ``"eager"`` runs them op by op (gradients
        bitwise equal to eager PyTorch on CPU).  ``None`` (default):
        ``"inductor"`` when the model is on CUDA, ``"eager"`` otherwise.  See
        :mod:`libra_opt.runtime.inductor`.
    cuda_graphs : bool
        Replay the compiled graphs as CUDA graphs (Inductor's CUDA graph
        trees); needs CUDA, ``executor="inductor"`` and a plan without swaps.
    **solver_options
        Passed to the solver (its ``Options`` dataclass).

    Returns
    -------
    OptimizedModule
        Called like ``model``; ``.plan`` is the :class:`~libra_opt.solvers.SolveResult`.

    Raises
    ------
    BudgetError
        ``budget`` breaks the budget contract (checked before anything is
        captured or profiled; a ``LibraOptError`` and a ``ValueError``).
    CaptureError
        The model does not capture as one graph (the message names the break).
    InfeasibleBudgetError
        No plan fits the budget (the message gives the smallest feasible one found).
    SolverNotFoundError, SolverUnavailableError
    ExecutorError
        Unknown ``executor`` (raised before anything is captured), or
        ``cuda_graphs=True`` without CUDA, without the Inductor executor, or
        with a plan that swaps.

    Notes
    -----
    The plan is made for the example inputs' shapes: calling the module with
    other shapes raises :class:`~libra_opt.errors.ShapeMismatchError`
    (TorchDynamo recompiles for the new shapes and the runtime's backend
    refuses them); optimize again for each shape you train with.  Under
    ``torch.no_grad()`` and in eval mode the module runs the model without a
    plan, at any shape.  A model whose forward reads a tensor's data into
    Python (``.item()``) or makes data-dependent shapes (``torch.nonzero``)
    raises :class:`~libra_opt.errors.CaptureError` here, naming the op.
    ``backward(retain_graph=True)`` is not supported.
    """
    from .runtime.inductor import check_cuda_graphs, resolve_executor
    from .runtime.module import OptimizedModule
    from .solvers import solve
    from .units import check_budget

    check_budget(budget)  # the budget contract, before any capture or profiling
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    executor = resolve_executor(executor, device)
    check_cuda_graphs(cuda_graphs, executor, device, swaps=0)
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    t0 = time.perf_counter()
    step = capture(model, args, example_kwargs, autocast_dtype=autocast_dtype, loss_fn=loss_fn)
    problem = problem_of(step, optimizer=optimizer, profile=profile)
    if executor != "eager" and problem.device.memory_bytes_per_s:
        from .costs import for_executor

        problem = for_executor(problem, executor)  # recomputes priced as the executor runs them (fused)
    result = solve(problem, budget, solver, **solver_options)
    logger.info("optimize(%s): solver %s, predicted peak %d bytes (budget %d) in %.1f s", step.model_name,
                result.solver, result.peak_bytes, result.budget_bytes, time.perf_counter() - t0)
    return OptimizedModule(model, problem, result, example_shapes=step.example_shapes,
                           autocast_dtype=autocast_dtype, loss_fn=loss_fn, device=step.device,
                           executor=executor, cuda_graphs=cuda_graphs)
