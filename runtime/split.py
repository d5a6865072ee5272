"""A training step in pieces, one plan per piece under one budget: DDP's
gradient buckets (:func:`optimize_split`) and FSDP2's units (:func:`optimize_units`).

``DistributedDataParallel`` all-reduces gradients in buckets (``bucket_cap_mb``,
parameters in reverse order) from autograd hooks that fire when a parameter's
gradient is accumulated.  An optimized module runs its backward as one graph
(one ``autograd.Function``), so every gradient is ready only when the whole
backward has ended and no all-reduce overlaps it.  Here the TorchDynamo graph
is split as ``torch.compile``'s DDPOptimizer splits it
(``torch._dynamo.backends.distributed.DDPOptimizer``: parameter bytes counted
in reverse graph order, a new piece at each ``bucket_cap_mb``; the same class
is used, so the pieces are exactly its pieces).  Each piece is captured,
profiled and planned on its own and runs as its own forward and backward
graph; the backward of piece ``k`` produces the gradients of piece ``k``'s
parameters, and DDP's hooks launch that bucket's all-reduce while the
backward of the pieces before it is still running.

**One budget for all pieces.**  While piece ``k`` runs, the other pieces
hold memory too: a piece before it (whose forward has run, its backward not
yet) holds what its forward part keeps for the backward and its outputs
(``F_j``, simulated); a piece after it holds, once its backward has run, its
parameters' gradients (``G_j``; nothing while ``k``'s forward runs); and the
gradient of ``k``'s output, made by piece ``k + 1``'s backward, is at most
``k + 1``'s input bytes ``I_{k+1}``.  With ``peak_k`` the simulated peak of
piece ``k``'s plan, the step's graph memory never exceeds

    bound = max over k of ( peak_k + sum_{j<k} F_j + sum_{j>k} G_j + I_{k+1} )

(:func:`split_bound`; :func:`held_bytes` gives ``F_j`` and ``G_j``).  The plans are
chosen so that ``bound <= budget`` (:func:`plan_pieces`): each piece has a
few candidate plans (the solver's for 100%, 95%, ... of its own no-remat
peak, and ``"checkpoint-all"``'s, which keeps the least for the backward),
and starting from the fastest, the piece whose switch lowers the bound most
per second of added time is switched until the bound fits.  A budget given as a fraction
or percentage refers to the bound of the no-remat plans, the split step's
no-remat peak.

**FSDP2.**  A model sharded with ``fully_shard`` is not one graph (FSDP2's
hooks are excluded from TorchDynamo), but a unit optimized *before* it is
sharded is: ``fully_shard(optimized_unit)`` all-gathers the parameters before
the unit's forward and backward, and the unit's compiled step runs its plan
between the hooks (the gathered parameters are its graph inputs; gradients
bitwise equal to FSDP2 without a plan with the eager executor).
:func:`optimize_units` plans the units as the pieces above, under one
per-rank budget.

Sources: ``torch/_dynamo/backends/distributed.py`` (Note [DDPOptimizer]);
``torch.distributed.fsdp.fully_shard`` (FSDP2);
``torch.nn.parallel.DistributedDataParallel`` (``bucket_cap_mb``, gradient
hooks); Checkmate (Jain et al., MLSys 2020) for the per-piece problems.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx
from torch import nn

from libra_opt.frontend.capture import CapturedStep, check_example_shapes, example_input_shapes, step_function
from libra_opt.frontend.capture_passes import apply_graph_passes, apply_joint_passes
from libra_opt.errors import InfeasibleBudgetError, LibraOptError, RuntimeExecutionError
from libra_opt.ir.problem import RematProblem

from .inductor import InductorCompiler
from .module import OptimizedModule, eager_boxed
from .partition import forward_split, lower_plan
from .swap import SwapManager

logger = logging.getLogger(__name__)

__all__ = ["SplitPlan", "SplitOptimizedModule", "bucket_bytes", "capture_pieces", "held_bytes", "split_bound",
           "plan_pieces", "optimize_split", "optimize_units", "check_not_sharded", "active_ddp_module",
           "no_ddp_split"]

#: fractions of each piece's no-remat peak its candidate plans are made for (:func:`candidate_plans`)
FRACTIONS = tuple(round(1 - i / 20, 2) for i in range(20))
#: DDP's first bucket (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``, bytes)
FIRST_BUCKET_BYTES = 1024 * 1024


def bucket_bytes(bucket_cap_mb: float) -> int:
    """``bucket_cap_mb`` in bytes as DDP counts it (``int(mb * 1024 * 1024)``).

    Raises
    ------
    LibraOptError
        ``bucket_cap_mb`` is not a positive number.
    """
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb > 0:
        raise LibraOptError(f"ddp_bucket_cap_mb must be a positive number of MiB (DDP's bucket_cap_mb, "
                            f"default 25), got {bucket_cap_mb!r}")
    return int(bucket_cap_mb * 1024 * 1024)


def _ddp_optimizer(bucket_bytes_cap: int, compile_fn: Callable):
    """torch.compile's DDPOptimizer with DDP's first-bucket size (at most the cap)."""
    from torch._dynamo.backends.distributed import DDPOptimizer

    first = getattr(torch.distributed, "_DEFAULT_FIRST_BUCKET_BYTES", FIRST_BUCKET_BYTES)
    return DDPOptimizer(bucket_bytes_cap, compile_fn, first_bucket_cap=min(first, bucket_bytes_cap))


def active_ddp_module():
    """The ``DistributedDataParallel`` whose forward is running now (DDP sets
    it for TorchDynamo: ``DistributedDataParallel._get_active_ddp_module``), or
    ``None``."""
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel

    getter = getattr(DistributedDataParallel, "_get_active_ddp_module", None)
    return getter() if getter is not None else None


def no_ddp_split():
    """Context: TorchDynamo does not split graphs for DDP itself
    (``torch._dynamo.config.optimize_ddp = False``); an optimized module
    decides its own graph pieces, since a plan is made for given graphs."""
    import torch._dynamo

    return torch._dynamo.config.patch(optimize_ddp=False)


# ---------------------------------------------------------------- capture
def capture_pieces(model: nn.Module, args: tuple = (), kwargs: dict | None = None, *, bucket_bytes_cap: int,
                   autocast_dtype: torch.dtype | None = None, loss_fn: Callable | None = None) -> list[CapturedStep]:
    """Capture one training step of ``model`` as one joint graph per DDP piece.

    The TorchDynamo graph is split by DDPOptimizer with ``bucket_bytes_cap``
    (bytes); each piece is traced by AOTAutograd (its joint graph kept), then
    the pieces' forwards are run once on the real inputs (no grad; buffers and
    RNG state restored after) to get each piece's real inputs, which the
    profiler needs.

    Returns
    -------
    list of CapturedStep
        In execution order; a piece's inputs made by an earlier piece are
        ``"input"`` primals.  One element when the parameters fit one bucket.

    Raises
    ------
    CaptureError
        As :func:`libra_opt.capture.capture`.
    """
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import default_partition

    from libra_opt.frontend.calibrate import preserved_state
    from libra_opt.frontend.capture import GraphCaptured, finish_capture, run_capture

    kwargs = dict(kwargs or {})
    name = type(model).__name__
    pieces: list[dict] = []

    def piece_backend(gm, example_inputs):
        box = {"passes": apply_graph_passes(gm), "module": gm}
        pieces.append(box)

        def partition(joint, joint_inputs, *, num_fwd_outputs, **kw):
            box["passes"].update(apply_joint_passes(joint, num_fwd_outputs))
            box["joint"] = joint
            box["num_fwd_outputs"] = num_fwd_outputs
            # DDPOptimizer runs each compiled piece on fake tensors to get the next piece's inputs
            return default_partition(fx.GraphModule(joint, joint.graph.__deepcopy__()), joint_inputs,
                                     num_fwd_outputs=num_fwd_outputs, **kw)

        return aot_autograd(fw_compiler=eager_boxed, bw_compiler=eager_boxed,
                            partition_fn=partition)(gm, example_inputs)

    def backend(gm, example_inputs):
        shapes.extend(example_input_shapes(model, example_inputs))   # the whole step's inputs
        split = _ddp_optimizer(bucket_bytes_cap, piece_backend).compile_fn(gm, list(example_inputs))
        with preserved_state(model), torch.no_grad():
            for box, real in zip(pieces, _piece_inputs(split, pieces, example_inputs)):
                box["primals"] = real
        raise GraphCaptured()

    shapes: list = []
    compiled = torch.compile(step_function(model, loss_fn, autocast_dtype=autocast_dtype), backend=backend,
                             fullgraph=True, dynamic=False)
    try:
        with no_ddp_split():
            # the first piece through capture's own checks and error messages
            steps = [run_capture(_FirstPiece(pieces), compiled, model, args, kwargs, autocast_dtype, name)]
        steps += [finish_capture(model, box, autocast_dtype, name) for box in pieces[1:]]
    finally:
        pieces.clear()
    for s in steps:
        s.example_shapes = list(shapes)
    logger.info("captured %s as %d DDP pieces (bucket cap %d bytes)", name, len(steps), bucket_bytes_cap)
    return steps


class _FirstPiece(dict):
    """The first piece's capture box, read by :func:`libra_opt.frontend.capture.run_capture`
    after the backend has filled the list of pieces."""

    def __init__(self, pieces: list):
        super().__init__()
        self._pieces = pieces

    def _box(self) -> dict:
        return self._pieces[0] if self._pieces else {}

    def __contains__(self, key) -> bool:
        return key in self._box()

    def __getitem__(self, key):
        return self._box()[key]


def _piece_inputs(split: fx.GraphModule, pieces: list[dict], example_inputs) -> list[list]:
    """Run the split graph on the real ``example_inputs`` with each piece's
    original (uncompiled) graph and return the real inputs of every piece."""
    if len(pieces) == 1:
        return [list(example_inputs)]
    calls = [n for n in split.graph.nodes if n.op == "call_module"]
    index = {n.target: k for k, n in enumerate(calls)}
    seen: list[list] = [[] for _ in pieces]

    class RealInputs(fx.Interpreter):
        def call_module(self, target, args, kwargs):
            k = index[target]
            seen[k] = list(args)
            out = pieces[k]["module"](*args)
            return out[0] if getattr(split.get_submodule(target), "unwrap_singleton_tuple", False) else out

    RealInputs(split).run(*example_inputs)
    return seen


# ---------------------------------------------------------------- one budget for the pieces
def held_bytes(problem: RematProblem, schedule) -> tuple[int, int]:
    """Graph memory (bytes) piece ``problem`` holds while another piece runs:
    ``(after_forward, gradients)``, its simulated memory after its forward
    part (what it keeps for the backward, and its outputs) and the bytes of
    its parameters' gradients, which stay after its backward."""
    from libra_opt.passes.simulator import Simulator

    sim = Simulator(problem)
    sim.run(schedule, stop=forward_split(problem, schedule))
    return int(sim.mem), int(problem.fixed.gradients_bytes)


def split_bound(peaks: list[int], held: list[tuple[int, int]], input_bytes: list[int]) -> int:
    """The most graph memory (bytes) the split step holds, pieces in execution order:
    ``max_k(peaks[k] + sum_{j<k} held[j][0] + sum_{j>k} held[j][1] + input_bytes[k+1])``:
    piece ``k`` at its peak, the pieces before it holding what their forward
    part keeps, the pieces after it their parameters' gradients (none while
    ``k``'s forward runs: counted anyway), and the gradient of ``k``'s output
    that piece ``k + 1``'s backward made (at most ``k + 1``'s input bytes)."""
    out = 0
    for k, p in enumerate(peaks):
        nxt = input_bytes[k + 1] if k + 1 < len(input_bytes) else 0
        out = max(out, p + sum(h[0] for h in held[:k]) + sum(h[1] for h in held[k + 1:]) + nxt)
    return int(out)


@dataclass
class SplitPlan:
    """The plans of a split step (:func:`plan_pieces`).

    Attributes
    ----------
    pieces : list of SolveResult
        One plan per piece, in execution order (``pieces[k].peak_bytes`` is
        piece ``k``'s own simulated peak, bytes).
    held_bytes : list of (int, int)
        Bytes each piece holds while another runs: after its forward part, and
        its gradients after its backward (:func:`held_bytes`).
    peak_bytes : int
        :func:`split_bound` of the plans: the step's predicted peak graph
        memory (bytes), at most ``budget_bytes``.
    budget_bytes : int
        The solver budget for the whole step (bytes).
    time_s : float
        Sum of the pieces' simulated times (s).
    solver : str
        The solver asked for (a piece may use ``"checkpoint-all"``'s plan:
        ``pieces[k].solver``).
    status : str
        ``"optimal"`` when every piece's plan is, else ``"feasible"``.
    modules : list of OptimizedModule
        From :func:`optimize_units`: the optimized units, in execution order
        (empty for a DDP split).
    """

    pieces: list
    held_bytes: list
    peak_bytes: int
    budget_bytes: int
    time_s: float
    solver: str
    status: str = "feasible"
    modules: list = field(default_factory=list)

    @property
    def success(self) -> bool:
        """True: a split plan always fits its budget (else :func:`plan_pieces` raises)."""
        return True


def _no_remat(problem: RematProblem):
    from libra_opt.ir.schedule import no_remat_schedule
    from libra_opt.passes.simulator import no_remat_peak

    return no_remat_peak(problem), held_bytes(problem, no_remat_schedule(problem))


def no_remat_bound(problems: list[RematProblem]) -> int:
    """The split step's peak graph memory (bytes) without remat: the reference of a relative budget."""
    facts = [_no_remat(p) for p in problems]
    return split_bound([f[0] for f in facts], [f[1] for f in facts], [p.fixed.inputs_bytes for p in problems])


def candidate_plans(problem: RematProblem, solver="libra", **options) -> list:
    """Plans of one piece to choose from: ``solver``'s for each fraction of
    :data:`FRACTIONS` of the piece's no-remat peak (down to the first it
    cannot meet), and ``"checkpoint-all"``'s (which keeps the least for the
    backward, so the other pieces get the most room).  Each as
    ``(SolveResult, (after_forward, at_end))`` (bytes), fastest first."""
    from libra_opt.solvers import solve

    ref = _no_remat(problem)[0]
    out = []
    for a in FRACTIONS:
        res = solve(problem, max(1, int(a * ref)), solver, raise_on_infeasible=False, **options)
        if not res.success:
            break
        out.append(res)
    res = solve(problem, ref, "checkpoint-all", raise_on_infeasible=False)
    if res.success:
        out.append(res)
    return sorted(((r, held_bytes(problem, r.schedule)) for r in out), key=lambda c: c[0].time_s)


def plan_pieces(problems: list[RematProblem], budget_bytes: int, solver="libra", **options) -> SplitPlan:
    """Plan every piece so that the split step fits ``budget_bytes`` (bytes).

    Greedy over :func:`candidate_plans`: start from each piece's fastest
    plan; while :func:`split_bound` exceeds the budget, switch the one piece
    whose next plan lowers the bound most per second of added simulated time.

    Raises
    ------
    InfeasibleBudgetError
        No choice fits; ``min_feasible_bytes`` is the smallest bound reached.
    """
    cands = [candidate_plans(p, solver, **options) for p in problems]
    name = solver if isinstance(solver, str) else getattr(solver, "name", "?")
    if not all(cands):
        raise InfeasibleBudgetError(budget_bytes, None, name, "a DDP piece has no plan")
    pick = [0] * len(problems)

    inputs = [p.fixed.inputs_bytes for p in problems]

    def bound(choice) -> int:
        return split_bound([cands[k][c][0].peak_bytes for k, c in enumerate(choice)],
                           [cands[k][c][1] for k, c in enumerate(choice)], inputs)

    current = bound(pick)
    while current > budget_bytes:
        best = None
        for k, options_k in enumerate(cands):
            for c in range(len(options_k)):
                trial = pick[:k] + [c] + pick[k + 1:]
                b = bound(trial)
                if b >= current:
                    continue
                added = options_k[c][0].time_s - options_k[pick[k]][0].time_s
                score = (current - b) / max(added, 1e-12)
                if best is None or score > best[0]:
                    best = (score, trial, b)
        if best is None:
            raise InfeasibleBudgetError(budget_bytes, current, name,
                                        f"{len(problems)} DDP pieces under one budget (runtime/split.py)")
        _, pick, current = best
    results = [cands[k][c][0] for k, c in enumerate(pick)]
    status = "optimal" if all(r.status == "optimal" for r in results) else "feasible"
    return SplitPlan(pieces=results, held_bytes=[cands[k][c][1] for k, c in enumerate(pick)],
                     peak_bytes=int(current), budget_bytes=int(budget_bytes),
                     time_s=float(sum(r.time_s for r in results)), solver=name, status=status)


# ---------------------------------------------------------------- the module
class SplitOptimizedModule(OptimizedModule):
    """An :class:`~libra_opt.runtime.module.OptimizedModule` whose step runs
    as DDP pieces, each with its own plan (see the module docstring); made by
    ``libra_opt.optimize(..., ddp_bucket_cap_mb=)``.

    The compiled step splits the TorchDynamo graph with DDPOptimizer at
    ``bucket_bytes_cap`` (with or without DDP around it: DDP's own automatic
    split is turned off while it runs, :func:`no_ddp_split`) and lowers plan
    ``k`` into piece ``k``'s forward and backward graphs.

    Parameters
    ----------
    model : nn.Module
    problems : list of RematProblem
        One per piece, in execution order.
    plan : SplitPlan
    bucket_bytes_cap : int
        Bytes per piece of parameters (DDP's ``bucket_cap_mb`` in bytes).
    example_shapes, autocast_dtype, loss_fn, device, executor, cuda_graphs
        As :class:`OptimizedModule`.

    Raises
    ------
    ExecutorError
        As :class:`OptimizedModule`.
    RuntimeExecutionError
        At the first training call, when the step splits into other pieces
        than the plans were made for, or a DDP around it uses another
        ``bucket_cap_mb``.

    Attributes
    ----------
    plan : SplitPlan
        ``plan.peak_bytes`` is the step's predicted peak (bytes),
        ``plan.pieces`` the per-piece :class:`~libra_opt.solvers.SolveResult`.
    plans : list of SolveResult
        ``plan.pieces``.
    problems : list of RematProblem
    problem : None
        (one problem per piece: see ``problems``)
    lowered_pieces : list of LoweredPlan or None
        Each piece's graphs, after the first training call.
    """

    _RUNTIME_ATTRS = OptimizedModule._RUNTIME_ATTRS + ("inductors", "lowered_pieces", "_next_piece")

    def __init__(self, model: nn.Module, problems: list[RematProblem], plan: SplitPlan, *, bucket_bytes_cap: int,
                 example_shapes, autocast_dtype=None, loss_fn=None, device=None, executor="eager",
                 cuda_graphs: bool = False):
        nn.Module.__init__(self)
        self.problems = list(problems)
        self.problem = None
        self.bucket_bytes_cap = int(bucket_bytes_cap)
        self._settings(model, plan, example_shapes, autocast_dtype, loss_fn, device, executor, cuda_graphs,
                       swaps=sum(len(r.schedule.swapped_tensors()) for r in plan.pieces))
        # one split per example shape: another shape raises ShapeMismatchError (no per-shape plans here)
        self.example_key, self.planner, self.follow_autocast = None, None, False
        self._build_runtime()

    @property
    def plans(self) -> list:
        """The per-piece plans (``plan.pieces``)."""
        return self.plan.pieces

    def _build_runtime(self) -> None:
        self.swap = SwapManager(self.device)
        swapped = [(p, r.schedule.swapped_tensors()) for p, r in zip(self.problems, self.plan.pieces)]
        self.swap.pool.reserve_buffers(p.tensors[t].nbytes for p, ts in swapped for t in ts)
        self.inductors = [InductorCompiler(self.swap, has_swaps=bool(ts), cuda_graphs=self.cuda_graphs)
                          if self.executor == "inductor" else None for _, ts in swapped]
        self.inductor = None
        self.lowered = None
        self.lowered_pieces = [None] * len(self.problems)
        self._next_piece = 0
        self._ran = False
        self._tracker = None
        self._compiled = self._compile()
        self.shape_plans = {}

    def _compile(self):
        fn = step_function(self.model, self.loss_fn, autocast_dtype=self.autocast_dtype, device=self.device)
        return torch.compile(fn, backend=self._split_backend, fullgraph=True, dynamic=False)

    def _split_backend(self, gm, example_inputs):
        check_example_shapes(example_input_shapes(self.model, example_inputs), self.example_shapes)
        self._next_piece = 0
        return _ddp_optimizer(self.bucket_bytes_cap, self._piece_backend).compile_fn(gm, list(example_inputs))

    def _piece_backend(self, gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        k = self._next_piece
        self._next_piece += 1
        if k >= len(self.problems):
            raise RuntimeExecutionError(
                f"the step split into more than the {len(self.problems)} pieces the plans were made for; "
                f"re-optimize with the same model, inputs and ddp_bucket_cap_mb")
        apply_graph_passes(gm)

        def partition(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
            apply_joint_passes(joint, num_fwd_outputs)
            lowered = lower_plan(joint, num_fwd_outputs, self.problems[k], self.plan.pieces[k].schedule, self.swap)
            self.lowered_pieces[k] = lowered
            if self.inductors[k] is not None:
                self.inductors[k].prepare(lowered)
            return lowered.fw, lowered.bw

        def compiler(forward: bool):
            def compile_(g, inputs):
                ind = self.inductors[k]
                if ind is not None:
                    g = ind.forward(g, inputs) if forward else ind.backward(g, inputs)
                return self._boxed(g, forward=forward)
            return compile_

        return aot_autograd(fw_compiler=compiler(True), bw_compiler=compiler(False), partition_fn=partition,
                            inference_compiler=eager_boxed)(gm, example_inputs)

    def forward(self, *args, **kwargs):
        """As :meth:`OptimizedModule.forward`; inside a DDP forward, checks that
        DDP's ``bucket_cap_mb`` is the one the pieces were made for.

        Raises
        ------
        RuntimeExecutionError
            DDP around this module uses another bucket size (its buckets would
            not match the pieces).
        """
        ddp = active_ddp_module()
        if ddp is not None and int(ddp.bucket_bytes_cap) != self.bucket_bytes_cap:
            raise RuntimeExecutionError(
                f"DDP wraps this module with bucket_cap_mb={ddp.bucket_bytes_cap / 2 ** 20:g} but it was "
                f"optimized with ddp_bucket_cap_mb={self.bucket_bytes_cap / 2 ** 20:g}: pass the same value to "
                f"both")
        return super().forward(*args, **kwargs)

    def _ddp_context(self):
        """The pieces are this module's: TorchDynamo's own DDP split is off."""
        return no_ddp_split()

    @property
    def predicted_peak_bytes(self) -> int:
        """The split step's bound (``plan.peak_bytes``) plus the inputs CUDA graph trees copy (bytes)."""
        return int(self.plan.peak_bytes) + sum(int(i.cuda_graph_input_bytes) for i in self.inductors
                                               if i is not None)

    def extra_repr(self) -> str:
        """The split plan: pieces, solver, budget, bound (bytes)."""
        p = self.plan
        return (f"pieces={len(p.pieces)}, bucket_cap={self.bucket_bytes_cap} B, solver={p.solver!r}, "
                f"budget={p.budget_bytes} B, predicted peak={p.peak_bytes} B, "
                f"executor={self.executor!r}")


def optimize_split(model: nn.Module, args: tuple, kwargs: dict | None, budget, solver, *, bucket_cap_mb: float,
                   autocast_dtype, loss_fn, problem_builder: Callable[[CapturedStep], RematProblem],
                   executor: str, cuda_graphs: bool, margin_of: Callable[[int, torch.device], int],
                   solver_options: dict) -> SplitOptimizedModule:
    """``optimize`` for ``ddp_bucket_cap_mb``: capture the pieces
    (:func:`capture_pieces`), build a problem per piece with
    ``problem_builder``, plan them under one budget (:func:`plan_pieces`,
    the budget less ``margin_of(budget_bytes, device)`` bytes) and wrap the
    model in a :class:`SplitOptimizedModule`.

    Raises
    ------
    BudgetError, CaptureError, InfeasibleBudgetError, LibraOptError
        As :func:`libra_opt.optimize`; ``LibraOptError`` for a bad ``bucket_cap_mb``.
    """
    from libra_opt.ir.units import parse_budget

    cap = bucket_bytes(bucket_cap_mb)
    steps = capture_pieces(model, args, kwargs, bucket_bytes_cap=cap, autocast_dtype=autocast_dtype,
                           loss_fn=loss_fn)
    if steps[0].device.type == "cuda":
        from .memory import configure_allocator

        configure_allocator()       # as optimize does: expandable segments unless the user configured it
    problems = [problem_builder(s) for s in steps]
    budget_bytes = parse_budget(budget, no_remat_bound(problems))
    plan = plan_pieces(problems, budget_bytes - margin_of(budget_bytes, steps[0].device), solver, **solver_options)
    logger.info("optimize(%s): %d DDP pieces, predicted peak %d bytes (budget %d)", steps[0].model_name,
                len(problems), plan.peak_bytes, budget_bytes)
    om = SplitOptimizedModule(model, problems, plan, bucket_bytes_cap=cap, example_shapes=steps[0].example_shapes,
                              autocast_dtype=autocast_dtype, loss_fn=loss_fn, device=steps[0].device,
                              executor=executor, cuda_graphs=cuda_graphs)
    om.budget_bytes = budget_bytes
    om.calibration = []
    return om


@contextlib.contextmanager
def unsplit_under_ddp(module):
    """Context for an unsplit optimized module's compiled call: inside a DDP
    forward a warning says once that the backward is one graph (DDP then
    all-reduces every bucket after it) and how to split it."""
    if active_ddp_module() is not None and not getattr(module, "_ddp_warned", False):
        module._ddp_warned = True
        warnings.warn("DDP wraps an optimized module whose backward is one graph: every gradient bucket is "
                      "all-reduced after the whole backward (no overlap); optimize with "
                      "ddp_bucket_cap_mb=<DDP's bucket_cap_mb> to split it at DDP's buckets", stacklevel=4)
    with no_ddp_split():
        yield


# ---------------------------------------------------------------- FSDP2: one plan per unit
def _fsdp_module_class():
    """``torch.distributed.fsdp.FSDPModule`` (torch >= 2.6), else the
    ``torch.distributed._composable.fsdp`` one; ``None`` when neither is
    imported yet (no model can have been sharded: importing FSDP takes
    seconds) or torch.distributed is missing."""
    import sys

    if not torch.distributed.is_available() or not any(
            m in sys.modules for m in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")):
        return None
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import FSDPModule
        except ImportError:
            return None
    return FSDPModule


def check_not_sharded(model: nn.Module) -> None:
    """Raise :class:`~libra_opt.errors.LibraOptError` when ``model`` or one of
    its submodules was already sharded with FSDP2's ``fully_shard``.

    FSDP2's pre- and post-forward hooks (all-gather, reshard, the
    post-backward reduce-scatter) are wrapped in ``torch._dynamo.disable`` in
    torch 2.11-2.13, so a sharded model never captures as one graph; its units
    are optimized before sharding instead (:func:`optimize_units`).
    """
    cls = _fsdp_module_class()
    if cls is None:
        return
    sharded = [name or type(model).__name__ for name, m in model.named_modules() if isinstance(m, cls)]
    if sharded:
        raise LibraOptError(
            f"optimize() got a model sharded with FSDP2's fully_shard ({', '.join(sharded[:3])}"
            f"{', ...' if len(sharded) > 3 else ''}): FSDP2's hooks are excluded from TorchDynamo "
            f"(torch._dynamo.disable), so a sharded model is not one graph to plan. Optimize the units before "
            f"sharding them: plan = libra_opt.runtime.split.optimize_units(model, example_x, budget, "
            f"units=[...]), then fully_shard(unit) for unit in plan.modules and fully_shard(model); or use "
            f"DDP (see the README, 'Use it with FSDP2')")


def _record_unit_inputs(model: nn.Module, units: list, args: tuple, kwargs: dict) -> list:
    """Run ``model`` once without grad (buffers and RNG restored after) and
    return ``(unit, args, kwargs)`` per unit in the order they ran, the
    inputs cloned.  A floating-point input that is not one of the caller's
    own tensors is marked ``requires_grad`` (it was made from parameters:
    with grad on, it would require grad), as the unit's training step sees it.

    Raises
    ------
    LibraOptError
        A unit does not run, or runs more than once, in the forward.
    """
    from torch.utils._pytree import tree_map

    from libra_opt.frontend.calibrate import preserved_state

    own = {id(t) for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
    trains = any(p.requires_grad for p in model.parameters())

    def copy_(t):
        if not isinstance(t, torch.Tensor):
            return t
        c = t.detach().clone()
        grad = t.requires_grad if id(t) in own else (trains and c.is_floating_point())
        return c.requires_grad_(grad)

    seen: list = []

    def hook(module, a, kw):
        if any(m is module for m, _, _ in seen):
            raise LibraOptError(f"unit {type(module).__name__} runs more than once in the forward; a unit must run "
                                f"once per step")
        seen.append((module, tree_map(copy_, tuple(a)), tree_map(copy_, dict(kw))))

    handles = [u.register_forward_pre_hook(hook, with_kwargs=True) for u in units]
    try:
        with preserved_state(model), torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    missing = [type(u).__name__ for u in units if not any(m is u for m, _, _ in seen)]
    if missing:
        raise LibraOptError(f"units {missing} do not run in the model's forward; pass submodules the forward calls")
    return seen


def optimize_units(model: nn.Module, example_inputs: Any, budget, *, units, solver="libra",
                   example_kwargs: dict | None = None, autocast_dtype: torch.dtype | None = None,
                   optimizer: str = "adam", profile: bool = True, executor: str | None = None,
                   **solver_options) -> SplitPlan:
    """Optimize the units of ``model`` (the submodules you will ``fully_shard``)
    under one budget, replacing each by its :class:`OptimizedModule` in place.

    Call it before sharding, then ``fully_shard(unit)`` for each unit of
    ``plan.modules`` and ``fully_shard(model)``: FSDP2 all-gathers a unit's
    parameters before its forward and backward (they are the unit's graph
    inputs, outside the budget; its sharded parameters are the resident
    memory), and the unit runs its plan between its hooks.  The units are
    planned as the pieces of a DDP split (:func:`plan_pieces`: while one runs,
    the ones before it hold what their forward parts keep, the ones after it
    their gradients), so their graph memory together stays within
    ``budget`` per rank.  What runs outside the units (an embedding, the head,
    the loss) runs eagerly and is not in the budget.

    Parameters
    ----------
    model : nn.Module
        In training mode, not sharded yet.
    example_inputs : tensor or tuple
        The model's example inputs (each unit's are recorded by running the
        model once without grad).
    budget : int, float or str
        Graph-memory budget per rank (bytes, ``"12GiB"``, ``"60%"``: of the
        units' no-remat bound).
    units : iterable of nn.Module
        Submodules of ``model`` that run once per forward, e.g. the
        transformer blocks.
    solver, example_kwargs, autocast_dtype, optimizer, profile, executor, **solver_options
        As :func:`libra_opt.optimize`.

    Returns
    -------
    SplitPlan
        ``plan.modules``: the optimized units in execution order (also set
        in ``model`` in place of the units); ``plan.pieces`` their plans;
        ``plan.peak_bytes`` the units' predicted peak (bytes).

    Raises
    ------
    BudgetError, CaptureError, InfeasibleBudgetError, ExecutorError
        As :func:`libra_opt.optimize`.
    LibraOptError
        ``model`` is already sharded, or a unit is not called exactly once.
    """
    from libra_opt.frontend.calibrate import default_margin
    from libra_opt.frontend.capture import capture
    from libra_opt.optimize import problem_of
    from libra_opt.ir.units import check_budget, parse_budget

    from .inductor import resolve_executor

    check_budget(budget)
    check_not_sharded(model)
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    units = list(units)
    parents = {id(m): (parent, name) for parent in model.modules() for name, m in parent.named_children()}
    if not units or any(id(u) not in parents for u in units):
        raise LibraOptError("units must be one or more submodules of the model (e.g. model.layers), not the model "
                            "itself")
    runs = _record_unit_inputs(model, units, args, dict(example_kwargs or {}))
    steps = [capture(u, a, kw, autocast_dtype=autocast_dtype) for u, a, kw in runs]
    problems = [problem_of(s, optimizer=optimizer, profile=profile) for s in steps]
    budget_bytes = parse_budget(budget, no_remat_bound(problems))
    device = steps[0].device
    plan = plan_pieces(problems, budget_bytes - default_margin(budget_bytes, device), solver, **solver_options)
    executor = resolve_executor(executor, device)
    for (unit, _, _), step, problem, result in zip(runs, steps, problems, plan.pieces):
        om = OptimizedModule(unit, problem, result, example_shapes=step.example_shapes,
                             autocast_dtype=autocast_dtype, device=step.device, executor=executor)
        om.budget_bytes = budget_bytes
        om.calibration = []
        parent, name = parents[id(unit)]
        setattr(parent, name, om)
        plan.modules.append(om)
    logger.info("optimize_units: %d units, predicted peak %d bytes (budget %d)", len(problems), plan.peak_bytes,
                budget_bytes)
    return plan
