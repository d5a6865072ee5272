"""The largest batch that trains under a hard memory cap (``libra-opt max-batch``).

- :func:`max_batch` (needs CUDA: the cap is
  ``torch.cuda.set_per_process_memory_fraction(cap / total)``, see
  :func:`memory_cap`, so going over it is an out-of-memory error, not a
  silent pass) measures it with the OOM-safe search of
  :mod:`libra_opt.batch_search` over the training steps of
  :mod:`libra_opt.train_methods`.  For a solver, the unplanned step runs
  only at two small batches (profiling); every probe is planned from the
  step captured at its batch with op times extrapolated from them, within
  ``cap - resident(b) - reserve`` (resident memory measured on the device:
  :func:`~libra_opt.train_methods.measure_resident`), calibrated by the
  closed loop (:mod:`libra_opt.calibrate`) and checked by real steps under
  the cap;
- :func:`predict_max_batch` (no GPU needed: profiles at two small batches,
  extrapolates every storage's bytes linearly in the batch with
  :func:`scale_problem`, and asks the simulator / solver at each batch; a
  prediction, not a measurement; there the budget is ``cap - fixed(b) -
  reserve`` with the fixed memory counted from the tensors).

Both return a :class:`MaxBatchResult`, which says what limits the batch
(:func:`memory_floor`: the op whose working set is the memory floor).

Sources: ``torch.cuda.set_per_process_memory_fraction``,
``torch.cuda.max_memory_allocated``, ``max_memory_reserved``,
``torch.OutOfMemoryError``; the
max-batch experiment of Libra (Wang, NTHU 2024: max batch 3.12x PyTorch) and
of Checkmate (Jain et al., MLSys 2020, sec. 6.3: maximum batch size under a
memory budget).
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from .batch_search import SearchResult, Trial, free_device_memory, oom_safe, search_max_batch
from ..errors import InfeasibleBudgetError, LibraOptError
from ..runtime.memory import CudaMemory, configure_allocator, cuda_index, release_cached
from .train_methods import (DEFAULT_RESERVE, REFERENCE_METHODS, OptimizedStep, TrainStep, make_train_step,
                            measure_resident, method_names, reserve_bytes, time_steps)
from ..ir.units import format_bytes, parse_bytes

if TYPE_CHECKING:  # pragma: no cover
    from ..ir.problem import RematProblem

logger = logging.getLogger(__name__)

__all__ = ["MaxBatchResult", "NO_CUDA_MESSAGE", "memory_cap", "max_batch", "memory_floor", "predict_max_batch",
           "scale_problem", "search_under_cap"]


# =================================================================== results
@dataclass
class MaxBatchResult:
    """Outcome of :func:`max_batch` or :func:`predict_max_batch`.

    Attributes
    ----------
    model, method : str
    cap_bytes : int
        The memory cap (bytes).
    batch : int
        Largest batch that trained (or is predicted to train) under the cap.
    samples_per_s : float or None
        Throughput at ``batch``: measured (:func:`max_batch`) or, for a
        prediction, ``batch`` over the simulated step time built from the
        profiled op times (of the profiling device: a CPU's times say nothing
        about a GPU's).
    step_s : float or None
        Step time at ``batch`` (s), measured or simulated.
    predicted : bool
        True for :func:`predict_max_batch`.
    search : SearchResult
    notes : list of str
        How the cap and the budget were set, and caveats.
    peak_bytes : int or None
        Measured ``torch.cuda.max_memory_allocated`` of the step at ``batch``
        (or the predicted peak with fixed memory).
    planned_peak_bytes : int or None
        A solver's plan at ``batch`` as a device total: measured resident
        memory + the plan's simulated peak (bytes).
    reserved_peak_bytes : int or None
        Measured ``torch.cuda.max_memory_reserved`` at ``batch``: what the cap
        bounds (bytes).
    limit : str
        What stopped the search: the memory floor at the first batch that
        failed (the op whose working set does not fit:
        :func:`memory_floor`), the plan / allocator there, or the search limit.
    resident : ResidentMemory or None
        Measured before the timed step at ``batch``.
    calibration : list of CalibrationStep
        The closed loop's iterations at ``batch`` (solvers with ``calibrate``).
    """

    model: str
    method: str
    cap_bytes: int
    batch: int
    samples_per_s: float | None
    step_s: float | None
    predicted: bool
    search: SearchResult
    notes: list[str] = field(default_factory=list)
    peak_bytes: int | None = None
    planned_peak_bytes: int | None = None
    reserved_peak_bytes: int | None = None
    limit: str = ""
    resident: Any = None
    calibration: list = field(default_factory=list)

    def summary(self) -> str:
        """A few lines for people."""
        kind = "predicted" if self.predicted else "measured"
        lines = [f"model {self.model}, method {self.method}, cap {format_bytes(self.cap_bytes)}:",
                 f"  max batch ({kind}): {self.batch}" + (" (search stopped at --limit)"
                                                          if self.search.limit_reached else "")]
        if self.samples_per_s is not None:
            lines.append(f"  samples/s at batch {self.batch}: {self.samples_per_s:.2f} "
                         f"(step {self.step_s * 1e3:.1f} ms{', simulated' if self.predicted else ''})")
        if self.peak_bytes is not None:
            lines.append(f"  peak memory at batch {self.batch}: {format_bytes(self.peak_bytes)}"
                         + ("" if self.predicted else " allocated"))
        if self.planned_peak_bytes is not None or self.reserved_peak_bytes is not None:
            fmt = (lambda b: "-" if b is None else format_bytes(b))
            lines.append(f"  planned peak {fmt(self.planned_peak_bytes)}, measured reserved peak "
                         f"{fmt(self.reserved_peak_bytes)} (cap {format_bytes(self.cap_bytes)})")
        if self.resident is not None:
            lines.append(f"  {self.resident}")
        lines += [f"  calibration: {c}" for c in self.calibration]
        if self.limit:
            lines.append(f"  limited by: {self.limit}")
        lines.append("  probes: " + ", ".join(f"{t.batch}{'ok' if t.fits else 'x'}" for t in self.search.trials))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


# ============================================================ on a real GPU
NO_CUDA_MESSAGE = ("max-batch needs a CUDA GPU for a hard cap; this machine has none. Run it on a GPU, or pass "
                   "--simulate to predict the largest batch from CPU profiles and the simulator")


def _parse_cap(memory) -> int:
    try:
        cap = parse_bytes(memory)
    except ValueError as e:
        raise LibraOptError(f"--memory: {e}") from None
    if cap <= 0:
        raise LibraOptError(f"the memory cap must be > 0 bytes, got {memory!r}")
    return cap


@contextlib.contextmanager
def memory_cap(cap_bytes: int, device: torch.device | str = "cuda"):
    """Context: cap the caching allocator at ``cap_bytes`` on ``device`` with
    ``torch.cuda.set_per_process_memory_fraction(cap / total)``; restores 1.0
    on exit.  Going over the cap raises ``torch.OutOfMemoryError``.

    ``device`` may be ``"cuda"`` (the current device) or ``"cuda:N"``: the
    index is resolved (:func:`~libra_opt.runtime.memory.cuda_index`).

    Raises
    ------
    LibraOptError
        No CUDA, or a cap above the device's total memory.
    """
    if not torch.cuda.is_available():
        raise LibraOptError(NO_CUDA_MESSAGE)
    index = cuda_index(device)          # set_per_process_memory_fraction needs an index, not "cuda"
    total = torch.cuda.get_device_properties(index).total_memory
    if cap_bytes > total:
        raise LibraOptError(f"the cap {format_bytes(cap_bytes)} is above the GPU's total memory "
                            f"{format_bytes(total)}; pass a smaller --memory")
    free_device_memory()
    torch.cuda.set_per_process_memory_fraction(cap_bytes / total, index)
    try:
        yield total
    finally:
        free_device_memory()
        torch.cuda.set_per_process_memory_fraction(1.0, index)


def max_batch(model: str, memory, method: str = "libra", *, executor: Any = None, calibrate: bool = True,
              seq: int | None = None, device: str | torch.device = "cuda", dtype: torch.dtype = torch.float32,
              autocast_dtype: torch.dtype | None = None, reserve: float | int | None = None, start: int = 1,
              limit: int | None = None, steps: int = 2, time_repeats: int = 3, solver_options: dict | None = None,
              progress: bool = True, guess: int | None = None, profile_batches: tuple[int, int] = (2, 4),
              max_calibrations: int = 3) -> MaxBatchResult:
    """Measure the largest batch that trains under a hard cap on a CUDA GPU.

    For a solver (``"libra"``, ...), the unplanned step is profiled only at
    the two small ``profile_batches``; at every probed batch ``b`` the step is
    captured (fake tensors: exact bytes, nothing runs), its op times and
    workspace are extrapolated linearly from the profiles
    (:func:`scale_problem`), and the problem is planned within ``cap -
    resident(b) - reserve`` where ``resident(b)`` is measured on the device
    before the step (parameters, buffers, the AdamW state created up front,
    the input batch, the allocator's overhead: :func:`~libra_opt.train_methods.measure_resident`).
    A probe whose memory floor (:func:`libra_opt.bounds.memory_lower_bound`)
    is above that budget fails without planning.  With ``calibrate``, the plan
    goes through the closed loop (``optimize(calibrate=True)``: one measured
    step, re-planned with the overshoot of the reserved peak removed); then
    ``steps`` real training steps (forward, backward, fused AdamW) run under
    the cap (``torch.cuda.set_per_process_memory_fraction``), so a probe that
    fits has trained there.  Without ``guess``, the search starts from the
    batch :func:`predict_max_batch` predicts from the two profiles.

    Parameters
    ----------
    model : str
        Zoo name (see :mod:`libra_opt.zoo`) or ``"module:callable"``.
    memory : int or str
        The cap, e.g. ``"16GiB"``.
    method : str
        ``"none"`` (eager), ``"checkpoint"``, ``"save-on-cpu"`` or a solver.
    executor : optional
        Passed to :func:`libra_opt.optimize` as ``executor=`` when given (the
        runtime's executor; solvers only).
    calibrate : bool
        Plan with the closed loop (solvers only; default True).
    seq : int, optional
        Sequence length / image side.
    device : str or torch.device
        A CUDA device (``"cuda"`` is the current one).
    dtype : torch.dtype
        Parameter dtype.
    autocast_dtype : torch.dtype, optional
        Mixed precision, e.g. ``torch.bfloat16``.
    reserve : float or int, optional
        Kept out of a solver's budget: a fraction of the cap or bytes.
        Default: 0 with ``calibrate`` (the loop measures the allocator's
        overhead), else :data:`~libra_opt.train_methods.DEFAULT_RESERVE`.
    start, limit : int
        First batch probed; largest batch probed.
    steps : int
        Training steps run per probe under the cap (>= 2: the second starts
        from the cache the first left).
    time_repeats : int
        Timed steps at the maximum batch (median).
    solver_options : dict, optional
    progress : bool
        ``tqdm`` bar over the probes.
    guess : int, optional
        Where the search brackets the answer (:func:`search_max_batch`).
    profile_batches : (int, int)
        The two small batches the unplanned step is profiled at (solvers).
    max_calibrations : int
        Plans made at most per probe by the closed loop.

    Returns
    -------
    MaxBatchResult
        ``batch``, ``samples_per_s`` at it, ``planned_peak_bytes`` and
        ``reserved_peak_bytes`` (device totals at that batch: resident +
        planned peak, and ``max_memory_reserved``), ``limit`` (what stopped
        the search), ``calibration`` and ``resident`` of the timed run.

    Raises
    ------
    LibraOptError
        No CUDA (the message suggests ``--simulate``), a bad cap, an unknown
        method, or ``executor`` with a PyTorch reference method.
    """
    cap = _parse_cap(memory)
    if not torch.cuda.is_available():
        raise LibraOptError(NO_CUDA_MESSAGE)
    device = torch.device(device)
    if device.type != "cuda":
        raise LibraOptError(f"max-batch measures under a CUDA memory cap; got device {device}. Use 'cuda' "
                            f"or --simulate")
    if method not in method_names():
        raise LibraOptError(f"unknown method {method!r}; use one of {', '.join(method_names())}")
    allocator = configure_allocator()
    note = (f"cap: torch.cuda.set_per_process_memory_fraction({format_bytes(cap)} / GPU total) during the training "
            f"steps; AdamW (fused), {steps} steps per probe; allocator: {allocator}")
    return search_under_cap(model, cap, method, memory=CudaMemory(device), capped=lambda module: memory_cap(cap, device),
                            note=note, executor=executor, calibrate=calibrate, seq=seq, device=device, dtype=dtype,
                            autocast_dtype=autocast_dtype, reserve=reserve, start=start, limit=limit, steps=steps,
                            time_repeats=time_repeats, solver_options=solver_options, progress=progress, guess=guess,
                            profile_batches=profile_batches, max_calibrations=max_calibrations)


def search_under_cap(model: str, cap: int, method: str, *, memory, capped: Callable[[Any], Any], note: str = "",
                     executor: Any = None, calibrate: bool = True, seq: int | None = None,
                     device: str | torch.device = "cuda", dtype: torch.dtype = torch.float32,
                     autocast_dtype: torch.dtype | None = None, reserve: float | int | None = None, start: int = 1,
                     limit: int | None = None, steps: int = 2, time_repeats: int = 3,
                     solver_options: dict | None = None, progress: bool = True, guess: int | None = None,
                     profile_batches: tuple[int, int] = (2, 4), max_calibrations: int = 3) -> MaxBatchResult:
    """The search of :func:`max_batch` on any device memory: ``memory`` (a
    :class:`~libra_opt.runtime.memory.DeviceMemory`) is measured, and the
    training steps of each probe run inside ``capped(module)`` (a context that
    makes going over ``cap`` bytes an out-of-memory error; ``module`` is the
    probe's :class:`~libra_opt.runtime.module.OptimizedModule`, ``None`` for
    a PyTorch reference method).  :func:`max_batch` passes
    :class:`~libra_opt.runtime.memory.CudaMemory` and :func:`memory_cap`; a CPU
    test passes a :class:`~libra_opt.runtime.memory.FakeCachingAllocator` with
    a cap and its ``tracking`` context.  Parameters and result as in
    :func:`max_batch` (``cap`` in bytes; ``note`` opens the result's notes).

    Raises
    ------
    LibraOptError
        Unknown method, or ``executor`` with a PyTorch reference method.
    """
    from .zoo import build_model

    if method not in method_names():
        raise LibraOptError(f"unknown method {method!r}; use one of {', '.join(method_names())}")
    is_solver = method not in REFERENCE_METHODS
    if executor is not None and not is_solver:
        raise LibraOptError(f"executor= applies to libra-opt's solvers, not to PyTorch's {method!r}")
    device = torch.device(device)
    mem = memory
    if reserve is None:
        reserve = 0 if (calibrate and is_solver) else DEFAULT_RESERVE
    res_bytes = reserve_bytes(cap, reserve)
    notes = [note] if note else []
    profiles = None
    if is_solver:
        notes.append(f"solver budget at batch b = cap - resident(b) - reserve {format_bytes(res_bytes)}; resident "
                     f"measured on the device before the step (parameters, buffers, AdamW state, the batch, "
                     f"allocator overhead); gradients are graph outputs, inside the budget")
        b1, b2 = (int(b) for b in profile_batches)
        profiles = _profile_small(model, (b1, b2), seq=seq, device=device, dtype=dtype,
                                  autocast_dtype=autocast_dtype)
        notes.append(f"the unplanned step was profiled at batches {b1} and {b2} only; op times at other batches "
                     f"are extrapolated linearly" + ("; plans calibrated by one measured step (closed loop)"
                                                     if calibrate else ""))
        if guess is None:
            try:
                guess = predict_max_batch(model, cap, method, problems=profiles, profile_batches=(b1, b2),
                                          reserve=res_bytes, limit=limit, solver_options=solver_options,
                                          progress=False,
                                          bandwidth_bytes_per_s=float(profiles[1].device.h2d_bytes_per_s)
                                          ).batch or None
            except LibraOptError as e:  # a failed prediction only costs the guided search
                logger.warning("no prediction to start from (%s); searching from batch %d", e, start)
    floors: dict[int, dict] = {}

    def probe(batch: int, time_it: bool = False) -> dict:
        torch._dynamo.reset()  # each probe compiles anew; keep Dynamo's per-code cache from filling up
        release_cached(device)
        zm = build_model(model, batch, seq, device=device, dtype=dtype)
        info: dict[str, Any] = {"batch": batch}
        if is_solver:
            box: list = []
            train = TrainStep(lambda: box[0].loss(), zm.model.parameters(), device)
            resident = measure_resident(zm.model, train.optimizer, (zm.args, zm.kwargs), mem)
            budget = cap - resident.reserved_bytes - res_bytes
            info.update(resident=resident, budget_bytes=budget)
            if budget <= 0:
                raise InfeasibleBudgetError(max(budget, 0), None, method,
                                            f"{resident} fills the cap of {format_bytes(cap)}")
            builder = _scaled_builder(profiles, profile_batches, batch, budget, method, floors)
            opts = dict(solver_options or {})
            if executor is not None:
                opts["executor"] = executor
            from ..optimize import optimize

            om = optimize(zm.model, zm.args, budget, solver=method, example_kwargs=zm.kwargs,
                          autocast_dtype=autocast_dtype, loss_fn=zm.loss_fn, calibrate=calibrate,
                          max_calibrations=max_calibrations, problem_builder=builder, **opts)
            box.append(OptimizedStep(om, zm, loss_in_module=zm.loss_fn is not None))
            info.update(module=om, planned_peak_bytes=resident.reserved_bytes + int(om.plan.peak_bytes),
                        solver_budget_bytes=int(om.plan.budget_bytes), calibration=list(om.calibration))
        else:
            train = make_train_step(method, zm, autocast_dtype=autocast_dtype)
            info["resident"] = measure_resident(zm.model, train.optimizer, (zm.args, zm.kwargs), mem)
        mem.empty_cache()               # the capped steps start from an empty cache, as the calibration's did
        with capped(info.get("module")):
            mem.reset_peak()
            for _ in range(max(1, steps)):
                train()
            if time_it:
                info["step_s"], _ = time_steps(train, device, warmup=0, repeats=time_repeats)
            mem.synchronize()
            info.update(peak_bytes=mem.peak_allocated(), reserved_peak_bytes=mem.peak_reserved())
        del train, zm
        info.pop("module", None)
        return info

    fits = oom_safe(probe)
    search = search_max_batch(fits, start=start, limit=limit, guess=guess, progress=progress,
                              desc=f"max-batch {model} {method}")
    del fits
    result = MaxBatchResult(model, method, cap, search.batch, None, None, False, search, notes)
    result.limit = _what_limits(search, floors, limit)
    release_cached(device)
    if search.batch > 0:
        t = oom_safe(lambda b: probe(b, time_it=True))(search.batch)
        if t.fits:
            info = t.info
            result.step_s = info["step_s"]
            result.samples_per_s = search.batch / info["step_s"]
            result.peak_bytes = int(info["peak_bytes"])
            result.reserved_peak_bytes = int(info["reserved_peak_bytes"])
            result.planned_peak_bytes = info.get("planned_peak_bytes")
            result.resident = info.get("resident")
            result.calibration = info.get("calibration", [])
        else:
            result.notes.append(f"the timing run at batch {search.batch} did not fit: {t.reason}")
    torch._dynamo.reset()               # Dynamo's cache holds the last probe's module (and its gradients)
    mem.empty_cache()
    return result


def _profile_small(model: str, batches: tuple[int, int], *, seq, device, dtype, autocast_dtype):
    """The problems of ``model`` profiled on ``device`` at two small batches
    (the only batches where the unplanned step runs); the cache is released after each."""
    from ..frontend.profiling import profile

    if not 2 <= batches[0] < batches[1]:
        raise LibraOptError(f"profile batches must be two increasing batches >= 2, got {batches}")
    out = []
    for b in batches:
        torch._dynamo.reset()
        out.append(profile(model, batch=b, seq=seq, device=device, dtype=dtype, optimizer="adam",
                           autocast_dtype=autocast_dtype, warmup=1, repeats=3, progress=False))
        release_cached(device)
    return tuple(out)


def memory_floor(problem: "RematProblem") -> dict:
    """The memory floor of a problem and the op that sets it.

    Returns
    -------
    dict
        ``bytes`` (:func:`libra_opt.bounds.memory_lower_bound`: no plan needs
        less graph memory), ``node`` (name), ``target`` (aten op) and
        ``module`` (where in the model) of the op whose working set is the
        largest (:func:`libra_opt.bounds.node_memory_lower_bounds`); ``node`` is
        ``None`` when the step's outputs together set the floor.
    """
    from ..passes.bounds import memory_lower_bound, node_memory_lower_bounds

    floor = memory_lower_bound(problem)
    per = node_memory_lower_bounds(problem)
    out = {"bytes": int(floor), "node": None, "target": None, "module": None}
    if len(per) and int(per.max()) >= floor:
        n = problem.nodes[int(per.argmax())]
        out.update(node=n.name, target=n.target, module=getattr(n, "module", None) or None)
    return out


def _floor_text(f: dict) -> str:
    if f["node"] is None:
        return f"the step's outputs together need {format_bytes(f['bytes'])}"
    where = f" in {f['module']}" if f.get("module") else ""
    return f"op {f['node']} ({f['target']}{where}) needs {format_bytes(f['bytes'])} at once"


def _scaled_builder(profiles, batches, batch: int, budget: int, method: str, floors: dict):
    """``problem_builder`` for :func:`libra_opt.optimize` at ``batch``: the
    captured step's exact bytes with op times and workspace extrapolated from
    the two profiles; raises :class:`InfeasibleBudgetError` when the memory
    floor is above ``budget`` (recorded in ``floors[batch]``)."""
    from ..frontend.capture import build_problem

    (p1, p2), (b1, b2) = profiles, batches

    def build(step):
        scaled = scale_problem(p1, b1, p2, b2, batch)
        times = {n.name: n.time_s for n in scaled.nodes}
        ws = {n.name: n.workspace_bytes for n in scaled.nodes}
        names = [n.name for n in step.joint.graph.nodes if n.op == "call_function"]
        missing = [n for n in names if n not in times and not n.startswith("getitem")]
        if missing:
            raise LibraOptError(f"the graph captured at batch {batch} differs from the one profiled at {b1} and "
                                f"{b2} (e.g. {missing[0]}); op times cannot be extrapolated: profile at batches "
                                f"closer to it (profile_batches=)")
        problem = build_problem(step, times=times, workspace=ws, device=p2.device, optimizer="adam")
        f = memory_floor(problem)
        floors[batch] = {**f, "budget_bytes": int(budget)}
        if f["bytes"] > budget:
            raise InfeasibleBudgetError(budget, f["bytes"], method, f"memory floor at batch {batch}: {_floor_text(f)}")
        return problem

    return build


def _what_limits(search: SearchResult, floors: dict, limit: int | None) -> str:
    """What stopped the search: the ``limit``, the memory floor (the op whose
    working set does not fit) or the first failing probe's reason."""
    if search.limit_reached:
        return f"the search limit (batch {limit}): the true maximum may be larger"
    bad = search.first_failure
    if bad is None:
        return "nothing failed"
    reason = search.trial(bad).reason
    f = floors.get(bad)
    if f is not None and f["budget_bytes"] <= 0:
        f = None                         # resident memory alone fills the cap: the reason says so
    if f is not None and f["bytes"] > f["budget_bytes"]:
        return (f"the memory floor at batch {bad}: {_floor_text(f)}, above the budget "
                f"{format_bytes(f['budget_bytes'])}")
    if f is not None:
        return (f"batch {bad}: {reason} (its memory floor, {_floor_text(f)}, is within the budget "
                f"{format_bytes(f['budget_bytes'])}: the plan or the allocator sets the limit, not the floor)")
    return f"batch {bad}: {reason}"


# ======================================================= prediction (no GPU)
def scale_problem(p1: "RematProblem", b1: int, p2: "RematProblem", b2: int, batch: int) -> "RematProblem":
    """The problem at ``batch``, extrapolated linearly from profiles at ``b1``
    and ``b2``.

    Every storage's bytes, every node's time and workspace, and the fixed
    memory's input bytes are ``v(b) = v1 + (v2 - v1) (b - b1) / (b2 - b1)``,
    clipped at 0 (parameters, buffers, optimizer state: as profiled).

    Parameters
    ----------
    p1, p2 : RematProblem
        Profiles of the same model at batches ``b1 < b2``: the same graph
        (same node names in the same order, same tensors and storages).
    b1, b2 : int
    batch : int
        Target batch (>= 1).

    Returns
    -------
    RematProblem
        Named ``<p2 name>@b<batch>``; provenance ``extra["extrapolated_from"]
        = [b1, b2]``.

    Raises
    ------
    LibraOptError
        The two graphs differ (e.g. the batch changed the traced graph): the
        message says to profile at batches >= 2.
    """
    import dataclasses

    if not b1 < b2:
        raise LibraOptError(f"need two profiling batches b1 < b2, got {b1}, {b2}")
    if len(p1.nodes) != len(p2.nodes) or len(p1.tensors) != len(p2.tensors) or any(
            a.name != b.name or a.inputs != b.inputs for a, b in zip(p1.nodes, p2.nodes)) or any(
            a.storage != b.storage for a, b in zip(p1.tensors, p2.tensors)):
        raise LibraOptError(f"the graphs profiled at batch {b1} and {b2} differ, so bytes cannot be "
                            f"extrapolated linearly; profile at batches >= 2 (tracing specializes batch 1)")
    k = (batch - b1) / (b2 - b1)

    def lin(a, b):
        return max(0.0, a + (b - a) * k)

    tensors = [dataclasses.replace(t2, nbytes=int(round(lin(t1.nbytes, t2.nbytes))) if not t2.is_view else 0,
                                   shape=None)
               for t1, t2 in zip(p1.tensors, p2.tensors)]
    nodes = [dataclasses.replace(n2, time_s=lin(n1.time_s, n2.time_s),
                                 workspace_bytes=int(round(lin(n1.workspace_bytes, n2.workspace_bytes))))
             for n1, n2 in zip(p1.nodes, p2.nodes)]
    fixed = dataclasses.replace(p2.fixed, inputs_bytes=int(round(lin(p1.fixed.inputs_bytes,
                                                                     p2.fixed.inputs_bytes))))
    prov = dataclasses.replace(p2.provenance, batch=batch,
                               extra={**p2.provenance.extra, "extrapolated_from": [b1, b2]})
    return p2.replace(nodes=nodes, tensors=tensors, fixed=fixed, provenance=prov, name=f"{p2.name}@b{batch}")


def predict_max_batch(model: str, memory, method: str = "libra", *, seq: int | None = None,
                      profile_batches: tuple[int, int] = (2, 4), reserve: float | int = DEFAULT_RESERVE,
                      start: int = 1, limit: int | None = 1 << 16, dtype: torch.dtype = torch.float32,
                      autocast_dtype: torch.dtype | None = None, bandwidth_bytes_per_s: float = 55e9,
                      problems: tuple["RematProblem", "RematProblem"] | None = None,
                      solver_options: dict | None = None, progress: bool = True, guess: int | None = None
                      ) -> MaxBatchResult:
    """Predict the largest batch under a cap from CPU profiles and the simulator.

    Profiles the model on the CPU at two batches, extrapolates the problem to
    any batch (:func:`scale_problem`), and searches (:func:`search_max_batch`)
    for the largest batch whose plan fits: for ``"none"``, the no-remat peak;
    for a solver, a plan within ``cap - fixed(b) - reserve`` found by it.  In
    both cases ``peak graph memory + fixed(b) <= cap - reserve``.

    Parameters
    ----------
    model : str
        Zoo name or ``"module:callable"``.
    memory : int or str
        The cap, e.g. ``"16GiB"``.
    method : str
        ``"none"`` or a registered solver (PyTorch's ``checkpoint`` and
        ``save-on-cpu`` are not modelled by the simulator).
    seq : int, optional
    profile_batches : (int, int)
        The two batches profiled (>= 2 each, ascending).
    reserve : float or int
        As in :func:`max_batch`.
    start, limit : int
        Search range.
    dtype, autocast_dtype : torch.dtype
    bandwidth_bytes_per_s : float
        Host<->device bandwidth assumed for swaps (each way; default 55 GB/s,
        H100 PCIe pinned), with copies overlapping compute as on a GPU.
    problems : (RematProblem, RematProblem), optional
        Already profiled problems at ``profile_batches`` (skips profiling).
    solver_options : dict, optional
    progress : bool
    guess : int, optional
        Where the search starts bracketing (:func:`search_max_batch`).

    Returns
    -------
    MaxBatchResult
        ``predicted=True``; ``samples_per_s`` from the simulated step time
        (CPU-profiled op times); ``peak_bytes`` the predicted peak with fixed
        memory.

    Raises
    ------
    LibraOptError
        A reference method, an unknown solver, bad profile batches, or graphs
        that differ between the profiled batches.
    """
    from ..passes.simulator import no_remat_peak, simulate
    from ..solvers import available_solvers, solve

    cap = _parse_cap(memory)
    if method in ("checkpoint", "save-on-cpu"):
        raise LibraOptError(f"--simulate predicts with the simulator, which models solvers' plans, not PyTorch's "
                            f"{method!r}; use --solver none or a solver ({', '.join(available_solvers())}), or "
                            f"measure {method!r} on a GPU without --simulate")
    if method != "none" and method not in available_solvers():
        raise LibraOptError(f"unknown method {method!r}; use none or one of {', '.join(available_solvers())}")
    b1, b2 = (int(b) for b in profile_batches)
    if not 2 <= b1 < b2:
        raise LibraOptError(f"profile batches must be two increasing batches >= 2, got {profile_batches}")
    if problems is None:
        from ..frontend.profiling import profile

        problems = tuple(profile(model, batch=b, seq=seq, device="cpu", dtype=dtype, optimizer="adam",
                                 autocast_dtype=autocast_dtype, warmup=1, repeats=1, progress=False)
                         for b in (b1, b2))
    p1, p2 = problems
    res = reserve_bytes(cap, reserve)
    cache: dict[int, tuple] = {}

    def plan_at(batch: int):
        if batch in cache:
            return cache[batch]
        p = scale_problem(p1, b1, p2, b2, batch).with_device(
            name=f"simulated GPU ({format_bytes(cap)} cap)", total_memory_bytes=cap,
            h2d_bytes_per_s=bandwidth_bytes_per_s, d2h_bytes_per_s=bandwidth_bytes_per_s,
            copies_overlap_compute=True)
        budget = cap - p.fixed.resident_bytes - res
        if budget <= 0:
            out = (p, budget, None, f"fixed memory {format_bytes(p.fixed.resident_bytes)} fills the cap")
        elif method == "none":
            sim = simulate(p)
            out = (p, budget, sim, "" if sim.peak_bytes <= budget else
                   f"no-remat peak {format_bytes(sim.peak_bytes)} > budget {format_bytes(budget)}")
        else:
            r = solve(p, int(budget), solver=method, raise_on_infeasible=False, **(solver_options or {}))
            out = (p, budget, r.simulation if r.success else None,
                   "" if r.success else f"no plan within {format_bytes(budget)}")
        cache[batch] = out
        return out

    def fits(batch: int) -> Trial:
        p, budget, sim, why = plan_at(batch)
        return Trial(batch, not why, why, None)

    search = search_max_batch(fits, start=start, limit=limit, guess=guess, progress=progress,
                              desc=f"predict max-batch {model} {method}")
    notes = [f"PREDICTION, not a measurement: profiled on the CPU at batches {b1} and {b2}, every storage's bytes "
             f"extrapolated linearly in the batch, plans checked by the simulator",
             f"fits when peak graph memory + fixed memory <= cap - reserve ({format_bytes(res)}); fixed = "
             f"parameters + buffers + AdamW state + inputs",
             "samples/s comes from CPU-profiled op times: it ranks plans, it does not predict a GPU's speed"]
    result = MaxBatchResult(model, method, cap, search.batch, None, None, True, search, notes)
    floors = {}
    if search.first_failure is not None:
        p, budget, _, _ = plan_at(search.first_failure)
        floors[search.first_failure] = {**memory_floor(p), "budget_bytes": int(budget)}
    result.limit = _what_limits(search, floors, limit)
    if search.batch > 0:
        p, budget, sim, _ = plan_at(search.batch)
        if sim is not None:
            result.step_s = float(sim.time_s)
            result.samples_per_s = search.batch / sim.time_s if sim.time_s > 0 else None
            result.peak_bytes = int(sim.peak_bytes + p.fixed.resident_bytes)
    logger.info("predicted max batch of %s with %s under %s: %d (no-remat peak at batch %d: %s)", model, method,
                format_bytes(cap), search.batch, b2, format_bytes(no_remat_peak(p2)))
    return result
