"""Plans per input shape and autocast setting: a new shape gets its own plan.

A plan is made for one training graph, and the graph depends on the input
shapes (a dataloader's short last batch, another sequence length) and on the
autocast dtype.  :class:`~libra_opt.runtime.module.OptimizedModule` keys its
plans by :func:`call_key` (the call's tensor shapes, dtypes and
``requires_grad``, its Python scalars, and the autocast dtype) and, for a key
it has no plan for, asks a :class:`ShapePlanner`:

1. capture the step at the new shape (:func:`libra_opt.capture.capture`: fake
   tensors, nothing runs, so every storage's bytes are exact);
2. price its ops from the problem profiled at the example's shape
   (:func:`scale_to_step`): the unplanned step never runs at the new shape,
   where it may not fit;
3. solve it within the same bytes as the example's plan (a fraction budget
   is resolved once, against the example's no-remat peak: the memory the
   user gave the model does not change with the batch), logging the solve
   time.

Each key is compiled as a code object of its own
(:func:`libra_opt.capture.step_function`), so TorchDynamo sees one static
graph per code object and no number of shapes reaches its
``recompile_limit`` / ``accumulated_recompile_limit`` (both counted per code
object, ``torch/_dynamo/cache_size.py``).

:func:`pad_to_bucket` pads a batch to one of a few declared lengths, so a
loader with many sequence lengths needs only a few plans.

Sources: TorchDynamo's per-code-object cache and guards (PyTorch 2, Ansel et
al., ASPLOS 2024); the linear-in-size cost model of Checkmate (Jain et al.,
MLSys 2020, sec. 4: op cost from profiling, memory from tensor sizes), here
with op times scaled by the bytes each op reads and writes.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections import defaultdict
from typing import Any, Callable, Mapping, Sequence

import torch

from .errors import InfeasibleBudgetError, LibraOptError
from .ir.problem import RematProblem

logger = logging.getLogger(__name__)

__all__ = ["ambient_autocast", "call_key", "same_structure", "describe_key", "scale_to_step", "ShapePlanner",
           "pad_to_bucket", "DEFAULT_MAX_SHAPES"]

#: plans an optimized module makes at most by default (the example's included): each holds a
#: compiled graph pair; beyond it a call raises ShapeMismatchError (pad or bucket the inputs)
DEFAULT_MAX_SHAPES = 64

_SCALAR_TYPES = (bool, int, float, str, type(None))


# ------------------------------------------------------------------ keys
def ambient_autocast(device: torch.device | str) -> torch.dtype | None:
    """The dtype of the ``torch.autocast`` active for ``device``'s type at
    this call, or ``None`` when none is (``torch.is_autocast_enabled(device_type)``,
    ``torch.get_autocast_dtype(device_type)``, torch >= 2.4)."""
    kind = torch.device(device).type
    if not torch.is_autocast_enabled(kind):
        return None
    return torch.get_autocast_dtype(kind)


def call_key(args: tuple, kwargs: Mapping | None, autocast_dtype: torch.dtype | None) -> tuple:
    """The plan key of a call: what TorchDynamo specializes a static graph on.

    Parameters
    ----------
    args, kwargs :
        The call's inputs (nested lists, tuples and dicts are flattened with
        ``torch.utils._pytree``).
    autocast_dtype : torch.dtype or None
        The autocast the step runs under.

    Returns
    -------
    tuple
        Hashable: the input structure, per tensor ``(shape, dtype, device type,
        requires_grad)``, per Python scalar its type and value (Dynamo bakes
        them into the graph), per other object its type name, then the
        autocast dtype.
    """
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten((tuple(args), dict(kwargs or {})))
    items = []
    for v in leaves:
        if isinstance(v, torch.Tensor):
            items.append(("tensor", tuple(v.shape), str(v.dtype), v.device.type, bool(v.requires_grad)))
        elif isinstance(v, _SCALAR_TYPES):
            items.append((type(v).__name__, v))
        else:
            items.append(("object", type(v).__qualname__))
    return (str(spec), tuple(items), str(autocast_dtype))


def same_structure(a: tuple, b: tuple) -> bool:
    """True if keys ``a`` and ``b`` (from :func:`call_key`) have the same
    arguments: the same nesting, and a tensor where the other has one (only
    shapes, dtypes, scalars' values or the autocast differ)."""
    return a[0] == b[0] and [it[0] for it in a[1]] == [it[0] for it in b[1]]


def describe_key(key: tuple) -> str:
    """``key`` (from :func:`call_key`) for people: the tensor shapes and the autocast."""
    shapes = [list(it[1]) for it in key[1] if it[0] == "tensor"]
    return f"input shapes {shapes}, autocast {key[2]}"


# ------------------------------------------------------------------ scaling
@functools.lru_cache(maxsize=None)
def _itemsize(dtype: str) -> int | None:
    """Bytes per element of a dtype named like ``"torch.float32"`` (``None`` if unknown)."""
    dt = getattr(torch, dtype.replace("torch.", ""), None)
    return dt.itemsize if isinstance(dt, torch.dtype) else None


def _logical_bytes(t) -> int:
    """Bytes of a tensor's elements (its shape times its dtype's size; views
    included), else its storage bytes."""
    item = _itemsize(t.dtype) if t.shape is not None and t.dtype else None
    return int(t.nbytes) if item is None else int(math.prod(t.shape)) * item


def _io_bytes(problem: RematProblem) -> list[int]:
    """Per node: bytes of the tensors it reads and writes."""
    size = [_logical_bytes(t) for t in problem.tensors]
    return [sum(size[i] for i in n.inputs) + sum(size[o] for o in n.outputs) for n in problem.nodes]


def scale_to_step(reference: RematProblem, step, *, optimizer: str | None = None) -> RematProblem:
    """The problem of ``step`` (a :class:`~libra_opt.capture.CapturedStep` at
    a new shape) priced from ``reference`` (a problem profiled at another
    shape of the same model), without running the step.

    Storage bytes come from the capture (exact).  An op whose node has the
    same name and target in ``reference`` takes its time and workspace
    scaled by the ratio of the bytes it reads and writes (new / reference:
    a batch of 7 instead of 8 gives 7/8 of the time; a 48-token sequence
    instead of 32 gives 1.5x a linear layer's time and 2.25x an attention
    score's).  An op without a match (the graph changed: another autocast,
    a batch of 1) gets the reference's seconds per byte of its target (else
    of the whole step) times its bytes, and no workspace.

    Parameters
    ----------
    reference : RematProblem
        Profiled (or itself extrapolated) at another shape.
    step : CapturedStep
    optimizer : str, optional
        Optimizer state in the fixed memory (default: the reference's).

    Returns
    -------
    RematProblem
        Named ``<reference name>@<input shapes>``; device profile of the
        reference; provenance ``extra["scaled_from"]`` (the reference's name)
        and ``extra["matched_nodes"]`` (ops priced from their own profile,
        of all ops).
    """
    from .frontend.capture import build_problem

    opt = optimizer or reference.fixed.optimizer
    bare = build_problem(step, device=reference.device, optimizer=opt)
    ref_io = _io_bytes(reference)
    ref_by_name = {n.name: (n, b) for n, b in zip(reference.nodes, ref_io)}
    per_target: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for n, b in zip(reference.nodes, ref_io):
        per_target[n.target][0] += n.time_s
        per_target[n.target][1] += b
    total_t = sum(n.time_s for n in reference.nodes)
    total_b = sum(ref_io) or 1
    nodes, matched = [], 0
    for n, b in zip(bare.nodes, _io_bytes(bare)):
        ref = ref_by_name.get(n.name)
        if ref is not None and ref[0].target == n.target:
            r = b / ref[1] if ref[1] else 1.0
            nodes.append(dataclasses.replace(n, time_s=ref[0].time_s * r,
                                             workspace_bytes=int(round(ref[0].workspace_bytes * r))))
            matched += 1
        else:
            t, tb = per_target.get(n.target, (total_t, total_b))
            nodes.append(dataclasses.replace(n, time_s=(t / tb if tb else total_t / total_b) * b,
                                             workspace_bytes=0))
    shapes = "x".join(str(list(s)) for s in step.example_shapes)
    prov = dataclasses.replace(bare.provenance, extra={**bare.provenance.extra, "scaled_from": reference.name,
                                                       "matched_nodes": [matched, len(nodes)]})
    if matched < len(nodes):
        logger.info("scaled %s: %d of %d ops priced from their own profile, the rest per byte of their op",
                    reference.name, matched, len(nodes))
    return bare.replace(nodes=nodes, provenance=prov, name=f"{reference.name}@{shapes}")


# ------------------------------------------------------------------ planning
@dataclasses.dataclass
class ShapePlanner:
    """Plans a training step at a shape not planned yet, from a problem
    profiled at another shape (see the module docstring).

    Attributes
    ----------
    reference : RematProblem
        Profiled at the example's shape, before any executor cost model.
    budget_bytes : int
        The budget (bytes; a fraction resolved against the example's no-remat
        peak): no plan of any shape goes above it.
    solver_budget_bytes : int
        What the example's plan was solved to (the budget less the allocator
        margin and any calibration overshoot); new shapes are solved to it,
        else (no plan leaves that margin) to ``budget_bytes``, with a warning.
    solver : str or Solver
    solver_options : dict
    executor : str
        ``"eager"`` or ``"inductor"`` (the cost model of the plans).
    loss_fn : callable or None
    max_shapes : int or None
        Plans an optimized module makes at most (the example's included);
        ``None``: no limit.
    solve_fn : callable, optional
        ``solve_fn(problem, budget, solver, **options) -> SolveResult``
        (default :func:`libra_opt.solve`; :func:`libra_opt.optimize` passes one
        that reads and writes saved plans, :mod:`libra_opt.plan_store`).
    """

    reference: RematProblem
    budget_bytes: int
    solver_budget_bytes: int
    solver: Any = "libra"
    solver_options: dict = dataclasses.field(default_factory=dict)
    executor: str = "eager"
    loss_fn: Callable | None = None
    max_shapes: int | None = DEFAULT_MAX_SHAPES
    solve_fn: Callable | None = None

    def plan(self, model: torch.nn.Module, args: tuple, kwargs: dict, autocast_dtype: torch.dtype | None,
             key: tuple):
        """Capture ``model`` at the call's inputs and plan it.

        Returns
        -------
        (RematProblem, SolveResult)
            The scaled problem (priced for the executor) and its plan.

        Raises
        ------
        InfeasibleBudgetError
            No plan fits the budget at this shape; the message names the
            shape and the smallest feasible budget the solver found.
        CaptureError
            The step does not capture as one graph at this shape.
        """
        from .frontend.capture import capture
        from .passes.simulator import no_remat_peak
        from .solvers import solve

        t0 = time.perf_counter()
        step = capture(model, args, kwargs, autocast_dtype=autocast_dtype, loss_fn=self.loss_fn)
        problem = scale_to_step(self.reference, step)
        if self.executor != "eager" and problem.device.memory_bytes_per_s:
            from .passes.costs import for_executor

            problem = for_executor(problem, self.executor)
        solve_fn = self.solve_fn or solve
        t1 = time.perf_counter()
        try:
            try:
                result = solve_fn(problem, self.solver_budget_bytes, self.solver, **self.solver_options)
            except InfeasibleBudgetError:
                if self.solver_budget_bytes >= self.budget_bytes:
                    raise
                logger.warning("optimize(%s): no plan for %s within the solver budget (%d bytes); planning to "
                               "the whole budget", step.model_name, describe_key(key), self.solver_budget_bytes)
                result = solve_fn(problem, self.budget_bytes, self.solver, **self.solver_options)
        except InfeasibleBudgetError as e:
            raise InfeasibleBudgetError(self.budget_bytes, e.min_feasible_bytes, e.solver,
                                        f"at {describe_key(key)}, a shape not planned before; its no-remat "
                                        f"peak is {no_remat_peak(problem)} bytes") from None
        logger.info("optimize(%s): new plan for %s: solver %s, predicted peak %d bytes (solver budget %d "
                    "bytes); solved in %.3f s (captured and priced in %.3f s)", step.model_name,
                    describe_key(key), result.solver, result.peak_bytes, result.budget_bytes,
                    time.perf_counter() - t1, t1 - t0)
        return problem, result


# ------------------------------------------------------------------ buckets
def pad_to_bucket(batch, buckets: Sequence[int], *, dim: int = 1, pad_values: Mapping[str, Any] | None = None,
                  default_pad: Any = 0):
    """Pad every tensor of ``batch`` along ``dim`` to the smallest bucket
    length that holds it, so a loader of many sequence lengths trains with
    ``len(buckets)`` plans.

    The loss stays equal where the padding is neutral: attention masks are
    padded with 0 (padded keys get no attention) and labels with the loss's
    ``ignore_index`` (``-100`` for ``torch.nn.functional.cross_entropy``
    and ``transformers``), so a mean loss averages the same tokens.  Give
    ``pad_values`` for every key whose padding matters.

    Parameters
    ----------
    batch : tensor, dict of str to tensor, or tuple / list of tensors
        A collated batch (e.g. ``{"input_ids": (B, T), "attention_mask": (B, T),
        "labels": (B, T)}``).  Tensors with fewer than ``dim + 1`` dimensions
        and non-tensors are left as they are.
    buckets : sequence of int
        The lengths a batch may have along ``dim`` (positive).
    dim : int
        The padded dimension (1: the sequence of a ``(B, T)`` batch; 0 pads
        the batch dimension, e.g. for a short last batch, with rows the loss
        ignores: there pad the attention mask with 1, since a row attending
        to nothing makes softmax attention NaN, and mind that batch
        normalization sees the padded rows).
    pad_values : dict of str to scalar, optional
        Padding per key of a dict batch, e.g. ``{"input_ids": tokenizer.pad_token_id,
        "attention_mask": 0, "labels": -100}``.
    default_pad : scalar
        Padding of everything else.

    Returns
    -------
    Same structure as ``batch``, padded (a tensor already at a bucket length
    is returned as is).

    Raises
    ------
    ShapeMismatchError
        A tensor is longer along ``dim`` than the largest bucket, or two
        tensors of the batch differ in length there.
    LibraOptError
        ``buckets`` is empty or holds a non-positive length.

    Source: the length bucketing of sequence-to-sequence training (e.g.
    ``tf.data.experimental.bucket_by_sequence_length``) and
    ``torch.nn.functional.pad``.
    """
    from .errors import ShapeMismatchError

    sizes = sorted({int(b) for b in buckets})
    if not sizes or sizes[0] <= 0:
        raise LibraOptError(f"buckets must be positive lengths, got {list(buckets)!r}")
    pad_values = dict(pad_values or {})
    if isinstance(batch, torch.Tensor):
        items = {None: batch}
    elif isinstance(batch, Mapping):
        items = dict(batch)
    elif isinstance(batch, (tuple, list)):
        items = dict(enumerate(batch))
    else:
        raise LibraOptError(f"pad_to_bucket pads a tensor, a dict or a tuple of tensors, not {type(batch).__name__}")
    lengths = {k: v.shape[dim] for k, v in items.items() if isinstance(v, torch.Tensor) and v.dim() > dim}
    if len(set(lengths.values())) > 1:
        raise ShapeMismatchError(f"the batch's tensors differ in length along dim {dim}: {lengths}; collate them to "
                                 f"one length first")
    if not lengths:
        return batch
    n = next(iter(lengths.values()))
    target = next((b for b in sizes if b >= n), None)
    if target is None:
        raise ShapeMismatchError(f"a batch of length {n} along dim {dim} is longer than the largest bucket "
                                 f"{sizes[-1]}; add a bucket of at least {n} or truncate the batch")
    out = {}
    for k, v in items.items():
        if k not in lengths or target == n:
            out[k] = v
            continue
        fill = pad_values.get(k, default_pad) if isinstance(k, str) else default_pad
        shape = list(v.shape)
        shape[dim] = target - n
        out[k] = torch.cat([v, torch.full(shape, fill, dtype=v.dtype, device=v.device)], dim=dim)
    if isinstance(batch, torch.Tensor):
        return out[None]
    if isinstance(batch, Mapping):
        return type(batch)(out) if type(batch) is not dict else out
    return type(batch)(out[i] for i in range(len(batch)))
