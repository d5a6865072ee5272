"""Swaps as custom operators (namespace ``libra``) that Inductor compiles around.

The Inductor executor (:mod:`libra_opt.runtime.inductor`) rewrites the swap
steps of a lowered plan (bound methods of
:class:`~libra_opt.runtime.swap.SwapManager` in the eager graphs) into these
operators, so that the forward and backward graphs are pure ``torch.ops``
graphs that ``make_fx`` can retrace and Inductor can compile:

=============================================  ==================================================
``libra::offload(Tensor t, int manager)``       copy ``t``'s elements to a host buffer (pinned, from
``-> Tensor``                                    the manager's pool) on the transfer stream; returns
                                                 the host tensor (contiguous, ``t``'s shape/dtype)
``libra::reload(Tensor host, int manager,``     allocate ``empty_strided(size, stride)`` on the
``Device device, SymInt[] size,``               compute stream, copy ``host`` into it on the
``SymInt[] stride, bool last) -> Tensor``       transfer stream, record an event; ``last`` returns
                                                 the host buffer to the pool (its last reload)
``libra::wait(Tensor(a!) t, int manager)``      the compute stream waits for ``t``'s reload event
``libra::wait_offload(Tensor host,``            the compute stream waits for the offload into
``int manager)``                                 ``host`` and the manager drops the device tensor (a
                                                 plan's ``Wait`` after ``SwapOut``: the storage returns
                                                 to the allocator there, after the copy)
``libra::poll(int manager)``                    drop the references to storages whose copy-out has
                                                 finished (they return to the allocator)
=============================================  ==================================================

This follows PyTorch 2.13's ``torch/_functorch/_activation_offloading/
offload_ops.py`` (``ao::offload`` / ``ao::reload`` / ``ao::wait_tensor``: one
transfer stream, completion events looked up by the tensor's ``data_ptr``, a
pinned pool, the reload allocated on the compute stream), with three
differences, all for torch 2.11 (the GPU machine's version) as well as 2.13:

- ``wait`` is declared **mutating** (``Tensor(a!)``, no result) instead of
  returning an alias: a mutating operator is impure in every version (FX's
  ``eliminate_dead_code``, Inductor's ``FallbackKernel.has_side_effects``),
  and Inductor orders every later reader of ``t`` after it (its mutation
  dependencies), which is exactly "no consumer before the wait".
- ``offload``, ``reload``, ``wait_offload`` and ``poll`` are registered with
  :func:`torch.fx.node.has_side_effect` and get an Inductor lowering (a
  fallback kernel marked as having side effects), so neither FX nor Inductor
  eliminates them even where nothing reads their result (``poll``).
- The source of an offload is kept alive by the manager until its copy has
  finished (the references ``poll`` drops), as in the eager executor, instead
  of by a ``keepalive`` argument of a wait: the plan frees a swapped-out
  storage when its copy ends, or at its ``Wait`` (``wait_offload``) where the
  plan stalls for the copy.  Because Inductor
  may otherwise write into a buffer whose Python reference it dropped (buffer
  reuse, in-place kernels), the executor compiles plans with swaps with
  ``allow_buffer_reuse=False`` and ``inplace_buffers=False``.

Managers reach the operators through an integer id
(:func:`register_manager`); the registry holds them weakly.  On a CPU the
copies are synchronous (no stream, no event), so the same graphs run in CI.

Sources: ``torch.library`` (custom operators, ``register_fake``);
``torch._inductor.lowering.fallback_handler``; CUDA streams and events.
"""
from __future__ import annotations

import itertools
import logging
import weakref

import torch
from torch.fx.node import has_side_effect

from libra_opt.errors import RuntimeExecutionError


logger = logging.getLogger(__name__)

__all__ = ["register_manager", "manager", "offload", "reload", "wait", "wait_offload", "poll", "SWAP_OPS",
           "register_inductor_lowerings"]

_managers: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
_ids = itertools.count(1)


def register_manager(swap) -> int:
    """The integer id under which the swap operators reach ``swap`` (a
    :class:`~libra_opt.runtime.swap.SwapManager`); registered once per
    manager, held weakly."""
    mid = getattr(swap, "_op_id", None)
    if mid is None or _managers.get(mid) is not swap:
        mid = next(_ids)
        _managers[mid] = swap
        swap._op_id = mid
    return mid


def manager(mid: int):
    """The :class:`~libra_opt.runtime.swap.SwapManager` registered as ``mid``.

    Raises
    ------
    RuntimeExecutionError
        No live manager has that id (its optimized module was deleted).
    """
    try:
        return _managers[int(mid)]
    except KeyError:
        raise RuntimeExecutionError(f"swap manager {mid} is gone (its optimized module was deleted); "
                                    f"a compiled plan cannot outlive its module") from None


_lib = torch.library.Library("libra", "DEF")
_lib.define("offload(Tensor t, int manager) -> Tensor")
_lib.define("reload(Tensor host, int manager, Device device, SymInt[] size, SymInt[] stride, bool last) -> Tensor")
_lib.define("wait(Tensor(a!) t, int manager) -> ()")
_lib.define("wait_offload(Tensor host, int manager) -> ()")
_lib.define("poll(int manager) -> ()")


def _offload(t: torch.Tensor, mid: int) -> torch.Tensor:
    return manager(mid).op_offload(t)


def _offload_fake(t: torch.Tensor, mid: int) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="cpu")


def _reload(host: torch.Tensor, mid: int, device: torch.device, size, stride, last: bool) -> torch.Tensor:
    return manager(mid).op_reload(host, device, size, stride, last)


def _reload_fake(host, mid, device, size, stride, last):
    return torch.empty_strided(tuple(size), tuple(stride), dtype=host.dtype, device=device)


def _wait(t: torch.Tensor, mid: int) -> None:
    manager(mid).op_wait(t)


def _wait_fake(t, mid) -> None:
    return None


def _wait_offload(host: torch.Tensor, mid: int) -> None:
    manager(mid).wait_offload(host)


def _wait_offload_fake(host, mid) -> None:
    return None


def _poll(mid: int) -> None:
    manager(mid).poll()


def _poll_fake(mid) -> None:
    return None


for _name, _impl, _fake in (("offload", _offload, _offload_fake), ("reload", _reload, _reload_fake),
                            ("wait", _wait, _wait_fake), ("wait_offload", _wait_offload, _wait_offload_fake),
                            ("poll", _poll, _poll_fake)):
    _lib.impl(_name, _impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"libra::{_name}", _fake, lib=_lib)

offload = torch.ops.libra.offload.default
reload = torch.ops.libra.reload.default
wait = torch.ops.libra.wait.default
wait_offload = torch.ops.libra.wait_offload.default
poll = torch.ops.libra.poll.default
#: the five operators, in the order above
SWAP_OPS = (offload, reload, wait, wait_offload, poll)
for _op in SWAP_OPS:
    has_side_effect(_op)


def register_inductor_lowerings() -> None:
    """Lower each swap operator to an Inductor fallback kernel (a call of the
    operator in the generated code) that reports side effects, so Inductor's
    scheduler never eliminates it (torch 2.11's ``FallbackKernel`` only
    counts mutating operators as side-effecting).  Idempotent: an operator
    that already has a lowering is left as it is.  Called by
    :class:`~libra_opt.runtime.inductor.InductorCompiler`.  Source:
    ``torch._inductor.lowering`` (``fallback_handler``, ``register_lowering``)."""
    from torch._inductor import lowering as L
    from torch._inductor.virtualized import V

    for op in SWAP_OPS:
        if op in L.lowerings:
            continue
        handler = L.fallback_handler(op, add_to_fallback_set=False)

        def lower(*args, _handler=handler, **kwargs):
            ops = getattr(V.graph, "operations", None)
            if ops is None:   # pragma: no cover - torch versions without the Operation list
                ops = V.graph.buffers
            n = len(ops)
            out = _handler(*args, **kwargs)
            for new in ops[n:]:
                new.has_side_effects = lambda: True
            return out

        L.register_lowering(op, type_promotion_kind=None)(lower)
