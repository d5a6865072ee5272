"""Measuring what a step really allocates, on any device.

:class:`StorageTracker` is a ``TorchDispatchMode`` that sees every aten op and
counts the **storages** created while it is active: bytes are added when an op
returns a tensor on a storage it has not seen (and that none of the op's
inputs uses), and subtracted when that storage dies (a ``weakref.finalize``
on the storage; PyTorch keeps one Python object per live storage, so the
callback fires exactly when the last tensor or view on it is gone).  Storages
that existed before the tracker started (parameters, inputs) are never
counted.  This is the CPU stand-in for ``torch.cuda.max_memory_allocated``:
it measures graph memory per storage, the quantity the simulator predicts.

:func:`measure_joint_peak` runs a captured joint graph with a
``torch.fx.Interpreter`` (values freed after their last use) under the
tracker: the allocation-tracker check of the no-remat plan.
:func:`measure_step_peak` does the same for any callable, e.g. a forward,
loss and ``backward()`` of an :class:`~libra_opt.runtime.module.OptimizedModule`.

Sources: ``torch.utils._python_dispatch.TorchDispatchMode``;
``torch.fx.Interpreter`` (``garbage_collect_values``).
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

logger = logging.getLogger(__name__)

__all__ = ["StorageTracker", "TrackedRun", "measure_joint_peak", "measure_step_peak", "untracked"]


def untracked():
    """Context manager: allocations inside are invisible to an active
    :class:`StorageTracker` (used for host-side swap buffers)."""
    return _disable_current_modes()


def _storage(t: torch.Tensor):
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse / meta-less tensors
        return None


class StorageTracker(TorchDispatchMode):
    """Counts live bytes of the storages created while active.

    Attributes
    ----------
    live_bytes : int
        Bytes of tracked storages alive now.
    peak_bytes : int
        Highest ``live_bytes`` seen since start or :meth:`reset_peak`.
    allocations : int
        Number of storages counted.
    device : torch.device or None
        Only storages on this device are counted (default: all devices).

    Examples
    --------
    >>> with StorageTracker() as tr:
    ...     loss = model(x).sum(); loss.backward()
    >>> tr.peak_bytes
    """

    def __init__(self, device: torch.device | str | None = None):
        super().__init__()
        self.device = torch.device(device) if device is not None else None
        self.live_bytes = 0
        self.peak_bytes = 0
        self.allocations = 0
        self._live: dict[int, int] = {}

    def reset_peak(self) -> None:
        """Set :attr:`peak_bytes` to the current :attr:`live_bytes`."""
        self.peak_bytes = self.live_bytes

    def _free(self, key: int) -> None:
        nb = self._live.pop(key, 0)
        self.live_bytes -= nb

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        seen = set()
        for a in tree_leaves((args, kwargs)):
            if isinstance(a, torch.Tensor):
                s = _storage(a)
                if s is not None:
                    seen.add(s._cdata)
            elif isinstance(a, torch.UntypedStorage):
                seen.add(a._cdata)
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            if self.device is not None and t.device != self.device:
                continue
            s = _storage(t)
            if s is None:
                continue
            key = s._cdata
            if key in self._live or key in seen:
                continue
            nb = int(s.nbytes())
            if nb == 0:
                continue
            self._add(key, nb)
            weakref.finalize(s, self._free, key)
        return out

    def _add(self, key: int, nb: int) -> None:
        """Count a new storage of ``nb`` bytes (``key``: its ``_cdata``);
        subclasses hook allocations here and frees in :meth:`_free`."""
        self._live[key] = nb
        self.live_bytes += nb
        self.allocations += 1
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes


@dataclass
class TrackedRun:
    """Result of a tracked run.

    Attributes
    ----------
    peak_bytes : int
        Peak bytes of storages created during the run.
    end_bytes : int
        Bytes of those storages still alive at the end (outputs, gradients).
    allocations : int
    result : Any
        What the run returned.
    """

    peak_bytes: int
    end_bytes: int
    allocations: int
    result: Any = None


def measure_joint_peak(step, *, device: torch.device | str | None = None) -> TrackedRun:
    """Run a captured joint graph with ``torch.fx.Interpreter`` (free after
    last use) under a :class:`StorageTracker`: the measured peak of the
    no-remat plan.

    Parameters
    ----------
    step : CapturedStep
        From :func:`libra_opt.capture.capture`.
    device : optional
        Count only storages on this device.

    Returns
    -------
    TrackedRun
        ``peak_bytes`` compares with ``simulate(build_problem(step)).peak_bytes``.

    Notes
    -----
    Runs under ``torch.no_grad()`` (the joint graph computes gradients
    explicitly).  Consumes the global RNG state like one step would.
    """
    interp = fx.Interpreter(step.joint, garbage_collect_values=True)
    inputs = [t.detach() for t in step.primals] + [t.detach() for t in step.tangents]
    with torch.no_grad():
        tr = StorageTracker(device)
        with tr:
            out = interp.run(*inputs, enable_io_processing=False)
            peak = tr.peak_bytes
        end = tr.live_bytes
    return TrackedRun(peak_bytes=peak, end_bytes=end, allocations=tr.allocations, result=out)


def measure_step_peak(fn: Callable[[], Any], *, device: torch.device | str | None = None,
                      module=None) -> TrackedRun:
    """Peak bytes of the storages ``fn()`` creates, measured by a
    :class:`StorageTracker`: the CPU stand-in for ``torch.cuda.max_memory_allocated``.

    Parameters
    ----------
    fn : callable
        Called once with no arguments, e.g. forward, loss and ``backward()``.
    device : optional
        Count only storages on this device.
    module : OptimizedModule, optional
        When ``fn`` calls an optimized module, pass it: TorchDynamo refuses to
        run compiled code under a Python dispatch mode, so the tracker is then
        active only inside the module's forward and backward graphs (which
        create every activation and gradient of the step; what ``fn`` does
        outside them, e.g. a loss computed on the outputs, is not counted).

    Returns
    -------
    TrackedRun
    """
    tr = StorageTracker(device)
    if module is not None:
        with module.tracking(tr):
            res = fn()
    else:
        with tr:
            res = fn()
    return TrackedRun(peak_bytes=tr.peak_bytes, end_bytes=tr.live_bytes, allocations=tr.allocations, result=res)
