"""The training-step methods compared under a memory cap.

:func:`make_train_step` builds one real training step (forward, loss,
``backward``, ``AdamW.step``: a :class:`TrainStep`) by a *method*:
``"none"`` (eager PyTorch), ``"checkpoint"`` (per-block
``torch.utils.checkpoint``, non-reentrant: :func:`checkpoint_blocks`),
``"save-on-cpu"`` (``torch.autograd.graph.save_on_cpu``) or any registered
solver name (the model is planned by :func:`libra_opt.optimize` within a
budget and trained with the plan: :func:`optimize_zoo`).
:func:`method_names` lists them; :func:`time_steps` times a step.

The memory budget handed to a solver under a cap is
``cap - fixed - reserve`` (:func:`solver_budget`): ``fixed`` is what stays
resident for the whole step and lies outside the plan's graph memory
(parameters, buffers, the two AdamW moment buffers, the input batch:
:func:`fixed_memory_bytes`); gradients are *not* subtracted, because in the
problem IR they are graph outputs produced during backward and already
counted in the plan's peak; ``reserve`` (default :data:`DEFAULT_RESERVE`,
5 % of the cap) absorbs the caching allocator's rounding and fragmentation
and the optimizer step's small temporaries.

Sources: ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``,
``torch.autograd.graph.save_on_cpu``, ``torch.optim.AdamW(fused=True)``,
``torch.autocast``; Chen et al., "Training deep nets with sublinear memory
cost" (2016) for per-block checkpointing.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from torch import nn

from ..errors import InfeasibleBudgetError, LibraOptError
from ..ir.units import format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from .zoo import ZooModel


__all__ = ["REFERENCE_METHODS", "DEFAULT_RESERVE", "method_names", "checkpoint_blocks", "fixed_memory_bytes",
           "reserve_bytes", "solver_budget", "TrainStep", "make_train_step", "optimize_zoo", "OptimizedStep", "time_steps", "ResidentMemory",
           "init_optimizer_state", "measure_resident"]

#: PyTorch reference methods (not solvers): name -> what it does
REFERENCE_METHODS = {
    "none": "eager PyTorch (keeps every activation)",
    "checkpoint": "per-block torch.utils.checkpoint (use_reentrant=False)",
    "save-on-cpu": "torch.autograd.graph.save_on_cpu(pin_memory=True): every saved activation to host",
}

#: default reserve kept out of a solver's budget: a fraction of the cap
DEFAULT_RESERVE = 0.05


def method_names() -> list[str]:
    """Every method :func:`make_train_step` accepts: the reference methods and
    the registered solvers."""
    from ..solvers import available_solvers

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


def reserve_bytes(cap_bytes: int, reserve: float | int) -> int:
    """The reserve kept out of a solver's budget under a device cap, bytes:
    ``reserve`` itself (bytes, an int) or that fraction of the cap (a float
    < 1)."""
    return int(reserve * cap_bytes) if isinstance(reserve, float) and reserve < 1 else int(reserve)


def solver_budget(cap_bytes: int, fixed_bytes: int, reserve: float | int = DEFAULT_RESERVE) -> int:
    """The graph-memory budget for a solver under a device cap, bytes:
    ``cap - fixed - reserve`` where ``reserve`` is bytes (int) or a fraction
    of the cap (float < 1, :func:`reserve_bytes`).  Raises
    :class:`InfeasibleBudgetError` when nothing is left."""
    res = reserve_bytes(cap_bytes, reserve)
    budget = int(cap_bytes) - int(fixed_bytes) - res
    if budget <= 0:
        raise InfeasibleBudgetError(max(budget, 0), None, "max-batch",
                                    f"the fixed memory ({format_bytes(fixed_bytes)}) plus the reserve "
                                    f"({format_bytes(res)}) fill the cap of {format_bytes(cap_bytes)}")
    return budget


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> int:
    """Create the state an optimizer would create lazily at its first step,
    now, so it is resident before the step is measured; returns the number of
    parameters that got state.

    Parameters without state get a zero gradient and one ``optimizer.step()``
    runs with every group's learning rate at 0 (so no parameter moves: Adam /
    AdamW's update and decoupled weight decay both scale with it); then the
    ``step`` counters are set back to 0, every other state tensor is zeroed
    (an L2 ``weight_decay`` adds ``decay * p`` to the zero gradient even at a
    zero learning rate) and the zero gradients removed, which leaves Adam /
    AdamW exactly as their lazy initialisation would (both moments are
    zeros), and other optimizers with the state their first step makes from a
    zero gradient (e.g. SGD's momentum buffer, zeros).

    Source: ``torch.optim.Adam`` / ``AdamW`` ``_init_group`` (state created at
    the first ``step``: ``step``, ``exp_avg``, ``exp_avg_sq``).
    """
    fresh = [p for g in optimizer.param_groups for p in g["params"]
             if p.requires_grad and not optimizer.state.get(p)]
    if not fresh:
        return 0
    fresh_ids = {id(p) for p in fresh}
    saved_grads = [(p, p.grad) for g in optimizer.param_groups for p in g["params"]]
    saved_lr = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        for p in g["params"]:
            p.grad = torch.zeros_like(p) if id(p) in fresh_ids else None
        g["lr"] = g["lr"] * 0 if isinstance(g["lr"], torch.Tensor) else 0.0
    try:
        optimizer.step()
    finally:
        for g, lr in zip(optimizer.param_groups, saved_lr):
            g["lr"] = lr
        for p, grad in saved_grads:
            p.grad = grad
    with torch.no_grad():
        for p in fresh:
            state = optimizer.state[p]
            for k, v in state.items():
                if isinstance(v, torch.Tensor):
                    v.zero_()
                elif k == "step" and v is not None:
                    state[k] = 0
    return len(fresh)


@dataclass(frozen=True)
class ResidentMemory:
    """What is resident before a training step (bytes).

    ``allocated_bytes`` and ``reserved_bytes`` are measured on the device
    (after the allocator's cache is released); the rest is the breakdown by
    kind, counted from the tensors.  ``reserved_bytes`` is what a cap must
    hold besides the step: cap = resident + budget.

    Attributes
    ----------
    parameters, buffers, optimizer_state, gradients, inputs : int
        Bytes of each kind (gradients: those the user keeps between steps).
    allocated_bytes, reserved_bytes : int
        Measured (``torch.cuda.memory_allocated`` / ``memory_reserved`` on CUDA).
    """

    parameters: int
    buffers: int
    optimizer_state: int
    gradients: int
    inputs: int
    allocated_bytes: int
    reserved_bytes: int

    @property
    def allocator_overhead(self) -> int:
        """Reserved beyond allocated before the step (bytes)."""
        return self.reserved_bytes - self.allocated_bytes

    def __str__(self) -> str:
        return (f"resident {format_bytes(self.reserved_bytes)} reserved ({format_bytes(self.allocated_bytes)} "
                f"allocated: parameters {format_bytes(self.parameters)}, buffers {format_bytes(self.buffers)}, "
                f"optimizer state {format_bytes(self.optimizer_state)}, gradients kept {format_bytes(self.gradients)}, "
                f"inputs {format_bytes(self.inputs)})")


def _tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages of ``tensors`` (each counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            s = t.untyped_storage()
            key = (t.device, s.data_ptr())
            if s.nbytes() and key not in seen:
                seen.add(key)
                total += s.nbytes()
    return total


def measure_resident(model: nn.Module, optimizer: torch.optim.Optimizer | None, inputs: Any, memory) -> ResidentMemory:
    """Resident memory before a step, as measured: the optimizer's state is
    created first if it does not exist yet (:func:`init_optimizer_state`;
    AdamW creates it lazily at the first step), the allocator's cache is
    released, then allocated and reserved bytes are read.

    Parameters
    ----------
    model : nn.Module
    optimizer : torch.optim.Optimizer, optional
    inputs : any
        The batch (tensors in nested tuples / lists / dicts).
    memory : DeviceMemory
        :func:`libra_opt.runtime.memory.memory_for` of the model's device.

    Returns
    -------
    ResidentMemory
    """
    from torch.utils._pytree import tree_flatten

    if optimizer is not None:
        init_optimizer_state(optimizer)
    memory.synchronize()
    memory.empty_cache()
    state = [] if optimizer is None else [v for st in optimizer.state.values() for v in st.values()]
    return ResidentMemory(
        parameters=_tensor_bytes(model.parameters()), buffers=_tensor_bytes(model.buffers()),
        optimizer_state=_tensor_bytes(state), gradients=_tensor_bytes(p.grad for p in model.parameters()),
        inputs=_tensor_bytes(tree_flatten(inputs)[0]), allocated_bytes=memory.allocated(),
        reserved_bytes=memory.reserved())


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
    from ..solvers import available_solvers

    if method not in available_solvers():
        raise LibraOptError(f"unknown method {method!r}; use one of {', '.join(method_names())}")
    if budget is None:
        raise LibraOptError(f"method {method!r} is a solver and needs a memory budget")
    om = optimize_zoo(zm, budget=budget, solver=method, autocast_dtype=autocast_dtype,
                      **(solver_options or {}))
    return TrainStep(lambda: om.loss(), model.parameters(), device, lr=lr, autocast_dtype=None, module=om)


class OptimizedStep:
    """A zoo model's training step through an optimized module
    (:func:`libra_opt.optimize`'s): ``loss()`` runs the planned forward on the
    zoo model's example inputs and returns the scalar loss (the model's own
    loss when ``loss_in_module``, else ``zm.loss_fn`` of the output, else the
    output's sum); ``loss().backward()`` runs the planned backward.

    Attributes
    ----------
    om : OptimizedModule
    zm : ZooModel
    loss_in_module : bool
        The optimized module returns the loss itself (it was optimized with
        ``loss_fn``).
    plan : SolveResult or None
        ``om.plan``.
    problem : RematProblem or None
        ``om.problem``.
    """

    def __init__(self, om, zm: "ZooModel", loss_in_module: bool):
        self.om = om
        self.zm = zm
        self.loss_in_module = loss_in_module
        self.plan = getattr(om, "plan", None)
        self.problem = getattr(om, "problem", None)

    def loss(self) -> torch.Tensor:
        """One planned forward; the scalar loss (a 0-dim tensor)."""
        out = self.om(*self.zm.args, **self.zm.kwargs)
        if self.loss_in_module or self.zm.loss_fn is None:
            return out if out.dim() == 0 else out.sum()
        return self.zm.loss_fn(out)


def optimize_zoo(zm: "ZooModel", *, budget: Any, solver: str = "libra", autocast_dtype: torch.dtype | None = None,
                 **solver_options) -> OptimizedStep:
    """:func:`libra_opt.optimize` on a :class:`~libra_opt.zoo.ZooModel`, with
    its loss; returns an object whose ``loss()`` runs one planned forward and
    ``plan`` / ``problem`` are the optimizer's.  Raises what ``optimize``
    raises."""
    from ..optimize import optimize

    om = optimize(zm.model, zm.args, budget=budget, solver=solver, example_kwargs=zm.kwargs,
                  autocast_dtype=autocast_dtype, loss_fn=zm.loss_fn, **solver_options)
    return OptimizedStep(om, zm, loss_in_module=zm.loss_fn is not None)


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
