"""Executor cost models: what a recompute costs as the program really runs.

A plan is priced by the simulator on the problem's measured per-op times.
How much a *recompute* costs depends on the executor that runs the plan:

``"eager"``
    The planned forward and backward graphs run op by op; a recomputed node
    costs its measured ``time_s``, exactly as its first computation.  This is
    the cost model of every problem unless asked otherwise, and plans made
    under it are the plans the project always made.
``"inductor"``
    The graphs are compiled by Inductor; recomputation lives in the backward
    graph, where a memory-bound **pointwise** op (elementwise, cast,
    reduction: :attr:`Node.pointwise <libra_opt.problem.Node.pointwise>`) is
    fused into the kernel that consumes it.  It then costs the bytes it moves,
    ``(bytes of its inputs read + bytes of its outputs written) / device
    memory bandwidth``, never more than its measured time.  Compute-bound ops
    (matmul, convolution, attention) keep their measured time.  This is how
    PyTorch's min-cut partitioner reasons (``torch/_functorch/partitioners.py``:
    ops in its recomputable allowlist are fusible and "free" to recompute,
    compute-intensive and random ops are banned from recomputation, and a
    tensor's cost is ``_size_of`` = numel x itemsize), with the bytes turned
    into seconds by the measured bandwidth so that recomputes and swaps
    compare on one time axis.

:func:`for_executor` returns the problem priced for an executor; the
simulator (the single judge) and the ``libra`` solver read
:attr:`RematProblem.recompute_time <libra_opt.problem.RematProblem.recompute_time>`
where a node is computed again.  First computations are always charged
``time_s``: the measured step is the step as it runs; only recomputes change.

Which graph: plans are made on the joint aten graph that AOTAutograd
captures (before Inductor's decompositions).  A captured node maps to the
Inductor kernels that its decomposition lowers into; a pointwise node becomes
part of a fused kernel, which is why its recompute is priced by bytes and not
by its (launch-bound, unfused) measured time.

Sources: ``torch/_functorch/partitioners.py`` (``get_default_op_list``:
recomputable / compute-intensive / random / view op sets; ``_size_of``;
``should_ban_recomputation``); ``torch.Tag.pointwise`` (the op tags
``pointwise_ops()`` reads); Checkmate (Jain et al., MLSys 2020, sec. 4: a
per-node recompute cost in the objective).
"""
from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from ..errors import ProblemError
from ..ir.problem import EXECUTORS, RematProblem

log = logging.getLogger(__name__)

__all__ = ["EXECUTORS", "is_fusible_op", "tensor_bytes", "bytes_moved", "recompute_times", "for_executor"]

_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
             "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16, "float8_e4m3fn": 1,
             "float8_e5m2": 1}


#: memory-bound ops the min-cut partitioner's recomputable allowlist adds to the ops tagged
#: ``torch.Tag.pointwise`` (``get_default_op_list`` in torch/_functorch/partitioners.py): casts,
#: copies, reductions, fills, indexing
_FUSIBLE_EXTRA = frozenset(
    "sum mean amax var std var_mean _grad_sum_to_size sum_to_size _to_copy to type_as clone full_like zeros_like "
    "full zeros ones new_zeros empty empty_like scalar_tensor arange triu isinf any argmax maximum index gather "
    "lift_fresh_copy threshold_backward gelu_backward where".split())
#: compute-intensive ops (banned from recomputation by the partitioner), random ops and views
_NOT_FUSIBLE = frozenset(
    "mm convolution convolution_backward bmm addmm _scaled_dot_product_flash_attention "
    "_scaled_dot_product_efficient_attention _flash_attention_forward _efficient_attention_forward "
    "upsample_bilinear2d _scaled_mm native_dropout rand_like randn_like "
    "squeeze unsqueeze alias view slice t expand as_strided permute select split _unsafe_view reshape".split())


def _resolve(target: Any) -> Any:
    """An aten ``OpOverload`` from an op or its string (``"aten.add.Tensor"``); ``None`` if unknown."""
    import torch

    if not isinstance(target, str):
        return target
    parts = target.split(".")
    if len(parts) < 2 or parts[0] not in ("aten", "prims"):
        return None
    obj: Any = getattr(torch.ops, parts[0], None)
    for part in parts[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def is_fusible_op(target: Any) -> bool:
    """Whether an op is a memory-bound op that Inductor fuses into its
    neighbours (the ``pointwise`` flag of a node).

    Parameters
    ----------
    target : torch._ops.OpOverload or str
        The op (an FX node's ``target``) or its name as stored in a problem
        (``"aten.add.Tensor"``).

    Returns
    -------
    bool
        True if the op is tagged ``torch.Tag.pointwise`` or is one of the
        casts, copies, reductions (``sum`` / ``var_mean`` / ``amax``), fills
        and indexing ops of the min-cut partitioner's recomputable allowlist,
        and it is neither compute-intensive (mm, bmm, addmm, convolution,
        attention), nor random, nor a view (views move no bytes and keep
        their measured, near-zero time).  Unknown names are False.

    Notes
    -----
    Source: ``get_default_op_list`` in ``torch/_functorch/partitioners.py``
    (its recomputable / compute-intensive / random / view lists, mirrored
    here by name: calling it scans every aten op, seconds per process) and
    ``torch.Tag.pointwise``.
    """
    import torch

    op = _resolve(target)
    if op is None:
        return False
    packet = getattr(op, "overloadpacket", op)
    name = getattr(packet, "__name__", "")
    if name in _NOT_FUSIBLE:
        return False
    return name in _FUSIBLE_EXTRA or torch.Tag.pointwise in getattr(op, "tags", ())


def tensor_bytes(problem: RematProblem, tid: int) -> int:
    """Bytes a kernel reads or writes for tensor ``tid``: ``numel x itemsize``
    from its shape and dtype (a view counts its own extent), else the bytes of
    its storage (as the partitioner's ``_size_of``)."""
    t = problem.tensors[tid]
    if t.shape is not None and t.dtype is not None:
        size = _ITEMSIZE.get(str(t.dtype).replace("torch.", ""))
        if size is not None:
            return int(math.prod(t.shape)) * size
    return problem.storage_bytes(tid)


def bytes_moved(problem: RematProblem, nid: int) -> int:
    """Bytes node ``nid`` moves through device memory: every input read once
    plus every output written once (:func:`tensor_bytes` each)."""
    n = problem.nodes[nid]
    return sum(tensor_bytes(problem, t) for t in n.inputs) + sum(tensor_bytes(problem, t) for t in n.outputs)


def recompute_times(problem: RematProblem) -> np.ndarray:
    """Seconds a recompute of each node costs under ``problem.executor``,
    shape ``(num_nodes,)``.

    ``"eager"``: ``problem.node_time`` (a copy).  ``"inductor"``: for a
    ``pointwise`` node, ``min(time_s, bytes_moved / memory_bytes_per_s)``;
    every other node its ``time_s``.

    Raises
    ------
    ProblemError
        ``executor="inductor"`` but the device profile has no
        ``memory_bytes_per_s`` (use :func:`for_executor`, which checks it).
    """
    times = problem.node_time.copy()
    if problem.executor == "eager":
        return times
    bw = problem.device.memory_bytes_per_s
    if not bw or bw <= 0:
        raise ProblemError(f"problem {problem.name!r} is priced for the {problem.executor} executor but its device "
                           f"profile has no memory bandwidth; re-profile it or pass memory_bytes_per_s= (CLI: --memory-bandwidth) to "
                           f"libra_opt.costs.for_executor")
    for n in problem.nodes:
        if n.pointwise:
            times[n.id] = min(n.time_s, bytes_moved(problem, n.id) / bw)
    return times


def for_executor(problem: RematProblem, executor: str, *, memory_bytes_per_s: float | None = None) -> RematProblem:
    """``problem`` priced for the executor that will run its plan.

    Parameters
    ----------
    problem : RematProblem
    executor : {"eager", "inductor"}
        See the module docstring.  ``"eager"`` gives back the problem with the
        eager cost model: its plans are the plans made before executors existed.
    memory_bytes_per_s : float, optional
        Device-memory bandwidth (bytes read + written per second) to use
        instead of ``problem.device.memory_bytes_per_s`` (needed for problems
        profiled before it was measured).

    Returns
    -------
    RematProblem
        A copy with ``executor`` set (and the bandwidth, if given).  For
        ``"inductor"``, if no node carries the ``pointwise`` flag (a problem
        saved before it existed), the flag is derived from each node's
        ``target`` name with :func:`is_fusible_op`.

    Raises
    ------
    ProblemError
        Unknown executor (the message lists the valid ones), a non-positive
        bandwidth, or ``"inductor"`` without any measured or given bandwidth.

    Examples
    --------
    The lead's ``optimize(..., executor=...)`` calls
    ``solve(for_executor(problem, executor), budget, solver)``; the simulator
    and the ``libra`` solver then price recomputes as that executor runs them.
    """
    import dataclasses

    if executor not in EXECUTORS:
        raise ProblemError(f"unknown executor {executor!r}; use one of {EXECUTORS}")
    device = problem.device
    if memory_bytes_per_s is not None:
        if not memory_bytes_per_s > 0 or math.isinf(memory_bytes_per_s):
            raise ProblemError(f"memory_bytes_per_s must be a positive number of bytes per second, got "
                               f"{memory_bytes_per_s!r}")
        device = dataclasses.replace(device, memory_bytes_per_s=float(memory_bytes_per_s))
    nodes = problem.nodes
    if executor == "inductor":
        if not device.memory_bytes_per_s:
            raise ProblemError(f"problem {problem.name!r} has no measured device-memory bandwidth, which the "
                               f"inductor cost model needs; re-profile it (libra_opt.profile records it) or pass "
                               f"memory_bytes_per_s= (CLI: --memory-bandwidth)")
        if not any(n.pointwise for n in nodes):
            nodes = tuple(dataclasses.replace(n, pointwise=is_fusible_op(n.target)) for n in nodes)
    if executor == problem.executor and device is problem.device and nodes is problem.nodes:
        return problem
    return problem.replace(nodes=nodes, device=device, executor=executor)
