"""Profiling: measure every op of a captured training step on the device.

:func:`profile_step` runs the joint forward+backward aten graph of a
:class:`~libra_opt.capture.CapturedStep` node by node on real tensors (the
captured primals and tangents) with a :class:`torch.fx.Interpreter`
subclass, and returns each node's compute time (median over repeats, seconds)
and transient workspace (bytes).  :func:`problem_of` is the whole
model-to-problem pipeline (capture -> profile -> device profile ->
:func:`~libra_opt.capture.build_problem`), giving a
:class:`~libra_opt.problem.RematProblem` with a measured
:class:`~libra_opt.problem.DeviceProfile` and a
:class:`~libra_opt.problem.Provenance`; :func:`optimize
<libra_opt.optimize.optimize>`, the demo, the benchmarks and :func:`profile`
(which also takes a model by name or a model spec such as a
:class:`~libra_opt.zoo.ZooModel`) all go through it.  This module does not
import the zoo: a model name is resolved by :data:`NAME_BUILDER`.

How it measures (``DESIGN.md``, "Measuring"):

- **time on a GPU**: a CUDA event pair around each op, ``warmup`` untimed
  passes over the whole graph, then ``repeats`` timed passes, each one pass
  of the graph with no synchronization until its end; a node's time is the
  median of its repeats.  Only the op itself is timed, not the
  interpreter's Python overhead between ops.
- **time on a CPU**: ``time.perf_counter`` around each op (CPU ops are
  synchronous), same one-pass structure, warm-up and median.
- **calibration**: the whole step is timed as it runs (the joint graph's
  generated code, one event pair per run, median of ``repeats``), and every
  op's time is scaled by ``measured step / sum of op times`` so that the
  times add up to the measured step; the factor and the spread (relative
  interquartile ranges of the step, of each pass's op sum and of the ops,
  across repeats) are recorded in ``provenance.extra["profile"]``.
- **workspace on a GPU**: one extra pass; before each op
  ``torch.cuda.reset_peak_memory_stats``, after it
  ``max_memory_allocated - memory_allocated(before) - new output bytes``
  (output storages rounded up to the caching allocator's 512-byte blocks),
  clipped at 0.  This is the op's transient scratch memory (cuBLAS / cuDNN
  workspaces, temporaries inside composite kernels).
- **workspace on a CPU**: 0.  The CPU allocator has no peak counter that
  separates one op's temporaries from its outputs, so CPU problems carry no
  workspace; their memory numbers are storage sizes only.
- **bandwidth** (:func:`measure_bandwidth`): on a GPU, pinned host buffers
  copied with ``non_blocking=True`` and timed with CUDA events (median of
  repeats) each way; on a CPU, a host ``memcpy`` rate (``Tensor.copy_``), and
  ``copies_overlap_compute=False`` because a copy then occupies the compute
  timeline.  Measured once per device per process.

Sources: ``torch.fx.Interpreter`` (one method per opcode, overridden here in
``run_node``); ``torch.cuda.Event(enable_timing=True)``;
``torch.cuda.max_memory_allocated`` / ``reset_peak_memory_stats``; the
profiling step of Checkmate (Jain et al., MLSys 2020, sec. 6: per-op costs
measured on the target device) and of Libra (Wang 2024: profiled peak and
per-op time).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import gc
import importlib
import logging
import math
import operator
import os
import platform
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import LibraOptError
from ..ir.problem import DeviceProfile, Provenance, RematProblem

if TYPE_CHECKING:  # pragma: no cover
    from .capture import CapturedStep

logger = logging.getLogger(__name__)

__all__ = ["ProfilingError", "problem_of", "profile_step", "profile", "measure_bandwidth",
           "measure_memory_bandwidth", "device_profile", "cpu_name", "profile_agreement", "profile_summary", "OPTIMIZERS",
           "UNIT_TIME_S", "NAME_BUILDER"]

#: optimizers whose state :func:`~libra_opt.capture.build_problem` accounts for
OPTIMIZERS = ("none", "sgd", "adam", "adamw")

#: compute time given to every op when a step is not profiled (seconds; :func:`problem_of` with ``profile=False``)
UNIT_TIME_S = 1e-6

#: how :func:`profile` builds a model given by name: ``"module:callable"``, imported on first use and
#: called as ``builder(name, batch, seq, device=..., dtype=...)``; it returns a model spec (attributes
#: ``model``, ``args``, ``kwargs``, ``loss_fn``, ``name``, ``batch``, ``seq``, ``description``, as
#: :class:`~libra_opt.zoo.ZooModel` has).  The zoo, an application of this module, is the default; this
#: module never imports it.
NAME_BUILDER = "libra_opt.apps.zoo:build_model"

#: the CUDA caching allocator rounds every block up to a multiple of this (bytes)
_CUDA_BLOCK = 512


class ProfilingError(LibraOptError, RuntimeError):
    """Profiling could not run the captured graph (an op failed on real
    tensors, or the device does not match the captured tensors); the message
    names the node and says what to change."""


# ---------------------------------------------------------------- bandwidth
_BANDWIDTH_CACHE: dict[str, tuple[float, float]] = {}


def _as_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cpu")
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def _measured_device(device: str | torch.device | None) -> tuple[torch.device, str]:
    """``(device, its cache key)``; raises :class:`ProfilingError` for CUDA without CUDA."""
    dev = _as_device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ProfilingError(f"device {dev} requested but CUDA is not available; profile with device='cpu'")
    return dev, str(dev)


def _median_copy_s(dst: torch.Tensor, src: torch.Tensor, repeats: int) -> float:
    """Median seconds of ``dst.copy_(src)`` over ``repeats`` copies after one
    untimed copy: CUDA events on the current stream when either side is on a
    GPU (``non_blocking``: pinned host memory copies asynchronously),
    ``perf_counter`` otherwise."""
    cuda = dst.is_cuda or src.is_cuda
    dst.copy_(src, non_blocking=cuda)  # warm-up (faults host pages in)
    samples = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            samples.append(time.perf_counter() - t0)
    return max(statistics.median(samples), 1e-12)


def measure_bandwidth(device: str | torch.device | None = None, *, nbytes: int | None = None,
                      repeats: int = 5) -> tuple[float, float]:
    """Host<->device copy bandwidth, bytes per second, measured once per device.

    Parameters
    ----------
    device : str or torch.device, optional
        ``"cuda"`` / ``"cuda:1"`` or ``"cpu"`` (default).
    nbytes : int, optional
        Buffer size in bytes (default 256 MiB on a GPU, 64 MiB on a CPU).
    repeats : int
        Timed copies each way; the median is reported.

    Returns
    -------
    (h2d_bytes_per_s, d2h_bytes_per_s) : tuple of float
        On a GPU: pinned host -> device and device -> pinned host, each timed
        with CUDA events around ``Tensor.copy_(..., non_blocking=True)``.  On
        a CPU: the host memcpy rate (both values equal), which is what a
        "swap" costs when there is no separate device memory.

    Raises
    ------
    ProfilingError
        ``device`` is CUDA but CUDA is not available.

    Notes
    -----
    Results are cached per device for the life of the process.  Source:
    ``torch.cuda.Event``, ``Tensor.pin_memory``.
    """
    dev, key = _measured_device(device)
    if key in _BANDWIDTH_CACHE and nbytes is None:
        return _BANDWIDTH_CACHE[key]
    repeats = max(1, int(repeats))
    if dev.type == "cuda":
        n = int(nbytes or 256 * 2**20)
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        host.fill_(1)
        dbuf = torch.empty(n, dtype=torch.uint8, device=dev)
        with torch.cuda.device(dev):
            h2d = n / _median_copy_s(dbuf, host, repeats)
            d2h = n / _median_copy_s(host, dbuf, repeats)
        del host, dbuf
    else:
        n = int(nbytes or 64 * 2**20)
        src = torch.ones(n, dtype=torch.uint8)
        dst = torch.zeros(n, dtype=torch.uint8)
        h2d = d2h = n / _median_copy_s(dst, src, repeats)  # the first copy faults the pages in
        del src, dst
    result = (float(h2d), float(d2h))
    if nbytes is None:
        _BANDWIDTH_CACHE[key] = result
    logger.info("bandwidth on %s: h2d %.2f GB/s, d2h %.2f GB/s", key, result[0] / 1e9, result[1] / 1e9)
    return result


_MEMORY_BANDWIDTH_CACHE: dict[str, float] = {}


def measure_memory_bandwidth(device: str | torch.device | None = None, *, nbytes: int | None = None,
                             repeats: int = 5) -> float:
    """Device-memory bandwidth, bytes moved (read + written) per second.

    Parameters
    ----------
    device : str or torch.device, optional
        ``"cuda"`` / ``"cuda:1"`` or ``"cpu"`` (default).
    nbytes : int, optional
        Buffer size in bytes (default 512 MiB on a GPU, 64 MiB on a CPU).
    repeats : int
        Timed copies; the median is reported.

    Returns
    -------
    float
        ``2 * nbytes / t`` for a device-to-device ``Tensor.copy_`` of
        ``nbytes`` (each byte read once and written once), ``t`` timed with
        CUDA events on a GPU and ``time.perf_counter`` on a CPU.  This is what
        a fused, memory-bound kernel can stream, and what
        :func:`libra_opt.costs.recompute_times` divides a recomputed
        pointwise op's bytes by.

    Raises
    ------
    ProfilingError
        ``device`` is CUDA but CUDA is not available.

    Notes
    -----
    Cached per device for the life of the process (when ``nbytes`` is not
    given).  Source: ``torch.cuda.Event(enable_timing=True)``; the
    copy-kernel bandwidth test of the CUDA samples (``bandwidthTest``,
    device-to-device mode, which also counts read + write).
    """
    dev, key = _measured_device(device)
    if key in _MEMORY_BANDWIDTH_CACHE and nbytes is None:
        return _MEMORY_BANDWIDTH_CACHE[key]
    repeats = max(1, int(repeats))
    if dev.type == "cuda":
        n = int(nbytes or 512 * 2**20)
        with torch.cuda.device(dev):
            src = torch.ones(n, dtype=torch.uint8, device=dev)
            seconds = _median_copy_s(torch.empty_like(src), src, repeats)
            del src
    else:
        n = int(nbytes or 64 * 2**20)
        seconds = _median_copy_s(torch.zeros(n, dtype=torch.uint8), torch.ones(n, dtype=torch.uint8), repeats)
    bw = float(2 * n / seconds)
    if nbytes is None:
        _MEMORY_BANDWIDTH_CACHE[key] = bw
    logger.info("device-memory bandwidth on %s: %.1f GB/s", key, bw / 1e9)
    return bw


def cpu_name() -> str:
    """The host CPU's model name: the ``model name`` line of
    ``/proc/cpuinfo`` (Linux), else ``platform.processor()``, else
    ``platform.machine()``, else ``"cpu"``.  Names the CPU in a
    :class:`~libra_opt.problem.DeviceProfile` and in the plan store's device
    key (:mod:`libra_opt.plan_store`).  Never raises (an unreadable
    ``/proc/cpuinfo`` falls through)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _host_memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def device_profile(device: str | torch.device | None = None) -> DeviceProfile:
    """The :class:`~libra_opt.problem.DeviceProfile` of ``device``, measured.

    Parameters
    ----------
    device : str or torch.device, optional
        Default ``"cpu"``.

    Returns
    -------
    DeviceProfile
        GPU: ``torch.cuda.get_device_name``, ``total_memory`` of
        ``torch.cuda.get_device_properties`` (bytes), measured pinned
        bandwidths, ``copies_overlap_compute=True``.  CPU: ``"cpu (<model>,
        <n> threads)"``, physical memory (bytes), memcpy rate,
        ``copies_overlap_compute=False``.  Both: the device-memory
        bandwidth of :func:`measure_memory_bandwidth`.

    Raises
    ------
    ProfilingError
        CUDA requested but not available.
    """
    dev = _as_device(device)
    h2d, d2h = measure_bandwidth(dev)
    mem_bw = measure_memory_bandwidth(dev)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        return DeviceProfile(name=torch.cuda.get_device_name(dev), total_memory_bytes=int(props.total_memory),
                             h2d_bytes_per_s=h2d, d2h_bytes_per_s=d2h, copies_overlap_compute=True,
                             memory_bytes_per_s=mem_bw)
    return DeviceProfile(name=f"cpu ({cpu_name()}, {torch.get_num_threads()} threads)",
                         total_memory_bytes=_host_memory_bytes(), h2d_bytes_per_s=h2d, d2h_bytes_per_s=d2h,
                         copies_overlap_compute=False, memory_bytes_per_s=mem_bw)


# ------------------------------------------------------------------ per-node
def _storage_keys(values: Any, device: torch.device | None = None) -> set[tuple[int, int]]:
    """``(data_ptr, nbytes)`` of the storages of the strided tensors in ``values`` (on ``device`` if given)."""
    keys = set()
    for v in tree_flatten(values)[0]:
        if (isinstance(v, torch.Tensor) and v.layout == torch.strided
                and (device is None or _as_device(v.device) == device)):
            s = v.untyped_storage()
            keys.add((s.data_ptr(), s.nbytes()))
    return keys


def _new_output_bytes(out: Any, input_keys: set[tuple[int, int]], block: int, device: torch.device) -> int:
    """Bytes of output storages on ``device`` that are not input storages, each rounded up to ``block``."""
    total = 0
    for key in _storage_keys(out, device) - input_keys:
        total += -(-key[1] // block) * block
    return total


class _NodeProfiler(torch.fx.Interpreter):
    """Runs the joint graph and times every ``call_function`` node except
    ``getitem``; optionally measures CUDA workspace (see module docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, device: torch.device, bar=None):
        super().__init__(gm, garbage_collect_values=True)
        self.device = device
        self.cuda = device.type == "cuda"
        self.bar = bar
        self.measure_workspace = False
        self.cpu_times: dict[str, float] = {}
        self.cuda_events: dict[str, tuple[torch.cuda.Event, torch.cuda.Event]] = {}
        self.workspace: dict[str, int] = {}

    def timed_nodes(self) -> list[torch.fx.Node]:
        return [n for n in self.module.graph.nodes if _is_timed(n)]

    def run_node(self, n: torch.fx.Node) -> Any:
        if not _is_timed(n):
            return super().run_node(n)
        with self._set_current_node(n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            try:
                if self.measure_workspace:
                    out = self._run_workspace(n, args, kwargs)
                elif self.cuda:
                    ev = self.cuda_events.get(n.name)
                    if ev is None:
                        ev = self.cuda_events[n.name] = (torch.cuda.Event(enable_timing=True),
                                                         torch.cuda.Event(enable_timing=True))
                    ev[0].record()
                    out = n.target(*args, **kwargs)
                    ev[1].record()
                else:
                    t0 = time.perf_counter()
                    out = n.target(*args, **kwargs)
                    self.cpu_times[n.name] = time.perf_counter() - t0
            except Exception as e:  # re-raised naming the node
                raise ProfilingError(f"op {n.name} ({n.target}) failed while profiling: {type(e).__name__}: {e}; "
                                     f"check that the model runs eagerly on this device with these inputs") from e
        if self.bar is not None:
            self.bar.update(1)
        return out

    def _run_workspace(self, n: torch.fx.Node, args, kwargs) -> Any:
        in_keys = _storage_keys((args, kwargs), self.device)
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        out = n.target(*args, **kwargs)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        new_bytes = _new_output_bytes(out, in_keys, _CUDA_BLOCK, self.device)
        self.workspace[n.name] = max(0, int(peak - before - new_bytes))
        return out

    def pass_times(self) -> dict[str, float]:
        """Seconds per timed node of the last pass (synchronizes on a GPU)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return {name: s.elapsed_time(e) / 1e3 for name, (s, e) in self.cuda_events.items()}
        return dict(self.cpu_times)


def _is_timed(n: torch.fx.Node) -> bool:
    return n.op == "call_function" and n.target is not operator.getitem


def _step_device(step: "CapturedStep") -> torch.device:
    for t in list(step.primals) + list(step.tangents):
        if isinstance(t, torch.Tensor):
            return _as_device(t.device)
    return torch.device("cpu")


def _show_progress(progress: bool) -> bool:
    return bool(progress) and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def profile_step(step: "CapturedStep", device: str | torch.device | None = None, *, warmup: int = 2,
                 repeats: int = 5, progress: bool = True, calibrate: bool = True,
                 step_time_s: float | None = None) -> dict:
    """Measure each op of a captured step: time (median, s) and workspace (bytes).

    Parameters
    ----------
    step : CapturedStep
        From :func:`libra_opt.capture.capture`: the joint graph with real
        primals (parameters, buffers, inputs) and tangents.
    device : str or torch.device, optional
        Where to run; must be the device of the captured tensors (default:
        that device).  Graphs carry device constants, so capture on the device
        you profile on.
    warmup : int
        Untimed passes over the whole graph first (>= 0).
    repeats : int
        Timed passes (>= 1); each node's time is its median over them.
    progress : bool
        Show a ``tqdm`` bar (only when stderr is a terminal).
    calibrate : bool
        Scale every op's time by ``measured step / sum of op times`` so that
        the per-op times add up to the step as it really runs (default).
        The factor is recorded either way.
    step_time_s : float, optional
        The measured step to calibrate to, seconds (e.g. a compiled step
        timed by the caller).  Default: the joint graph run as a whole (its
        generated code, ``GraphModule.__call__``, op after op as the eager
        executor runs it), timed ``repeats`` times after ``warmup`` runs with
        one CUDA event pair (or ``perf_counter``) per run, median.

    Returns
    -------
    dict
        ``"times"``: ``{fx node name: seconds}`` for every ``call_function``
        node except ``getitem`` (folded into its producer by
        ``build_problem``), calibrated if ``calibrate``; ``"workspace"``:
        ``{fx node name: bytes}`` (all 0 on a CPU); ``"step_time_s"``: sum of
        ``"times"`` (s); ``"op_sum_s"``: sum of the uncalibrated median op
        times (s); ``"measured_step_s"``: the whole step calibrated to (s);
        ``"calibration"``: ``measured_step_s / op_sum_s`` (the factor applied
        when ``calibrate``); ``"calibrated"``: bool; ``"spread"``: relative
        interquartile ranges ((q75 - q25) / median) across the repeats:
        ``"step"`` of the measured whole step, ``"op_sum"`` of each pass's
        sum of op times, ``"op_weighted"`` the mean of the ops' relative IQRs
        weighted by their median times; ``"timer"``: ``"cuda-events"`` or
        ``"perf_counter"``; ``"device"``: the device string; ``"warmup"``,
        ``"repeats"``.

    How each op is timed: one pass of the graph per repeat, an event pair
    (GPU) or ``perf_counter`` pair (CPU) around each op, nothing synchronized
    until the end of the pass.  On a GPU an op's event pair also holds the
    launch gaps while the device waits for the host, so the raw sum over-
    states a launch-bound step (GPT-2 medium on an H100: 200 ms against 134
    ms measured, ``gpu-measurements/README.md``); calibration spreads the
    measured step over the ops in proportion to their times.

    Raises
    ------
    ProfilingError
        ``device`` differs from the captured tensors' device, bad
        ``warmup``/``repeats``, or an op fails (the message names it).

    Notes
    -----
    Runs under ``torch.no_grad()``: the joint graph computes gradients
    explicitly, so autograd bookkeeping would only add time and memory.
    Source: ``torch.fx.Interpreter`` (``run_node`` overridden), CUDA events,
    ``torch.cuda.max_memory_allocated``.
    """
    if int(repeats) < 1 or int(warmup) < 0:
        raise ProfilingError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    dev = _step_device(step)
    if device is not None and _as_device(device) != dev:
        raise ProfilingError(f"the captured tensors are on {dev} but profiling was asked on "
                             f"{_as_device(device)}; build and capture the model on {_as_device(device)}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ProfilingError("the captured tensors are on CUDA but CUDA is not available")
    gm = step.joint
    inputs = [t.detach() if isinstance(t, torch.Tensor) else t for t in list(step.primals) + list(step.tangents)]
    n_placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    if len(inputs) != n_placeholders:
        raise ProfilingError(f"the joint graph has {n_placeholders} placeholders but the step holds "
                             f"{len(step.primals)} primals + {len(step.tangents)} tangents; re-capture the step")
    runner = _NodeProfiler(gm, dev)
    timed = runner.timed_nodes()
    passes = int(warmup) + int(repeats) + (1 if dev.type == "cuda" else 0)
    samples: dict[str, list[float]] = {n.name: [] for n in timed}

    from tqdm.auto import tqdm

    name = getattr(step, "model_name", "") or "step"
    bar = tqdm(total=passes * len(timed), desc=f"profiling {name}", unit="op", leave=False,
               disable=not _show_progress(progress))
    runner.bar = bar
    logger.info("profiling %s: %d ops x (%d warm-up + %d timed passes) on %s", name, len(timed), warmup,
                repeats, dev)
    t_start = time.perf_counter()
    try:
        with torch.no_grad():
            for k in range(passes):
                runner.measure_workspace = dev.type == "cuda" and k == passes - 1
                runner.run(*inputs, enable_io_processing=False)
                if warmup <= k < warmup + repeats:
                    for node_name, s in runner.pass_times().items():
                        samples[node_name].append(s)
                elif dev.type == "cuda":
                    torch.cuda.synchronize(dev)
    finally:
        bar.close()
    times = {k: float(statistics.median(v)) if v else 0.0 for k, v in samples.items()}
    workspace = {n.name: int(runner.workspace.get(n.name, 0)) for n in timed}
    op_sum = math.fsum(times.values())
    pass_sums = [math.fsum(v[k] for v in samples.values() if k < len(v)) for k in range(int(repeats))]
    if step_time_s is None:
        whole = _time_whole_step(gm, inputs, dev, warmup=int(warmup), repeats=int(repeats))
        measured = float(statistics.median(whole))
    else:
        if not step_time_s > 0 or math.isinf(step_time_s):
            raise ProfilingError(f"step_time_s must be a positive number of seconds, got {step_time_s!r}")
        whole, measured = [], float(step_time_s)
    factor = measured / op_sum if op_sum > 0 else 1.0
    if calibrate and op_sum > 0:
        times = {k: v * factor for k, v in times.items()}
    spread = {"step": _relative_iqr(whole), "op_sum": _relative_iqr(pass_sums),
              "op_weighted": (math.fsum(statistics.median(v) * _relative_iqr(v) for v in samples.values() if v)
                              / op_sum if op_sum > 0 else 0.0)}
    step_s = math.fsum(times.values())
    logger.info("profiled %s: %d ops, op sum %.4f s, measured step %.4f s (calibration x%.3f), spread %s; "
                "%.1f s of profiling", name, len(timed), op_sum, measured, factor,
                {k: round(v, 4) for k, v in spread.items()}, time.perf_counter() - t_start)
    return {"times": times, "workspace": workspace, "step_time_s": step_s, "op_sum_s": op_sum,
            "measured_step_s": measured, "calibration": factor, "calibrated": bool(calibrate and op_sum > 0),
            "spread": spread, "timer": "cuda-events" if dev.type == "cuda" else "perf_counter",
            "device": str(dev), "warmup": int(warmup), "repeats": int(repeats)}


def profile_summary(measured: dict) -> dict:
    """The part of :func:`profile_step`'s result recorded in a problem's
    ``provenance.extra["profile"]``: ``op_sum_s``, ``measured_step_s``,
    ``calibration``, ``calibrated``, ``spread`` (JSON values)."""
    return {k: measured[k] for k in ("op_sum_s", "measured_step_s", "calibration", "calibrated", "spread")}


def _relative_iqr(values: list[float]) -> float:
    """``(q75 - q25) / median`` of ``values`` (0 for fewer than two values or a zero median)."""
    if len(values) < 2:
        return 0.0
    q25, q50, q75 = np.percentile(np.asarray(values, dtype=np.float64), [25, 50, 75])
    return float((q75 - q25) / q50) if q50 > 0 else 0.0


def _time_whole_step(gm: torch.fx.GraphModule, inputs: list, dev: torch.device, *, warmup: int,
                     repeats: int) -> list[float]:
    """Seconds per run of the whole joint graph (``repeats`` runs after
    ``warmup``), one CUDA event pair or ``perf_counter`` pair per run."""
    info = getattr(gm.graph._codegen, "pytree_info", None)
    args = tuple(tree_unflatten(inputs, info.in_spec)) if info is not None and info.in_spec is not None \
        else tuple(inputs)   # the joint graph takes (primals, tangents) lists: rebuild them from the flat inputs
    samples = []
    with torch.no_grad():
        for k in range(warmup + repeats):
            if dev.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = gm(*args)
                end.record()
                end.synchronize()
                dt = start.elapsed_time(end) / 1e3
            else:
                t0 = time.perf_counter()
                out = gm(*args)
                dt = time.perf_counter() - t0
            del out
            if k >= warmup:
                samples.append(dt)
    return samples


def profile_agreement(a: dict | RematProblem, b: dict | RematProblem) -> dict:
    """How well two profiles of one graph agree.

    Parameters
    ----------
    a, b : dict or RematProblem
        Results of :func:`profile_step` (their ``"times"``) or problems (node
        ``time_s`` by node name) of the same graph.

    Returns
    -------
    dict
        ``"step"``: ``|sum a - sum b| / mean of the sums``; ``"ops"``: the
        time-weighted relative difference of the ops, ``sum |a_i - b_i| /
        mean of the sums``; ``"ops_compared"``: how many ops both hold.  The
        issue-10 target on a GPU is ``"step" <= 0.05``.

    Raises
    ------
    ProfilingError
        The two profiles share no op name (different graphs).
    """
    def times_of(x) -> dict[str, float]:
        if isinstance(x, RematProblem):
            return {n.name: n.time_s for n in x.nodes}
        return dict(x["times"])

    ta, tb = times_of(a), times_of(b)
    common = sorted(set(ta) & set(tb))
    if not common:
        raise ProfilingError("the two profiles share no op: they are not profiles of one graph")
    sa, sb = math.fsum(ta[k] for k in common), math.fsum(tb[k] for k in common)
    mean = (sa + sb) / 2 or 1.0
    return {"step": abs(sa - sb) / mean, "ops": math.fsum(abs(ta[k] - tb[k]) for k in common) / mean,
            "ops_compared": len(common)}


# ------------------------------------------------------------------ pipeline
def _dtype_name(dtype: torch.dtype | None) -> str:
    return "" if dtype is None else str(dtype).replace("torch.", "")


def _model_dtype(model: nn.Module) -> torch.dtype | None:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return None


def _model_device(model: nn.Module, args, kwargs) -> torch.device:
    for p in model.parameters():
        return _as_device(p.device)
    for v in tree_flatten((args, kwargs))[0]:
        if isinstance(v, torch.Tensor):
            return _as_device(v.device)
    return torch.device("cpu")


def problem_of(model: "nn.Module | CapturedStep", example_inputs: Any = (), example_kwargs: dict | None = None,
               *, loss_fn: Callable[[Any], torch.Tensor] | None = None,
               autocast_dtype: torch.dtype | None = None, optimizer: str = "adam", profile: bool = True,
               warmup: int = 2, repeats: int = 5, progress: bool = False, calibrate: bool = True,
               name: str | None = None) -> RematProblem:
    """The :class:`RematProblem` of one training step of ``model``: capture,
    profile, device profile, build.  Every model-to-problem caller (``optimize``,
    :func:`profile`, the demo, ``benchmarks/headline.py``) uses this.

    Parameters
    ----------
    model : nn.Module or CapturedStep
        A model (captured here with :func:`libra_opt.capture.capture`, with
        ``example_inputs`` / ``example_kwargs`` / ``loss_fn`` /
        ``autocast_dtype``), or a step already captured (then leave those out).
    example_inputs : tensor or tuple
        Positional inputs of one step (a lone tensor is one input).
    example_kwargs : dict, optional
    loss_fn : callable, optional
        ``loss_fn(output) -> scalar`` (default: the output is differentiated
        with ones as tangents).
    autocast_dtype : torch.dtype, optional
        Capture under ``torch.autocast`` with this dtype (mixed precision).
    optimizer : {"none", "sgd", "adam", "adamw"}
        Optimizer whose state is counted in the fixed memory (sgd: 1x,
        adam/adamw: 2x the trainable parameters' bytes).
    profile : bool
        Time every op on the step's device (:func:`profile_step`) and measure
        the device (:func:`device_profile`).  ``False``: every op takes
        :data:`UNIT_TIME_S` seconds, no workspace, the device only named
        (nothing runs: for tests and byte-exact planning).
    warmup, repeats, progress, calibrate
        See :func:`profile_step`.
    name : str, optional
        Problem name (default: the captured step's model name).

    Returns
    -------
    RematProblem
        Nodes in the eager order of the joint graph.  Profiled: measured
        ``time_s`` (seconds) and ``workspace_bytes`` (bytes), the measured
        device, and in ``provenance.extra``: device, timer, warm-up, repeats,
        optimizer, transformers version, autocast dtype, threads (CPU) and
        ``"profile"`` (:func:`profile_summary`).  On CUDA the blocks that
        profiling the unplanned step cached go back to the driver
        (``torch.cuda.empty_cache``) before the device is measured, so what
        is planned next does not run beside them.

    Raises
    ------
    CaptureError
        The model does not capture as one graph (the message names the break).
    ProfilingError
        Unknown ``optimizer``, capture options given with a captured step, or
        an op fails while profiling.

    Sources: the profiling step of Checkmate (Jain et al., MLSys 2020, sec. 6)
    and Libra (Wang 2024); ``torch._functorch.aot_autograd`` for the capture.
    """
    from .capture import CapturedStep, build_problem, capture

    if optimizer not in OPTIMIZERS:
        raise ProfilingError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
    if isinstance(model, CapturedStep):
        if (example_inputs not in ((), None) or example_kwargs or loss_fn is not None
                or autocast_dtype is not None):
            raise ProfilingError("problem_of(step): the step is already captured; pass example_inputs, "
                                 "example_kwargs, loss_fn and autocast_dtype to capture() instead, or pass the "
                                 "model")
        step = model
    elif isinstance(model, nn.Module):
        args = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
        t0 = time.perf_counter()
        step = capture(model, tuple(args), dict(example_kwargs or {}), autocast_dtype=autocast_dtype,
                       loss_fn=loss_fn)
        logger.info("captured %s in %.1f s", type(model).__name__, time.perf_counter() - t0)
    else:
        raise ProfilingError(f"problem_of() takes an nn.Module or a CapturedStep, got {type(model).__name__}")
    if not profile:
        times = {n.name: UNIT_TIME_S for n in step.joint.graph.nodes if n.op == "call_function"}
        problem = build_problem(step, times=times, optimizer=optimizer)
        return problem if name is None else problem.replace(name=name)
    dev = step.device
    t0 = time.perf_counter()
    measured = profile_step(step, dev, warmup=warmup, repeats=repeats, progress=progress, calibrate=calibrate)
    logger.info("profiled %s in %.1f s", step.model_name, time.perf_counter() - t0)
    gc.collect()
    if dev.type == "cuda" and torch.cuda.is_initialized():  # what profiling cached goes back to the driver
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
    dprof = device_profile(dev)
    try:
        import transformers
        tf_version = transformers.__version__
    except ImportError:  # pragma: no cover
        tf_version = ""
    problem = build_problem(step, times=measured["times"], workspace=measured["workspace"], device=dprof,
                            optimizer=optimizer)
    prov = problem.provenance
    prov = dataclasses.replace(
        prov, date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        extra={**prov.extra, "device": dprof.name, "timer": measured["timer"], "warmup": measured["warmup"],
               "profile": profile_summary(measured), "repeats": measured["repeats"], "optimizer": optimizer,
               "transformers_version": tf_version, "autocast_dtype": _dtype_name(step.autocast_dtype),
               "threads": torch.get_num_threads() if dev.type == "cpu" else None})
    return problem.replace(provenance=prov, **({} if name is None else {"name": name}))


def _build_by_name(name: str, batch: int, seq: int | None, device, dtype: torch.dtype):
    """The model spec :data:`NAME_BUILDER` builds for ``name``."""
    module, _, attr = NAME_BUILDER.partition(":")
    builder = getattr(importlib.import_module(module), attr)
    return builder(name, batch, seq, device=device, dtype=dtype)


def profile(model_or_zoo: "nn.Module | Any | str", args: tuple = (), kwargs: dict | None = None, *,
            loss_fn: Callable[[Any], torch.Tensor] | None = None, optimizer: str = "adam",
            device: str | torch.device | None = None, autocast_dtype: torch.dtype | None = None,
            batch: int | None = None, seq: int | None = None, dtype: torch.dtype = torch.float32,
            warmup: int = 2, repeats: int = 5, progress: bool = True, name: str | None = None,
            calibrate: bool = True) -> RematProblem:
    """Capture one training step, profile it, and build its :class:`RematProblem`
    (:func:`problem_of`, with the model given by name or spec too, and the
    model, batch, sequence length and dtype recorded in the provenance).

    Parameters
    ----------
    model_or_zoo : nn.Module, model spec or str
        A model (with ``args``/``kwargs``/``loss_fn``), a model spec (an
        object with ``model``, ``args``, ``kwargs``, ``loss_fn``, ``name``,
        ``batch``, ``seq``, ``description``, such as a
        :class:`~libra_opt.zoo.ZooModel`), or a name :data:`NAME_BUILDER`
        builds (a zoo name or ``"module:callable"``; then ``batch`` is
        required and ``seq``, ``dtype``, ``device`` are used to build it).
    args, kwargs
        Example inputs for a plain model; ignored for a spec or a name.
    loss_fn : callable, optional
        ``loss_fn(output) -> scalar`` for a plain model (default: the output
        is differentiated with ones as tangents).
    optimizer : {"none", "sgd", "adam", "adamw"}
        Optimizer whose state is counted in the fixed memory (sgd: 1x,
        adam/adamw: 2x the trainable parameters' bytes).
    device : str or torch.device, optional
        Profiling device.  A name is built there; a model must already be
        there (default: the model's device).
    autocast_dtype : torch.dtype, optional
        Capture under ``torch.autocast`` with this dtype (mixed precision).
    batch, seq, dtype
        Used when ``model_or_zoo`` is a name (see
        :func:`libra_opt.zoo.build_model`); ``batch``/``seq`` are also
        recorded in the provenance for a plain model (``batch`` defaults to
        the leading dimension of its first input tensor).
    warmup, repeats, progress, calibrate
        See :func:`profile_step`.
    name : str, optional
        Problem name (default ``"<model>-b<batch>[-s<seq>]"``).

    Returns
    -------
    RematProblem
        As :func:`problem_of`; provenance model, batch, seq, dtype (the
        parameters'), UTC date, and ``extra["description"]``.

    Raises
    ------
    CaptureError
        The model does not capture as one graph (the message names the break).
    ProfilingError
        Wrong device, a name without ``batch``, an unknown optimizer, or an
        op fails while profiling.
    ZooError
        Unknown zoo name.
    """
    if optimizer not in OPTIMIZERS:
        raise ProfilingError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
    if isinstance(model_or_zoo, str):
        if batch is None:
            raise ProfilingError(f"profiling zoo model {model_or_zoo!r} needs batch=")
        model_or_zoo = _build_by_name(model_or_zoo, batch, seq, device=device or "cpu", dtype=dtype)
    if isinstance(model_or_zoo, nn.Module):
        model, args, kwargs = model_or_zoo, tuple(args), dict(kwargs or {})
        model_name, desc = type(model).__name__, ""
        if batch is None:  # the leading dimension of the first input tensor
            first = next((v for v in tree_flatten((args, kwargs))[0] if isinstance(v, torch.Tensor)), None)
            batch = int(first.shape[0]) if first is not None and first.dim() > 0 else None
    elif all(hasattr(model_or_zoo, a) for a in ("model", "args", "kwargs", "loss_fn", "name", "batch", "seq")):
        zm = model_or_zoo
        model, args, kwargs, loss_fn = zm.model, zm.args, zm.kwargs, zm.loss_fn
        model_name, batch, seq, desc = zm.name, zm.batch, zm.seq, getattr(zm, "description", "")
    else:
        raise ProfilingError(f"profile() takes an nn.Module, a model spec (e.g. a ZooModel) or a model name, "
                             f"got {type(model_or_zoo).__name__}")
    kwargs = dict(kwargs or {})
    dev = _model_device(model, args, kwargs)
    if device is not None and _as_device(device) != dev:
        raise ProfilingError(f"the model is on {dev} but profiling was asked on {_as_device(device)}; "
                             f"move the model and its inputs to {_as_device(device)} first")
    mdtype = _model_dtype(model)
    problem = problem_of(model, tuple(args), kwargs, loss_fn=loss_fn, autocast_dtype=autocast_dtype,
                         optimizer=optimizer, warmup=warmup, repeats=repeats, progress=progress,
                         calibrate=calibrate)
    prov = problem.provenance
    prov = dataclasses.replace(prov, model=model_name, batch=batch, seq=seq, dtype=_dtype_name(mdtype),
                               extra={**prov.extra, "description": desc})
    if name is None:
        name = model_name + (f"-b{batch}" if batch is not None else "") + (f"-s{seq}" if seq is not None else "")
    return problem.replace(name=name, provenance=prov)
