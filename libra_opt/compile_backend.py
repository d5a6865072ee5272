"""libra-opt as a ``torch.compile`` backend: ``torch.compile(model, backend=libra_opt.backend(budget=...))``.

TorchDynamo traces the model's forward into an FX graph and hands it, with
its example inputs, to the backend.  :class:`LibraBackend` plans the training
step of that graph with the same pipeline as :func:`libra_opt.optimize`, at
the point where AOTAutograd has the joint forward+backward graph:

    Dynamo graph -> capture passes -> AOTAutograd joint graph (partition hook)
        -> profile (or unit op times) -> RematProblem -> solve -> lower_plan
        -> forward / backward graphs, run op by op ("eager") or by Inductor

The partition hook is the runtime's (:func:`libra_opt.runtime.partition.lower_plan`,
:class:`~libra_opt.runtime.inductor.InductorCompiler`, the
:class:`~libra_opt.runtime.swap.SwapManager`); only where the problem comes
from differs from :class:`~libra_opt.runtime.module.OptimizedModule`: here it
is built inside the hook from the joint graph AOTAutograd traced for Dynamo,
with the graph's real inputs (parameters, buffers, the batch) as primals.

**Graph breaks.**  Where Dynamo breaks the forward into several graphs, the
backend is called once per graph and each graph gets a plan of its own
(``plans`` holds them in compile order).  A fraction or percentage budget
applies to each graph's own no-remat peak, so every graph is cut by that
share.  A bytes budget applies to each graph alone: the activations the
earlier graphs keep for their backward are resident while a later graph runs
and are not counted in its plan, so the step may add more than the budget.
A warning names the break (TorchDynamo's reason) and the number of breaks
seen so far; remove the break (``torch._dynamo.explain``) to plan the whole
step as one graph.

**Inference.**  A call without grad (``torch.no_grad()``, ``inference_mode``)
has no backward and no activations to keep: AOTAutograd's inference graph is
run as it is (op by op, or by Inductor with ``executor="inductor"``), with no
plan.

**Shapes.**  A plan is made for the shapes of the call that compiled it;
compile with ``dynamic=False`` so that TorchDynamo recompiles (and the backend
plans again) for each new shape instead of handing it a graph with symbolic
sizes, which is refused (:class:`~libra_opt.errors.CaptureError`).  After
``torch._dynamo.config.recompile_limit`` shapes of one frame (8 by default)
TorchDynamo runs further shapes eagerly, without calling the backend: without
a plan.

**Errors** of planning (an infeasible budget, a data-dependent op) are raised
at the call that compiled the graph, as themselves: TorchDynamo would wrap
an exception raised by a backend in ``BackendCompilerFailed``, so the backend
returns a function that raises it instead.

Sources: PyTorch 2 (Ansel et al., ASPLOS 2024): TorchDynamo custom backends
(``torch.compile(backend=callable)``, ``gm.compile_subgraph_reason``) and
AOTAutograd (``torch._dynamo.backends.common.aot_autograd``, its
``partition_fn`` / ``fw_compiler`` / ``bw_compiler`` / ``inference_compiler``
hooks).
"""
from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from .frontend.capture import CapturedStep, example_tangents
from .frontend.capture_passes import apply_graph_passes, apply_joint_passes
from .errors import CaptureError, InfeasibleBudgetError, LibraOptError

logger = logging.getLogger(__name__)

__all__ = ["backend", "LibraBackend", "CompiledGraph"]


def backend(budget, solver="libra", *, executor: str | None = None, profile: bool = True,
            optimizer: str = "adam", **solver_options) -> "LibraBackend":
    """A ``torch.compile`` backend that trains the compiled model within a memory budget.

    ``torch.compile(model, backend=libra_opt.backend(budget="60%"), dynamic=False)``
    returns a module whose every training step (forward, ``loss.backward()``)
    executes a rematerialization plan; see :class:`LibraBackend`.

    Parameters
    ----------
    budget : int, float or str
        Graph-memory budget (``DESIGN.md``, "The budget contract"): bytes
        (``int``), ``"12GiB"`` / ``"800MB"``, ``"60%"`` or a float in (0, 1]
        (that fraction of each graph's simulated no-remat peak).  Checked here,
        before anything is compiled (:func:`libra_opt.units.check_budget`).
    solver : str or Solver
        As in :func:`libra_opt.optimize` (default ``"libra"``).
    executor : {"inductor", "eager"} or None
        How the planned graphs run: ``"inductor"`` compiles them with
        Inductor (gradients as close to eager as ``torch.compile``'s),
        ``"eager"`` runs them op by op (bitwise equal to eager PyTorch on CPU
        without random ops).  ``None``: ``"inductor"`` on CUDA, ``"eager"``
        elsewhere.
    profile : bool
        Measure each op's time on the device when a graph is compiled
        (default); ``False`` plans with unit op times (fast; for tests).
    optimizer : {"adam", "adamw", "sgd", "none"}
        Optimizer whose state is counted in the fixed memory.
    **solver_options
        The solver's options (its ``Options`` dataclass).

    Returns
    -------
    LibraBackend

    Raises
    ------
    BudgetError
        ``budget`` breaks the budget contract.
    ExecutorError
        Unknown ``executor``.
    SolverNotFoundError, SolverOptionError
        Unknown solver or option.
    """
    return LibraBackend(budget, solver, executor=executor, profile=profile, optimizer=optimizer,
                        **solver_options)


@dataclass
class CompiledGraph:
    """One graph TorchDynamo handed the backend, and what was made of it.

    Attributes
    ----------
    index : int
        Compile order (0 for the first graph).
    break_reason : str or None
        TorchDynamo's reason when the graph ends at a graph break.
    plan : SolveResult or None
        The plan (``None`` until AOTAutograd partitions a training graph;
        an inference graph has none).
    problem : RematProblem or None
    budget_bytes : int or None
        This graph's budget (a fraction budget resolved against its no-remat peak).
    executor : str or None
        ``"eager"`` or ``"inductor"``.
    lowered : LoweredPlan or None
        The planned forward and backward graphs.
    error : LibraOptError or None
        Why the graph could not be planned (raised at each call of it).
    """

    index: int
    break_reason: str | None = None
    plan: Any = None
    problem: Any = None
    budget_bytes: int | None = None
    executor: str | None = None
    lowered: Any = None
    error: LibraOptError | None = None
    _swap: Any = field(default=None, repr=False)
    _inductor: Any = field(default=None, repr=False)


class LibraBackend:
    """A ``torch.compile`` backend that plans and executes rematerialization.

    Made by :func:`backend` (see it for the parameters).  One instance may
    compile several graphs (graph breaks, recompiles for new shapes, several
    models); each gets its own plan against the budget (a fraction budget:
    that share of each graph's own no-remat peak; a bytes budget: the bytes
    for each graph alone, see the module docstring).

    Attributes
    ----------
    graphs : list of CompiledGraph
        Every graph compiled, in order.
    plans : list of SolveResult
        The plans made so far, in compile order (one per training graph).
    graph_breaks : int
        Distinct graph breaks seen (each warned about once).

    Raises (when a compiled graph is first called)
    ----------------------------------------------
    InfeasibleBudgetError
        No plan of a graph fits its budget; the message gives the smallest
        feasible budget the solver found (``min_feasible_bytes``).
    CaptureError
        The graph has symbolic sizes (compile with ``dynamic=False``) or a
        data-dependent op.
    ProfilingError
        An op fails while profiling.
    """

    def __init__(self, budget, solver="libra", *, executor: str | None = None, profile: bool = True,
                 optimizer: str = "adam", **solver_options):
        from .frontend.capture import OPTIMIZER_STATE_FACTOR
        from .runtime.inductor import resolve_executor
        from .solvers import get_solver
        from .ir.units import check_budget

        check_budget(budget)
        if executor is not None:
            resolve_executor(executor, "cpu")       # the name only; None resolves per graph's device
        if optimizer not in OPTIMIZER_STATE_FACTOR:
            raise LibraOptError(f"unknown optimizer {optimizer!r}; use one of {sorted(OPTIMIZER_STATE_FACTOR)}")
        get_solver(solver, **solver_options)        # unknown solver or option: now, not at the first call
        self.budget = budget
        self.solver = solver
        self.executor = executor
        self.profile = bool(profile)
        self.optimizer = optimizer
        self.solver_options = dict(solver_options)
        self.graphs: list[CompiledGraph] = []
        self._breaks: dict[tuple[str, str], str] = {}

    @property
    def plans(self) -> list:
        """The :class:`~libra_opt.solvers.SolveResult` of every planned graph, in compile order."""
        return [g.plan for g in self.graphs if g.plan is not None]

    def __repr__(self) -> str:
        return (f"libra_opt.backend(budget={self.budget!r}, solver={self.solver!r}, executor={self.executor!r}, "
                f"profile={self.profile}; {len(self.plans)} plan(s))")

    # ------------------------------------------------------------ the backend
    def __call__(self, gm: fx.GraphModule, example_inputs: list):
        """Compile one TorchDynamo graph: AOTAutograd with this backend's
        partition hook and forward / backward / inference compilers.

        Returns a boxed callable; when planning fails, one that raises the
        :class:`~libra_opt.errors.LibraOptError` at every call."""
        from torch._dynamo.backends.common import aot_autograd

        graph = CompiledGraph(index=len(self.graphs), break_reason=self._note_break(gm))
        self.graphs.append(graph)
        try:
            _check_static(gm)
            apply_graph_passes(gm)      # the capture's passes, so the graphs match the plan's
            kinds = _primal_kinds(gm, example_inputs)
            autocast = _ambient_autocast(example_inputs)
            compiled = aot_autograd(
                fw_compiler=lambda g, ex: self._compile_graph(graph, g, ex, backward=False),
                bw_compiler=lambda g, ex: self._compile_graph(graph, g, ex, backward=True),
                partition_fn=lambda joint, joint_inputs, *, num_fwd_outputs, **kw:
                    self._partition(graph, joint, num_fwd_outputs, list(example_inputs), kinds, autocast),
                inference_compiler=lambda g, ex: self._compile_inference(graph, g, ex))(gm, example_inputs)
        except LibraOptError as e:
            graph.error = e
            if hasattr(e, "add_note"):      # Python >= 3.11: the traceback names the graph
                e.add_note(f"in libra_opt.backend's graph {graph.index} (backend.graphs[{graph.index}])")
            logger.warning("libra_opt.backend: graph %d not planned: %s", graph.index, e)
            return _raise_when_called(e)
        return compiled

    def _note_break(self, gm: fx.GraphModule) -> str | None:
        """TorchDynamo's reason when ``gm`` ends at a graph break
        (``gm.compile_subgraph_reason``), else ``None``; a warning names each
        break the first time it is seen (a recompile of the same graph, e.g.
        for ``no_grad``, does not warn again)."""
        reason = getattr(gm, "compile_subgraph_reason", None)
        if reason is None or not getattr(reason, "graph_break", False):
            return None
        text = next((ln.strip() for ln in str(getattr(reason, "reason", reason)).splitlines() if ln.strip()), "?")
        stack = list(getattr(reason, "user_stack", None) or [])
        where = f"{stack[-1].filename}:{stack[-1].lineno}" if stack else ""
        if (text, where) not in self._breaks:
            self._breaks[(text, where)] = text
            warnings.warn(
                f"libra_opt.backend: TorchDynamo broke the model into {self.graph_breaks + 1} graphs "
                f"({self.graph_breaks} graph break(s); this one: {text}{' at ' + where if where else ''}); each "
                f"graph is planned alone ({_break_budget_rule(self.budget)}). Remove the break to plan the step "
                f"as one graph (torch._dynamo.explain(model)(*inputs) lists the breaks)", stacklevel=3)
        return text

    @property
    def graph_breaks(self) -> int:
        """Distinct graph breaks seen so far (reason and source line)."""
        return len(self._breaks)

    def _partition(self, graph: CompiledGraph, joint: fx.GraphModule, num_fwd_outputs: int, primals: list,
                   kinds: list, autocast: torch.dtype | None):
        """AOTAutograd's partition hook: plan the joint graph and lower the plan."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        from .runtime.inductor import InductorCompiler, resolve_executor
        from .runtime.partition import lower_plan
        from .runtime.swap import SwapManager

        passes = apply_joint_passes(joint, num_fwd_outputs)
        with unset_fake_temporarily():      # AOTAutograd traces under a fake mode; the profile runs real ops
            step = _captured_step(joint, num_fwd_outputs, primals, kinds, passes, _graph_name(graph.index))
            step.autocast_dtype = autocast      # the problem's provenance dtype
            graph.executor = resolve_executor(self.executor, step.device)
            self._plan(graph, step)
        graph._swap = SwapManager(step.device)
        swapped = graph.plan.schedule.swapped_tensors()
        graph._swap.pool.reserve_buffers(graph.problem.tensors[t].nbytes for t in swapped)
        if graph.executor == "inductor":
            graph._inductor = InductorCompiler(graph._swap, has_swaps=bool(swapped))
        graph.lowered = lower_plan(joint, num_fwd_outputs, graph.problem, graph.plan.schedule, graph._swap)
        if graph._inductor is not None:
            graph._inductor.prepare(graph.lowered)
        return graph.lowered.fw, graph.lowered.bw

    def _plan(self, graph: CompiledGraph, step: CapturedStep) -> None:
        """Profile ``step`` (or give it unit op times), build its problem and
        solve it to the budget (less the allocator margin on CUDA, as
        :func:`libra_opt.optimize` does)."""
        from .frontend.calibrate import default_margin
        from .optimize import problem_of
        from .passes.simulator import no_remat_peak
        from .solvers import solve
        from .ir.units import parse_budget

        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=[step.device] if step.device.type == "cuda" else []):
            problem = problem_of(step, optimizer=self.optimizer, profile=self.profile)   # leaves the RNG as it was
        if graph.executor != "eager" and problem.device.memory_bytes_per_s:
            from .passes.costs import for_executor

            problem = for_executor(problem, graph.executor)     # recomputes priced as Inductor runs them (fused)
        graph.problem = problem
        graph.budget_bytes = parse_budget(self.budget, no_remat_peak(problem))
        margin = default_margin(graph.budget_bytes, step.device)
        try:
            graph.plan = solve(problem, graph.budget_bytes - margin, self.solver, **self.solver_options)
        except InfeasibleBudgetError:
            if not margin:
                raise
            logger.warning("libra_opt.backend: graph %d: no plan within the budget less the allocator margin "
                           "(%d bytes); planning to the whole budget", graph.index, margin)
            graph.plan = solve(problem, graph.budget_bytes, self.solver, **self.solver_options)
        logger.info("libra_opt.backend: graph %d planned by %s: predicted peak %d bytes of a %d-byte budget "
                    "in %.2f s", graph.index, graph.plan.solver, graph.plan.peak_bytes, graph.budget_bytes,
                    time.perf_counter() - t0)

    def _compile_graph(self, graph: CompiledGraph, gm: fx.GraphModule, example_inputs, *, backward: bool):
        """The planned forward or backward graph as a boxed callable: the
        graph itself (``"eager"``) or Inductor's code for it."""
        if graph._inductor is not None:
            return graph._inductor.backward(gm, example_inputs) if backward else \
                graph._inductor.forward(gm, example_inputs)
        return gm       # lower_plan's graphs take one list (_BoxedCodeGen: ``gm._boxed_call``)

    def _compile_inference(self, graph: CompiledGraph, gm: fx.GraphModule, example_inputs):
        """AOTAutograd's inference graph (no grad): run as it is, or by
        Inductor with ``executor="inductor"`` (on CUDA by default)."""
        from .runtime.inductor import InductorCompiler, resolve_executor
        from .runtime.module import eager_boxed
        from .runtime.swap import SwapManager

        device = next((t.device for t in example_inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
        graph.executor = resolve_executor(self.executor, device)
        if graph.executor == "inductor":
            return InductorCompiler(SwapManager(device), has_swaps=False).forward(gm, example_inputs)
        return eager_boxed(gm, example_inputs)


def _break_budget_rule(budget) -> str:
    """How a budget applies to the graphs of a broken model (see the module docstring)."""
    from .ir.units import classify_budget

    kind, _ = classify_budget(budget)
    if kind == "fraction":
        return f"budget {budget!r}: that share of each graph's own no-remat peak"
    return (f"budget {budget!r} for each graph alone: the activations earlier graphs keep for their backward "
            f"are on top, so the step may add more; a fraction budget such as 0.5 cuts every graph by that share")


def _raise_when_called(error: LibraOptError):
    """A boxed compiled function that raises ``error`` (a fresh traceback each call)."""
    def run(*args):
        raise error.with_traceback(None)

    run._boxed_call = True
    return run


def _check_static(gm: fx.GraphModule) -> None:
    """Raise :class:`CaptureError` when the graph has symbolic sizes (a plan is for one shape)."""
    for n in gm.graph.find_nodes(op="placeholder"):
        v = n.meta.get("example_value")
        sizes = v.shape if isinstance(v, torch.Tensor) else (v,)
        if any(isinstance(s, torch.SymInt) for s in sizes):
            raise CaptureError(
                f"libra_opt.backend got a graph with symbolic sizes (input {n.name}: {tuple(sizes)}); a plan is "
                f"made for one shape: compile with torch.compile(model, backend=..., dynamic=False) so that "
                f"each new shape is planned on its own")


def _graph_name(index: int) -> str:
    """``"graph 3 (compile 1/0)"``: the compile order and TorchDynamo's compile id (frame / recompile, as
    ``TORCH_LOGS`` prints it) of the graph being compiled."""
    from torch._guards import CompileContext

    cid = CompileContext.current_compile_id()
    return f"graph {index}" + (f" (compile {cid})" if cid is not None else "")


def _ambient_autocast(example_inputs: list) -> torch.dtype | None:
    """The dtype of the ``torch.autocast`` region the compiled call runs in
    (on the inputs' device type), or ``None``: TorchDynamo traces the casts
    into the graph, so the plan covers them; the dtype is recorded in the
    problem's provenance."""
    device = next((t.device for t in example_inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
    if not torch.is_autocast_enabled(device.type):
        return None
    return torch.get_autocast_dtype(device.type)


def _source_name(n: fx.Node) -> str:
    """TorchDynamo's source of a placeholder (``L['self']._modules['bn']._buffers['running_mean']``), or ''."""
    src = getattr(n.meta.get("grapharg"), "source", None)
    name = getattr(src, "name", "")
    return str(name() if callable(name) else name)


def _primal_kinds(gm: fx.GraphModule, example_inputs: list) -> list[str]:
    """``"parameter"`` / ``"buffer"`` / ``"input"`` per Dynamo graph input:
    parameters are ``nn.Parameter`` (real or fake) or read from a module's
    ``_parameters``, buffers from its ``_buffers`` (the placeholder's Dynamo
    source); the rest are the user's inputs."""
    ph = list(gm.graph.find_nodes(op="placeholder"))
    kinds = []
    for k, t in enumerate(example_inputs):
        source = _source_name(ph[k]) if k < len(ph) else ""
        if isinstance(t, torch.nn.Parameter) or "_parameters" in source:
            kinds.append("parameter")
        elif "_buffers" in source:
            kinds.append("buffer")
        else:
            kinds.append("input")
    return kinds


def _real(t):
    """``t``, or a zero tensor of its size, stride and dtype when it is a fake tensor (values do not
    matter to the problem: sizes and op times only)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(t, FakeTensor):
        return t
    real = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device).zero_()
    return real.requires_grad_(t.requires_grad)     # a parameter's gradient is counted in the fixed memory


def _captured_step(joint: fx.GraphModule, num_fwd_outputs: int, primals: list, kinds: list, passes: dict,
                   name: str) -> CapturedStep:
    """The :class:`~libra_opt.capture.CapturedStep` of a joint graph AOTAutograd traced for a Dynamo graph
    whose inputs are ``primals`` (real tensors, or fake ones replaced by zeros)."""
    from .frontend.capture import check_data_independent

    check_data_independent(joint, name)
    primals = [_real(t) for t in primals]
    step = CapturedStep(joint=joint, num_fwd_outputs=num_fwd_outputs, primals=primals, primal_kinds=list(kinds),
                        tangents=[], autocast_dtype=None, model_name=name, passes=dict(passes))
    prim_ph, tang_ph = step.placeholders()
    if len(prim_ph) != len(primals):
        raise CaptureError(f"{name}: the joint graph has {len(prim_ph)} primal inputs but TorchDynamo passed "
                           f"{len(primals)} example inputs")
    step.example_shapes = [tuple(t.shape) for t, k in zip(primals, kinds) if k == "input"]
    step.tangents = example_tangents(tang_ph, name)
    return step
