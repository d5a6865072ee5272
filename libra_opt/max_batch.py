"""The largest batch that trains under a hard memory cap (``libra-opt max-batch``).

- :func:`max_batch` (needs CUDA: the cap is
  ``torch.cuda.set_per_process_memory_fraction(cap / total)``, see
  :func:`memory_cap`, so going over it is an out-of-memory error, not a
  silent pass) measures it with the OOM-safe search of
  :mod:`libra_opt.batch_search` over the training steps of
  :mod:`libra_opt.train_methods`;
- :func:`predict_max_batch` (no GPU needed: profiles at two small batches,
  extrapolates every storage's bytes linearly in the batch with
  :func:`scale_problem`, and asks the simulator / solver at each batch; a
  prediction, not a measurement).

Both return a :class:`MaxBatchResult`.  The memory budget handed to a solver
at batch ``b`` is ``cap - fixed(b) - reserve``
(:func:`~libra_opt.train_methods.solver_budget`).

Sources: ``torch.cuda.set_per_process_memory_fraction``,
``torch.cuda.max_memory_allocated``, ``torch.OutOfMemoryError``; the
max-batch experiment of Libra (Wang, NTHU 2024: max batch 3.12x PyTorch) and
of Checkmate (Jain et al., MLSys 2020, sec. 6.3: maximum batch size under a
memory budget).
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .batch_search import SearchResult, Trial, free_device_memory, oom_safe, search_max_batch
from .errors import LibraOptError
from .train_methods import (DEFAULT_RESERVE, REFERENCE_METHODS, fixed_memory_bytes, make_train_step, method_names,
                            solver_budget, time_steps)
from .units import format_bytes, parse_bytes

if TYPE_CHECKING:  # pragma: no cover
    from .problem import RematProblem

logger = logging.getLogger(__name__)

__all__ = ["MaxBatchResult", "NO_CUDA_MESSAGE", "memory_cap", "max_batch", "predict_max_batch", "scale_problem"]


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
            lines.append(f"  peak memory at batch {self.batch}: {format_bytes(self.peak_bytes)}")
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

    Raises
    ------
    LibraOptError
        No CUDA, or a cap above the device's total memory.
    """
    if not torch.cuda.is_available():
        raise LibraOptError(NO_CUDA_MESSAGE)
    device = torch.device(device)
    total = torch.cuda.get_device_properties(device).total_memory
    if cap_bytes > total:
        raise LibraOptError(f"the cap {format_bytes(cap_bytes)} is above the GPU's total memory "
                            f"{format_bytes(total)}; pass a smaller --memory")
    free_device_memory()
    torch.cuda.set_per_process_memory_fraction(cap_bytes / total, device)
    try:
        yield total
    finally:
        free_device_memory()
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def max_batch(model: str, memory, method: str = "libra", *, seq: int | None = None,
              device: str | torch.device = "cuda", dtype: torch.dtype = torch.float32,
              autocast_dtype: torch.dtype | None = None, reserve: float | int = DEFAULT_RESERVE,
              start: int = 1, limit: int | None = None, steps: int = 2, time_repeats: int = 3,
              solver_options: dict | None = None, progress: bool = True, guess: int | None = None
              ) -> MaxBatchResult:
    """Measure the largest batch that trains under a hard cap on a CUDA GPU.

    Parameters
    ----------
    model : str
        Zoo name (see :mod:`libra_opt.zoo`) or ``"module:callable"``.
    memory : int or str
        The cap, e.g. ``"16GiB"``.
    method : str
        ``"none"`` (eager), ``"checkpoint"``, ``"save-on-cpu"`` or a solver.
    seq : int, optional
        Sequence length / image side.
    device : str or torch.device
        A CUDA device.
    dtype : torch.dtype
        Parameter dtype.
    autocast_dtype : torch.dtype, optional
        Mixed precision, e.g. ``torch.bfloat16``.
    reserve : float or int
        Kept out of a solver's budget: a fraction of the cap or bytes.
    start, limit : int
        First batch probed; largest batch probed.
    guess : int, optional
        A predicted maximum (e.g. :func:`predict_max_batch`'s): the search
        brackets the answer around it (:func:`search_max_batch`), about half
        the probes of a search from ``start``.
    steps : int
        Training steps run per probe (>= 2: the first allocates the AdamW
        state, so the second is the steady state).
    time_repeats : int
        Timed steps at the maximum batch (median).
    solver_options : dict, optional
    progress : bool
        ``tqdm`` bar over the probes.

    Returns
    -------
    MaxBatchResult

    Raises
    ------
    LibraOptError
        No CUDA (the message suggests ``--simulate``), a bad cap, an unknown
        method.

    Notes
    -----
    For a solver, capture, profiling and planning run *without* the cap (they
    run the unplanned step once per op); only the training steps run under
    it.  A user of a GPU whose total memory is the cap would profile at a
    smaller batch and extrapolate (:func:`predict_max_batch`).
    """
    from .zoo import build_model

    cap = _parse_cap(memory)
    if not torch.cuda.is_available():
        raise LibraOptError(NO_CUDA_MESSAGE)
    device = torch.device(device)
    if device.type != "cuda":
        raise LibraOptError(f"max-batch measures under a CUDA memory cap; got device {device}. Use 'cuda' "
                            f"or --simulate")
    if method not in method_names():
        raise LibraOptError(f"unknown method {method!r}; use one of {', '.join(method_names())}")
    notes = [f"cap: torch.cuda.set_per_process_memory_fraction({format_bytes(cap)} / GPU total) during "
             f"the training steps; AdamW (fused), {steps} steps per probe"]
    is_solver = method not in REFERENCE_METHODS
    if is_solver:
        res = format_bytes(int(reserve * cap)) if isinstance(reserve, float) else format_bytes(reserve)
        notes.append(f"solver budget at batch b = cap - fixed(b) - reserve {res}; fixed = parameters + buffers "
                     f"+ AdamW state (2x trainable) + the input batch; gradients are graph outputs, inside "
                     f"the budget")
        notes.append("capture, profiling and planning ran without the cap; only the training steps ran under it")
    def step_at(batch: int):
        torch._dynamo.reset()  # each probe compiles anew; keep Dynamo's per-code cache from filling up
        zm = build_model(model, batch, seq, device=device, dtype=dtype)
        budget = None
        if is_solver:
            fixed = fixed_memory_bytes(zm.model, (zm.args, zm.kwargs))["total"]
            budget = solver_budget(cap, fixed, reserve)
        train = make_train_step(method, zm, budget=budget, autocast_dtype=autocast_dtype,
                                solver_options=solver_options)
        with memory_cap(cap, device):
            torch.cuda.reset_peak_memory_stats(device)
            for _ in range(max(1, steps)):
                train()
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device)
        return {"peak_bytes": peak, "budget_bytes": budget}

    fits = oom_safe(step_at)
    search = search_max_batch(fits, start=start, limit=limit, guess=guess, progress=progress,
                              desc=f"max-batch {model} {method}")
    del fits
    result = MaxBatchResult(model, method, cap, search.batch, None, None, False, search, notes)
    free_device_memory()
    if search.batch > 0:
        torch._dynamo.reset()
        zm = build_model(model, search.batch, seq, device=device, dtype=dtype)
        budget = None
        if is_solver:
            budget = solver_budget(cap, fixed_memory_bytes(zm.model, (zm.args, zm.kwargs))["total"], reserve)
        train = make_train_step(method, zm, budget=budget, autocast_dtype=autocast_dtype,
                                solver_options=solver_options)
        with memory_cap(cap, device):
            torch.cuda.reset_peak_memory_stats(device)
            step_s, _ = time_steps(train, device, warmup=1, repeats=time_repeats)
            result.peak_bytes = int(torch.cuda.max_memory_allocated(device))
        result.step_s = step_s
        result.samples_per_s = search.batch / step_s
        del train, zm
        free_device_memory()
    return result


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


def _reserve_bytes(cap: int, reserve: float | int) -> int:
    return int(reserve * cap) if isinstance(reserve, float) and reserve < 1 else int(reserve)


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
    from .simulator import no_remat_peak, simulate
    from .solvers import available_solvers, solve

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
        from .profiling import profile

        problems = tuple(profile(model, batch=b, seq=seq, device="cpu", dtype=dtype, optimizer="adam",
                                 autocast_dtype=autocast_dtype, warmup=1, repeats=1, progress=False)
                         for b in (b1, b2))
    p1, p2 = problems
    res = _reserve_bytes(cap, reserve)
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
    if search.batch > 0:
        p, budget, sim, _ = plan_at(search.batch)
        if sim is not None:
            result.step_s = float(sim.time_s)
            result.samples_per_s = search.batch / sim.time_s if sim.time_s > 0 else None
            result.peak_bytes = int(sim.peak_bytes + p.fixed.resident_bytes)
    logger.info("predicted max batch of %s with %s under %s: %d (no-remat peak at batch %d: %s)", model, method,
                format_bytes(cap), search.batch, b2, format_bytes(no_remat_peak(p2)))
    return result
