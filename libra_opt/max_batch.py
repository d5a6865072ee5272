"""The largest batch that trains under a hard memory cap (``libra-opt max-batch``).

Three parts:

- :func:`search_max_batch`: an OOM-safe search over batch sizes: exponential
  growth (1, 2, 4, ...) until a batch fails, then binary search between the
  last batch that fit and the first that did not.  It assumes "fits" is
  monotone in the batch (a bigger batch never needs less memory).
  :func:`oom_safe` turns a training step into the predicate: it catches
  ``torch.OutOfMemoryError`` (and a solver's
  :class:`~libra_opt.errors.InfeasibleBudgetError`), drops every reference
  to the failed step, runs ``gc`` and ``torch.cuda.empty_cache`` and reports
  "does not fit", so the search continues.
- :func:`make_train_step`: one real training step (forward, loss,
  ``backward``, ``AdamW.step``) by a *method*: ``"none"`` (eager PyTorch),
  ``"checkpoint"`` (per-block ``torch.utils.checkpoint``, non-reentrant),
  ``"save-on-cpu"`` (``torch.autograd.graph.save_on_cpu``) or any registered
  solver name (the model is planned by :func:`libra_opt.optimize` within a
  budget and trained with the plan).
- :func:`max_batch` (needs CUDA: the cap is
  ``torch.cuda.set_per_process_memory_fraction(cap / total)``, so going over
  it is an out-of-memory error, not a silent pass) and
  :func:`predict_max_batch` (no GPU needed: profiles at two small batches,
  extrapolates every storage's bytes linearly in the batch with
  :func:`scale_problem`, and asks the simulator / solver at each batch; a
  prediction, not a measurement).

The memory budget handed to a solver at batch ``b`` is
``cap - fixed(b) - reserve``: ``fixed`` is what stays resident for the whole
step and lies outside the plan's graph memory (parameters, buffers, the two
AdamW moment buffers, the input batch: :func:`fixed_memory_bytes`);
gradients are *not* subtracted, because in the problem IR they are graph
outputs produced during backward and already counted in the plan's peak;
``reserve`` (default 5 % of the cap) absorbs the caching allocator's rounding
and fragmentation and the optimizer step's small temporaries.

Sources: ``torch.cuda.set_per_process_memory_fraction``,
``torch.cuda.max_memory_allocated``, ``torch.OutOfMemoryError``,
``torch.utils.checkpoint.checkpoint(use_reentrant=False)``,
``torch.autograd.graph.save_on_cpu``; the max-batch experiment of Libra
(Wang, NTHU 2024: max batch 3.12x PyTorch) and of Checkmate (Jain et al.,
MLSys 2020, sec. 6.3: maximum batch size under a memory budget).
"""
from __future__ import annotations

import contextlib
import functools
import gc
import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import torch
from torch import nn

from .errors import InfeasibleBudgetError, LibraOptError
from .units import format_bytes, parse_bytes

if TYPE_CHECKING:  # pragma: no cover
    from .problem import RematProblem
    from .zoo import ZooModel

logger = logging.getLogger(__name__)

__all__ = ["Trial", "SearchResult", "search_max_batch", "oom_safe", "REFERENCE_METHODS", "method_names",
           "checkpoint_blocks", "fixed_memory_bytes", "make_train_step", "TrainStep", "time_steps",
           "MaxBatchResult", "max_batch", "predict_max_batch", "scale_problem", "solver_budget",
           "DEFAULT_RESERVE"]

#: PyTorch reference methods (not solvers): name -> what it does
REFERENCE_METHODS = {
    "none": "eager PyTorch (keeps every activation)",
    "checkpoint": "per-block torch.utils.checkpoint (use_reentrant=False)",
    "save-on-cpu": "torch.autograd.graph.save_on_cpu(pin_memory=True): every saved activation to host",
}

#: default reserve kept out of a solver's budget: a fraction of the cap
DEFAULT_RESERVE = 0.05

#: exceptions a training step raises when it does not fit (besides OOM)
_NO_FIT_ERRORS = (InfeasibleBudgetError,)


# ====================================================================== search
@dataclass(frozen=True)
class Trial:
    """One probe of the search: ``batch`` did (``fits``) or did not fit;
    ``reason`` says why not (e.g. ``"CUDA out of memory"``); ``info`` holds
    whatever the step function returned (e.g. its peak bytes)."""

    batch: int
    fits: bool
    reason: str = ""
    info: Any = None


@dataclass(frozen=True)
class SearchResult:
    """Outcome of :func:`search_max_batch`.

    Attributes
    ----------
    batch : int
        Largest batch that fit; 0 if not even ``start`` (nor any smaller
        batch) fit.
    trials : tuple of Trial
        Every probe, in the order made.
    limit_reached : bool
        True if the search stopped at ``limit`` with that batch fitting (the
        true maximum may be larger).
    """

    batch: int
    trials: tuple[Trial, ...]
    limit_reached: bool = False

    @property
    def first_failure(self) -> int | None:
        """Smallest batch that did not fit (``None`` if every probe fit)."""
        bad = [t.batch for t in self.trials if not t.fits]
        return min(bad) if bad else None

    def trial(self, batch: int) -> Trial | None:
        """The probe of ``batch`` (``None`` if it was not probed)."""
        for t in self.trials:
            if t.batch == batch:
                return t
        return None


def search_max_batch(try_batch: Callable[[int], "bool | Trial"], *, start: int = 1, limit: int | None = None,
                     growth: int = 2, progress: bool | Any = False, desc: str = "max-batch") -> SearchResult:
    """Largest batch for which ``try_batch`` succeeds: exponential growth, then
    binary search.

    Parameters
    ----------
    try_batch : callable
        ``try_batch(batch) -> bool`` (True: it fits) or a :class:`Trial`.
        Wrap a step that may run out of memory with :func:`oom_safe`.  Must be
        monotone: if ``b`` fits, every smaller batch fits.
    start : int
        First batch probed (>= 1).
    limit : int, optional
        Never probe above this batch (>= ``start``).
    growth : int
        Factor of the exponential phase (>= 2).
    progress : bool or tqdm
        Show a ``tqdm`` bar (True), or update the given bar, one tick per probe.
    desc : str
        Bar label.

    Returns
    -------
    SearchResult
        The largest fitting batch and every probe.  Probes: ``start``,
        ``start * growth``, ... until one fails (or ``limit``), then a binary
        search in the open interval between the last success and the first
        failure: about ``2 log2(max batch)`` probes.  If ``start`` fails, the
        binary search runs on ``[1, start)``.

    Raises
    ------
    ValueError
        ``start < 1``, ``growth < 2`` or ``limit < start``.
    """
    start, growth = int(start), int(growth)
    if start < 1 or growth < 2:
        raise ValueError(f"need start >= 1 and growth >= 2, got start={start}, growth={growth}")
    if limit is not None and int(limit) < start:
        raise ValueError(f"limit ({limit}) must be >= start ({start})")
    bar = _bar(progress, desc)
    trials: list[Trial] = []

    def probe(b: int) -> bool:
        got = try_batch(b)
        t = got if isinstance(got, Trial) else Trial(b, bool(got))
        if t.batch != b:
            t = Trial(b, t.fits, t.reason, t.info)
        trials.append(t)
        logger.info("batch %d: %s%s", b, "fits" if t.fits else "does not fit",
                    f" ({t.reason})" if t.reason else "")
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"batch {b} {'ok' if t.fits else 'fail'}; best {best_so_far(trials)}")
        return t.fits

    try:
        lo, hi = 0, None          # lo fits (0 = nothing yet), hi does not fit
        b = start
        limit_reached = False
        while True:
            if probe(b):
                lo = b
                if limit is not None and b >= limit:
                    limit_reached = True
                    break
                b = b * growth if limit is None else min(b * growth, int(limit))
            else:
                hi = b
                break
        if hi is not None:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if probe(mid):
                    lo = mid
                else:
                    hi = mid
    finally:
        if bar is not None and progress is True:
            bar.close()
    return SearchResult(batch=lo, trials=tuple(trials), limit_reached=limit_reached)


def best_so_far(trials: Iterable[Trial]) -> int:
    """Largest fitting batch among ``trials`` (0 if none)."""
    return max((t.batch for t in trials if t.fits), default=0)


def _bar(progress, desc: str):
    if progress is True:
        from tqdm.auto import tqdm

        return tqdm(desc=desc, unit="try", leave=True)
    if progress:
        return progress
    return None


def _is_oom(e: BaseException) -> bool:
    """True if ``e`` (or an exception it wraps: ``__cause__``, ``__context__``,
    Dynamo's ``inner_exception``) is an out-of-memory error."""
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if oom and isinstance(e, oom):
            return True
        # cuBLAS / cuDNN workspace allocations fail with a RuntimeError
        if isinstance(e, RuntimeError) and ("out of memory" in str(e).lower()
                                            or "CUBLAS_STATUS_ALLOC_FAILED" in str(e)):
            return True
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
    return False


def free_device_memory() -> None:
    """Collect garbage and return cached CUDA blocks to the driver
    (``gc.collect`` + ``torch.cuda.empty_cache``), so the next probe starts
    clean."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def oom_safe(step: Callable[[int], Any]) -> Callable[[int], Trial]:
    """Wrap ``step(batch)`` so that running out of memory means "does not fit".

    Parameters
    ----------
    step : callable
        ``step(batch)`` runs a training step at that batch (building what it
        needs) and returns anything (kept as :attr:`Trial.info`).  It should
        hold no reference to its tensors after returning or raising.

    Returns
    -------
    callable
        ``fits(batch) -> Trial``: ``fits=True`` when ``step`` returned;
        ``fits=False`` with the reason when it raised
        ``torch.OutOfMemoryError`` (or a CUDA "out of memory" /
        ``CUBLAS_STATUS_ALLOC_FAILED`` ``RuntimeError``) or
        :class:`~libra_opt.errors.InfeasibleBudgetError` (the solver found no
        plan within the budget).  Any other exception propagates.  Memory is
        freed after every failed probe, and after every probe when CUDA is
        available (:func:`free_device_memory`), outside the ``except`` block
        so the traceback's frames, which hold the failed step's tensors, are
        gone first.

    Notes
    -----
    Source: the PyTorch FAQ "my model reports cuda runtime error(2): out of
    memory" (free the references, then ``torch.cuda.empty_cache``).
    """

    @functools.wraps(step)
    def fits(batch: int) -> Trial:
        reason = None
        info = None
        try:
            info = step(batch)
        except _NO_FIT_ERRORS as e:
            reason = f"no plan: {e}"
        except Exception as e:  # noqa: BLE001 - re-raised unless it is an OOM
            if not _is_oom(e):
                raise
            reason = "out of memory: " + (str(e).splitlines() or [""])[0][:160]
        if reason is not None or torch.cuda.is_available():
            free_device_memory()
        return Trial(batch, reason is None, reason or "", info)

    return fits


# ================================================================= train steps
def method_names() -> list[str]:
    """Every method :func:`make_train_step` accepts: the reference methods and
    the registered solvers."""
    from .solvers import available_solvers

    names = list(REFERENCE_METHODS)
    for s in available_solvers():
        if s not in names:
            names.append(s)
    return names


def _block_modules(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a model, outermost first: ``transformers``
    layers (``GradientCheckpointingLayer``), ResNet residual layers, else the
    children of the outermost ``ModuleList``/``Sequential`` whose >= 2
    children share a class and hold parameters."""
    blocks: list[nn.Module] = []
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # pragma: no cover
        GradientCheckpointingLayer = ()  # noqa: N806
    residual_names = ("ResNetBottleNeckLayer", "ResNetBasicLayer", "Bottleneck", "BasicBlock")

    def is_block(m: nn.Module) -> bool:
        return (bool(GradientCheckpointingLayer) and isinstance(m, GradientCheckpointingLayer)) or \
            type(m).__name__ in residual_names

    def walk(m: nn.Module) -> None:
        for child in m.children():
            if is_block(child):
                blocks.append(child)
            else:
                walk(child)

    walk(model)
    if blocks:
        return blocks

    def walk_containers(m: nn.Module) -> bool:
        for child in m.children():
            if isinstance(child, (nn.ModuleList, nn.Sequential)):
                kids = list(child.children())
                if len(kids) >= 2 and len({type(k) for k in kids}) == 1 and all(
                        any(True for _ in k.parameters()) for k in kids):
                    blocks.extend(kids)
                    continue
            walk_containers(child)
        return bool(blocks)

    walk_containers(model)
    return blocks


def checkpoint_blocks(model: nn.Module, blocks: Sequence[nn.Module] | None = None) -> int:
    """Make every block of ``model`` run under ``torch.utils.checkpoint``
    (non-reentrant): its activations are dropped after the forward and
    recomputed in the backward.

    Parameters
    ----------
    model : nn.Module
        Changed in place (the blocks' ``forward`` is wrapped on the instance).
    blocks : sequence of nn.Module, optional
        Default: ``transformers`` layers, ResNet residual layers, or the
        children of the outermost repeated container (see
        :func:`_block_modules`).

    Returns
    -------
    int
        Number of blocks wrapped.

    Raises
    ------
    LibraOptError
        No block found: pass ``blocks``.

    Notes
    -----
    Source: ``torch.utils.checkpoint.checkpoint(fn, *args,
    use_reentrant=False, **kwargs)``; per-block checkpointing as in Chen et
    al., "Training deep nets with sublinear memory cost" (2016).
    """
    from torch.utils.checkpoint import checkpoint

    blocks = list(blocks) if blocks is not None else _block_modules(model)
    if not blocks:
        raise LibraOptError(f"found no repeated blocks in {type(model).__name__} to checkpoint; pass blocks=")
    for b in blocks:
        inner = b.forward

        def forward(*args, _inner=inner, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        b.forward = forward
    return len(blocks)


def fixed_memory_bytes(model: nn.Module, inputs: Any = (), *, optimizer: str = "adamw") -> dict[str, int]:
    """Memory resident for the whole step outside the plan's graph memory.

    Parameters
    ----------
    model : nn.Module
    inputs : any
        The batch (tensors found in nested tuples / lists / dicts are counted).
    optimizer : {"adamw", "adam", "sgd", "none"}
        AdamW / Adam keep two moment buffers per trainable parameter (2x its
        bytes), SGD with momentum one.

    Returns
    -------
    dict
        ``parameters``, ``buffers``, ``optimizer_state``, ``inputs``,
        ``gradients`` (for information: inside the graph memory) and ``total``
        (= parameters + buffers + optimizer_state + inputs), all bytes.

    Notes
    -----
    Matches :class:`~libra_opt.problem.FixedMemory.resident_bytes` of a
    profiled problem with ``optimizer="adam"``.  Source:
    ``torch.optim.AdamW`` state (``exp_avg``, ``exp_avg_sq``).
    """
    from torch.utils._pytree import tree_flatten

    factor = {"adamw": 2, "adam": 2, "sgd": 1, "none": 0}.get(optimizer)
    if factor is None:
        raise LibraOptError(f"unknown optimizer {optimizer!r}; use adamw, adam, sgd or none")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    seen = set()
    inp = 0
    for t in tree_flatten(inputs)[0]:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            inp += t.numel() * t.element_size()
    opt = factor * trainable
    return {"parameters": params, "buffers": buffers, "optimizer_state": opt, "inputs": inp,
            "gradients": trainable, "total": params + buffers + opt + inp}


def solver_budget(cap_bytes: int, fixed_bytes: int, reserve: float | int = DEFAULT_RESERVE) -> int:
    """The graph-memory budget for a solver under a device cap, bytes:
    ``cap - fixed - reserve`` where ``reserve`` is bytes (int) or a fraction
    of the cap (float < 1).  Raises :class:`InfeasibleBudgetError` when
    nothing is left."""
    res = int(reserve * cap_bytes) if isinstance(reserve, float) and reserve < 1 else int(reserve)
    budget = int(cap_bytes) - int(fixed_bytes) - res
    if budget <= 0:
        raise InfeasibleBudgetError(max(budget, 0), None, "max-batch",
                                    f"the fixed memory ({format_bytes(fixed_bytes)}) plus the reserve "
                                    f"({format_bytes(res)}) fill the cap of {format_bytes(cap_bytes)}")
    return budget


def _autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _adamw(params, device: torch.device, lr: float) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    # fused AdamW: one kernel, no per-step temporaries of parameter size
    fused = device.type in ("cuda", "cpu") and all(p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=lr, fused=fused)


class TrainStep:
    """One training step: ``zero_grad`` (set to ``None``), forward under
    autocast, loss, ``backward``, ``AdamW.step``.

    Parameters
    ----------
    forward : callable
        ``forward() -> loss`` (a scalar tensor).
    params : iterable of Parameter
    device : torch.device
    lr : float
    autocast_dtype : torch.dtype, optional
    context : callable, optional
        Returns a context manager wrapped around the forward (e.g.
        ``save_on_cpu``).

    Calling it returns the loss as a float.
    """

    def __init__(self, forward: Callable[[], torch.Tensor], params, device: torch.device, *,
                 lr: float = 1e-4, autocast_dtype: torch.dtype | None = None,
                 context: Callable[[], Any] | None = None, module: Any = None):
        self.forward = forward
        self.device = torch.device(device)
        self.optimizer = _adamw(params, self.device, lr)
        self.autocast_dtype = autocast_dtype
        self.context = context or contextlib.nullcontext
        self.module = module

    def __call__(self) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        with self.context(), _autocast(self.device, self.autocast_dtype):
            loss = self.forward()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())


def make_train_step(method: str, zm: "ZooModel", *, budget: Any = None, autocast_dtype: torch.dtype | None = None,
                    lr: float = 1e-4, solver_options: dict | None = None) -> TrainStep:
    """A :class:`TrainStep` for ``zm`` by ``method``.

    Parameters
    ----------
    method : str
        ``"none"``, ``"checkpoint"``, ``"save-on-cpu"`` or a registered
        solver name (``"libra"``, ``"checkmate-lp"``, ...).
    zm : ZooModel
        The model and its batch (changed in place for ``"checkpoint"``).
    budget : int or str, optional
        Graph-memory budget for a solver (bytes, ``"12GiB"``, ``"60%"``).
    autocast_dtype : torch.dtype, optional
        Mixed precision (e.g. ``torch.bfloat16``).
    lr : float
        AdamW learning rate.
    solver_options : dict, optional
        Passed to the solver.

    Returns
    -------
    TrainStep

    Raises
    ------
    LibraOptError
        Unknown method (the message lists them), or a solver without budget.
    InfeasibleBudgetError
        The solver found no plan within ``budget``.
    """
    device = _device_of(zm)
    model = zm.model

    def loss_of(out):
        return zm.loss_fn(out) if zm.loss_fn is not None else out.sum()

    if method == "none":
        return TrainStep(lambda: loss_of(model(*zm.args, **zm.kwargs)), model.parameters(), device, lr=lr,
                         autocast_dtype=autocast_dtype)
    if method == "checkpoint":
        checkpoint_blocks(model)
        return TrainStep(lambda: loss_of(model(*zm.args, **zm.kwargs)), model.parameters(), device, lr=lr,
                         autocast_dtype=autocast_dtype)
    if method == "save-on-cpu":
        pin = device.type == "cuda"
        return TrainStep(lambda: loss_of(model(*zm.args, **zm.kwargs)), model.parameters(), device, lr=lr,
                         autocast_dtype=autocast_dtype,
                         context=lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin))
    from .solvers import available_solvers

    if method not in available_solvers():
        raise LibraOptError(f"unknown method {method!r}; use one of {', '.join(method_names())}")
    if budget is None:
        raise LibraOptError(f"method {method!r} is a solver and needs a memory budget")
    om = optimize_zoo(zm, budget=budget, solver=method, autocast_dtype=autocast_dtype,
                      **(solver_options or {}))
    return TrainStep(lambda: om.loss(), model.parameters(), device, lr=lr, autocast_dtype=None, module=om)


class _OptimizedStep:
    """Adapter over :func:`libra_opt.optimize`'s module: ``loss()`` runs the
    planned forward and returns the scalar loss."""

    def __init__(self, om, zm: "ZooModel", loss_in_module: bool):
        self.om = om
        self.zm = zm
        self.loss_in_module = loss_in_module
        self.plan = getattr(om, "plan", None)
        self.problem = getattr(om, "problem", None)

    def loss(self) -> torch.Tensor:
        out = self.om(*self.zm.args, **self.zm.kwargs)
        if self.loss_in_module or self.zm.loss_fn is None:
            return out if out.dim() == 0 else out.sum()
        return self.zm.loss_fn(out)


def optimize_zoo(zm: "ZooModel", *, budget: Any, solver: str = "libra", autocast_dtype: torch.dtype | None = None,
                 **solver_options) -> _OptimizedStep:
    """:func:`libra_opt.optimize` on a :class:`~libra_opt.zoo.ZooModel`, with
    its loss; returns an object whose ``loss()`` runs one planned forward and
    ``plan`` / ``problem`` are the optimizer's.  Raises what ``optimize``
    raises."""
    from .optimize import optimize

    om = optimize(zm.model, zm.args, budget=budget, solver=solver, example_kwargs=zm.kwargs,
                  autocast_dtype=autocast_dtype, loss_fn=zm.loss_fn, **solver_options)
    return _OptimizedStep(om, zm, loss_in_module=zm.loss_fn is not None)


def _device_of(zm: "ZooModel") -> torch.device:
    for p in zm.model.parameters():
        return p.device
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: Callable[[], Any], device: torch.device | str, *, warmup: int = 1, repeats: int = 3
               ) -> tuple[float, list[Any]]:
    """Median wall time of ``repeats`` calls of ``step`` after ``warmup`` calls.

    Returns
    -------
    (seconds, values) : tuple
        Median seconds per step (CUDA synchronized before and after each
        call) and what each call returned (warm-up included).
    """
    device = torch.device(device)
    values = []
    for _ in range(max(0, warmup)):
        values.append(step())
    samples = []
    for _ in range(max(1, repeats)):
        _sync(device)
        t0 = time.perf_counter()
        values.append(step())
        _sync(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), values


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
              solver_options: dict | None = None, progress: bool = True) -> MaxBatchResult:
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
    search = search_max_batch(fits, start=start, limit=limit, progress=progress,
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
                      solver_options: dict | None = None, progress: bool = True) -> MaxBatchResult:
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

    search = search_max_batch(fits, start=start, limit=limit, progress=progress,
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
