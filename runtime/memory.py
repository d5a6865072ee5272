"""Device memory as the allocator holds it: one small interface, three implementations.

The budget contract (``DESIGN.md``) is about what the device *holds*: during a
planned step ``max_memory_reserved()`` stays within what was allocated before
the step plus the budget.  :class:`DeviceMemory` is what the closed loop
(:mod:`libra_opt.calibrate`) and ``max-batch`` read and reset:

- :class:`CudaMemory`: the CUDA caching allocator
  (``torch.cuda.memory_allocated``, ``max_memory_allocated``,
  ``memory_reserved``, ``max_memory_reserved``, ``reset_peak_memory_stats``,
  ``empty_cache``, ``mem_get_info``), on one device whose index is resolved
  (``"cuda"`` means the current device);
- :class:`TrackerMemory`: the CPU stand-in: the bytes of the storages a step
  creates, counted by :class:`~libra_opt.runtime.executor.StorageTracker`
  (reserved = allocated: no caching);
- :class:`FakeCachingAllocator`: a model of PyTorch's CUDA caching allocator
  fed by the same tracker, for tests: requests rounded to blocks, blocks carved
  from segments (2 MiB segments for a small-block pool, 20 MiB or rounded-up
  segments for the large pool), freed blocks cached and reused best-fit, split
  and coalesced within their segment, segments released only by
  :meth:`~FakeCachingAllocator.empty_cache` or when a cap would be crossed.
  Reserved memory then exceeds allocated memory as on a GPU, so the closed
  loop is exercised for real on a CPU.

:func:`configure_allocator` turns on expandable segments
(``expandable_segments:True``) when the user has not configured the CUDA
allocator; opt out with ``LIBRA_OPT_EXPANDABLE_SEGMENTS=0``.

Sources: PyTorch's CUDA caching allocator
(``c10/cuda/CUDACachingAllocator.cpp``: ``kMinBlockSize`` 512 B,
``kSmallSize`` 1 MiB, ``kSmallBuffer`` 2 MiB, ``kLargeBuffer`` 20 MiB,
``kMinLargeAlloc`` 10 MiB, ``kRoundLarge`` 2 MiB; "Memory management" in the
CUDA semantics notes: ``PYTORCH_CUDA_ALLOC_CONF``, ``expandable_segments``).
"""
from __future__ import annotations

import abc
import contextlib
import gc
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from .executor import StorageTracker

logger = logging.getLogger(__name__)

__all__ = ["DeviceMemory", "CudaMemory", "TrackerMemory", "FakeCachingAllocator", "memory_for",
           "configure_allocator", "release_cached", "cuda_index", "is_out_of_memory", "EXPANDABLE_ENV"]

#: environment variable: ``0`` keeps libra-opt from turning on expandable segments
EXPANDABLE_ENV = "LIBRA_OPT_EXPANDABLE_SEGMENTS"
#: environment variables through which a user configures PyTorch's allocator
_ALLOC_CONF_ENVS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def cuda_index(device: torch.device | str | int | None = None) -> int:
    """The index of a CUDA device: ``"cuda"`` / ``None`` -> the current device
    (``torch.cuda.current_device()``), ``"cuda:1"`` / ``1`` -> 1.

    ``torch.cuda.set_per_process_memory_fraction`` needs an index (it rejects
    ``torch.device("cuda")``).

    Raises
    ------
    ValueError
        ``device`` is not a CUDA device.
    """
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"not a CUDA device: {device}")
    return torch.cuda.current_device() if device.index is None else device.index


def release_cached(device: torch.device | str | None = None) -> None:
    """Collect garbage (storages held only by reference cycles die, also on
    a CPU, where a storage tracker or a fake allocator counts them), then,
    for a CUDA ``device`` (or ``None``: the current one) once CUDA is
    initialised, return the caching allocator's cached blocks to the driver
    (``torch.cuda.synchronize`` + ``torch.cuda.empty_cache``).  Called after
    profiling the unplanned step, so the plan does not train next to what
    profiling reserved, and between max-batch probes."""
    gc.collect()
    if device is not None and torch.device(device).type != "cuda":
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` means the device ran out of memory: a
    ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` before torch
    2.5), or a ``RuntimeError`` saying "out of memory" or
    ``CUBLAS_STATUS_ALLOC_FAILED`` (cuBLAS / cuDNN workspace allocations),
    found in ``e`` or in an exception it wraps (``__cause__``,
    ``__context__``, TorchDynamo's ``inner_exception``).  Used by the closed
    loop (:func:`~libra_opt.calibrate.measure_step`) and the max-batch
    probes (:func:`~libra_opt.batch_search.oom_safe`).  Never raises."""
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


_configured: str | None = None


def configure_allocator() -> str:
    """Turn on the CUDA allocator's expandable segments, unless the user chose.

    Expandable segments map memory into one growing segment per pool instead
    of fixed-size segments, which cuts what is reserved beyond what is
    allocated (H100, GPT-2 medium b8, ``gpu-measurements/README.md``: peak
    reserved 19.0 GiB for 17.0 GiB allocated without, 16.2 GiB for 15.3 GiB
    with).

    Left alone when ``PYTORCH_CUDA_ALLOC_CONF`` or ``PYTORCH_ALLOC_CONF`` is set
    (the user configured the allocator), when ``LIBRA_OPT_EXPANDABLE_SEGMENTS=0``,
    without CUDA, or when the allocator backend is not PyTorch's native one
    (``cudaMallocAsync``).  Applied once per process through
    ``torch._C._accelerator_setAllocatorSettings`` (torch >= 2.9) or
    ``torch.cuda.memory._set_allocator_settings`` (older); new segments use it.

    Returns
    -------
    str
        What was done: ``"expandable_segments:True"``, or why not
        (``"user-configured"``, ``"opted-out"``, ``"no-cuda"``, ``"backend ..."``,
        ``"unsupported"``).
    """
    global _configured
    if _configured is not None:
        return _configured
    if any(os.environ.get(k) for k in _ALLOC_CONF_ENVS):
        outcome = "user-configured"
    elif os.environ.get(EXPANDABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        outcome = "opted-out"
    elif not torch.cuda.is_available():
        return "no-cuda"                    # not cached: CUDA may appear in a test's monkeypatch
    else:
        backend = torch.cuda.get_allocator_backend()
        setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or getattr(
            torch.cuda.memory, "_set_allocator_settings", None)
        if backend != "native":
            outcome = f"backend {backend}"
        elif setter is None:
            outcome = "unsupported"
        else:
            setter("expandable_segments:True")
            outcome = "expandable_segments:True"
    logger.info("CUDA allocator: %s", outcome)
    _configured = outcome
    return outcome


# ================================================================ interface
class DeviceMemory(abc.ABC):
    """Memory of one device as its allocator holds it (bytes).

    ``allocated`` is what live tensors occupy; ``reserved`` what the allocator
    holds (allocated plus cached blocks and rounding); peaks are since the last
    :meth:`reset_peak`.  :meth:`tracking` is the context a measured step runs
    in (a no-op on CUDA; on a CPU the storage tracker).
    """

    device: torch.device

    @abc.abstractmethod
    def allocated(self) -> int:
        """Bytes allocated now."""

    @abc.abstractmethod
    def reserved(self) -> int:
        """Bytes reserved now."""

    @abc.abstractmethod
    def peak_allocated(self) -> int:
        """Highest allocated bytes since :meth:`reset_peak`."""

    @abc.abstractmethod
    def peak_reserved(self) -> int:
        """Highest reserved bytes since :meth:`reset_peak`."""

    @abc.abstractmethod
    def reset_peak(self) -> None:
        """Start the peaks from the current values."""

    def empty_cache(self) -> None:
        """Release cached, unallocated memory (default: nothing to release)."""

    def total(self) -> int | None:
        """Device memory in bytes, if bounded (``None``: unknown)."""
        return None

    def synchronize(self) -> None:
        """Wait for queued work (default: nothing queued)."""

    def tracking(self, module: Any = None):
        """Context a measured step runs in (default: none needed)."""
        return contextlib.nullcontext()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(allocated={self.allocated()}, reserved={self.reserved()}, "
                f"peak_allocated={self.peak_allocated()}, peak_reserved={self.peak_reserved()})")


class CudaMemory(DeviceMemory):
    """The CUDA caching allocator of one device.

    Parameters
    ----------
    device : torch.device, str or int
        ``"cuda"`` (the current device), ``"cuda:N"`` or ``N``.

    Raises
    ------
    ValueError
        Not a CUDA device.
    """

    def __init__(self, device: torch.device | str | int = "cuda"):
        self.index = cuda_index(device)
        self.device = torch.device("cuda", self.index)

    def allocated(self) -> int:
        return int(torch.cuda.memory_allocated(self.index))

    def reserved(self) -> int:
        return int(torch.cuda.memory_reserved(self.index))

    def peak_allocated(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.index))

    def peak_reserved(self) -> int:
        return int(torch.cuda.max_memory_reserved(self.index))

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.index)

    def empty_cache(self) -> None:
        release_cached(torch.device("cuda", self.index))

    def total(self) -> int:
        """Total device memory (``torch.cuda.mem_get_info``), bytes."""
        return int(torch.cuda.mem_get_info(self.index)[1])

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.index)


class TrackerMemory(DeviceMemory):
    """CPU stand-in: the bytes of the storages created inside :meth:`tracking`
    (a :class:`~libra_opt.runtime.executor.StorageTracker`, kept across
    steps so storages a step leaves behind stay counted); reserved equals
    allocated.

    Parameters
    ----------
    device : optional
        Count only storages on this device (default: all).
    """

    def __init__(self, device: torch.device | str | None = None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.tracker = self._make_tracker(device)

    def _make_tracker(self, device) -> StorageTracker:
        return StorageTracker(device)

    def allocated(self) -> int:
        return int(self.tracker.live_bytes)

    def reserved(self) -> int:
        return self.allocated()

    def peak_allocated(self) -> int:
        return int(self.tracker.peak_bytes)

    def peak_reserved(self) -> int:
        return self.peak_allocated()

    def reset_peak(self) -> None:
        self.tracker.reset_peak()

    def tracking(self, module: Any = None):
        """The tracker, installed in ``module``'s graphs when given (an
        :class:`~libra_opt.runtime.module.OptimizedModule`: TorchDynamo does not
        run compiled code under a dispatch mode), else around the step."""
        if module is not None and hasattr(module, "tracking"):
            return module.tracking(self.tracker)
        return self.tracker


# ============================================================ fake allocator
@dataclass(eq=False)
class _Block:
    segment: "_Segment"
    offset: int
    size: int
    free: bool = True


@dataclass(eq=False)
class _Segment:
    pool: str
    size: int
    blocks: list  # of _Block, by offset


class _FeedingTracker(StorageTracker):
    """A storage tracker that allocates every storage it counts from a
    :class:`FakeCachingAllocator` and frees it there when the storage dies."""

    def __init__(self, allocator: "FakeCachingAllocator", device=None):
        super().__init__(device)
        self.allocator = allocator

    def _add(self, key: int, nb: int) -> None:
        self.allocator.malloc(key, nb)
        super()._add(key, nb)

    def _free(self, key: int) -> None:
        if key in self._live:
            self.allocator.free(key)
        super()._free(key)


class FakeCachingAllocator(TrackerMemory):
    """A model of PyTorch's CUDA caching allocator, fed by a storage tracker
    (tests: the closed loop against an allocator that rounds and caches).

    Each request is rounded up to ``round_bytes``; requests up to
    ``small_size`` come from the small pool (segments of ``small_segment``
    bytes) when ``small_pool``, others from the large pool (a segment of
    ``large_segment`` bytes for requests under ``min_large_alloc``, else the
    request rounded up to ``round_large``).  A request takes the smallest
    cached free block of its pool that holds it (best fit); the block is split
    when the remainder is at least ``round_bytes`` (small pool) or above
    ``small_size`` (large pool), else handed out whole (allocated bytes count
    the whole block, as PyTorch's stats do).  Freed blocks are cached and
    coalesce with free neighbours of their segment; :meth:`empty_cache`
    releases segments with nothing allocated.  With a ``cap``, a request that
    would take the reserved bytes over it first releases the cache, then
    raises ``torch.OutOfMemoryError``.

    Parameters
    ----------
    round_bytes, small_size, small_segment, large_segment, min_large_alloc, round_large : int
        Bytes; PyTorch's values by default.  Scale them down (:meth:`scaled`)
        for the tiny models a CPU test trains.
    small_pool : bool
        Keep a second pool for small requests (PyTorch does).
    cap : int, optional
        Most bytes that may be reserved.
    device : optional
        Count only storages on this device.
    """

    def __init__(self, *, round_bytes: int = 512, small_size: int = 1 << 20, small_segment: int = 2 << 20,
                 large_segment: int = 20 << 20, min_large_alloc: int = 10 << 20, round_large: int = 2 << 20,
                 small_pool: bool = True, cap: int | None = None, device=None):
        if not 0 < round_bytes <= small_size < small_segment or not round_large > 0 or large_segment <= 0:
            raise ValueError("allocator sizes must satisfy 0 < round_bytes <= small_size < small_segment, "
                             "round_large > 0, large_segment > 0")
        self.round_bytes, self.small_size, self.small_segment = int(round_bytes), int(small_size), int(small_segment)
        self.large_segment, self.min_large_alloc, self.round_large = (int(large_segment), int(min_large_alloc),
                                                                      int(round_large))
        self.small_pool = bool(small_pool)
        self.cap = None if cap is None else int(cap)
        self.segments: list[_Segment] = []
        self._blocks: dict[Any, _Block] = {}
        self._allocated = self._reserved = 0
        self._peak_allocated = self._peak_reserved = 0
        self.segment_allocations = 0
        super().__init__(device)

    @classmethod
    def scaled(cls, factor: float, **kwargs) -> "FakeCachingAllocator":
        """PyTorch's granularities divided by ``factor`` (e.g. 1024: 20 KiB
        large segments, 2 KiB small ones), for models 1000x smaller than a
        GPU's."""
        d = dict(round_bytes=512, small_size=1 << 20, small_segment=2 << 20, large_segment=20 << 20,
                 min_large_alloc=10 << 20, round_large=2 << 20)
        d = {k: max(1, int(v / factor)) for k, v in d.items()}
        d["round_bytes"] = max(8, min(d["round_bytes"], d["small_size"]))
        d.update(kwargs)
        return cls(**d)

    def _make_tracker(self, device) -> StorageTracker:
        return _FeedingTracker(self, device)

    # -------------------------------------------------------------- sizes
    def round_size(self, nbytes: int) -> int:
        """A request's block size: ``nbytes`` rounded up to ``round_bytes``."""
        r = self.round_bytes
        return max(r, (int(nbytes) + r - 1) // r * r)

    def _pool(self, size: int) -> str:
        return "small" if self.small_pool and size <= self.small_size else "large"

    def _segment_size(self, pool: str, size: int) -> int:
        if pool == "small":
            return self.small_segment
        if size < self.min_large_alloc:
            return max(self.large_segment, size)
        return (size + self.round_large - 1) // self.round_large * self.round_large

    # ------------------------------------------------------ malloc / free
    def malloc(self, key: Any, nbytes: int) -> int:
        """Allocate ``nbytes`` for ``key``; returns the block's size (bytes).

        Raises
        ------
        torch.OutOfMemoryError
            A new segment would take the reserved bytes over ``cap`` even
            after the cache is released.
        ValueError
            ``key`` is already allocated.
        """
        if key in self._blocks:
            raise ValueError(f"{key!r} is already allocated")
        size = self.round_size(nbytes)
        pool = self._pool(size)
        block = self._best_fit(pool, size)
        if block is None:
            block = self._new_segment(pool, size)
        split = block.size - size
        if (pool == "small" and split >= self.round_bytes) or (pool == "large" and split > self.small_size):
            seg = block.segment
            rest = _Block(seg, block.offset + size, split, True)
            seg.blocks.insert(seg.blocks.index(block) + 1, rest)
            block.size = size
        block.free = False
        self._blocks[key] = block
        self._allocated += block.size
        self._peak_allocated = max(self._peak_allocated, self._allocated)
        return block.size

    def free(self, key: Any) -> None:
        """Return ``key``'s block to the cache (coalescing with free neighbours).

        Raises
        ------
        KeyError
            ``key`` is not allocated.
        """
        block = self._blocks.pop(key)
        self._allocated -= block.size
        block.free = True
        blocks = block.segment.blocks
        i = blocks.index(block)
        if i + 1 < len(blocks) and blocks[i + 1].free:
            block.size += blocks.pop(i + 1).size
        if i > 0 and blocks[i - 1].free:
            blocks[i - 1].size += blocks.pop(i).size

    def _best_fit(self, pool: str, size: int) -> _Block | None:
        best = None
        for seg in self.segments:
            if seg.pool != pool:
                continue
            for b in seg.blocks:
                if b.free and b.size >= size and (best is None or b.size < best.size):
                    best = b
        return best

    def _new_segment(self, pool: str, size: int) -> _Block:
        seg_size = self._segment_size(pool, size)
        if self.cap is not None and self._reserved + seg_size > self.cap:
            self.empty_cache()
            if self._reserved + seg_size > self.cap:
                raise torch.OutOfMemoryError(
                    f"fake CUDA out of memory: tried to allocate {seg_size} bytes with {self._reserved} reserved "
                    f"({self._allocated} allocated) under a cap of {self.cap}")
        seg = _Segment(pool, seg_size, [])
        block = _Block(seg, 0, seg_size, True)
        seg.blocks.append(block)
        self.segments.append(seg)
        self.segment_allocations += 1
        self._reserved += seg_size
        self._peak_reserved = max(self._peak_reserved, self._reserved)
        return block

    # ------------------------------------------------------------- stats
    def allocated(self) -> int:
        return self._allocated

    def reserved(self) -> int:
        return self._reserved

    def peak_allocated(self) -> int:
        return self._peak_allocated

    def peak_reserved(self) -> int:
        return self._peak_reserved

    def reset_peak(self) -> None:
        self._peak_allocated, self._peak_reserved = self._allocated, self._reserved
        self.tracker.reset_peak()

    def empty_cache(self) -> None:
        """Release every segment with no allocated block."""
        gc.collect()
        keep = [s for s in self.segments if not all(b.free for b in s.blocks)]
        self._reserved -= sum(s.size for s in self.segments) - sum(s.size for s in keep)
        self.segments = keep

    def total(self) -> int | None:
        return self.cap


def memory_for(device: torch.device | str) -> DeviceMemory:
    """The :class:`DeviceMemory` that measures a step on ``device``:
    :class:`CudaMemory` on CUDA, :class:`TrackerMemory` elsewhere."""
    device = torch.device(device)
    if device.type == "cuda":
        return CudaMemory(device)
    return TrackerMemory(device)
