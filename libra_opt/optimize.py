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

import logging
import sys
import time
from contextlib import nullcontext
from typing import Any, Callable

import torch
from torch import nn

from . import CallableModule
from .frontend.capture import CapturedStep, capture
from .plan_cache import DEFAULT_MAX_SHAPES
from .ir.problem import RematProblem
from .frontend.profiling import UNIT_TIME_S, problem_of  # noqa: F401  (public here too: the one model-to-problem pipeline)
from .runtime.memory import configure_allocator

logger = logging.getLogger(__name__)

__all__ = ["optimize", "problem_of"]

#: steps measured per plan by ``calibrate``: the second starts from the cache the first left (the steady
#: state, where the caching allocator hands out larger cached blocks than asked for)
CALIBRATION_STEPS = 2


def optimize(model: nn.Module, example_inputs: Any, budget, solver="libra", example_kwargs: dict | None = None,
             autocast_dtype: torch.dtype | None = None, loss_fn: Callable | None = None, *,
             optimizer: str = "adam", profile: bool = True, executor: str | None = None,
             cuda_graphs: bool = False, calibrate: bool = False, allocator_margin: int | float | None = None,
             max_calibrations: int = 3, problem_builder: Callable[[CapturedStep], RematProblem] | None = None,
             max_shapes: int | None = DEFAULT_MAX_SHAPES, cache_dir=None, ddp_bucket_cap_mb: float | None = None,
             **solver_options):
    """Make ``model`` train within a memory budget.

    Parameters
    ----------
    model : torch.nn.Module
        In training mode, on its device.
    example_inputs : tensor or tuple
        Positional example inputs (a single tensor is one argument); the
        first plan is made for their shapes (other shapes: see Notes).
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
        Capture and run every call under ``torch.autocast`` with this dtype.
        Not given: the autocast active around each call is used (an
        enclosing ``with torch.autocast(device_type, dtype=...)`` around
        ``optimize`` and around the calls, as Hugging Face ``Trainer`` and
        Lightning's ``precision="bf16-mixed"`` do; ``torch.is_autocast_enabled`` /
        ``torch.get_autocast_dtype``); its dtype is part of the plan key.
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
    calibrate : bool
        Close the loop (:func:`libra_opt.calibrate.calibrate`): run the
        planned step (forward and backward on the example inputs, twice:
        :data:`CALIBRATION_STEPS`; the model's gradients, buffers and RNG
        state are restored afterwards), measure the reserved peak above what
        was allocated before it
        (``torch.cuda.max_memory_reserved`` on CUDA; the storage tracker on a
        CPU) and, while it exceeds the budget, re-plan with the overshoot taken
        off the solver budget (at most ``max_calibrations`` plans).  Each
        iteration is logged and kept in ``.calibration``.
    allocator_margin : int or float, optional
        Left out of the budget the solver plans to, for the allocator's
        rounding and caching: bytes (int) or a fraction of the budget (float
        < 1).  Default: 5 % of the budget on CUDA, 0 on a CPU
        (:func:`libra_opt.calibrate.default_margin`).  When no plan leaves the
        margin (e.g. solver ``"none"`` at ``1.0``), the first plan is made for
        the whole budget (a warning is logged).
    max_calibrations : int
        Plans made at most with ``calibrate`` (>= 1).
    problem_builder : callable, optional
        ``problem_builder(captured_step) -> RematProblem``: how the captured
        step becomes a problem (default :func:`problem_of`, which profiles the
        unplanned step).  ``max-batch`` passes one that reuses op times
        profiled at smaller batches, so the unplanned step never runs at a
        batch that may not fit.
    max_shapes : int or None
        Plans the module makes at most, the example's included (default
        :data:`~libra_opt.plan_cache.DEFAULT_MAX_SHAPES`); ``1``: new shapes
        are not planned (they raise ``ShapeMismatchError``); ``None``: no limit.
    cache_dir : str, PathLike, None or False
        Directory of saved profiles and plans (:mod:`libra_opt.plan_store`): a
        restart with the same model, shapes, dtype, device and versions loads
        the profile instead of profiling, and the plan instead of solving.
        ``None`` (default): the environment variable ``LIBRA_OPT_CACHE_DIR``
        if set, else off; ``False``: off.
    ddp_bucket_cap_mb : float, optional
        For a module you then wrap in ``DistributedDataParallel(om,
        bucket_cap_mb=...)``: split the step into pieces at DDP's gradient
        buckets of this many MiB (pass DDP's ``bucket_cap_mb``, default 25),
        as ``torch.compile``'s DDPOptimizer does, one plan per piece under the
        one budget, so each bucket's all-reduce starts while the backward of
        the earlier pieces runs (:mod:`libra_opt.runtime.split`).  The result
        is a :class:`~libra_opt.runtime.split.SplitOptimizedModule`: ``.plan``
        is a :class:`~libra_opt.runtime.split.SplitPlan`, ``.plans`` the
        per-piece plans.  Not with ``calibrate`` nor a ``cache_dir``, and only
        for the example's shapes (another shape raises ``ShapeMismatchError``).
    **solver_options
        Passed to the solver (its ``Options`` dataclass).

    Returns
    -------
    OptimizedModule
        Called like ``model``; ``.plan`` is the :class:`~libra_opt.solvers.SolveResult`
        (``plan.budget_bytes`` is the solver budget: the budget less the
        margin and any calibration); ``.budget_bytes`` the budget asked for;
        ``.calibration`` the list of
        :class:`~libra_opt.calibrate.CalibrationStep` (empty without ``calibrate``);
        ``.shape_plans`` the plans of other shapes, made so far.

    Raises
    ------
    BudgetError
        ``budget`` breaks the budget contract (checked before anything is
        captured or profiled; a ``LibraOptError`` and a ``ValueError``).
    CaptureError
        The model does not capture as one graph (the message names the break).
    InfeasibleBudgetError
        No plan fits the budget (the message gives the smallest feasible one found);
        with ``calibrate``, :class:`~libra_opt.errors.CalibrationError` when no
        measured step fits (the message lists each iteration and the smallest
        budget that would work).
    SolverNotFoundError, SolverUnavailableError
    LibraOptError
        ``model`` is a ``DistributedDataParallel`` (wrap the optimized module
        instead) or sharded with FSDP2's ``fully_shard`` (optimize its units
        before sharding: :func:`libra_opt.runtime.split.optimize_units`); a bad
        ``ddp_bucket_cap_mb``, or ``ddp_bucket_cap_mb`` with ``calibrate``.
    ExecutorError
        Unknown ``executor`` (raised before anything is captured), or
        ``cuda_graphs=True`` without CUDA, without the Inductor executor, or
        with a plan that swaps.
    OutputPathError
        ``cache_dir`` cannot be created.

    Notes
    -----
    Shapes: the first plan is made for the example inputs' shapes.  A
    training call with other shapes (a dataloader's short last batch, another
    sequence length) or under another enclosing autocast gets a plan of its
    own on first use (:mod:`libra_opt.plan_cache`): the step is captured at
    the new shape (nothing runs), its op times are scaled from the profile
    made here (the unplanned step is never run at the new shape), and it is
    solved within the same bytes as the example's plan (a fraction budget is
    resolved once, against the example's no-remat peak, into
    ``.budget_bytes``; the solver budget is the example plan's
    ``plan.budget_bytes``); the solve time is logged (``logging.INFO``).
    No plan for a new shape raises
    :class:`~libra_opt.errors.InfeasibleBudgetError` naming the shape and the
    smallest feasible budget.  ``calibrate`` measures the example's shape
    only.  Each shape compiles a step of its own, so TorchDynamo's
    ``recompile_limit`` is never reached; ``max_shapes`` bounds the plans,
    and :func:`libra_opt.plan_cache.pad_to_bucket` pads inputs to a few
    lengths.  A new shape raises :class:`~libra_opt.errors.ShapeMismatchError`
    with ``max_shapes=1`` or past ``max_shapes``.  Under
    ``torch.no_grad()`` and in eval mode the module runs the model without a
    plan, at any shape.  A model whose forward reads a tensor's data into
    Python (``.item()``) or makes data-dependent shapes (``torch.nonzero``)
    raises :class:`~libra_opt.errors.CaptureError` here, naming the op.
    ``backward(retain_graph=True)`` is not supported.

    On CUDA the allocator's expandable segments are turned on unless the user
    configured the allocator (``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF``)
    or set ``LIBRA_OPT_EXPANDABLE_SEGMENTS=0``
    (:func:`~libra_opt.runtime.memory.configure_allocator`).
    """
    from .errors import InfeasibleBudgetError, LibraOptError
    from .runtime.inductor import check_cuda_graphs, resolve_executor
    from .runtime.module import OptimizedModule
    from .passes.simulator import no_remat_peak
    from .solvers import solve
    from .ir.units import check_budget, parse_budget

    # the budget contract, the executor and the margin: checked before anything is captured or profiled
    check_budget(budget)
    _check_margin(allocator_margin)
    if max_shapes is not None and (not isinstance(max_shapes, int) or max_shapes < 1):
        from .errors import LibraOptError

        raise LibraOptError(f"max_shapes is the number of plans kept (an int >= 1) or None, got {max_shapes!r}")
    _check_not_wrapped(model)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    executor = resolve_executor(executor, device)
    check_cuda_graphs(cuda_graphs, executor, device, swaps=0)
    # ---- shapes, enclosing autocast and saved plans (libra_opt.plan_cache, libra_opt.plan_store)
    from .plan_cache import ShapePlanner, ambient_autocast, call_key
    from .plan_store import PlanStore

    follow_autocast = autocast_dtype is None
    if follow_autocast:
        autocast_dtype = ambient_autocast(device)
    store = PlanStore.open(cache_dir)
    solve = store.solve if store is not None else solve    # a bound method: the module still pickles
    # ---- end
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if ddp_bucket_cap_mb is not None:
        from .runtime.split import bucket_bytes, optimize_split

        bucket_bytes(ddp_bucket_cap_mb)
        if calibrate:
            raise LibraOptError("calibrate=True is not available with ddp_bucket_cap_mb (one plan per DDP piece); "
                                "leave one of them out")
        if store is not None:
            logger.warning("optimize(ddp_bucket_cap_mb=%g): the pieces' profiles and plans are not saved in the "
                           "cache directory %s (one plan per DDP piece); they are made again", ddp_bucket_cap_mb,
                           store.root)
        return optimize_split(model, args, example_kwargs, budget, solver, bucket_cap_mb=ddp_bucket_cap_mb,
                              autocast_dtype=autocast_dtype, loss_fn=loss_fn,
                              problem_builder=problem_builder or (lambda s: problem_of(s, optimizer=optimizer,
                                                                                       profile=profile)),
                              executor=executor, cuda_graphs=cuda_graphs,
                              margin_of=lambda b, dev: _margin_bytes(allocator_margin, b, dev),
                              solver_options=solver_options)
    t0 = time.perf_counter()
    # an enclosing autocast is applied by the captured graph itself (forward and loss only, capture.step_function)
    ambient = torch.autocast(device.type, enabled=False) if follow_autocast and autocast_dtype else nullcontext()
    with ambient:
        step = capture(model, args, example_kwargs, autocast_dtype=autocast_dtype, loss_fn=loss_fn)
        if step.device.type == "cuda":
            configure_allocator()
        problem = _problem(step, store, problem_builder, optimizer=optimizer, profile=profile)
    reference = problem
    if executor != "eager" and problem.device.memory_bytes_per_s:
        from .passes.costs import for_executor

        problem = for_executor(problem, executor)  # recomputes priced as the executor runs them (fused)
    budget_bytes = parse_budget(budget, no_remat_peak(problem))
    margin = _margin_bytes(allocator_margin, budget_bytes, step.device)

    first = [margin > 0]

    def plan(solver_budget) -> OptimizedModule:
        try:
            result = solve(problem, solver_budget, solver, **solver_options)
        except InfeasibleBudgetError:
            if not first[0]:
                raise
            # no plan leaves the margin (e.g. solver "none" at 100%): plan to the whole budget instead
            logger.warning("optimize(%s): no plan within the budget less the allocator margin (%d bytes); "
                           "planning to the whole budget", step.model_name, margin)
            result = solve(problem, budget, solver, **solver_options)
        finally:
            first[0] = False
        logger.info("optimize(%s): solver %s, predicted peak %d bytes (solver budget %d of %d) in %.1f s",
                    step.model_name, result.solver, result.peak_bytes, result.budget_bytes, budget_bytes,
                    time.perf_counter() - t0)
        planner = None if max_shapes == 1 else ShapePlanner(
            reference, budget_bytes, int(result.budget_bytes), solver, dict(solver_options), executor, loss_fn,
            max_shapes, solve_fn=solve)
        return OptimizedModule(model, problem, result, example_shapes=step.example_shapes,
                               autocast_dtype=autocast_dtype, loss_fn=loss_fn, device=step.device,
                               executor=executor, cuda_graphs=cuda_graphs,
                               example_key=call_key(args, example_kwargs, autocast_dtype), planner=planner,
                               follow_autocast=follow_autocast)

    records = []
    if calibrate:
        from .frontend.calibrate import calibrate as close_loop
        from .runtime.memory import memory_for

        om, records = close_loop(plan, lambda m: _measured_step(m, args, example_kwargs or {}), budget_bytes,
                                 memory_for(step.device), margin_bytes=margin, max_iterations=max_calibrations,
                                 steps=CALIBRATION_STEPS,
                                 solver=solver if isinstance(solver, str) else getattr(solver, "name", "?"))
    else:
        om = plan(budget if margin == 0 else budget_bytes - margin)
    om.budget_bytes = budget_bytes
    om.calibration = records
    return om


def _problem(step: CapturedStep, store, problem_builder, *, optimizer: str, profile: bool) -> RematProblem:
    """The problem of ``step``: from ``problem_builder`` if given, else the
    profile saved in ``store`` (a :class:`~libra_opt.plan_store.PlanStore`)
    under :func:`~libra_opt.plan_store.profile_key`, else :func:`problem_of`
    (then saved in ``store``)."""
    if problem_builder is not None:
        return problem_builder(step)
    if store is None or not profile:
        return problem_of(step, optimizer=optimizer, profile=profile)
    from .plan_store import profile_key

    key = profile_key(step, optimizer=optimizer)
    problem = store.load_problem(key)
    if problem is None:
        problem = problem_of(step, optimizer=optimizer, profile=profile)
        store.save_problem(key, problem)
    return problem


def _check_not_wrapped(model: nn.Module) -> None:
    """Raise :class:`~libra_opt.errors.LibraOptError` for a model wrapped in
    ``DistributedDataParallel`` (wrap the optimized module instead: the plan
    is made for the model, DDP wraps what trains) or sharded by FSDP2's
    ``fully_shard`` (see :func:`libra_opt.runtime.split.check_not_sharded`)."""
    from .errors import LibraOptError
    from .runtime.split import check_not_sharded

    if torch.distributed.is_available():
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            cap = model.bucket_bytes_cap / 2 ** 20
            raise LibraOptError(
                f"optimize() got a DistributedDataParallel module: wrap the other way, "
                f"DistributedDataParallel(libra_opt.optimize(model, ..., ddp_bucket_cap_mb={cap:g}), "
                f"bucket_cap_mb={cap:g}) with the unwrapped model (ddp.module), so that DDP all-reduces the "
                f"gradients of the planned step")
    check_not_sharded(model)


def _check_margin(margin) -> None:
    """Raise :class:`LibraOptError` for a negative margin or a fraction outside [0, 1)."""
    from .errors import LibraOptError

    if margin is not None and (margin < 0 or (isinstance(margin, float) and margin >= 1)):
        raise LibraOptError(f"allocator_margin is bytes (int >= 0) or a fraction of the budget in [0, 1), "
                            f"got {margin}")


def _margin_bytes(margin, budget_bytes: int, device) -> int:
    """The allocator margin in bytes (see ``optimize(allocator_margin=)``)."""
    from .frontend.calibrate import default_margin
    from .errors import LibraOptError

    if margin is None:
        return default_margin(budget_bytes, device)
    _check_margin(margin)
    out = int(margin * budget_bytes) if isinstance(margin, float) else int(margin)
    if not 0 <= out < budget_bytes:
        raise LibraOptError(f"allocator_margin must be >= 0 and below the budget ({budget_bytes} bytes), got {margin}")
    return out


def _measured_step(om, args: tuple, kwargs: dict) -> None:
    """One planned forward and backward on the example inputs, leaving the
    model's gradients, buffers and RNG state as they were."""
    from torch.utils._pytree import tree_leaves

    from .frontend.calibrate import preserved_state

    with preserved_state(om.model):
        out = om(*args, **kwargs)
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
        del out, outs
        om.swap.synchronize()


sys.modules[__name__].__class__ = CallableModule   # libra_opt.optimize(...) whichever import ran first
